"""Value codecs: exactness, measured error bounds, unbiasedness, NaN/Inf policy, arrangements."""

import numpy as np
import pytest
from hypothesis import given, strategies as st

import deepreduce_hvd as dr
from deepreduce_hvd.codecs import arrangement
from deepreduce_hvd.compression import sparsify
from deepreduce_hvd.engine import native


@pytest.fixture
def topk_values(rng):
    """Top-1% of a heavy-tailed gradient-like tensor: what value codecs see in practice."""
    dense = (rng.standard_t(3, size=200_000) * 1e-3).astype(np.float32)
    values, indices = dr.topk(dense, 0.01)
    return values, indices, dense


def roundtrip(value, values, indices, size, **kw):
    payload = dr.SparseCodec(index="entropy", value=value, **kw).encode(values, indices, (size,))
    v2, i2, _ = dr.decode(payload)
    np.testing.assert_array_equal(i2, indices)
    return v2, payload


def rel_error(got, want):
    return np.linalg.norm(got.astype(np.float64) - want) / np.linalg.norm(want.astype(np.float64))


@pytest.mark.parametrize("value,bound", [("raw", 0), ("deflate", 0), ("fp16", 2**-11),
                                         ("bf16", 2**-8)])
def test_elementwise_codecs(value, bound, topk_values):
    values, indices, dense = topk_values
    got, _ = roundtrip(value, values, indices, dense.size)
    assert got.dtype == values.dtype
    assert np.all(np.abs(got - values) <= bound * np.abs(values))


@pytest.mark.parametrize("value", ["raw", "deflate", "fp16", "bf16"])
def test_nan_and_inf_preserved(value):
    values = np.array([np.nan, np.inf, -np.inf, 1.5, -2.0], dtype=np.float32)
    got, _ = roundtrip(value, values, np.arange(5), 10)
    assert np.isnan(got[0]) and got[1] == np.inf and got[2] == -np.inf
    np.testing.assert_allclose(got[3:], values[3:], rtol=1e-2)


@pytest.mark.parametrize("value", ["qsgd", "polyfit", "dexp", "entropy"])
def test_lossy_codecs_reject_nan_and_inf(value):
    values = np.array([1.0, np.nan, 2.0], dtype=np.float32)
    with pytest.raises(dr.DeepReduceError, match="NaN or Inf"):
        dr.SparseCodec(value=value).encode(values, np.arange(3), (3,))


@pytest.mark.parametrize("scale", [1e-9, 1e-7, 1.0, 1e6, 1e30])
def test_fp16_bound_holds_at_any_scale(scale, rng):
    """Scaled by a power of two, fp16 keeps 2**-11 relative error for every value within
    2**28 of the largest, and absolute error <= max * 2**-39 below that."""
    values = (rng.standard_t(3, size=4000) * scale).astype(np.float32)
    values[:3] = [scale * 1e-10, -scale * 1e-12, 0.0]
    got, _ = roundtrip("fp16", values, np.arange(values.size), values.size)
    top = np.abs(values).max()
    normal = np.abs(values) >= top * 2.0 ** -28
    assert np.all(np.abs(got - values)[normal] <= 2**-11 * np.abs(values[normal]))
    assert np.all(np.abs(got - values)[~normal] <= top * 2.0 ** -39)
    assert np.isfinite(got).all()


@pytest.mark.parametrize("scale", [1e-38, 1e-9, 1.0, 1e30, 3e38])
def test_fp16_of_float32_rounds_as_the_float64_definition(scale, rng):
    """float32 values are scaled and rounded in float32 by the engine (F16C) or numpy; body
    and delivered values equal the definition's float64 route, subnormals and zeros too."""
    from deepreduce_hvd.codecs.value.fp16 import Fp16Value, scale_exponent
    values = (rng.standard_normal(3000) * scale).astype(np.float32)
    values[:4] = [0.0, -0.0, 1e-44, -1e-40]
    values[4::97] *= np.float32(2.0 ** -40)
    encoded = Fp16Value().encode(values)
    wide = values.astype(np.float64)
    exponent = scale_exponent(wide)
    halves = np.ldexp(wide, exponent).astype("<f2")
    assert encoded.body == bytes([exponent + 128]) + halves.tobytes()
    want = np.ldexp(halves.astype(np.float64), -exponent).astype(np.float32)
    np.testing.assert_array_equal(encoded.delivered.view(np.uint32), want.view(np.uint32))
    decoded = Fp16Value().decode(encoded.body, values.size, np.dtype(np.float32))
    np.testing.assert_array_equal(decoded.view(np.uint32), want.view(np.uint32))


