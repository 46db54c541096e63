"""The step guard's schedule and decisions from given step times (a stand-in clock); on real
Horovod ranks it runs in tests/workers/torch_checks.py (check_step_guard)."""
import numpy as np
import pytest

import deepreduce_hvd as dr
from deepreduce_hvd.adapters.base import TensorInfo
from deepreduce_hvd.comm.calibration import LinkModel
from deepreduce_hvd.comm.planner import ALLREDUCE, ALLREDUCE_FP16, ALLGATHER, Policy, TimePlanner
from deepreduce_hvd.comm.step_guard import LEAN, MARGIN, PLANNED, SPARSE, StepGuard
from test_planner import CANDIDATES, GBIT, priors

ARMS = (SPARSE, ALLREDUCE_FP16, ALLREDUCE)
LARGE = TensorInfo(size=4_000_000, is_float=True, sparse_layout=False, on_device=False,
                   shape=(4_000_000,), dtype="float32", itemsize=4)
SMALL = LARGE._replace(size=10, shape=(10,))


# a comparison of ARMS (2 timed steps a visit): every arm in turn, then in reverse
COMPARISON = [PLANNED] * 3 + [SPARSE] * 3 + [ALLREDUCE_FP16] * 3 + [ALLREDUCE] * 5 + \
    [ALLREDUCE_FP16] * 3 + [SPARSE] * 3 + [PLANNED] * 3


class Job:
    """Steps of a job with two routed tensors; a step's seconds depend on its arm (a list:
    its steps in turn), a switch of arm adds `switch` seconds to the first step of the new
    one, and the host slows by `drift` seconds every step."""

    def __init__(self, seconds, switch=0.0, sizes=(0, 0), drift=0.0):
        self.now, self.seconds, self.switch, self.last = 0.0, seconds, switch, PLANNED
        self.sizes, self.drift, self.steps = sizes, drift, 0

    def clock(self):
        return self.now

    def run(self, guard, steps):
        arms = []
        for _ in range(steps):
            kinds = {guard.kind(key, size) for key, size in zip(("pacer", "other"), self.sizes)}
            assert len(kinds) == 1, kinds  # every tensor of a step alike
            arm = kinds.pop() or PLANNED
            seconds = self.seconds[arm]
            if isinstance(seconds, list):
                seconds = seconds[sum(a == arm for a in arms) % len(seconds)]
            self.now += seconds + (self.switch if arm != self.last else 0.0) + \
                self.drift * self.steps
            arms.append(arm)
            self.last, self.steps = arm, self.steps + 1
        return arms


def guard_of(job, agree=np.asarray, start=5, period=10, floor=None, arms=ARMS, replan=None):
    return StepGuard(arms, start, agree, timed_steps=2, period=period, clock=job.clock,
                     floor=floor, replan=replan)


def test_each_arm_is_visited_twice_then_the_fastest_runs_until_the_next_comparison():
    """Before `start` the plan; then the plan, the sparse arm, fp16 and fp32, and back, 3
    steps a visit (the first not timed: a switch's slow step does not count; fp32's two
    visits are one of 5 steps); the least median time wins for `period` steps."""
    job = Job({PLANNED: 0.3, SPARSE: 0.28, ALLREDUCE_FP16: 0.2, ALLREDUCE: 0.25}, switch=1.0)
    guard = guard_of(job)
    arms = job.run(guard, 4 + 23 + 10 + 23)
    assert arms == [PLANNED] * 4 + COMPARISON + [ALLREDUCE_FP16] * 10 + COMPARISON
    assert guard.winner == ALLREDUCE_FP16
    assert guard.compared == pytest.approx({PLANNED: 0.3, SPARSE: 0.28, ALLREDUCE_FP16: 0.2,
                                            ALLREDUCE: 0.25})
    assert guard.report()["compared_ms"] == {PLANNED: 300.0, SPARSE: 280.0, ALLREDUCE_FP16: 200.0,
                                             ALLREDUCE: 250.0}


