"""The low-rank route (compression/lowrank.py) on simulated ranks: the arithmetic, error
feedback, non-finite gradients, state, and where the planner sends a matrix."""
import numpy as np
import pytest

import deepreduce_hvd as dr
from deepreduce_hvd.comm.planner import (ALLREDUCE, ALLREDUCE_FP16, LOWRANK, Costs, LinkModel, Measured, Plan,
                                         TimePlanner)
from deepreduce_hvd.compression.lowrank import matrix_shape, worth_factoring


def step(pipelines, name, grads):
    """One step of the route over simulated ranks (the two allreduces are sums) -> (every
    rank's delivered average, what left each rank's residual: compensated minus kept)."""
    size = len(pipelines)
    p_sum = sum(p.project(name, g) for p, g in zip(pipelines, grads))
    compensated = [p.memory.residual(name).reshape(-1).copy() for p in pipelines]
    q_sum = sum(p.settle(name, p_sum, size)[0] for p in pipelines)
    kept = [p.memory.residual(name) for p in pipelines]  # None: reset (a non-finite step)
    sent = [c - (0.0 if k is None else k.reshape(-1)) for c, k in zip(compensated, kept)]
    delivered = [p.reconstruct(name, q_sum, grads[0].shape, 1.0 / size) for p in pipelines]
    return delivered, sent


def test_a_rank_one_sum_arrives_exactly_and_leaves_nothing_behind(rng):
    """Every rank's gradient a multiple of one outer product u v^T: the rank-1 factors carry
    the average exactly, and every residual is zero (wrong transposes or a wrong basis fail)."""
    u, v = rng.standard_normal(40).astype(np.float32), rng.standard_normal(30).astype(np.float32)
    grads = [np.float32(a) * np.outer(u, v) for a in (1.0, -2.5, 4.0)]
    pipelines = [dr.Pipeline(lowrank=1) for _ in grads]
    delivered, _ = step(pipelines, "w", grads)
    want = np.mean(grads, axis=0).reshape(-1)
    for got in delivered:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    for p in pipelines:
        np.testing.assert_allclose(p.memory.residual("w"), 0.0, atol=1e-5)


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_nothing_is_lost_over_many_steps(momentum, rng):
    """Full-rank gradients, rank 2, 4 ranks, 30 steps: what leaves the residuals of all
    ranks at a step is what every rank receives (size times the average), and each rank's
    sent plus residual is the sum of what entered it (gradients, or velocities)."""
    ranks, shape = 4, (32, 24)
    pipelines = [dr.Pipeline(lowrank=2, momentum=momentum) for _ in range(ranks)]
    entered = [np.zeros(np.prod(shape), np.float64) for _ in range(ranks)]
    sent_total = [np.zeros(np.prod(shape), np.float64) for _ in range(ranks)]
    velocity = [np.zeros(np.prod(shape), np.float32) for _ in range(ranks)]
    for _ in range(30):
        grads = [rng.standard_normal(shape).astype(np.float32) for _ in range(ranks)]
        delivered, sent = step(pipelines, "w", grads)
        for r in range(ranks):
            velocity[r] = momentum * velocity[r] + grads[r].reshape(-1)
            entered[r] += velocity[r]
            sent_total[r] += sent[r]
            np.testing.assert_array_equal(delivered[r], delivered[0])  # the same bits
        np.testing.assert_allclose(ranks * delivered[0], np.sum(sent, axis=0), rtol=1e-4, atol=1e-4)
    for r, p in enumerate(pipelines):
        np.testing.assert_allclose(sent_total[r] + p.memory.residual("w").reshape(-1), entered[r],
                                   rtol=1e-4, atol=1e-3)


def test_a_nonfinite_gradient_delivers_nan_everywhere_then_starts_afresh(rng):
    pipelines = [dr.Pipeline(lowrank=2) for _ in range(2)]
    grads = [rng.standard_normal((20, 20)).astype(np.float32) for _ in range(2)]
    step(pipelines, "w", grads)
    grads[1][3, 4] = np.inf
    delivered, _ = step(pipelines, "w", grads)
    assert all(np.isnan(d).all() for d in delivered)
    assert all(p.memory.residual("w") is None for p in pipelines)
    grads[1][3, 4] = 0.0
    delivered, _ = step(pipelines, "w", grads)
    assert all(np.isfinite(d).all() for d in delivered)


