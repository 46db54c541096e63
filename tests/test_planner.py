"""The time-aware planner's choices from given link models and CPU costs, and the calibration
that measures them (CPU costs here, link costs through a stand-in link)."""
import numpy as np
import pytest

import deepreduce_hvd as dr
from deepreduce_hvd.comm.planner import (ALLGATHER, ALLREDUCE, ALLREDUCE_FP16,
                                         SPARSE_ALLREDUCE, SPARSE_ALLREDUCE_MIN_RANKS, Costs,
                                         LinkModel, Measured, Plan, TimePlanner)
from deepreduce_hvd.wire.frames import PAYLOAD, Frame

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


def test_the_plans_dense_tensors_take_the_kind_whole_steps_chose():
    """Calibrated alone fp16 leads; once the step guard's dense arms find fp32 faster, the
    tensors the plan sent by fp16 go by fp32 (and back); a kind that changes nothing, or fp16
    where values must stay exact, is refused."""
    chooser = planner()
    assert chooser.plan("small", 2000, True).kind == ALLREDUCE_FP16
    assert chooser.use_dense(ALLREDUCE) is True
    assert chooser.plan("small", 2000, True).kind == ALLREDUCE
    assert chooser.use_dense(ALLREDUCE) is False
    assert chooser.use_dense(ALLREDUCE_FP16) is True
    assert chooser.plan("small", 2000, True).kind == ALLREDUCE_FP16
    exact = planner(allow_fp16=False)
    exact.plan("small", 2000, True)
    assert exact.use_dense(ALLREDUCE_FP16) is False and exact.dense == ALLREDUCE
    sparse_only = planner()
    assert sparse_only.plan("large", 4_000_000, True).kind == ALLGATHER
    assert sparse_only.use_dense(ALLREDUCE) is False  # no tensor of the plan went dense


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


TWO = [("golomb", "fp16"), ("entropy", "entropy")]


def two_candidates(ranks=2):
    costs = priors()
    costs["entropy+entropy"] = costs["golomb+fp16"]._replace(bits_per_selected=12.0)
    return TimePlanner(dr.Pipeline(ratio=0.01), {"allreduce": GBIT, "allgather": GBIT}, ranks,
                       costs, TWO, warm_steps=2, explore_steps=2, revisit=5)


def frames_of(encode_s, nbytes, decode_s, ranks=2):
    return Measured.of([Frame(r, PAYLOAD, memoryview(bytes(nbytes)), encode_s, decode_s)
                        for r in range(ranks)])


def test_exploration_tries_each_candidate_then_settles_and_revisits_the_runner_up():
    """Warm steps on the prior's choice, each candidate for explore_steps steps, then the
    cheapest measured one, with the runner-up measured again every `revisit` steps."""
    planner, size, labels = two_candidates(), 4_000_000, []
    cost = {"golomb+fp16": (0.004, 9000), "entropy+entropy": (0.002, 6000)}
    for step in range(20):
        plan = planner.plan("w", size, True)
        labels.append(plan.label)
        encode_s, nbytes = cost[plan.label]
        planner.observe("w", plan, frames_of(encode_s, nbytes, 0.001))
    prior_choice = labels[0]
    assert labels[:2] == [prior_choice] * 2
    assert labels[2:6] == ["golomb+fp16"] * 2 + ["entropy+entropy"] * 2  # in candidate order
    settled = labels[6:]
    assert settled.count("golomb+fp16") == 2 and settled.count("entropy+entropy") == 12
    assert [i for i, label in enumerate(settled) if label == "golomb+fp16"] == [4, 9]
    measured = planner.report()["w"]["measured"]
    assert measured["entropy+entropy"]["encode"] == 0.002 and measured["golomb+fp16"]["bytes"] == 9000