def test_the_sparse_arm_wins_where_the_plan_is_dense_and_sending_sparse_is_faster():
    job = Job({PLANNED: 0.5, SPARSE: 0.2, ALLREDUCE_FP16: 0.3, ALLREDUCE: 0.5})
    guard = guard_of(job)
    assert job.run(guard, 4 + 23 + 10)[-10:] == [SPARSE] * 10
    assert guard.winner == SPARSE


def test_the_plan_wins_only_by_a_margin_and_wins_back_the_job_when_it_becomes_faster():
    job = Job({PLANNED: 0.2, SPARSE: 0.3, ALLREDUCE_FP16: 0.3, ALLREDUCE: 0.25})
    guard = guard_of(job)
    job.run(guard, 4 + 23 + 1)
    assert guard.winner == PLANNED
    job.seconds[PLANNED] = (1 - MARGIN / 2) * 0.25  # faster, but within the margin
    job.run(guard, 10 + 23 + 1)
    assert guard.winner == ALLREDUCE
    job.seconds[PLANNED] = 0.1
    job.run(guard, 10 + 23 + 1)
    assert guard.winner == PLANNED


def test_an_arm_of_more_work_wins_only_by_the_margin_over_one_of_less():
    """fp16 timed 2% faster than fp32 (within a few steps' noise): fp32, Horovod's own, runs;
    the sparse arm 10% faster than fp32 wins, and the plan not 4% faster than it does not."""
    job = Job({PLANNED: 0.3, SPARSE: 0.4, ALLREDUCE_FP16: 0.98, ALLREDUCE: 1.0})
    guard = guard_of(job)
    job.run(guard, 4 + 23 + 1)
    assert guard.winner == PLANNED
    job.seconds.update({PLANNED: 1.1, SPARSE: 1.1})
    job.run(guard, 10 + 23 + 1)
    assert guard.winner == ALLREDUCE
    job.seconds.update({PLANNED: 0.88, SPARSE: 0.9})
    job.run(guard, 10 + 23 + 1)
    assert guard.winner == SPARSE


def test_an_arm_of_more_work_wins_by_its_median_step_not_by_one_lucky_or_unlucky_step():
    """fp16 with one timed step half of fp32's and three 2% slower: fp32 runs, and fp16's
    median, fastest and slowest steps are reported; fp16 with three timed steps 5-15% faster
    and one 30% slower wins."""
    job = Job({PLANNED: 1.2, SPARSE: 1.2, ALLREDUCE_FP16: [1.0, 0.5, 1.02, 1.0, 1.02, 1.02],
               ALLREDUCE: 1.0})
    guard = guard_of(job)
    job.run(guard, 4 + 23 + 1)
    assert guard.winner == ALLREDUCE
    report = guard.report()
    assert report["compared_ms"][ALLREDUCE_FP16] == pytest.approx(1020.0)
    assert report["fastest_ms"][ALLREDUCE_FP16] == pytest.approx(500.0)
    assert report["slowest_ms"][ALLREDUCE_FP16] == pytest.approx(1020.0)
    job.seconds[ALLREDUCE_FP16] = [1.0, 0.85, 0.95, 1.0, 0.9, 1.3]
    job.run(guard, 10 + 23 + 1)
    assert guard.winner == ALLREDUCE_FP16 and guard.compared[ALLREDUCE_FP16] == pytest.approx(0.925)


def test_drift_within_a_comparison_falls_alike_on_every_arm():
    """The host slows by 2% of a step every step: the plan, as fast as fp32 and timed first,
    does not win by the drift; a plan 6% faster does, though it runs first and last."""
    seconds = {PLANNED: 1.0, SPARSE: 1.2, ALLREDUCE_FP16: 1.2, ALLREDUCE: 1.0}
    job = Job(seconds, drift=0.02)
    guard = guard_of(job)
    job.run(guard, 4 + 23 + 1)
    assert guard.winner == ALLREDUCE
    assert guard.compared[PLANNED] == pytest.approx(guard.compared[ALLREDUCE])
    job = Job(dict(seconds, **{PLANNED: 0.94}), drift=0.02)
    guard = guard_of(job)
    job.run(guard, 4 + 23 + 1)
    assert guard.winner == PLANNED


