"""Momentum correction (DGC) and Accordion's critical regimes, on the framework-neutral pipeline."""
import numpy as np
import pytest

import deepreduce_hvd as dr
from deepreduce_hvd.compression import density
from deepreduce_hvd.compression.momentum import MomentumCorrection


def one_rank_step(pipeline, gradient):
    """One step of a 1-rank job: the delivered average of `gradient` as the optimizer gets it."""
    frame = pipeline.compress("w", gradient)
    delivered, _ = pipeline.decompress(frame, gradient.shape, "float32", ranks=1, name="w")
    return delivered, pipeline.momentum.for_optimizer("w", delivered)


def test_momentum_correction_matches_a_hand_computed_case():
    """m = 0.5, top-2 of 4, raw codecs. By hand:
    step 1: g=[4,-1,2,0.5]  u=g              v=u=[4,-1,2,0.5]   send {0:4, 2:2}  v=[0,-1,0,0.5]
    step 2: g=[1,1,1,1]     u=[3,0.5,2,1.25] v=[3,-0.5,2,1.75]  send {0:3, 2:2}  v=[0,-0.5,0,1.75]
    step 3: g=[0,-2,0,1]    u=[1.5,-1.75,1,1.625] v=[1.5,-2.25,1,3.375] send {1:-2.25, 3:3.375}
    the optimizer gets D_t - m*D_{t-1}: [4,0,2,0], [1,0,1,0], [-1.5,-2.25,-1,3.375]."""
    pipeline = dr.Pipeline(ratio=0.5, index="raw", value="raw", min_size=0, momentum=0.5)
    gradients = [[4, -1, 2, 0.5], [1, 1, 1, 1], [0, -2, 0, 1]]
    delivered = [[4, 0, 2, 0], [3, 0, 2, 0], [0, -2.25, 0, 3.375]]
    handed = [[4, 0, 2, 0], [1, 0, 1, 0], [-1.5, -2.25, -1, 3.375]]
    residuals = [[0, -1, 0, 0.5], [0, -0.5, 0, 1.75], [1.5, 0, 1, 0]]
    for g, d, h, r in zip(gradients, delivered, handed, residuals):
        got_delivered, got_handed = one_rank_step(pipeline, np.array(g, np.float32))
        np.testing.assert_array_equal(got_delivered, d)
        np.testing.assert_array_equal(got_handed, h)
        np.testing.assert_array_equal(pipeline.memory.residual("w"), r)


def dgc_reference(gradients, momentum, ratio, masking):
    """Deep Gradient Compression's algorithm 1 (one rank, exact values): the updates it makes."""
    u = v = None
    updates = []
    for g in gradients:
        u = g.copy() if u is None else momentum * u + g
        v = u.copy() if v is None else v + u
        k = max(1, int(round(ratio * g.size)))
        order = np.lexsort((np.arange(g.size), -np.abs(v)))  # largest first, lower position on ties
        mask = np.zeros(g.size, bool)
        mask[order[:k]] = True
        updates.append(np.where(mask, v, 0))
        v = np.where(mask, 0, v)
        if masking:
            u = np.where(mask, 0, u)
    return updates


