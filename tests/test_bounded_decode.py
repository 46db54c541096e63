"""Decode work bounded by what a payload justifies: Bloom filters by their value count, curves
by the caller's tensor, and describe() taking exactly what decode() takes. (Each hostile case
itself runs in a fresh process, measured, in test_hostile_payloads.py.)"""
import numpy as np
import pytest

import deepreduce_hvd as dr
from deepreduce_hvd.codecs import bloom_filter
from deepreduce_hvd.codecs.sparse_codec import ascending
from deepreduce_hvd.compression.pipeline import decode_all, worth_parallel
from deepreduce_hvd.engine import native
from hostile import curve_body, payload


@pytest.fixture(scope="module")
def valid():
    dense = np.random.default_rng(19).standard_normal(3000).astype(np.float32)
    return dr.SparseCodec(index="golomb", value="raw").encode(*dr.topk(dense, 0.2), (60, 50))


@pytest.mark.parametrize("form", [
    bytes, bytearray, memoryview, np.bytes_,
    lambda p: np.frombuffer(p, np.uint8),
    lambda p: np.frombuffer(p, np.uint8).reshape(1, -1),
    lambda p: np.stack([np.frombuffer(p, np.uint8)] * 2, axis=1)[:, :1],
    lambda p: np.repeat(np.frombuffer(p, np.uint8), 2)[::2],
    lambda p: np.array(p, dtype=f"S{len(p)}"),
], ids=["bytes", "bytearray", "memoryview", "bytes_", "uint8", "uint8 2-D", "uint8 2-D strided",
        "uint8 strided", "S array"])
def test_describe_takes_what_decode_takes(form, valid):
    data = form(valid)
    assert dr.describe(data)["total_bytes"] == len(valid)
    values, _, _ = dr.decode(data)
    assert values.size == dr.describe(data)["count"]


@pytest.mark.parametrize("bad", [
    "text", None, 5, [1, 2], np.int8(3), np.zeros(10, np.float32), np.zeros(4, np.int8),
    np.array(["2020-01-01"], dtype="datetime64[D]"), np.array([b"x"], dtype=object),
], ids=str)
def test_anything_else_is_a_deepreduce_error_for_both(bad):
    for reader in (dr.describe, dr.decode):
        with pytest.raises(dr.DeepReduceError):
            reader(bad)


def test_ascending_across_chunks():
    positions = np.arange(10, dtype=np.int64)
    assert ascending(positions, chunk=3) and ascending(positions[:1]) and ascending(positions[:0])
    for at in range(1, 10):  # a repeat on every side of a chunk boundary
        repeated = positions.copy()
        repeated[at] = repeated[at - 1]
        assert not ascending(repeated, chunk=3)


def test_callers_that_know_the_tensor_pass_its_size():
    """A curve over 2^26 elements in a few bytes: refused by decode_all (the path of
    Pipeline.decompress) for a 1,000-element tensor before anything is evaluated."""
    hostile = payload((1 << 26,), 1 << 26, "dense", b"", "dexp", curve_body("dexp"))
    with pytest.raises(dr.DeepReduceError, match="limit"):
        list(decode_all([hostile], (1000,), "float32"))
    fitting = payload((1000,), 1000, "dense", b"", "dexp", curve_body("dexp", 1000))
    (values, positions), = decode_all([fitting], (1000,), "float32")
    assert values.size == positions.size == 1000


def test_encoder_refuses_a_filter_with_too_many_false_positives(rng):
    dense = rng.standard_normal(100_000).astype(np.float32)
    values, indices = dr.topk(dense, 0.01)
    with pytest.raises(dr.DeepReduceError, match="positives"):
        dr.SparseCodec(index={"id": "bloom", "fpr": 0.2}).encode(values, indices, dense.shape,
                                                                 dense=dense)


def test_scan_limit_bounds_the_positives_by_the_insertions():
    m, h = bloom_filter.parameters(100, 10_000)
    filt = bloom_filter.insert(np.arange(0, 10_000, 100), m, h, 0)
    assert bloom_filter.scan_limit(filt, m, h, 100, 10_000) == bloom_filter.max_positives(100)
    with pytest.raises(dr.DeepReduceError, match="bits set"):  # more than 1 * h bits
        bloom_filter.scan_limit(filt, m, h, 1, 10_000)
    with pytest.raises(dr.DeepReduceError, match="predicts"):  # fine for 10^4, not for 10^8
        bloom_filter.scan_limit(filt, m, h, 100, 10**8)


@pytest.mark.parametrize("environ, cpus, expected", [
    ({}, 8, 8),                                        # no launcher: the whole host
    ({"HOROVOD_LOCAL_SIZE": "4"}, 2, 1),               # oversubscribed: never below one
    ({"HOROVOD_LOCAL_SIZE": "2"}, 8, 4),
    ({"OMPI_COMM_WORLD_LOCAL_SIZE": "3"}, 16, 5),
    ({"SLURM_NTASKS_PER_NODE": "2(x3)"}, 8, 4),        # Slurm's per-node form
    ({"HOROVOD_LOCAL_SIZE": "junk", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}, 4, 2),
    ({"HOROVOD_LOCAL_SIZE": "0"}, 4, 4),
])
def test_cores_per_rank_shares_the_host_between_its_ranks(environ, cpus, expected):
    assert native.cores_per_rank(environ, cpus) == expected


