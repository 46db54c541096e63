"""Hand-made hostile payloads (valid checksums, lying headers) and a harness that decodes each
in a fresh process, measuring its time and the memory it took beyond the output it returned."""
import json
import os
import subprocess
import sys
import time
import zlib
from pathlib import Path

import numpy as np

from deepreduce_hvd.wire.payload import MAGIC, VERSION
from deepreduce_hvd.wire.bytestream import ByteWriter

ROOT = Path(__file__).resolve().parent.parent
WIRE = {"raw": 1, "bitmap": 2, "rle": 3, "deflate": 4, "varint": 5, "golomb": 6, "seeded": 7,
        "huffman": 8, "bloom": 9, "entropy": 10, "dense": 11}
VALUE = {"raw": 1, "fp16": 2, "bf16": 3, "deflate": 4, "qsgd": 5, "polyfit": 6, "dexp": 7,
         "entropy": 8}


def payload(shape, count, index, index_body, value, value_body, dtype=0, layout=0, extra=b""):
    """A payload with a valid checksum around whatever header and sections are given."""
    body = ByteWriter().u8(dtype).u8(layout).varint(len(shape))
    for dim in shape:
        body.varint(dim)
    body.varint(count).u8(WIRE[index]).section(index_body)
    if layout:
        body.section(extra)
    body = body.u8(VALUE[value]).raw(value_body).getvalue()
    return MAGIC + bytes([VERSION]) + zlib.crc32(body).to_bytes(4, "little") + body


def bloom_body(policy, h, m, inserted, filter_bytes, seed=0):
    return (ByteWriter().u8(policy).u8(h).varint(m).varint(seed).varint(inserted)
            .raw(filter_bytes).getvalue())


POLICIES = ("p0", "random", "conflict", "leftmost")


def bloom_raised(policy):
    """A valid Bloom payload of 900 of 3,000 values whose dimension is then raised to 2^26
    (checksum recomputed): the filter's false positives over 2^26 positions are millions."""
    import deepreduce_hvd as dr
    from deepreduce_hvd.wire.payload import parse
    dense = np.random.default_rng(19).standard_normal(3000).astype(np.float32)
    values, indices = dr.topk(dense, 0.3)
    p = parse(dr.SparseCodec(index={"id": "bloom", "policy": policy}).encode(
        values, indices, dense.shape, dense=dense))
    return payload((1 << 26,), p.count, "bloom", bytes(p.index_body), "raw", bytes(p.value_body))


def curve_body(value, count=1 << 26):
    """A curve's body that expands to `count` values (dexp: two runs; polyfit: one piece)."""
    if value == "dexp":
        return ByteWriter().varint(count // 2).raw(np.array([1, 0.5, 0, 0, -1, 0.5, 0, 0], "<f4")
                                                   .tobytes()).getvalue()
    return (ByteWriter().u8(3).varint(1).section(ByteWriter().varint(count).getvalue())
            .raw(np.array([1, 2, 3, 4], "<f4").tobytes()).getvalue())