def test_qsgd_is_unbiased(rng):
    values = rng.standard_normal(256).astype(np.float32)
    trials = np.stack([roundtrip({"id": "qsgd", "bits": 3, "bucket": 64, "seed": s}, values,
                                 np.arange(256), 256)[0] for s in range(400)]).astype(np.float64)
    # each coordinate rounds between two levels norm/s apart: its variance is at most
    # (norm / s)**2 / 4, so the mean of T trials lies within 5 sd = 2.5 norm / s / sqrt(T)
    norms = np.repeat(np.linalg.norm(values.reshape(4, 64).astype(np.float64), axis=1), 64)
    sd = norms / 3 / 2 / np.sqrt(len(trials))
    bias = trials.mean(axis=0) - values
    assert np.all(np.abs(bias) <= 5 * sd + 1e-6)
    assert abs(bias.sum()) <= 5 * np.sqrt((sd ** 2).sum())  # no drift summed over coordinates
    assert rel_error(trials[0], values) > 0.01  # it really is lossy at 3 bits


@pytest.mark.parametrize("value,bound", [("polyfit", 0.02), ("dexp", 0.2), ("entropy", 0.04),
                                         ({"id": "entropy", "max_error": 0.01}, 0.01),
                                         ({"id": "qsgd", "bits": 8, "bucket": 128}, 0.1)])
def test_lossy_codecs_measured_error(value, bound, topk_values):
    values, indices, dense = topk_values
    got, payload = roundtrip(value, values, indices, dense.size)
    error = rel_error(got, values)
    assert error <= bound, error
    assert len(payload) < 4 * values.size  # and smaller than raw float32


@given(seed=st.integers(0, 2**32 - 1), count=st.integers(1, 3000),
       max_error=st.sampled_from([0.5, 0.1, 0.04, 0.01, 0.001, 1e-4]),
       scale=st.integers(-20, 20))