def test_decode_all_gives_the_same_sums_on_worker_threads_or_not(rng, monkeypatch):
    """Long entropy-coded payloads go to the pool only where each rank has a spare core;
    either way the same (values, positions) come back in rank order."""
    codec = dr.SparseCodec(index="entropy", value="entropy")
    payloads = [codec.encode(*dr.topk(rng.standard_normal(400_000).astype(np.float32), 0.05),
                             (400_000,)) for _ in range(4)]
    results = {}
    for cores in (1, 2):
        monkeypatch.setattr(native, "cores_per_rank", lambda: cores)
        assert worth_parallel(payloads) == (cores == 2)
        results[cores] = list(decode_all(payloads, (400_000,), "float32"))
    for (v1, p1), (v2, p2) in zip(results[1], results[2]):
        np.testing.assert_array_equal(v1, v2)
        np.testing.assert_array_equal(p1, p2)


def test_only_long_costly_payload_sets_go_to_the_pool(rng, monkeypatch):
    """The pool pays for sets of three or more payloads of 16k+ elements coded in at most 12
    bits an element (entropy codecs: costly to decode per element), or 32k+ in at most 32;
    cheaper codecs, short or few payloads and unreadable headers decode on the calling
    thread."""
    monkeypatch.setattr(native, "cores_per_rank", lambda: 2)
    values, indices = dr.topk(rng.standard_normal(1_600_000).astype(np.float32), 0.025)
    encode = lambda index, value, k=None: dr.SparseCodec(index=index, value=value).encode(  # noqa: E731
        values[:k], indices[:k], (1_600_000,))
    assert worth_parallel([encode("entropy", "entropy")] * 3)
    assert not worth_parallel([encode("entropy", "entropy")] * 2)
    assert not worth_parallel([encode("entropy", "entropy", 10_000)] * 3)
    assert worth_parallel([encode("golomb", "fp16")] * 3)
    assert not worth_parallel([encode("golomb", "fp16", 20_000)] * 3)
    assert not worth_parallel([encode("raw", "raw")] * 3)
    assert not worth_parallel([b"\xd7R\x02junk"] * 3)



@pytest.mark.parametrize("order", ["ascending", "column-major", "shuffled"])
def test_native_scatter_adds_the_same_bits_in_any_order_of_positions(rng, order):
    """scatter_add goes by cache-sized blocks where positions wander (the matrix model's
    transposed orientation decodes column by column): the sum must equal numpy's in-order
    adds bit for bit, repeated positions included, and a position outside is refused."""
    from deepreduce_hvd.engine.scatter import scatter_add
    if native.engine is None:
        pytest.skip("native engine not built")
    rows, cols = 1024, 1024
    grid = np.sort(rng.choice(rows * cols, 40_000, replace=False))
    if order == "column-major":
        grid = grid[np.lexsort((grid // cols, grid % cols))]
    elif order == "shuffled":
        grid = rng.permutation(grid)
    positions = np.concatenate([grid, grid[::7]])  # each repeat after its first add
    values = rng.standard_normal(positions.size).astype(np.float32)
    start = rng.standard_normal(rows * cols).astype(np.float32)
    fast, slow = start.copy(), start.copy()
    scatter_add(fast, positions, values, -0.5)
    np.add.at(slow, positions, values * np.float32(-0.5))
    np.testing.assert_array_equal(fast.view(np.uint32), slow.view(np.uint32))
    with pytest.raises(dr.DeepReduceError):
        scatter_add(fast, np.append(positions, rows * cols), np.append(values, 1), 1.0)


@pytest.mark.parametrize("engine,order", [  # numpy's scatter trusts the decoders' range checks
    (engine, order) for engine in ("native", "numpy")
    for order in ("ascending", "shuffled", "repeated", "outside")
    if (engine, order) != ("numpy", "outside")])
def test_densify_writes_the_bits_of_a_scatter_into_zeros(rng, order, engine, monkeypatch):
    """densify (a range of the sparse allreduce's total, cleared and its payload written in
    one pass where the positions ascend) leaves the bits of filling with zeros and adding:
    every element written, -0.0 and NaN values and a scale included; positions that do not
    ascend (repeated ones too) take the fill and the scatter, and one outside the range is
    refused."""
    from deepreduce_hvd.engine.scatter import densify, scatter_add
    if engine == "native" and native.engine is None:
        pytest.skip("native engine not built")
    if engine == "numpy":
        monkeypatch.setattr(native, "engine", None)
    size = 3 * 4096 + 17  # blocks of the native pass and a partial one
    positions = np.sort(rng.choice(size, 900, replace=False))
    positions = {"ascending": positions, "shuffled": rng.permutation(positions),
                 "repeated": np.append(positions, positions[:5]),
                 "outside": np.append(positions, size)}[order]
    values = rng.standard_normal(positions.size).astype(np.float32)
    values[:3] = [-0.0, np.nan, 1e-45]
    dst = rng.standard_normal(size).astype(np.float32)  # what the buffer held before
    expected = np.zeros(size, np.float32)
    if order == "outside":
        with pytest.raises(dr.DeepReduceError):
            densify(dst, positions, values, -0.5)
        return
    np.add.at(expected, positions, values * np.float32(-0.5))
    densify(dst, positions, values, -0.5)
    if order != "repeated":  # outside scatter_add's contract (unique positions) in numpy
        np.testing.assert_array_equal(dst.view(np.uint32), expected.view(np.uint32))
    fill_then_add = np.zeros(size, np.float32)  # what the gather did before densify
    scatter_add(fill_then_add, positions, values, -0.5)
    np.testing.assert_array_equal(dst.view(np.uint32), fill_then_add.view(np.uint32))