def test_a_candidate_measured_far_slower_than_the_best_is_dropped_after_one_step():
    """Exploration costs steps on slow codecs: one measured more than EXPLORE_MARGIN times
    slower than the best measured so far is not tried for the rest of its turn."""
    for slow_s, expected in ((0.5, 1), (0.006, 2)):  # far slower / within the margin
        planner, labels = two_candidates(), []
        golomb = planner.priors["golomb+fp16"]  # the prior's choice: golomb+fp16
        planner.priors["entropy+entropy"] = golomb._replace(
            bits_per_selected=golomb.bits_per_selected + 8)
        cost = {"golomb+fp16": (0.004, 9000), "entropy+entropy": (slow_s, 6000)}
        for _ in range(12):
            plan = planner.plan("w", 4_000_000, True)
            labels.append(plan.label)
            planner.observe("w", plan, frames_of(*cost[plan.label], 0.001))
        assert labels[:4] == ["golomb+fp16"] * 4
        assert labels[4:4 + expected] == ["entropy+entropy"] * expected
        assert labels[4 + expected:8] == ["golomb+fp16"] * (4 - expected)  # settled


def test_observe_keeps_the_least_of_recent_costs_and_decode_of_the_previous_step():
    """Stalls only add time: a cost is the least of the window; a frame's decode time is the
    sender's decode of the previous step, credited to the option used then."""
    planner = two_candidates()
    plan = planner.plan("w", 4_000_000, True)
    planner.observe("w", plan, frames_of(0.010, 5000, 0.0))
    planner.observe("w", plan, frames_of(0.003, 5000, 0.007))
    planner.observe("w", plan, frames_of(0.050, 5000, 0.004))
    seen = planner.report()["w"]["measured"][plan.label]
    assert seen["encode"] == 0.003 and seen["decode"] == 0.004 and seen["bytes"] == 5000


def test_observe_uses_the_slowest_rank_and_dense_steps_leave_no_measurement():
    planner = two_candidates()
    plan = planner.plan("w", 4_000_000, True)
    planner.observe("w", plan, Measured.of([Frame(0, PAYLOAD, memoryview(bytes(10)), 0.001, 0.0),
                                            Frame(1, PAYLOAD, memoryview(bytes(30)), 0.009, 0.0)]))
    seen = planner.report()["w"]["measured"][plan.label]
    assert seen["encode"] == 0.009 and seen["bytes"] == 20
    planner.observe("w", Plan(ALLREDUCE_FP16, label=ALLREDUCE_FP16), None)
    assert set(planner.report()["w"]["measured"]) == {plan.label}


def test_planner_state_round_trips():
    first, second = two_candidates(), two_candidates()
    for _ in range(9):
        plan = first.plan("w", 4_000_000, True)
        first.observe("w", plan, frames_of(0.002 if "entropy" in plan.label else 0.004, 7000, 0.001))
    second.load_state_dict(first.state_dict())
    for _ in range(12):
        one, other = first.plan("w", 4_000_000, True), second.plan("w", 4_000_000, True)
        assert one.label == other.label
        for p in (first, second):
            p.observe("w", one, frames_of(0.002, 7000, 0.001))


def test_a_tensor_sent_dense_at_a_high_density_goes_sparse_when_its_density_drops():
    """The warm-up (and critical phases) start dense enough that the dense allreduce wins; the
    ranking follows the selection count down instead of sticking to the first choice."""
    pipeline = dr.Pipeline(ratio=0.01, warmup_steps=10)
    plans = TimePlanner(pipeline, {"allreduce": GBIT, "allgather": GBIT}, 4, priors(), CANDIDATES)
    first = plans.plan("w", 4_000_000, True)
    pipeline.set_steps({"w": 10})  # the warm-up is over: 1% again
    assert first.kind == ALLREDUCE_FP16 and plans.plan("w", 4_000_000, True).kind == ALLGATHER