def test_the_agreed_times_decide_not_this_ranks():
    """This rank measures fp16 faster; averaged with the other rank's times the plan is."""
    job = Job({PLANNED: 0.3, SPARSE: 0.5, ALLREDUCE_FP16: 0.2, ALLREDUCE: 0.4})
    other = np.array([0.1, 0.5, 0.6, 0.4] * 3)  # median steps, then fastest, then slowest
    guard = guard_of(job, agree=lambda seconds: (np.asarray(seconds) + other) / 2)
    job.run(guard, 4 + 23 + 1)
    assert guard.winner == PLANNED
    assert np.allclose([guard.compared[arm] for arm in (PLANNED,) + ARMS], [0.2, 0.5, 0.4, 0.4])


def test_a_dense_arm_whose_wire_alone_outlasts_the_plans_step_is_not_run():
    """Once the plan's first visit is timed, fp32, whose floor (for the elements a step
    routes) is above the plan's agreed step, is dropped from the comparison (fp16's two
    visits become one); fp16, whose floor is below, runs, and wins."""
    asked = []

    def floor(arm, elements):
        asked.append((arm, elements))
        return {ALLREDUCE_FP16: 0.1, ALLREDUCE: 0.35}.get(arm)
    job = Job({PLANNED: 0.3, SPARSE: 0.4, ALLREDUCE_FP16: 0.2, ALLREDUCE: 0.1}, sizes=(1000, 24))
    guard = guard_of(job, floor=floor)
    assert job.run(guard, 4 + 17 + 5) == [PLANNED] * 7 + [SPARSE] * 3 + [ALLREDUCE_FP16] * 5 + \
        [SPARSE] * 3 + [PLANNED] * 3 + [ALLREDUCE_FP16] * 5
    assert set(asked) == {(ALLREDUCE_FP16, 1024), (ALLREDUCE, 1024)}
    assert guard.winner == ALLREDUCE_FP16
    assert guard.report()["compared_ms"] == {PLANNED: 300.0, SPARSE: 400.0, ALLREDUCE_FP16: 200.0}
    assert guard.report()["skipped_ms"] == {ALLREDUCE: 350.0}
    job.seconds[PLANNED] = 0.5  # the next comparison runs fp32 again
    assert job.run(guard, 5 + 23 + 1).count(ALLREDUCE) == 5 + 1
    assert guard.winner == ALLREDUCE and guard.report()["skipped_ms"] == {}


@pytest.mark.parametrize("floor", [None, lambda arm, elements: 0.3 if arm == ALLREDUCE else None])
def test_a_restored_guard_keeps_the_schedule_and_the_winner(floor):
    seconds = {PLANNED: 0.28, SPARSE: 0.4, ALLREDUCE_FP16: 0.2, ALLREDUCE: 0.25}
    job = Job(seconds, sizes=(10, 10))
    whole = job.run(guard_of(job, floor=floor), 50)
    for cut in (5, 11, 14, 18, 24, 30):
        job = Job(seconds, sizes=(10, 10))
        first = guard_of(job, floor=floor)
        head = job.run(first, cut)
        resumed = guard_of(job, floor=floor)
        resumed.load_state_dict(first.state_dict())
        assert resumed.report() == first.report()  # the winner, the steps it compared
        assert head + job.run(resumed, 50 - cut) == whole
        assert resumed.winner == ALLREDUCE_FP16
    older = {k: v for k, v in first.state_dict().items() if k not in ("fastest", "slowest")}
    resumed = guard_of(job, floor=floor)
    resumed.load_state_dict(older)  # saved before them: the compared steps stand in
    assert resumed.report()["slowest_ms"] == resumed.report()["fastest_ms"] == \
        first.report()["compared_ms"]