@pytest.mark.parametrize("masking", [False, True])
def test_sgd_momentum_on_what_it_is_handed_makes_dgc_updates(masking, rng):
    """A momentum-SGD optimizer (buf = m*buf + g; w -= lr*buf) fed what the pipeline hands it
    moves the weights exactly as DGC does."""
    m, lr = 0.9, 0.1
    gradients = [rng.standard_normal(300).astype(np.float32) for _ in range(12)]
    pipeline = dr.Pipeline(ratio=0.05, index="raw", value="raw", min_size=0, momentum=m,
                           momentum_masking=masking)
    buf, weights, reference = None, np.zeros(300), np.zeros(300)
    for g, update in zip(gradients, dgc_reference(gradients, m, 0.05, masking)):
        _, handed = one_rank_step(pipeline, g)
        buf = handed.copy() if buf is None else m * buf + handed
        weights -= lr * buf
        reference -= lr * update
    np.testing.assert_allclose(weights, reference, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("momentum", [0.0, 0.9])
@pytest.mark.parametrize("value", ["raw", {"id": "qsgd", "bits": 4}])
def test_error_feedback_loses_nothing_over_many_steps(momentum, value, rng):
    """sum of delivered + residual = sum of gradients (of velocities with momentum correction),
    over 60 steps, with a lossy value codec and the critical-phase density changes."""
    pipeline = dr.Pipeline(ratio=0.02, index="entropy", value=value, momentum=momentum,
                           adaptive_density=True)
    shape, velocity = (50, 40), 0
    sent = fed = 0
    for step in range(60):
        g = rng.standard_normal(shape).astype(np.float32) * (1 + step % 7)
        velocity = momentum * velocity + g
        frame = pipeline.compress("w", g)
        delivered, _ = pipeline.decompress(frame, shape, "float32", ranks=1, name="w")
        sent, fed = sent + delivered, fed + velocity
    np.testing.assert_allclose(sent + pipeline.memory.residual("w"), fed, rtol=1e-3, atol=1e-3)
    assert pipeline.stats.selections_boosted > 0


def test_dense_route_with_momentum_is_momentum_sgd(rng):
    """All of the velocity sent (Horovod's own allreduce): the optimizer's buffer is then the
    average velocity, i.e. plain momentum SGD."""
    pipeline = dr.Pipeline(momentum=0.9, min_size=0)
    buf = velocity = 0
    for _ in range(5):
        g = rng.standard_normal(100).astype(np.float32)
        sent = pipeline.compress_dense("w", g)
        handed = pipeline.momentum.for_optimizer("w", sent)
        buf, velocity = 0.9 * buf + handed, 0.9 * velocity + g
        np.testing.assert_allclose(buf, velocity, rtol=1e-5, atol=1e-6)


def test_nonfinite_gradient_restarts_the_velocity():
    pipeline = dr.Pipeline(ratio=0.5, index="raw", value="raw", min_size=0, momentum=0.5)
    one_rank_step(pipeline, np.ones(4, np.float32))
    _, handed = one_rank_step(pipeline, np.array([np.nan, 1, 1, 1], np.float32))
    assert np.isnan(handed).all()
    delivered, handed = one_rank_step(pipeline, np.ones(4, np.float32))
    np.testing.assert_array_equal(handed, delivered)  # a fresh start: nothing stale, no NaN


def test_momentum_options_are_checked():
    with pytest.raises(dr.DeepReduceError, match="momentum must be"):
        dr.Pipeline(momentum=1.0)
    with pytest.raises(dr.DeepReduceError, match="memory='residual'"):
        dr.Pipeline(momentum=0.9, memory=None)
    with pytest.raises(dr.DeepReduceError, match="adaptive_density"):
        dr.Pipeline(adaptive_density="yes")


def test_a_tensor_whose_gradient_settles_leaves_its_critical_phase():
    watch = density.Density(0.01, adaptive=True)
    assert watch.ratio("w", 0) == 0.04  # a new tensor is critical
    for step in range(2 * density.INTERVAL):  # a constant gradient: the norm does not change
        watch.observe("w", np.ones(10))
    assert not watch.critical("w") and watch.ratio("w", 10) == 0.01
    for scale in (1, 1, 1, 1, 5):  # the gradient jumps: critical again
        watch.observe("w", scale * np.ones(10))
    assert watch.critical("w")
    assert not density.Density(0.01).critical("w")  # off unless asked for


def test_a_warm_up_and_a_critical_phase_select_the_larger_count_not_the_product():
    boosted = density.BOOST * 0.01
    watch = density.Density(0.01, warmup_steps=10, adaptive=True)
    assert watch.critical("w") and watch.ratio("w", 0) == density.WARMUP_START
    assert watch.ratio("w", 9) == pytest.approx(boosted)  # the warm-up asks for less by now
    assert watch.ratio("w", 10) == pytest.approx(boosted)  # and is over
    assert density.Density(0.01, warmup_steps=10).ratio("w", 9) < boosted


def test_density_and_momentum_state_round_trip(rng):
    config = dict(ratio=0.05, index="raw", value="raw", min_size=0, momentum=0.9,
                  adaptive_density=True)
    a, b = dr.Pipeline(**config), dr.Pipeline(**config)
    for _ in range(7):
        one_rank_step(a, rng.standard_normal(200).astype(np.float32))
    b.load_state_dict(a.state_dict())
    for _ in range(4):
        g = rng.standard_normal(200).astype(np.float32)
        np.testing.assert_array_equal(one_rank_step(a, g)[1], one_rank_step(b, g)[1])


def sparse_deliveries(rng, steps=8, size=5000):
    """(delivered average, flat positions with repeats) of a few steps, every third one dense."""
    for step in range(steps):
        if step % 3 == 2:
            yield rng.standard_normal(size).astype(np.float32), None
            continue
        positions = rng.integers(0, size, 400)
        delivered = np.zeros(size, np.float32)
        delivered[positions] = rng.standard_normal(400).astype(np.float32)
        yield delivered, np.concatenate([positions, positions[:50]])


def test_momentum_correction_on_arrived_positions_is_the_dense_formula_bit_for_bit(rng):
    """A sparse route names where the delivered average arrived: the correction then touches
    those positions and the last step's, in place, and hands the optimizer the same bits as
    D_t - m*D_{t-1} over the whole tensor; dense steps between sparse ones too."""
    sparse, dense = MomentumCorrection(0.9), MomentumCorrection(0.9)
    previous = None
    for delivered, positions in sparse_deliveries(rng):
        sparse.velocity("w", delivered)  # a step starts (its arrivals are cleared)
        if positions is not None:
            sparse.arrived("w", positions)
        expected = delivered if previous is None else delivered - np.float32(0.9) * previous
        buffer = delivered.copy()
        handed = sparse.for_optimizer("w", buffer, out=buffer)
        assert handed is buffer
        np.testing.assert_array_equal(handed, expected)
        np.testing.assert_array_equal(dense.for_optimizer("w", delivered), expected)
        previous = delivered
    np.testing.assert_array_equal(sparse.state_dict()["delivered"]["w"], previous)


def test_the_critical_phase_detector_reads_arrived_positions_as_the_dense_sum(rng):
    sparse, dense = density.Density(0.01, adaptive=True), density.Density(0.01, adaptive=True)
    for step, (delivered, positions) in enumerate(sparse_deliveries(rng, steps=23)):
        scaled = delivered * (1 + step // 5)
        sparse.observe("w", scaled, positions)
        dense.observe("w", scaled)
        assert sparse.decisions() == dense.decisions()
        a, b = sparse.state_dict()["w"], dense.state_dict()["w"]
        assert a["norm"] == b["norm"]
        np.testing.assert_array_equal(a["sum"], b["sum"])


def test_local_clipping_matches_a_hand_computed_case():
    """DGC's local gradient clipping: a gradient longer than local_clip_norm enters the
    velocity (and so the residual) scaled to that norm; a shorter one unchanged. Hand case:
    g1 = (3, 4) (norm 5) clipped to 1 -> (0.6, 0.8); u1 = g1'; g2 = (0.3, 0) stays; u2 =
    0.5 * u1 + g2 = (0.6, 0.4); top-1 sends 0.6 at 0 at both steps."""
    pipeline = dr.Pipeline(ratio=0.5, index="raw", value="raw", min_size=0, momentum=0.5,
                           local_clip_norm=1.0)
    delivered, _ = one_rank_step(pipeline, np.array([3.0, 4.0], np.float32))
    np.testing.assert_allclose(delivered, [0.0, 0.8], rtol=1e-6)
    np.testing.assert_allclose(pipeline.memory.residual("w"), [0.6, 0.0], rtol=1e-6)
    delivered, _ = one_rank_step(pipeline, np.array([0.3, 0.0], np.float32))
    # velocity (0.3 + 0.3, 0.4); compensated with the residual: (1.2, 0.4)
    np.testing.assert_allclose(delivered, [1.2, 0.0], rtol=1e-6)
    np.testing.assert_allclose(pipeline.memory.residual("w"), [0.0, 0.4], rtol=1e-6)


@pytest.mark.parametrize("route", ["sparse", "dense"])
def test_local_clipping_is_the_same_on_both_routes_and_loses_nothing_it_let_in(route, rng):
    """What error feedback takes in is the clipped gradient, on the sparse and the dense
    route alike: sum of delivered + residual = sum of clipped gradients; NaN still passes."""
    pipeline = dr.Pipeline(ratio=0.05, index="golomb", value="raw", min_size=0,
                           local_clip_norm=2.0)
    sent = fed = 0
    for step in range(20):
        g = rng.standard_normal(400).astype(np.float32) * (0.01 if step % 3 else 1.0)
        if route == "sparse":
            frame = pipeline.compress("w", g)
            delivered, _ = pipeline.decompress(frame, g.shape, "float32", ranks=1, name="w")
        else:
            delivered = pipeline.compress_dense("w", g)
        norm = np.linalg.norm(g)
        sent, fed = sent + delivered, fed + g * min(1.0, 2.0 / norm)
        assert np.linalg.norm(delivered) <= 2.0 * (step + 1) + 1e-4
    np.testing.assert_allclose(sent + pipeline.memory.residual("w"), fed, rtol=1e-5, atol=1e-5)
    g = np.full(400, np.nan, np.float32)
    delivered = pipeline.compress_dense("w", g) if route == "dense" else pipeline.decompress(
        pipeline.compress("w", g), g.shape, "float32", ranks=1, name="w")[0]
    assert np.isnan(delivered).all()


@pytest.mark.parametrize("bad", [0, -1.0, float("inf"), float("nan"), True, "1"])
def test_local_clip_norm_is_checked(bad):
    with pytest.raises(dr.DeepReduceError, match="local_clip_norm"):
        dr.Pipeline(local_clip_norm=bad)


def test_the_energy_share_keeps_more_where_the_count_carries_too_little(rng):
    """A flat gradient: 2% of its elements carry far less than 70% of its energy, so top-k
    keeps up to 4x the count, the largest first; a spiky one, whose 2% carry it, keeps the
    count. Either way the kept elements are the largest, and what is sent is what is taken
    out of the residual."""
    flat = rng.standard_normal(10_000).astype(np.float32)
    spiky = flat * 1e-3
    spiky[rng.choice(flat.size, 100, replace=False)] = 50.0
    for gradient, expected in ((flat, 800), (spiky, 200)):
        pipeline = dr.Pipeline(ratio=0.02, index="entropy", value="raw", energy=0.7)
        frame = pipeline.compress("w", gradient)
        delivered, _ = pipeline.decompress(frame, gradient.shape, "float32", ranks=1)
        kept = np.flatnonzero(delivered)
        assert kept.size == expected
        assert np.abs(gradient[kept]).min() >= np.sort(np.abs(gradient))[-kept.size]
        np.testing.assert_array_equal(delivered + pipeline.memory.residual("w"), gradient)
    between = flat.copy()
    between[:100] = 13.0  # the 200 largest carry some of the energy; enough of the next reach 70%
    pipeline = dr.Pipeline(ratio=0.02, index="entropy", value="raw", energy=0.7)
    delivered, _ = pipeline.decompress(pipeline.compress("w", between), between.shape,
                                       "float32", ranks=1)
    largest = np.sort(between.astype(np.float64) ** 2)[::-1]
    share = np.cumsum(largest) / largest.sum()
    assert 200 < np.count_nonzero(delivered) == int(np.searchsorted(share, 0.7)) + 1 < 800


@pytest.mark.parametrize("bad", [0, -0.1, 1.5, float("nan"), True, "0.7"])
def test_the_energy_share_is_checked(bad):
    with pytest.raises(dr.DeepReduceError, match="energy"):
        dr.Pipeline(energy=bad)
    with pytest.raises(dr.DeepReduceError, match="energy"):
        dr.Pipeline(sparsifier="randomk", energy=0.7)