def test_costs_measured_at_another_density_give_way_to_the_priors():
    """Payloads measured during the warm-up at 25% say nothing of 1%: once the selection
    count has moved past DRIFT, the tensor is predicted from the priors again."""
    pipeline = dr.Pipeline(ratio=0.01, warmup_steps=10)
    plans = TimePlanner(pipeline, {"allreduce": GBIT, "allgather": GBIT}, 2, priors(), CANDIDATES)
    sparse = Plan(ALLGATHER, label="golomb+fp16")
    plans.plan("w", 4_000_000, True)
    plans.observe("w", sparse, frames_of(0.5, 3_000_000, 0.5))  # a slow 25% payload
    pipeline.set_steps({"w": 1})
    assert plans.plan("w", 4_000_000, True).kind == ALLREDUCE_FP16  # still about 25%: believed
    pipeline.set_steps({"w": 10})
    assert plans.plan("w", 4_000_000, True).kind == ALLGATHER
    assert plans.report()["w"]["measured"] == {}


def test_cpu_costs_are_calibrated_at_the_base_ratio():
    """Per-selected costs come from payloads of the base ratio, whatever the warm-up or a
    critical phase would select at a tensor's first step (else they would be 100x too high)."""
    from deepreduce_hvd.comm.calibration import calibrate_cpu
    plain = calibrate_cpu(dr.Pipeline(ratio=0.01), CANDIDATES, repeats=1)
    eager = calibrate_cpu(dr.Pipeline(ratio=0.01, warmup_steps=50, adaptive_density=True),
                          CANDIDATES, repeats=1)
    assert eager["golomb+fp16"].bits_per_selected == plain["golomb+fp16"].bits_per_selected


def test_candidates_are_explored_once_the_density_warm_up_is_over():
    """Costs measured while the warm-up's count moves every step are dropped as it drifts,
    and a slow candidate tried at 25% costs seconds: exploration waits for the warm-up."""
    pipeline = dr.Pipeline(ratio=0.01, warmup_steps=8)
    planner = TimePlanner(pipeline, {"allreduce": GBIT, "allgather": GBIT}, 2,
                          two_candidates().priors, TWO, warm_steps=2, explore_steps=2)
    for step in range(12):
        plan = planner.plan("w", 4_000_000, True)
        if plan.kind == ALLGATHER:
            planner.observe("w", plan, frames_of(0.004, 9000, 0.001))
        pipeline.set_steps({"w": step + 1})
    assert planner.state_dict()["w"]["explore_start"] == 8


def test_encoding_is_priced_by_the_count_selected():
    """A warm-up or a critical phase selects several times the ratio: the calibrated prior
    charges encoding per selected element (measured at 4x the ratio), not only per element
    of the tensor, so a 4x count is predicted to cost more to encode."""
    from deepreduce_hvd.comm.calibration import calibrate_cpu
    costs = calibrate_cpu(dr.Pipeline(ratio=0.01), [("golomb", "fp16")], repeats=1)
    prior = costs["golomb+fp16"]
    assert prior.encode_per_selected > 0
    planner = TimePlanner(dr.Pipeline(ratio=0.01), {"allreduce": GBIT, "allgather": GBIT}, 2,
                          {**priors(), **costs}, [("golomb", "fp16")])
    known = {"golomb+fp16": {"bytes": [1000.0], "decode": [0.001]}}  # the encode from the prior
    more = planner._predict("golomb+fp16", 4_000_000, 160_000, known)
    less = planner._predict("golomb+fp16", 4_000_000, 40_000, known)
    assert more - less == pytest.approx(120_000 * prior.encode_per_selected)


