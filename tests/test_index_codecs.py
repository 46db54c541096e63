"""Every lossless index codec reproduces the exact sparse tensor, over awkward shapes."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

import deepreduce_hvd as dr

GAP_CODECS = ["raw", "rle", "huffman", "deflate", "varint", "golomb", "entropy",
              {"id": "huffman", "extra_bits": 2}]
ALL_LOSSLESS = GAP_CODECS + ["bitmap", "bloom"]


def roundtrip(index, values, indices, shape, dense=None):
    codec = dr.SparseCodec(index=index, value="raw")
    assert codec.lossless
    payload = codec.encode(values, indices, shape, dense=dense)
    v2, i2, s2 = dr.decode(payload, max_elements=2**40)
    assert s2 == tuple(shape)
    return v2, i2


def assert_exact(values, indices, v2, i2):
    order = np.argsort(indices)
    np.testing.assert_array_equal(i2, np.asarray(indices, dtype=np.int64)[order])
    assert v2.dtype == values.dtype
    np.testing.assert_array_equal(v2.view(np.uint8), values[order].view(np.uint8))


@st.composite
def sparse_sets(draw, max_size=5000):
    size = draw(st.integers(1, max_size))
    kind = draw(st.sampled_from(["random", "clustered", "all", "ends", "empty", "single"]))
    if kind == "all":
        idx = np.arange(size)
    elif kind == "ends":
        idx = np.unique([0, size - 1])
    elif kind == "empty":
        idx = np.zeros(0, np.int64)
    elif kind == "single":
        idx = np.array([draw(st.integers(0, size - 1))])
    else:
        pos = draw(st.lists(st.integers(0, size - 1), max_size=300, unique=True))
        if kind == "clustered":
            pos = [p + d for p in pos[:30] for d in range(5) if p + d < size]
        idx = np.unique(np.array(pos, dtype=np.int64))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    idx = rng.permutation(idx)  # encoders must accept any order
    values = rng.standard_normal(idx.size).astype(np.float32)
    return values, idx, (size,)


@pytest.mark.parametrize("index", ALL_LOSSLESS, ids=str)
@given(data=sparse_sets())
def test_lossless_roundtrip(index, data):
    values, indices, shape = data
    dense = np.zeros(shape, np.float32)
    dense[indices] = values
    try:
        v2, i2 = roundtrip(index, values, indices, shape, dense=dense)
    except dr.DeepReduceError as exc:  # a filter of a few bits over a long tensor reports
        # more false positives than a decoder accepts (bloom_filter.MAX_FALSE_PER_VALUE)
        assert index == "bloom" and "positives" in str(exc) and 20 * indices.size < shape[0], exc
        return
    if index == "bloom":  # p0: a superset, every extra position carries its true dense value
        assert np.isin(indices, i2).all()
        np.testing.assert_array_equal(v2, dense[i2])
    else:
        assert_exact(values, indices, v2, i2)


@pytest.mark.parametrize("index", GAP_CODECS, ids=str)
@given(st.integers(2**20, 2**31), st.lists(st.integers(0, 2**31 - 1), max_size=40, unique=True))
def test_huge_shape_tiny_k(index, size, pos):
    indices = np.array([p % size for p in pos], dtype=np.int64)
    indices = np.unique(indices)
    values = np.linspace(-1, 1, indices.size).astype(np.float32)
    v2, i2 = roundtrip(index, values, indices, (size,))
    assert_exact(values, indices, v2, i2)


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "bfloat16"])
def test_dtypes_restored(dtype, rng):
    from ml_dtypes import bfloat16
    np_dtype = bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    dense = rng.standard_normal((30, 40)).astype(np_dtype)
    values, indices = dr.topk(dense, 0.05)
    v2, i2 = roundtrip("entropy", values, indices, dense.shape)
    assert_exact(values, indices, v2, i2)


def test_nan_and_inf_preserved_by_raw():
    values = np.array([np.nan, np.inf, -np.inf, -0.0], dtype=np.float32)
    v2, i2 = roundtrip("golomb", values, np.array([3, 1, 7, 9]), (10,))
    assert_exact(values, np.array([3, 1, 7, 9]), v2, i2)


def test_seeded_sends_no_index_bytes(rng):
    dense = rng.standard_normal(100_000).astype(np.float32)
    values, indices = dr.randomk(dense, 0.01, seed=77)
    payload = dr.SparseCodec(index="seeded").encode(values, indices, dense.shape, seed=77)
    assert len(payload) < 4 * values.size + 40
    v2, i2, _ = dr.decode(payload)
    assert_exact(values, indices, v2, i2)
    with pytest.raises(dr.DeepReduceError, match="seed"):
        dr.SparseCodec(index="seeded").encode(values, indices, dense.shape, seed=78)


@pytest.mark.parametrize("bad", [
    dict(indices=[1, 1], values=[1.0, 2.0]),
    dict(indices=[0, 10], values=[1.0, 2.0]),
    dict(indices=[-1], values=[1.0]),
    dict(indices=[0.5], values=[1.0]),
    dict(indices=[1, 2], values=[1.0]),
    dict(indices=[1], values=np.array([1], dtype=np.int32)),
])
def test_bad_input_is_a_clear_error(bad):
    with pytest.raises(dr.DeepReduceError):
        dr.SparseCodec().encode(np.asarray(bad["values"]), np.asarray(bad["indices"]), (10,))


def test_bloom_p0_needs_dense(rng):
    dense = rng.standard_normal(50_000).astype(np.float32)
    values, indices = dr.topk(dense, 0.01)
    with pytest.raises(dr.DeepReduceError, match="dense="):
        dr.SparseCodec(index="bloom").encode(values, indices, dense.shape)


def test_config_roundtrip():
    codec = dr.SparseCodec(index={"id": "bloom", "policy": "conflict", "fpr": 0.01}, value="raw")
    again = dr.SparseCodec.from_config(codec.get_config())
    assert again.get_config() == codec.get_config()
    assert not again.lossless
    with pytest.raises(dr.DeepReduceError, match="unknown index codec"):
        dr.SparseCodec(index="nope")
    with pytest.raises(dr.DeepReduceError, match="policy"):
        dr.SparseCodec(index={"id": "bloom", "policy": "p9"})


@given(data=sparse_sets(), extra=st.integers(0, 3))
def test_planned_sizes_are_exact(data, extra):
    """entropy picks by computed sizes: they must equal the bytes actually written."""
    from deepreduce_hvd.codecs.index.golomb import encode_rice, rice_parameter
    from deepreduce_hvd.codecs.index.gaps import to_gaps
    from deepreduce_hvd.codecs.index.huffman import GapStats
    gaps = to_gaps(np.sort(data[1]))
    stats = GapStats(gaps)
    assert stats.plan(extra)[0] == len(stats.encode(extra))
    r, nbytes = rice_parameter(gaps)
    assert nbytes == len(encode_rice(gaps, r))
    assert all(nbytes <= len(encode_rice(gaps, other)) for other in range(0, 20))


@pytest.mark.parametrize("shape", [(64, 50), (50, 64), (300, 7)])
@pytest.mark.parametrize("transpose", [0, 1])
def test_matrix_plan_size_is_exact(shape, transpose, rng):
    """The matrix model is chosen by its planned size: it must equal the body written, and the
    body must decode to the positions in the plan's order."""
    from deepreduce_hvd.codecs.index import matrix
    size = shape[0] * shape[1]
    # rows that mostly select the same columns, as a weight gradient's top-k does
    columns = rng.choice(shape[1], size=max(2, shape[1] // 4), replace=False)
    rows = rng.choice(shape[0], size=max(2, shape[0] // 3), replace=False)
    indices = np.unique(np.concatenate([(rows[:, None] * shape[1] + columns[None, :]).ravel(),
                                        rng.choice(size, 20, replace=False)]))
    plan = matrix.MatrixPlan(indices, *shape, transpose)
    body = plan.body()
    assert plan.nbytes == len(body)
    np.testing.assert_array_equal(matrix.decode(body, indices.size, *shape, transpose),
                                  indices[plan.order])


@given(data=st.data())
def test_native_matrix_coding_equals_its_numpy_twin(data):
    """The encoder's (line, rank) ordering, column ranking and rank steps: the engine's
    counting passes give the numpy twin's stable sorts exactly, ties in counts included."""
    from deepreduce_hvd.codecs.index import matrix
    from deepreduce_hvd.engine import native
    if native.engine is None:
        pytest.skip("native engine not built")
    rows, cols = data.draw(st.integers(2, 70)), data.draw(st.integers(2, 70))
    indices = np.unique(np.array(data.draw(st.lists(st.integers(0, rows * cols - 1),
                                                    min_size=1, max_size=600)), np.int64))
    for transpose in (0, 1):
        fast = matrix.coding(indices, rows, cols, transpose)
        engine, native.engine = native.engine, None
        try:
            slow = matrix.coding(indices, rows, cols, transpose)
        finally:
            native.engine = engine
        for got, want in zip(fast, slow):
            np.testing.assert_array_equal(got, want)


@given(data=st.data())
def test_native_matrix_sizes_equal_the_plans_of_both_orientations(data):
    """The encoder codes only the smaller orientation, sized by the engine's histograms (no
    coding order made): the same body bytes and gap histograms as the numpy twin, which
    codes both, and as each orientation's MatrixPlan; the winner's body is that size."""
    from conftest import on_both_engines
    from deepreduce_hvd.codecs.index import matrix
    rows, cols = data.draw(st.integers(2, 70)), data.draw(st.integers(2, 70))
    indices = np.unique(np.array(data.draw(st.lists(st.integers(0, rows * cols - 1),
                                                    min_size=1, max_size=600)), np.int64))
    fast, slow = on_both_engines(lambda: matrix.sizes(indices, rows, cols))
    for transpose, ((nbytes, hists), (want, want_hists)) in enumerate(zip(fast, slow)):
        assert nbytes == want
        for hist, want_hist in zip(hists, want_hists):
            np.testing.assert_array_equal(np.reshape(hist, -1), np.reshape(want_hist, -1))
        plan = matrix.MatrixPlan(indices, rows, cols, transpose, hists)
        assert plan.nbytes == nbytes == len(plan.body())


@given(gaps=st.lists(st.one_of(st.integers(0, 40), st.integers(0, 2**64 - 1)), max_size=300))
def test_native_gap_histogram_equals_its_numpy_twin(gaps):
    """The (bit length, top three bits) histogram every gap code is sized from, branch-free
    in the engine: the numpy twin's counts for every gap, 0 and 2**64 - 1 included."""
    from conftest import on_both_engines
    from deepreduce_hvd.codecs.index.huffman import GapStats
    gaps = np.array(gaps, np.uint64)
    fast, slow = on_both_engines(lambda: GapStats(gaps).hist)
    np.testing.assert_array_equal(fast, slow)


@given(freqs=st.lists(st.integers(0, 10**6), min_size=1, max_size=600))
def test_canonical_codes_follow_the_definition(freqs):
    """Each code (shorter first, then by symbol) is the previous code plus one, shifted left by
    the growth in length: the reference rule, one symbol at a time; and no code is a prefix of
    another."""
    from deepreduce_hvd.codecs import huffman_code
    lengths = huffman_code.code_lengths(np.array(freqs))
    codes = huffman_code.canonical_codes(lengths)
    code = previous = 0
    used = np.flatnonzero(lengths)
    for symbol in used[np.argsort(lengths[used], kind="stable")]:
        code <<= int(lengths[symbol]) - previous
        previous = int(lengths[symbol])
        assert int(codes[symbol]) == code
        code += 1
    words = sorted(format(int(codes[s]), f"0{lengths[s]}b") for s in used)
    assert all(not b.startswith(a) for a, b in zip(words, words[1:]))
    assert not codes[lengths == 0].any()


@given(gaps=st.lists(st.integers(0, 2**50), max_size=300), r=st.integers(0, 40))
def test_native_rice_code_equals_its_numpy_twin(gaps, r):
    """Unary quotients (beyond 64 bits too) and remainders: the same bytes from both engines."""
    from deepreduce_hvd.codecs.index.golomb import encode_rice
    from deepreduce_hvd.engine import native
    if native.engine is None:
        pytest.skip("native engine not built")
    gaps = np.array(gaps, np.uint64) >> np.uint64(max(0, 50 - r - 8))  # quotients up to ~256
    fast = encode_rice(gaps, r)
    engine, native.engine = native.engine, None
    try:
        slow = encode_rice(gaps, r)
    finally:
        native.engine = engine
    assert fast == slow


@given(gaps=st.lists(st.integers(0, 2**12), max_size=300), r=st.integers(0, 12),
       slack=st.integers(-3, 3))
def test_native_rice_positions_equal_their_numpy_twin(gaps, r, slack):
    """The native decoder turns the gaps into positions as it reads them: the same positions
    as the numpy twin's gaps and cumulative sum, and the same refusal (DeepReduceError) when
    the tensor is too small for the last of them (slack < 0)."""
    from deepreduce_hvd.codecs.index.golomb import decode_positions, encode_rice
    from deepreduce_hvd.engine import native
    if native.engine is None:
        pytest.skip("native engine not built")
    gaps = np.array(gaps, np.uint64)
    body = encode_rice(gaps, r)
    size = max(0, int((gaps.astype(np.int64) + 1).sum()) + slack)
    results = []
    engine = native.engine
    for current in (engine, None):
        native.engine = current
        try:
            results.append(decode_positions(body, gaps.size, size))
        except dr.DeepReduceError:
            results.append(None)
        finally:
            native.engine = engine
    fast, slow = results
    if slack < 0 and gaps.size:
        assert fast is None and slow is None
    else:
        np.testing.assert_array_equal(fast, slow)
        np.testing.assert_array_equal(fast, np.cumsum(gaps.astype(np.int64) + 1) - 1)


@given(gaps=st.lists(st.integers(0, 2**40), max_size=400), scale=st.integers(0, 40))
def test_native_gap_plan_sizes_equal_the_python_plans_and_the_bytes(gaps, scale):
    """GapStats.smallest sizes all four extra-bit plans in one native call: the same (bytes,
    extra) as the Python plans, and the winner's body is exactly that many bytes, the same
    bytes from both engines (low bits up to 11 wide go through a reversal table)."""
    from deepreduce_hvd.codecs.index.huffman import GapStats
    from deepreduce_hvd.engine import native
    if native.engine is None:
        pytest.skip("native engine not built")
    stats = GapStats(np.array(gaps, np.uint64) >> np.uint64(scale))
    fast = stats.smallest()
    body = stats.encode(fast[1])
    engine, native.engine = native.engine, None
    try:
        slow = stats.smallest()
        slow_body = stats.encode(fast[1])
    finally:
        native.engine = engine
    assert fast == slow
    assert len(body) == fast[0] and body == slow_body


@given(data=st.data())
def test_native_body_decoders_equal_their_numpy_twins(data):
    """The engine decodes a matrix-model or Huffman gap body in one call (csrc/bodies.cpp):
    on intact and damaged bodies and on miscounted headers, the same positions as the numpy
    twin, or a DeepReduceError from both."""
    from conftest import damage, on_both_engines
    from deepreduce_hvd.codecs.index import huffman, matrix
    from deepreduce_hvd.codecs.index.gaps import to_gaps
    rows, cols = data.draw(st.integers(2, 40)), data.draw(st.integers(2, 40))
    rows, cols = (rows * 4, cols * 8) if data.draw(st.booleans()) else (rows, cols)
    picks = data.draw(st.lists(st.integers(0, rows * cols - 1), min_size=1, max_size=400))
    if rows * cols > 4000 and data.draw(st.booleans()):  # enough for the widest decoding table
        picks += list(np.random.default_rng(len(picks)).choice(rows * cols, 2100, replace=False))
    indices = np.unique(np.array(picks, np.int64))
    transpose = data.draw(st.integers(0, 1))
    bodies = {"matrix": matrix.MatrixPlan(indices, rows, cols, transpose).body(),
              "gaps": huffman.GapStats(to_gaps(indices)).encode(data.draw(st.integers(0, 3)))}
    kind = data.draw(st.sampled_from(sorted(bodies)))
    body = damage(data, bodies[kind])
    count = indices.size + data.draw(st.sampled_from([0, 0, -1, 1]))
    size = rows * cols - data.draw(st.sampled_from([0, 0, 1]))
    if kind == "matrix":
        fast, slow = on_both_engines(lambda: matrix.decode(body, count, rows, cols, transpose))
    else:
        fast, slow = on_both_engines(lambda: huffman.decode_positions(body, count, size))
    assert (fast is None) == (slow is None)
    if fast is not None:
        np.testing.assert_array_equal(fast, slow)