CASES = {
    # a 29-byte Bloom p0 payload, every bit set, for a 2^28-element tensor
    "bloom_p0_all_ones": lambda: payload((1 << 28,), 1, "bloom", bloom_body(0, 1, 8, 1, b"\xff"),
                                         "raw", b"\0" * 4),
    # the same at a limit that admits the shape: the filter's fill is refused
    "bloom_p0_all_ones_admitted": lambda: (payload((1 << 28,), 1, "bloom",
                                                   bloom_body(0, 1, 8, 1, b"\xff"), "raw",
                                                   b"\0" * 4), 1 << 28),
    # a dense index of 2^31 elements and no value bytes
    "dense_2_31_no_values": lambda: payload((1 << 31,), 1 << 31, "dense", b"", "raw", b""),
    "dense_2_31_admitted": lambda: (payload((1 << 31,), 1 << 31, "dense", b"", "raw", b""), 1 << 31),
    # seeded positions, count 2^30, with a curve that expands to any count
    "seeded_2_30": lambda: payload((1 << 30,), 1 << 30, "seeded", ByteWriter().varint(1).getvalue(),
                                   "dexp", ByteWriter().varint(0).raw(bytes(32)).getvalue()),
    # one run of 2^31 selected elements
    "rle_run_2_31": lambda: payload((1 << 31,), 1 << 31, "rle",
                                    ByteWriter().u8(32).varint(1).raw((0).to_bytes(4, "big") +
                                                                      (1 << 31).to_bytes(4, "big")).getvalue(),
                                    "dexp", ByteWriter().varint(0).raw(bytes(32)).getvalue()),
    # a Huffman gap stream whose count is never backed by bits
    "huffman_count_without_bits": lambda: (payload((1 << 26,), 1 << 26, "huffman",
                                                   bytes([0, 1, 1, 0x1]) + b"\0",
                                                   "dexp", ByteWriter().varint(0).raw(bytes(32)).getvalue()),
                                           1 << 26),
    # a 28-byte Bloom "conflict" payload: h=32, all-ones filter, 2^24 elements
    "bloom_conflict_all_ones": lambda: payload((1 << 24,), 1, "bloom",
                                               bloom_body(2, 32, 46, 1, b"\xff" * 6), "raw", b"\0" * 4),
    # the issue-19 cases: a tiny filter (h=1, m=8, 6 bits set) claiming 2^26 elements, for
    # every policy; a valid payload with a dimension raised to 2^26; curves over 2^26 elements
    **{f"bloom_tiny_filter_{policy}": (lambda i=i: payload(
        (1 << 26,), 1, "bloom", bloom_body(i, 1, 8, 1, b"\x3f"), "raw", b"\0" * 4))
       for i, policy in enumerate(POLICIES)},
    **{f"bloom_dimension_raised_{policy}": (lambda policy=policy: bloom_raised(policy))
       for policy in POLICIES},
    "dense_dexp_2_26": lambda: payload((1 << 26,), 1 << 26, "dense", b"", "dexp", curve_body("dexp")),
    "seeded_dexp_2_26": lambda: payload((1 << 26,), 1 << 26, "seeded",
                                        ByteWriter().varint(1).getvalue(), "dexp", curve_body("dexp")),
    "dense_polyfit_2_26": lambda: payload((1 << 26,), 1 << 26, "dense", b"", "polyfit",
                                          curve_body("polyfit")),
    # zlib bombs: far more declared than the stream can hold; and a stream that inflates past
    # what its header justifies
    "zlib_declared_beyond_ratio": lambda: (payload((1 << 26,), 1 << 26, "deflate",
                                                   bytes([4]) + zlib.compress(bytes(1000)), "dexp",
                                                   ByteWriter().varint(0).raw(bytes(32)).getvalue()),
                                           1 << 26),
    "zlib_bomb_past_header": lambda: (payload((1 << 26,), 1 << 16, "deflate",
                                              bytes([4]) + zlib.compress(bytes(1 << 28), 9), "dexp",
                                              ByteWriter().varint(0).raw(bytes(32)).getvalue()),
                                      1 << 26),
    # a polyfit body of 8 million zero-length pieces
    "polyfit_zero_pieces": lambda: payload((1000,), 10, "raw", np.arange(10, dtype="<i4").tobytes(),
                                           "polyfit", ByteWriter().u8(0).varint(8_000_000)
                                           .section(bytes(8_000_000)).getvalue()),
    # lossy decoders that would return NaN or Inf
    "polyfit_nan_coefficient": lambda: payload((100,), 2, "raw", np.arange(2, dtype="<i4").tobytes(),
                                               "polyfit", ByteWriter().u8(0).varint(1).section(bytes([2]))
                                               .raw(np.array([np.nan], "<f4").tobytes()).getvalue()),
    "qsgd_nan_norm": lambda: payload((100,), 2, "raw", np.arange(2, dtype="<i4").tobytes(), "qsgd",
                                     ByteWriter().u8(7).varint(2).raw(np.array([np.nan], "<f4").tobytes())
                                     .raw(b"\x03\x00").getvalue()),
    "qsgd_negative_norm": lambda: payload((100,), 2, "raw", np.arange(2, dtype="<i4").tobytes(), "qsgd",
                                          ByteWriter().u8(7).varint(2).raw(np.array([-1.0], "<f4").tobytes())
                                          .raw(b"\x03\x00").getvalue()),
    "dexp_overflow": lambda: payload((100,), 4, "raw", np.arange(4, dtype="<i4").tobytes(), "dexp",
                                     ByteWriter().varint(2).raw(np.array([1e30, 80, 0, 0, 1e30, 80, 0, 0],
                                                                         "<f4").tobytes()).getvalue()),
    # the entropy codec's matrix model over a 2 x 2^30 grid, two elements: checking its ranked
    # columns must cost what the body holds, not the grid's side
    "matrix_wide_grid": lambda: (payload((2, 1 << 30), 2, "entropy", matrix_body(1 << 30, [0, 5]),
                                         "raw", bytes(8)), 1 << 31),
}