def test_a_dense_lead_within_the_margin_is_challenged_and_a_faster_sparse_wins():
    """A noisy calibration that ranks the dense allreduce first must not keep the tensor
    dense for the whole job: candidates predicted within EXPLORE_MARGIN are measured, and a
    measured cheaper one takes over; one predicted far slower is never tried."""
    from deepreduce_hvd.comm.planner import EXPLORE_MARGIN
    size = 400_000
    for slowdown, expect_sparse in ((0.8 * EXPLORE_MARGIN, True), (1.5 * EXPLORE_MARGIN, False)):
        plans = two_candidates()
        k = plans.pipeline.selection_count(size, "w")
        dense_s = plans._predict(plans.dense, size, k, {})
        extra = slowdown * dense_s - plans._predict("golomb+fp16", size, k, {})
        for label in plans.candidates:  # the sparse priors about `slowdown` x dense
            plans.priors[label] = plans.priors[label]._replace(
                encode_fixed=plans.priors[label].encode_fixed + extra)
        labels = []
        for _ in range(30):
            plan = plans.plan("w", size, True)
            labels.append(plan.label)
            if plan.kind == ALLGATHER:  # measured: far cheaper than the priors said
                plans.observe("w", plan, frames_of(1e-5, 200, 1e-5))
        assert labels[0] == plans.dense
        assert (labels[-1] != plans.dense) == expect_sparse, labels


def threshold_planner():
    return TimePlanner(dr.Pipeline(sparsifier="threshold"), {"allreduce": GBIT, "allgather": GBIT},
                       2, two_candidates().priors, TWO, warm_steps=2, explore_steps=2, revisit=5)


def labels_over(plans, steps, size, cost):
    """The options chosen over `steps` steps, each sparse one measured at cost[label]."""
    labels = []
    for _ in range(steps):
        plan = plans.plan("w", size, True)
        labels.append(plan.label)
        if plan.kind == ALLGATHER:
            plans.observe("w", plan, frames_of(*cost[plan.label], 0.002))
    return labels


def test_a_threshold_sparsifier_is_measured_before_its_whole_tensor_prior_keeps_it_dense():
    """The threshold sparsifier's count is known only once sent, so its prior prices every
    element: the candidates are still tried (for one step while one is predicted more than
    EXPLORE_MARGIN times the dense option), and a measured cheap one takes over; where the
    first one tried measures far slower than dense, the others are not tried at all."""
    from deepreduce_hvd.comm.planner import EXPLORE_MARGIN
    plans, size = threshold_planner(), 2_600_000
    assert plans.pipeline.selection_count(size, "w") == size
    for label in plans.candidates:
        assert plans._predict(label, size, size, {}) > EXPLORE_MARGIN * plans._predict(
            plans.dense, size, size, {})
    cost = {"golomb+fp16": (0.002, 300_000), "entropy+entropy": (0.5, 6_000_000)}
    labels = labels_over(plans, 12, size, cost)
    assert labels[:2] == [plans.dense] * 2
    # golomb priced at the count its bytes imply; entropy measured far slower: one step
    assert labels[2:5] == ["golomb+fp16"] * 2 + ["entropy+entropy"], labels
    assert labels[5:9] == ["golomb+fp16"] * 4, labels
    cost["golomb+fp16"] = (0.5, 6_000_000)  # a dense gradient: sent whole, slowly
    labels = labels_over(threshold_planner(), 40, size, cost)
    assert labels.count("golomb+fp16") == 1 and "entropy+entropy" not in labels, labels


@pytest.mark.parametrize("collective,ranks,sar,gather", [
    ("auto", 4, False, True), ("auto", 16, True, True), ("allgather", 64, False, True),
    ("sparse_allreduce", 2, True, False)])
def test_the_routes_each_collective_weighs(collective, ranks, sar, gather):
    planner = TimePlanner(dr.Pipeline(ratio=0.01), {"allreduce": GBIT, "allgather": GBIT}, ranks,
                          priors(), CANDIDATES, collective=collective)
    kinds = set(planner.kind_of.values())
    assert (SPARSE_ALLREDUCE in kinds, ALLGATHER in kinds) == (sar, gather)
    if not gather:
        assert planner.plan("w", 4_000_000, True).kind == SPARSE_ALLREDUCE