def test_entropy_levels_are_the_fewest_within_the_bound(seed, count, max_error, scale):
    """The level search starts where uniform rounding noise predicts and steps one level
    count at a time: whatever the start, it must end on levels within max_error whose half
    is not (4..4096 levels: 4 may be within with room, 4096 is the most there is)."""
    from deepreduce_hvd.codecs.value.entropy import EntropyValue, quantise, step_size
    from deepreduce_hvd.engine.norms import l2_norm
    rng = np.random.default_rng(seed)
    values = (rng.standard_normal(count) * 10.0**scale).astype(np.float32)
    magnitude = np.abs(values).astype(np.float64)
    lo, hi = float(np.float32(magnitude.min())), float(np.float32(magnitude.max()))
    error = lambda levels: l2_norm(  # noqa: E731
        lo + quantise(magnitude, lo, hi, levels) * step_size(lo, hi, levels) - magnitude)
    bound = max_error * l2_norm(magnitude)
    levels = EntropyValue(max_error=max_error).choose_levels(magnitude, lo, hi)
    assert levels in [1 << bits for bits in range(2, 13)]
    assert levels == 4096 or error(levels) <= bound
    assert levels == 4 or error(levels // 2) > bound


@pytest.mark.torch
def test_entropy_pipeline_meets_target_on_real_gradients():
    """entropy + entropy: <= 9 bits per selected element, headers included, at <= 0.05
    relative error, on real gradients (a wide MLP trained on digits for a few steps)."""
    from capture_gradients import capture
    gradients = capture("mlp", {30}, batch=64, seed=0)
    dense = gradients["mlp/step30/net.3.weight"]
    values, indices = dr.topk(dense, 0.01)
    payload = dr.SparseCodec(index="entropy", value="entropy").encode(values, indices, dense.shape)
    got, _, _ = dr.decode(payload)
    assert rel_error(got, values) <= 0.05
    assert 8 * len(payload) / values.size <= 9


@pytest.mark.parametrize("mode", ["permutation", "auto"])
def test_sorted_codecs_restore_index_order(mode, topk_values):
    values, indices, dense = topk_values
    got, payload = roundtrip("dexp", values, indices, dense.size, arrangement=mode)
    layout = payload[8]
    assert layout == (arrangement.PERMUTATION if mode == "permutation" else arrangement.RANKS)
    # each value lands near its own position: the error is the fit's, not a shuffle's
    assert rel_error(got, values) < 0.2
    perm, _ = roundtrip("dexp", values, indices, dense.size, arrangement="permutation")
    if mode == "auto":
        assert rel_error(got, values) <= arrangement.RANK_TOLERANCE * rel_error(perm, values) + 1e-9


def test_rank_layout_is_smaller_than_permutation(topk_values):
    values, indices, dense = topk_values
    _, ranks = roundtrip("dexp", values, indices, dense.size)
    _, perm = roundtrip("dexp", values, indices, dense.size, arrangement="permutation")
    assert len(ranks) < len(perm)


@pytest.mark.parametrize("value", ["qsgd", "polyfit", "dexp", "entropy", "fp16"])
@pytest.mark.parametrize("count", [0, 1, 2, 5])
def test_tiny_inputs(value, count, rng):
    values = rng.standard_normal(count).astype(np.float32)
    got, _ = roundtrip(value, values, np.arange(count), 10)
    assert got.shape == (count,)
    if count:
        assert rel_error(got, values) < 0.5


def test_auto_value_meets_its_bound_and_is_smallest(topk_values):
    values, indices, dense = topk_values
    auto = dr.SparseCodec(index="entropy", value={"id": "auto", "max_error": 0.05})
    payload = auto.encode(values, indices, (dense.size,))
    got, _, _ = dr.decode(payload)
    assert rel_error(got, values) <= 0.05
    for other in ["raw", "fp16", "bf16", "entropy"]:
        assert len(payload) <= len(dr.SparseCodec(index="entropy", value=other).encode(
            values, indices, (dense.size,)))
    exact = dr.SparseCodec(index="entropy", value={"id": "auto", "max_error": 0})
    np.testing.assert_array_equal(dr.decode(exact.encode(values, indices, (dense.size,)))[0], values)


def test_auto_index_falls_back_to_dense(rng):
    dense = rng.standard_normal(10_000).astype(np.float32)
    values, indices = dr.topk(dense, 1.0)
    payload = dr.SparseCodec(index="auto", value="fp16").encode(values, indices, dense.shape,
                                                                dense=dense)
    assert dr.describe(payload)["index"] == "dense"  # every element: no index bytes at all
    sparse = dr.SparseCodec(index="entropy", value="fp16").encode(values, indices, dense.shape)
    assert len(payload) < len(sparse)
    got, got_indices, _ = dr.decode(payload)
    np.testing.assert_array_equal(got_indices, np.arange(dense.size))
    np.testing.assert_allclose(got, dense, rtol=2**-11)
    small = dr.SparseCodec(index="auto", value="raw").encode(*dr.topk(dense, 0.01), dense.shape,
                                                             dense=dense)
    assert dr.describe(small)["index"] in ("entropy", "bitmap")  # sparse wins at 1%


def test_topk_is_exact_on_large_tensors(rng):
    dense = rng.standard_normal(1_000_003).astype(np.float32)
    values, indices = dr.topk(dense, 0.01)
    assert indices.size == 10_000 and np.all(np.diff(indices) > 0)
    kth = np.sort(np.abs(dense))[-10_000]
    assert np.abs(values).min() == kth
    np.testing.assert_array_equal(values, dense[indices])


def test_fused_selection_is_the_same_on_both_engines_and_across_threads(rng, monkeypatch):
    """Above 2M elements the native pass splits the tensor between threads: the same
    selection and residual as the numpy twin, top-k and threshold; a NaN in the last range
    still makes it None."""
    if native.engine is None:
        pytest.skip("C++ engine not built")
    grad = rng.standard_normal(2_100_003).astype(np.float32)
    start = rng.standard_normal(grad.size).astype(np.float32)
    results = []
    for engine in (native.engine, None):
        monkeypatch.setattr(native, "engine", engine)
        residual = start.copy()
        top = sparsify.select("topk", grad, residual, k=21_000)
        over = sparsify.select("threshold", grad, residual.copy(), tau=3.0)
        poisoned = grad.copy()
        poisoned[-5] = np.nan
        results.append((top, over, residual, sparsify.select("topk", poisoned, None, k=10)))
    (top, over, residual, nan), (top2, over2, residual2, nan2) = results
    for a, b in ((top, top2), (over, over2)):
        np.testing.assert_array_equal(a[1], b[1])
        np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(residual, residual2)
    assert nan is None and nan2 is None and top[1].size == 21_000


def test_native_topk_when_its_sampled_cut_misses(monkeypatch):
    """The native pass guesses its cut from 64 evenly spaced runs of the tensor: where those
    runs hold the largest values and too few of them pass the cut, every position becomes a
    candidate, and the selection and residual are still those of the numpy twin."""
    if native.engine is None:
        pytest.skip("C++ engine not built")
    n, runs, run = 1 << 20, 64, 256
    dense = np.full(n, 0.5, np.float32)
    for c in range(runs):  # where the native sample reads
        base = c * ((n - run) // (runs - 1))
        dense[base:base + run] = 1.0
    k = 20_000  # more than the 16,384 sampled ones
    results = []
    for engine in (native.engine, None):
        monkeypatch.setattr(native, "engine", engine)
        residual = np.full(n, 0.25, np.float32)
        results.append((sparsify.select("topk", dense, residual, k=k), residual))
    ((values, indices), residual), ((values2, indices2), residual2) = results
    np.testing.assert_array_equal(indices, indices2)
    np.testing.assert_array_equal(values, values2)
    np.testing.assert_array_equal(residual, residual2)
    assert indices.size == k and np.count_nonzero(values == 1.25) == runs * run


@pytest.mark.parametrize("ratio", [0.1, 0.4, 0.999])
def test_native_topk_matches_numpy_at_high_density_and_ties(ratio, rng, monkeypatch):
    """The native k-th magnitude comes from a two-level radix count over the float bits: the
    same positions as the numpy twin, also where magnitudes tie at the boundary and where
    they differ only in their low 16 bits (the second level decides)."""
    if native.engine is None:
        pytest.skip("C++ engine not built")
    base = np.float32(1.5).view(np.uint32)
    close = (base + rng.integers(0, 40, 300_000)).astype(np.uint32).view(np.float32)
    dense = np.concatenate([rng.standard_normal(300_000).astype(np.float32), close,
                            np.full(50_000, -1.5, np.float32)])
    dense = dense[rng.permutation(dense.size)]
    k = sparsify.selection_size(dense.size, ratio)
    native_picked = sparsify.select("topk", dense, None, k=k)
    monkeypatch.setattr(native, "engine", None)
    numpy_picked = sparsify.select("topk", dense, None, k=k)
    np.testing.assert_array_equal(native_picked[1], numpy_picked[1])
    np.testing.assert_array_equal(native_picked[0], numpy_picked[0])


@pytest.mark.parametrize("exponent", [-128, -127, -20, 0, 14, 126, 127])
def test_native_from_half_equals_numpy_ldexp_for_every_half(exponent):
    """The fp16 codec's decoding back to float32: every one of the 65,536 half bit patterns,
    scaled by 2**-exponent, the same bits as numpy's ldexp of the float32 cast (NaN as NaN),
    also where the result overflows or rounds into float32's subnormals."""
    from deepreduce_hvd.engine.halves import from_half
    if native.engine is None or not native.engine.have_f16c():
        pytest.skip("no native float16 conversion here")
    halves = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    fast = from_half(halves, exponent)
    with np.errstate(over="ignore", invalid="ignore"):
        slow = np.ldexp(halves.astype(np.float32), -exponent)
    same = (fast.view(np.uint32) == slow.view(np.uint32)) | (np.isnan(fast) & np.isnan(slow))
    assert same.all()


@pytest.mark.parametrize("seed", range(6))
def test_native_huffman_pack_equals_its_numpy_twin(seed):
    """The entropy value codec's stream (each level's canonical code, then a sign bit each):
    the same bytes from the native pass as from pack_fields, and symbols without a code are
    refused on both."""
    from deepreduce_hvd.codecs import huffman_code
    if native.engine is None:
        pytest.skip("C++ engine not built")
    rng = np.random.default_rng(seed)
    levels = np.minimum(rng.geometric(0.3, int(rng.integers(1, 5000))) - 1, 40).astype(np.int64)
    lengths = huffman_code.code_lengths(np.bincount(levels, minlength=41))
    signs = rng.random(levels.size) < 0.5
    fast = huffman_code.pack(levels, lengths, signs)
    engine, native.engine = native.engine, None
    try:
        slow = huffman_code.pack(levels, lengths, signs)
    finally:
        native.engine = engine
    assert fast == slow
    unused = np.flatnonzero(lengths == 0)
    for current in (engine, None):
        native.engine = current
        try:
            with pytest.raises(dr.DeepReduceError):
                huffman_code.pack(np.array([unused[0]]), lengths, np.zeros(1, bool))
        finally:
            native.engine = engine


@given(data=st.data())
def test_native_entropy_value_body_equals_its_numpy_twin(data):
    """The engine decodes an entropy value body in one call (csrc/bodies.cpp): on intact and
    damaged bodies and miscounted headers, bit-equal values or a DeepReduceError from both.
    From 2,048 values on, the decoder's table spans 11 bits whatever the code lengths."""
    from conftest import damage, on_both_engines
    from deepreduce_hvd.codecs.value.entropy import EntropyValue
    seed = data.draw(st.integers(0, 2**32 - 1))
    count = data.draw(st.one_of(st.integers(0, 40), st.integers(2040, 5000)))
    values = (np.random.default_rng(seed).standard_normal(count) * 10.0**data.draw(
        st.integers(-30, 30))).astype(np.float32)
    codec = EntropyValue(max_error=data.draw(st.sampled_from([0.5, 0.04, 0.001])))
    body = damage(data, codec.encode(values).body)
    declared = count + data.draw(st.sampled_from([0, 0, -1, 1]))
    fast, slow = on_both_engines(lambda: codec.decode(body, max(declared, 0), np.float32))
    assert (fast is None) == (slow is None)
    if fast is not None:
        np.testing.assert_array_equal(fast.view(np.uint32), slow.view(np.uint32))