def test_a_guard_state_of_visits_to_arms_resumes_with_a_visit_to_each():
    """A state saved by the version whose comparison ran each arm once (its pending arms
    named alone) resumes with one visit of 3 steps to each, then the verdict."""
    job = Job({PLANNED: 0.3, SPARSE: 0.28, ALLREDUCE_FP16: 0.2, ALLREDUCE: 0.25})
    guard = guard_of(job)
    guard.load_state_dict({"step": 7, "winner": PLANNED, "compared": {}, "next": 5,
                           "times": {PLANNED: [0.3, 0.3]}, "trial": PLANNED, "left": 0,
                           "pending": [SPARSE, ALLREDUCE_FP16, ALLREDUCE]})
    assert job.run(guard, 10) == [SPARSE] * 3 + [ALLREDUCE_FP16] * 3 + [ALLREDUCE] * 3 + \
        [ALLREDUCE_FP16]
    assert guard.winner == ALLREDUCE_FP16 and guard.compared[PLANNED] == pytest.approx(0.3)


class Replanned:
    """A plan whose step time follows the dense kind its dense tensors take."""

    def __init__(self, job, seconds, kind=ALLREDUCE_FP16):
        self.job, self.seconds, self.kinds = job, seconds, [kind]
        job.seconds[PLANNED] = seconds[kind]

    def __call__(self, kind):
        changed = kind != self.kinds[-1]
        self.kinds.append(kind)
        self.job.seconds[PLANNED] = self.seconds[kind]
        return changed


def test_the_dense_arms_verdict_sets_the_plans_dense_kind_and_the_plans_last_visit_is_timed():
    """Calibrated alone the plan sends its dense tensors by fp16; in whole steps fp32 is
    faster (fp16 not by the margin): the plan's dense tensors take fp32 before its last
    visit, which is timed alone (5 steps), and that plan is what is compared and wins. A
    restored guard gives the plan the same kind; the next comparison, where fp32 stays, does
    not lengthen the plan's visit."""
    job = Job({SPARSE: 1.2, ALLREDUCE_FP16: 1.02, ALLREDUCE: 1.0})
    plan = Replanned(job, {ALLREDUCE_FP16: 1.1, ALLREDUCE: 0.8})
    guard = guard_of(job, replan=plan)
    arms = job.run(guard, 4 + 25 + 1)
    assert arms == [PLANNED] * 4 + COMPARISON + [PLANNED] * 3
    assert plan.kinds == [ALLREDUCE_FP16, ALLREDUCE]
    assert guard.winner == PLANNED and guard.compared[PLANNED] == pytest.approx(0.8)
    assert guard.report()["dense"] == ALLREDUCE
    restored = Replanned(Job({}), {ALLREDUCE_FP16: 1.1, ALLREDUCE: 0.8})
    guard_of(Job({}), replan=restored).load_state_dict(guard.state_dict())
    assert restored.kinds == [ALLREDUCE_FP16, ALLREDUCE]
    assert job.run(guard, 9 + 23 + 1)[-24:] == COMPARISON + [PLANNED]
    assert plan.kinds == [ALLREDUCE_FP16, ALLREDUCE, ALLREDUCE] and guard.winner == PLANNED


def test_fp16_faster_by_the_margin_keeps_the_plans_fp16_and_its_first_visit():
    job = Job({SPARSE: 1.2, ALLREDUCE_FP16: 0.8, ALLREDUCE: 1.0})
    plan = Replanned(job, {ALLREDUCE_FP16: 0.7, ALLREDUCE: 0.9})
    guard = guard_of(job, replan=plan)
    assert job.run(guard, 4 + 23 + 1)[-1] == PLANNED
    assert plan.kinds == [ALLREDUCE_FP16, ALLREDUCE_FP16]
    assert guard.compared[PLANNED] == pytest.approx(0.7)
    assert len(guard.times) == 0 and guard.fastest[PLANNED] == pytest.approx(0.7)