def test_at_many_ranks_the_sparse_allreduce_is_predicted_faster_than_the_allgather():
    """Its bytes and decoding stay near k while the allgather's grow with P: at 2 ranks the
    allgather leads (one round, the same bytes), at SPARSE_ALLREDUCE_MIN_RANKS the sparse
    allreduce."""
    def predicted(collective, label, ranks):
        planner = TimePlanner(dr.Pipeline(ratio=0.01), {"allreduce": GBIT, "allgather": GBIT},
                              ranks, priors(), CANDIDATES, collective=collective)
        return planner._predict(label, 4_000_000, planner.pipeline.selection_count(4_000_000), {})
    for ranks, sar_leads in ((2, False), (SPARSE_ALLREDUCE_MIN_RANKS, True)):
        gather = predicted("allgather", "golomb+fp16", ranks)
        sar = predicted("sparse_allreduce", "sar:golomb+fp16", ranks)
        assert (sar < gather) == sar_leads, (ranks, sar, gather)


def test_the_threshold_sparsifier_weighs_exact_values():
    """At threshold 0 a lossy codec's rounding, kept by error feedback, is sent again at the
    next step: exact values keep a row-sparse gradient at its own rows."""
    from deepreduce_hvd.comm.planner import candidates
    assert [v for _, v in candidates("auto", "auto", 0.05, "threshold")][:2] == ["raw", "fp16"]
    assert "raw" not in [v for _, v in candidates("auto", "auto", 0.05, "topk")]
    rng = np.random.default_rng(0)
    supports = {}
    for value in ("raw", "fp16"):
        pipeline, sizes = dr.Pipeline(sparsifier="threshold", index="golomb", value=value), []
        for step in range(6):
            grad = np.zeros((200, 64), np.float32)
            grad[rng.choice(200, 10, replace=False)] = rng.standard_normal((10, 64)) / 3
            frame = pipeline.compress("emb", grad)
            sizes.append(np.count_nonzero(pipeline.decompress(frame, grad.shape, "float32", 1)[0]))
        supports[value] = sizes
    assert all(n <= 10 * 64 for n in supports["raw"])
    assert supports["fp16"][-1] > 2 * 10 * 64


class NegotiatingLink:
    """A link whose collectives take latency + bytes / bandwidth, and a first use of a name
    15 ms more (Horovod's negotiation; repeats are served from its response cache)."""

    def __init__(self, latency=1e-3, bandwidth=1e9 / 8):
        self.latency, self.bandwidth, self.names, self.calls = latency, bandwidth, set(), 0

    def _time(self, nbytes, name):
        self.calls += 1
        first = name not in self.names
        self.names.add(name)
        return self.latency + nbytes / self.bandwidth + (0.015 if first else 0.0)

    def set_size(self, process_set):
        return 2

    def time_allreduce(self, elements, half, process_set, name):
        return self._time((2 if half else 4) * elements, name)

    def time_allgather(self, elements, process_set, name):
        return self._time(4 * elements, name)

    def allgather_numbers(self, values, process_set, name):
        return np.array([values, values], dtype=np.float64)


def test_link_latency_is_what_a_repeated_name_pays():
    """A step repeats its tensors' names; the calibration times repeats of one name, so the
    latency it fits leaves out the first use's negotiation (15 ms here, 1 ms per collective
    after it), which would make every small sparse tensor look 15 ms dearer."""
    from deepreduce_hvd.comm.calibration import measure_links
    link = NegotiatingLink()
    links = measure_links(link, None)
    for kind in ("allreduce", "allreduce_fp16", "allgather"):
        assert links[kind].latency == pytest.approx(1e-3, rel=0.2)
        assert links[kind].bandwidth == pytest.approx(1e9 / 8, rel=0.2)
    assert link.calls <= 3 * 3 * 6  # three kinds, a few sizes each, three tries a size