def test_state_round_trips_bit_for_bit(rng):
    """A pipeline restored from another's state_dict mid-run continues with the same bits
    (the warm-start factor is part of the state)."""
    grads = [rng.standard_normal((16, 12)).astype(np.float32) for _ in range(6)]
    original = [dr.Pipeline(lowrank=2)]
    for g in grads[:3]:
        step(original, "w", [g])
    restored = [dr.Pipeline(lowrank=2)]
    restored[0].load_state_dict(original[0].state_dict())
    for g in grads[3:]:
        a, _ = step(original, "w", [g])
        b, _ = step(restored, "w", [g])
        np.testing.assert_array_equal(a[0], b[0])


def test_which_tensors_may_be_factored():
    assert matrix_shape((64, 3, 3, 3)) == (64, 27) and matrix_shape((5,)) is None
    assert worth_factoring((2048, 2048), 4) and worth_factoring((2048, 64), 4)
    assert not worth_factoring((10, 2048), 4)  # the factors would save less than 8x
    assert not worth_factoring((2048,), 4) and not worth_factoring((2048, 2048), 0)
    for bad in (-1, 1.5, True, "4", 4096):
        with pytest.raises(dr.DeepReduceError, match="lowrank"):
            dr.Pipeline(lowrank=bad)


def planner(bandwidth):
    """A time-aware planner at a stated bandwidth (bytes/s), with made-up CPU costs."""
    pipeline = dr.Pipeline(lowrank=4)
    priors = {"golomb+fp16": Costs(1e-4, 1e-9, 1e-8, 1e-4, 0.0, 1e-8, 20.0),
              ALLREDUCE_FP16: Costs(0.0, 1e-9, 0.0, 0.0, 0.0, 0.0, 16.0),
              "allreduce": Costs(0.0, 1e-9, 0.0, 0.0, 0.0, 0.0, 32.0),
              LOWRANK: Costs(1e-4, 2e-9, 0.0, 1e-4, 1e-9, 0.0, 0.0)}
    link = LinkModel(1e-4, bandwidth)
    return TimePlanner(pipeline, {"allreduce": link, "allgather": link}, 2, priors,
                       [("golomb", "fp16")])


def test_a_factorable_matrix_goes_as_factors_or_dense_never_sparse():
    """Factors until their rounds are measured; then factors on a slow link, dense on a fast
    one; sparse options only for the tensors that are not factorable matrices."""
    slow, fast = planner(1e6), planner(1e11)
    measured = Measured(encode_s=0.01, nbytes=0.0, decode_s=0.005)
    for step_ in range(30):
        assert slow.plan("w", 2048 * 2048, True, shape=(2048, 2048)).kind == LOWRANK
        plan = fast.plan("w", 2048 * 2048, True, shape=(2048, 2048))
        assert plan.kind == (LOWRANK if step_ < 2 else ALLREDUCE_FP16), (step_, plan)
        if step_ >= 1:  # the first step's costs are not reported (first touches)
            fast.observe("w", plan, measured)
            slow.observe("w", Plan(LOWRANK, None, LOWRANK), measured)
        # a vector, or a matrix without a name to keep its factor by: the sparse options
        assert slow.plan("b", 2048, True, shape=(2048,)).kind == "allgather"
        assert slow.plan("u", 2048 * 2048, True).kind == "allgather"
    assert slow.sparse("w", 2048 * 2048, (2048, 2048)).kind == LOWRANK  # the guard's arm


def test_the_lean_arm_factors_the_largest_matrices_holding_half_the_factored_elements():
    """The plan factors four matrices; the lean arm factors the largest that hold half the
    elements the plan factors (1M + 0.5M of 2.2M; ties by name, alike on every rank), sends
    every other tensor by fp32 allreduce, and keeps that choice through a state round trip."""
    slow = planner(1e6)
    shapes = {"a": (1024, 1024), "b": (512, 1024), "c": (512, 1024), "d": (256, 512),
              "v": (1024,)}
    for name, shape in shapes.items():
        slow.plan(name, int(np.prod(shape)), True, shape=shape)
    assert [slow.lean(name, shapes[name]).kind for name in "abcdv"] == \
        [LOWRANK, LOWRANK, ALLREDUCE, ALLREDUCE, ALLREDUCE]
    assert slow.lean("b", None).kind == ALLREDUCE  # a tensor that may not be factored
    restored = planner(1e6)
    restored.load_state_dict(slow.state_dict())
    assert [restored.lean(name, shapes[name]).kind for name in "abcdv"] == \
        [LOWRANK, LOWRANK, ALLREDUCE, ALLREDUCE, ALLREDUCE]