def test_the_lean_arm_runs_between_sparse_and_the_dense_arms_and_sets_no_dense_kind():
    """With matrices to factor the guard also times the lean arm, after fp16 (which touches
    every element): it wins where it beats fp32 by the margin and neither fp16 nor the plan
    beats it by the margin (ResNet-50 at 1 Gbit/s: the 5 largest matrices factored 10%
    faster than fp32, all 35 the plan factored 5%); the plan's dense kind is the dense arms'
    verdict alone, and a plan that changes with it is timed again, the lean arm (fp32 for all
    it does not factor) is not. A lean arm within the margin of fp32 loses to it."""
    job = Job({SPARSE: 1.2, LEAN: 0.9, ALLREDUCE_FP16: 0.92, ALLREDUCE: 1.0})
    plan = Replanned(job, {ALLREDUCE_FP16: 0.97, ALLREDUCE: 0.97}, kind=ALLREDUCE)
    guard = guard_of(job, arms=(SPARSE, ALLREDUCE_FP16, LEAN, ALLREDUCE), replan=plan)
    assert job.run(guard, 4 + 31 + 1) == [PLANNED] * 7 + [SPARSE] * 3 + [ALLREDUCE_FP16] * 3 + \
        [LEAN] * 3 + [ALLREDUCE] * 5 + [LEAN] * 3 + [ALLREDUCE_FP16] * 3 + [SPARSE] * 3 + \
        [PLANNED] * 5 + [LEAN]
    assert guard.winner == LEAN and plan.kinds == [ALLREDUCE, ALLREDUCE_FP16]
    assert guard.dense_arms == (ALLREDUCE_FP16, ALLREDUCE)
    job.seconds.update({LEAN: (1 - MARGIN / 2) * 1.0, ALLREDUCE_FP16: 1.02})
    job.run(guard, 9 + 31 + 1)
    assert guard.winner == ALLREDUCE
    plan.seconds[ALLREDUCE] = job.seconds[PLANNED] = 0.8  # 11% faster than lean: the plan
    job.seconds[LEAN] = 0.9
    job.run(guard, 9 + 29 + 1)
    assert guard.winner == PLANNED


def guarded_policy(seconds, bandwidth=GBIT):
    """A time-aware Policy whose guard sees `seconds` a step per arm, run past its first
    comparison, with tensors "a" (LARGE) and "b" (SMALL) routed at every step."""
    job = Job(seconds)
    planner = TimePlanner(dr.Pipeline(ratio=0.01), {"allreduce": bandwidth, "allgather": bandwidth},
                          2, priors(), CANDIDATES)
    policy = Policy(planner, guard=guard_of(job, start=planner.settled_after + 1))
    for _ in range(planner.settled_after + 23 + 1):
        for key, info in (("a", LARGE), ("b", SMALL)):
            policy.route(key, info)
        job.now += job.seconds[policy.guard.current]
    return policy


def test_policy_lets_the_guard_overrule_the_planner_only_where_it_may():
    """The guard's dense kind for every tensor it routes, small or large; in a traced graph
    (guarded=False) the planner's route."""
    policy = guarded_policy({PLANNED: 1.0, SPARSE: 1.0, ALLREDUCE_FP16: 0.05, ALLREDUCE: 0.1})
    assert policy.guard.winner == ALLREDUCE_FP16
    assert [policy.route(key, info).kind for key, info in (("a", LARGE), ("b", SMALL))] == \
        [ALLREDUCE_FP16, ALLREDUCE_FP16]
    assert policy.route("a", LARGE, guarded=False).kind == ALLGATHER


def test_the_sparse_arm_sends_sparse_what_the_planner_would_send_dense():
    """On a fast link the planner sends the large tensor dense; once the sparse arm wins it
    goes by the sparse option, and the small one, too small for a codec, stays dense."""
    fast = LinkModel(latency=1e-4, bandwidth=1e12 / 8)
    policy = guarded_policy({PLANNED: 1.0, SPARSE: 0.1, ALLREDUCE_FP16: 1.0, ALLREDUCE: 1.0}, fast)
    assert policy.route("a", LARGE, guarded=False).kind in (ALLREDUCE, ALLREDUCE_FP16)
    assert policy.guard.winner == SPARSE
    large, small = (policy.route(key, info) for key, info in (("a", LARGE), ("b", SMALL)))
    assert (large.kind, large.label, small.kind) == (ALLGATHER, "golomb+fp16", policy.planner.dense)


