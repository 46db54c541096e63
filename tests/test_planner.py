"""The time-aware planner's choices, from given link models and CPU costs (no calibration)."""
import pytest

import deepreduce_hvd as dr
from deepreduce_hvd.comm.planner import (ALLGATHER, ALLREDUCE, ALLREDUCE_FP16, Costs, LinkModel,
                                    TimePlanner)

CANDIDATES = [("golomb", "fp16")]
GBIT = LinkModel(latency=1e-4, bandwidth=1e9 / 8)


def priors(decode_per_selected=2e-8):
    dense = Costs(1e-5, 1e-10, 0.0, 0.0, 0.0, 0.0, 32.0)
    half = Costs(1e-5, 2e-10, 0.0, 0.0, 0.0, 0.0, 16.0)
    sparse = Costs(1e-4, 1e-9, 0.0, 1e-4, 0.0, decode_per_selected, 24.0)
    return {ALLREDUCE: dense, ALLREDUCE_FP16: half, "golomb+fp16": sparse}


def planner(ranks=2, links=None, allow_fp16=True, **prior_args):
    links = links or {"allreduce": GBIT, "allgather": GBIT}
    return TimePlanner(dr.Pipeline(ratio=0.01), links, ranks, priors(**prior_args), CANDIDATES,
                       allow_fp16=allow_fp16)


def test_dense_tensors_travel_as_fp16_when_that_is_faster():
    assert planner().dense == ALLREDUCE_FP16
    assert planner(allow_fp16=False).dense == ALLREDUCE


def test_fp16_that_is_slow_to_reduce_gives_way_to_fp32():
    """Horovod sums halves on the CPU; where its measured fp16 allreduce is slower than fp32,
    dense tensors go as fp32."""
    slow_half = LinkModel(latency=1e-4, bandwidth=1e9 / 8 / 4)
    links = {"allreduce": GBIT, "allgather": GBIT, "allreduce_fp16": slow_half}
    assert planner(links=links).dense == ALLREDUCE


@pytest.mark.parametrize("size, kind", [(2000, ALLREDUCE_FP16), (4_000_000, ALLGATHER)])
def test_small_tensors_allreduce_and_large_ones_allgather_at_1gbit(size, kind):
    assert planner().plan("w", size, True).kind == kind


def test_many_ranks_make_the_allgather_lose():
    """Each receiver decodes P payloads and the allgather moves P-1 of them: past some P the
    ring allreduce of the dense tensor wins."""
    size = 4_000_000
    assert planner(ranks=2).plan("w", size, True).kind == ALLGATHER
    assert planner(ranks=512).plan("w", size, True).kind == ALLREDUCE_FP16


def test_same_inputs_same_choices():
    first, second = planner(), planner()
    for step in range(40):
        for name, size in (("a", 4_000_000), ("b", 50_000), ("c", 900)):
            one, other = first.plan(name, size, True), second.plan(name, size, True)
            assert (one.kind, one.label) == (other.kind, other.label)