def matrix_body(cols, ranked):
    """An entropy index body in matrix mode (rows ranked by columns): one line, row 0, holding
    the columns `ranked` (ascending)."""
    from deepreduce_hvd.codecs.index.huffman import GapStats
    from deepreduce_hvd.engine.bits import pack_fixed
    gaps = lambda values: GapStats(np.array(values, np.uint64)).encode(0)  # noqa: E731
    body = (ByteWriter().varint(1).varint(len(ranked)).section(gaps([0]))
            .section(gaps([len(ranked) - 1]))
            .section(pack_fixed(np.array(ranked, np.uint64), int(cols - 1).bit_length())))
    return bytes([2, 0]) + body.raw(gaps([0] * len(ranked))).getvalue()


def measure(name, native=True, timeout=60):
    """Decode case `name` in a fresh interpreter (with the C++ engine or DEEPREDUCE_NATIVE=0)
    -> {"outcome", "seconds", "cpu_seconds", "extra_mb", "elements"}: the outcome is
    "DeepReduceError", "finite" (a result, all finite) or what else escaped; cpu_seconds (all
    threads) barely depends on what else the machine runs; extra_mb is the peak resident
    memory during the decode minus before it, minus the output of `elements` values."""
    env = {**os.environ, "DEEPREDUCE_NATIVE": "1" if native else "0",  # this checkout's package
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, __file__, name], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=env)
    if proc.returncode:
        return {"outcome": f"crash {proc.returncode}: {proc.stderr[-500:]}", "seconds": None,
                "cpu_seconds": None, "extra_mb": None, "elements": 0}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _decode_once(dr, data, limit):
    """-> (outcome, seconds, cpu seconds, peak MB beyond the output, elements) of one decode."""
    from fuzz import rss_kb  # scripts/ is on the path (_run)
    Path("/proc/self/clear_refs").write_text("5")  # reset the peak to the current size
    before = rss_kb("VmRSS")
    start, cpu = time.perf_counter(), time.process_time()
    output = elements = 0
    try:
        values, indices, _ = dr.decode(data, max_elements=limit)
        outcome = "finite" if np.isfinite(values).all() else "non-finite result"
        output, elements = values.nbytes + indices.nbytes, values.size
    except dr.DeepReduceError:
        outcome = "DeepReduceError"
    except BaseException as exc:  # noqa: BLE001 - reported, and the test fails on it
        outcome = f"escaped {type(exc).__name__}: {exc}"
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    values = indices = None  # the output goes before the next decode measures its peak
    return outcome, seconds, cpu, (rss_kb("VmHWM") - before) / 1024 - output / 2**20, elements


def _run(name):
    """Decode twice and report the quicker decode's time: on a virtual machine the first touch
    of fresh memory can cost the host's page backing (here 0.1-4 CPU s per 512 MB, varying run
    to run), which is not work the payload asked for; the second decode reuses those pages. The
    peak memory is the larger of the two, and both decodes must end the same way."""
    import deepreduce_hvd as dr
    sys.path.insert(0, str(ROOT / "scripts"))
    case = CASES[name]()
    data, limit = case if isinstance(case, tuple) else (case, dr.wire.payload.DEFAULT_MAX_ELEMENTS)
    runs = [_decode_once(dr, data, limit) for _ in range(2)]
    outcomes = {run[0] for run in runs}
    print(json.dumps({"outcome": runs[0][0] if len(outcomes) == 1 else f"differs: {sorted(outcomes)}",
                      "seconds": min(run[1] for run in runs), "cpu_seconds": min(run[2] for run in runs),
                      "extra_mb": max(run[3] for run in runs), "elements": runs[0][4]}))


if __name__ == "__main__":
    _run(sys.argv[1])
