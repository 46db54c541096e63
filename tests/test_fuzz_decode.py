"""dr.decode on hostile bytes: only DeepReduceError ever escapes, and nothing large is allocated."""
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import deepreduce_hvd as dr
from deepreduce_hvd.wire.payload import MAGIC, VERSION

CODECS = ["raw", "bitmap", "rle", "huffman", "deflate", "varint", "golomb", "entropy", "bloom",
          {"id": "bloom", "policy": "conflict"}, {"id": "huffman", "extra_bits": 3}]


def reseal(body):
    """A payload with a valid checksum around arbitrary header+body bytes."""
    return MAGIC + bytes([VERSION]) + zlib.crc32(body).to_bytes(4, "little") + body


def sample_payloads():
    rng = np.random.default_rng(0)
    dense = rng.standard_normal(3000).astype(np.float32)
    values, indices = dr.topk(dense, 0.02)
    return [dr.SparseCodec(index=c).encode(values, indices, (60, 50), dense=dense) for c in CODECS]


PAYLOADS = sample_payloads()


def decode_safely(data):
    try:
        values, indices, shape = dr.decode(data, max_elements=10**6)
    except dr.DeepReduceError:
        return
    assert values.size == indices.size


@given(st.binary(max_size=200))
def test_random_bytes(data):
    decode_safely(data)
    decode_safely(MAGIC + bytes([VERSION]) + data)
    decode_safely(reseal(data))


@settings(suppress_health_check=[HealthCheck.too_slow], max_examples=300)
@given(st.integers(0, len(PAYLOADS) - 1), st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)),
                                                  min_size=1, max_size=4),
       st.integers(0, 10**6), st.booleans())
def test_mutated_payloads(which, flips, cut, sealed):
    body = bytearray(PAYLOADS[which][7:])
    for pos, byte in flips:
        body[pos % len(body)] = byte
    body = bytes(body[: max(0, len(body) - cut % 8)] if cut % 3 == 0 else body)
    decode_safely(reseal(body) if sealed else PAYLOADS[which][:7] + body)


@pytest.mark.parametrize("payload", PAYLOADS[:4])
def test_every_truncation(payload):
    for n in range(len(payload)):
        with pytest.raises(dr.DeepReduceError):
            dr.decode(payload[:n])


def test_checksum_catches_a_flipped_bit():
    data = bytearray(PAYLOADS[0])
    data[-1] ^= 1
    with pytest.raises(dr.DeepReduceError, match="checksum"):
        dr.decode(bytes(data))


def test_declared_size_over_limit_is_refused_before_allocation():
    from deepreduce_hvd.wire.bytestream import ByteWriter
    header = ByteWriter().u8(0).u8(0).varint(2).varint(2**40).varint(2**40).varint(5)
    with pytest.raises(dr.DeepReduceError, match="limit"):
        dr.decode(reseal(header.getvalue()))
    header = ByteWriter().u8(0).u8(0).varint(1).varint(10**6).varint(10**6).u8(2).varint(0).u8(1)
    with pytest.raises(dr.DeepReduceError):  # a 10**6-element bitmap declared in 0 bytes
        dr.decode(reseal(header.getvalue()))


def test_expected_shape_mismatch():
    with pytest.raises(dr.DeepReduceError, match="expected"):
        dr.decode(PAYLOADS[0], expect_shape=(50, 60))


def test_not_bytes():
    with pytest.raises(dr.DeepReduceError):
        dr.decode("text")
    with pytest.raises(dr.DeepReduceError):
        dr.decode(None)


def test_structural_mutants_end_in_a_result_or_deepreduce_error():
    """scripts/fuzz.py's structural mode (hostile counts, shapes, codec ids, Bloom fields,
    curves, each resealed): a short run, every decode bounded by the fuzzer's max_elements and
    256 MB beyond its output; no base payload is dropped unreported."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    import fuzz
    rng = np.random.default_rng(19)
    bases, skipped = fuzz.base_payloads(rng)
    assert len(bases) + len(skipped) == 2 * 2 * len(fuzz.INDEX) * len(fuzz.VALUE)
    kinds = set()
    for _ in range(150):
        data, what = fuzz.structural(bases[rng.integers(len(bases))], rng)
        kinds.add(what.split()[0])
        outcome, _, peak_mb, output_mb, values = fuzz.measured_decode(data)
        assert outcome in ("decoded", "refused"), (what, outcome)
        assert values is None or values.size <= fuzz.MAX_ELEMENTS
        assert peak_mb - output_mb < 256, what
    assert {"shape", "count", "bloom", "curve"} <= kinds