def test_the_planners_wire_floors_a_dense_arm_by_the_bytes_it_moves():
    """At 1 Gbit/s over 2 ranks a step of 4M elements by fp32 moves 16 MB: 0.128 s at
    least, by fp16 half that; a plan of 0.1 s a step keeps fp16 in the comparison only."""
    planner = TimePlanner(dr.Pipeline(ratio=0.01), {"allreduce": GBIT, "allgather": GBIT}, 2,
                          priors(), CANDIDATES)
    assert planner.wire(ALLREDUCE, 4_000_000) == pytest.approx(0.128)
    assert planner.wire(ALLREDUCE_FP16, 4_000_000) == pytest.approx(0.064)
    job = Job({PLANNED: 0.1, SPARSE: 0.2, ALLREDUCE_FP16: 0.2, ALLREDUCE: 0.2},
              sizes=(4_000_000, 0))
    guard = guard_of(job, floor=lambda arm, n: planner.wire(arm, n) if arm != SPARSE else None)
    job.run(guard, 4 + 17 + 1)
    assert set(guard.compared) == {PLANNED, SPARSE, ALLREDUCE_FP16}
    assert guard.report()["skipped_ms"] == {ALLREDUCE: pytest.approx(128.0)}


@pytest.mark.parametrize("state", [None, {}, {"step": "x", "winner": PLANNED, "compared": {}, "times": {}},
                                   {"step": 3, "winner": "allgather", "compared": {}, "times": {}},
                                   {"step": 3, "winner": PLANNED, "compared": {"other": 1.0}, "times": {}},
                                   {"step": 3, "winner": PLANNED, "compared": {}, "times": {PLANNED: 1.0}},
                                   {"step": 3, "winner": PLANNED, "compared": {}, "times": {},
                                    "pending": ["allgather"]},
                                   {"step": 3, "winner": PLANNED, "compared": {}, "times": {},
                                    "pending": [PLANNED], "left": 6},
                                   {"step": 3, "winner": PLANNED, "compared": {}, "times": {},
                                    "pending": [[PLANNED, 6]]},
                                   {"step": 3, "winner": PLANNED, "compared": {}, "times": {},
                                    "pending": [[PLANNED, 0]]},
                                   {"step": 3, "winner": PLANNED, "compared": {}, "times": {},
                                    "pending": [[PLANNED]]},
                                   {"step": 3, "winner": PLANNED, "compared": {}, "times": {},
                                    "pending": [["allgather", 3]]},
                                   {"step": 3, "winner": PLANNED, "compared": {}, "times": {},
                                    "pending": [[[PLANNED], 3]]},
                                   {"step": 3, "winner": [PLANNED], "compared": {}, "times": {}},
                                   {"step": 3, "winner": PLANNED, "compared": {}, "times": {},
                                    "fastest": {"other": 1.0}},
                                   {"step": 30, "winner": PLANNED, "compared": {}, "times": {},
                                    "next": 20},
                                   {"step": 3, "winner": PLANNED, "compared": {}, "times": {},
                                    "slowest": {"other": 1.0}},
                                   {"step": 3, "winner": PLANNED, "compared": {}, "times": {},
                                    "slowest": "x"},
                                   {"step": 3, "winner": PLANNED, "compared": {}, "times": {},
                                    "slowest": None},
                                   {"step": 3, "winner": PLANNED, "compared": {}, "times": {},
                                    "dense": SPARSE}])
def test_a_malformed_guard_state_is_refused(state):
    with pytest.raises(dr.DeepReduceError):
        guard_of(Job({})).load_state_dict(state)
