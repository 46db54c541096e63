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


class Job:
    """Steps of a job with two routed tensors; a step's seconds depend on its arm (a list:
    its steps in turn), and a switch of arm adds `switch` seconds to the first step of the
    new one."""

    def __init__(self, seconds, switch=0.0, sizes=(0, 0)):
        self.now, self.seconds, self.switch, self.last = 0.0, seconds, switch, PLANNED
        self.sizes = sizes

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
            self.now += seconds + (self.switch if arm != self.last else 0.0)
            arms.append(arm)
            self.last = arm
        return arms


def guard_of(job, agree=np.asarray, start=5, period=10, floor=None):
    return StepGuard(ARMS, start, agree, trial_steps=3, period=period, clock=job.clock, floor=floor)


def test_each_arm_runs_its_trial_then_the_fastest_runs_until_the_next_comparison():
    """Before `start` the plan; then the plan, the sparse arm, fp16 and fp32 for 3 steps each
    (their first not timed: a switch's slow step does not count); the least time wins for
    `period` steps."""
    job = Job({PLANNED: 0.3, SPARSE: 0.28, ALLREDUCE_FP16: 0.2, ALLREDUCE: 0.25}, switch=1.0)
    guard = guard_of(job)
    arms = job.run(guard, 4 + 12 + 10 + 12)
    assert arms == [PLANNED] * 7 + [SPARSE] * 3 + [ALLREDUCE_FP16] * 3 + [ALLREDUCE] * 3 \
        + [ALLREDUCE_FP16] * 10 + [PLANNED] * 3 + [SPARSE] * 3 + [ALLREDUCE_FP16] * 3 \
        + [ALLREDUCE] * 3
    assert guard.winner == ALLREDUCE_FP16
    assert guard.compared == pytest.approx({PLANNED: 0.3, SPARSE: 0.28, ALLREDUCE_FP16: 0.2,
                                            ALLREDUCE: 0.25})
    assert guard.report()["compared_ms"] == {PLANNED: 300.0, SPARSE: 280.0, ALLREDUCE_FP16: 200.0,
                                             ALLREDUCE: 250.0}


def test_the_sparse_arm_wins_where_the_plan_is_dense_and_sending_sparse_is_faster():
    job = Job({PLANNED: 0.5, SPARSE: 0.2, ALLREDUCE_FP16: 0.3, ALLREDUCE: 0.5})
    guard = guard_of(job)
    assert job.run(guard, 4 + 12 + 10)[-10:] == [SPARSE] * 10
    assert guard.winner == SPARSE


def test_the_plan_wins_only_by_a_margin_and_wins_back_the_job_when_it_becomes_faster():
    job = Job({PLANNED: 0.2, SPARSE: 0.3, ALLREDUCE_FP16: 0.3, ALLREDUCE: 0.25})
    guard = guard_of(job)
    job.run(guard, 4 + 12 + 1)
    assert guard.winner == PLANNED
    job.seconds[PLANNED] = (1 - MARGIN / 2) * 0.25  # faster, but within the margin
    job.run(guard, 10 + 12 + 1)
    assert guard.winner == ALLREDUCE
    job.seconds[PLANNED] = 0.1
    job.run(guard, 10 + 12 + 1)
    assert guard.winner == PLANNED


def test_an_arm_of_more_work_wins_only_by_the_margin_over_one_of_less():
    """fp16 timed 2% faster than fp32 (within a few steps' noise): fp32, Horovod's own, runs;
    the sparse arm 10% faster than fp32 wins, and the plan not 5% faster than it does not."""
    job = Job({PLANNED: 0.3, SPARSE: 0.4, ALLREDUCE_FP16: 0.98, ALLREDUCE: 1.0})
    guard = guard_of(job)
    job.run(guard, 4 + 12 + 1)
    assert guard.winner == PLANNED
    job.seconds.update({PLANNED: 1.1, SPARSE: 1.1})
    job.run(guard, 10 + 12 + 1)
    assert guard.winner == ALLREDUCE
    job.seconds.update({PLANNED: 0.88, SPARSE: 0.9})
    job.run(guard, 10 + 12 + 1)
    assert guard.winner == SPARSE


def test_an_arm_of_more_work_wins_only_if_its_slowest_step_beats_the_others_fastest():
    """fp16 with one step 20% faster than fp32's and one 2% slower (a lucky step): fp32
    runs, and its times are reported; fp16 with both timed steps 10% faster wins."""
    job = Job({PLANNED: 1.2, SPARSE: 1.2, ALLREDUCE_FP16: [0.5, 0.8, 1.02], ALLREDUCE: 1.0})
    guard = guard_of(job)
    job.run(guard, 4 + 12 + 1)
    assert guard.winner == ALLREDUCE
    report = guard.report()
    assert report["compared_ms"][ALLREDUCE_FP16] == pytest.approx(800.0)
    assert report["slowest_ms"][ALLREDUCE_FP16] == pytest.approx(1020.0)
    job.seconds[ALLREDUCE_FP16] = [0.5, 0.85, 0.88]
    job.run(guard, 10 + 12 + 1)
    assert guard.winner == ALLREDUCE_FP16


def test_the_agreed_times_decide_not_this_ranks():
    """This rank measures fp16 faster; averaged with the other rank's times the plan is."""
    job = Job({PLANNED: 0.3, SPARSE: 0.5, ALLREDUCE_FP16: 0.2, ALLREDUCE: 0.4})
    other = np.array([0.1, 0.5, 0.6, 0.4] * 2)  # fastest steps, then slowest
    guard = guard_of(job, agree=lambda seconds: (np.asarray(seconds) + other) / 2)
    job.run(guard, 4 + 12 + 1)
    assert guard.winner == PLANNED
    assert np.allclose([guard.compared[arm] for arm in (PLANNED,) + ARMS], [0.2, 0.5, 0.4, 0.4])


def test_a_dense_arm_whose_wire_alone_outlasts_the_plans_step_is_not_run():
    """Once the plan's steps are timed, fp32, whose floor (for the elements a step routes)
    is above the plan's agreed step, is dropped from the comparison; fp16, whose floor is
    below, runs, and wins."""
    asked = []

    def floor(arm, elements):
        asked.append((arm, elements))
        return {ALLREDUCE_FP16: 0.1, ALLREDUCE: 0.35}.get(arm)
    job = Job({PLANNED: 0.3, SPARSE: 0.4, ALLREDUCE_FP16: 0.2, ALLREDUCE: 0.1}, sizes=(1000, 24))
    guard = guard_of(job, floor=floor)
    assert job.run(guard, 4 + 9 + 5) == [PLANNED] * 7 + [SPARSE] * 3 + [ALLREDUCE_FP16] * 3 + \
        [ALLREDUCE_FP16] * 5
    assert set(asked) == {(SPARSE, 1024), (ALLREDUCE_FP16, 1024), (ALLREDUCE, 1024)}
    assert guard.winner == ALLREDUCE_FP16
    assert guard.report()["compared_ms"] == {PLANNED: 300.0, SPARSE: 400.0, ALLREDUCE_FP16: 200.0}
    assert guard.report()["skipped_ms"] == {ALLREDUCE: 350.0}
    job.seconds[PLANNED] = 0.5  # the next comparison runs fp32 again
    assert job.run(guard, 5 + 12 + 1)[-4:] == [ALLREDUCE] * 4
    assert guard.winner == ALLREDUCE and guard.report()["skipped_ms"] == {}


@pytest.mark.parametrize("floor", [None, lambda arm, elements: 0.3 if arm == ALLREDUCE else None])
def test_a_restored_guard_keeps_the_schedule_and_the_winner(floor):
    seconds = {PLANNED: 0.28, SPARSE: 0.4, ALLREDUCE_FP16: 0.2, ALLREDUCE: 0.25}
    job = Job(seconds, sizes=(10, 10))
    whole = job.run(guard_of(job, floor=floor), 40)
    for cut in (5, 11, 14, 18):
        job = Job(seconds, sizes=(10, 10))
        first = guard_of(job, floor=floor)
        head = job.run(first, cut)
        resumed = guard_of(job, floor=floor)
        resumed.load_state_dict(first.state_dict())
        assert resumed.report() == first.report()  # the winner, fastest and slowest steps
        assert head + job.run(resumed, 40 - cut) == whole
        assert resumed.winner == ALLREDUCE_FP16
    older = {k: v for k, v in first.state_dict().items() if k != "slowest"}  # saved before them
    resumed = guard_of(job, floor=floor)
    resumed.load_state_dict(older)
    assert resumed.report()["slowest_ms"] == first.report()["compared_ms"]


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


def test_the_dense_arms_verdict_sets_the_plans_dense_kind_and_the_plan_runs_again():
    """Calibrated alone the plan sends its dense tensors by fp16; in whole steps fp32 is
    faster (fp16 not by the margin): the plan's dense tensors take fp32 and the plan runs its
    trial again, and that plan is what is compared and wins. A restored guard gives the plan
    the same kind; the next comparison, where fp32 stays, does not run the plan twice."""
    job = Job({SPARSE: 1.2, ALLREDUCE_FP16: 1.02, ALLREDUCE: 1.0})
    plan = Replanned(job, {ALLREDUCE_FP16: 1.1, ALLREDUCE: 0.8})
    guard = StepGuard(ARMS, 5, np.asarray, trial_steps=3, period=10, clock=job.clock,
                      replan=plan)
    arms = job.run(guard, 4 + 15 + 1)
    assert arms == [PLANNED] * 7 + [SPARSE] * 3 + [ALLREDUCE_FP16] * 3 + [ALLREDUCE] * 3 \
        + [PLANNED] * 4
    assert plan.kinds == [ALLREDUCE_FP16, ALLREDUCE]
    assert guard.winner == PLANNED and guard.compared[PLANNED] == pytest.approx(0.8)
    assert guard.report()["dense"] == ALLREDUCE
    restored = Replanned(Job({}), {ALLREDUCE_FP16: 1.1, ALLREDUCE: 0.8})
    StepGuard(ARMS, 5, np.asarray, trial_steps=3, replan=restored).load_state_dict(
        guard.state_dict())
    assert restored.kinds == [ALLREDUCE_FP16, ALLREDUCE]
    assert job.run(guard, 9 + 12 + 1)[-13:] == [PLANNED] * 3 + [SPARSE] * 3 + \
        [ALLREDUCE_FP16] * 3 + [ALLREDUCE] * 3 + [PLANNED]
    assert plan.kinds == [ALLREDUCE_FP16, ALLREDUCE, ALLREDUCE] and guard.winner == PLANNED


def test_fp16_faster_by_the_margin_keeps_the_plans_fp16_and_its_first_trial():
    job = Job({SPARSE: 1.2, ALLREDUCE_FP16: 0.8, ALLREDUCE: 1.0})
    plan = Replanned(job, {ALLREDUCE_FP16: 0.7, ALLREDUCE: 0.9})
    guard = StepGuard(ARMS, 5, np.asarray, trial_steps=3, period=10, clock=job.clock,
                      replan=plan)
    assert job.run(guard, 4 + 12 + 1)[-1] == PLANNED
    assert plan.kinds == [ALLREDUCE_FP16, ALLREDUCE_FP16]
    assert guard.compared[PLANNED] == pytest.approx(0.7)


def test_the_lean_arm_runs_between_sparse_and_the_dense_arms_and_sets_no_dense_kind():
    """With matrices to factor the guard also times the lean arm, after fp16 (which touches
    every element): it wins where it beats fp32 by the margin and neither fp16 nor the plan
    beats it by the margin (ResNet-50 at 1 Gbit/s: the 5 largest matrices factored 10%
    faster than fp32, all 35 the plan factored 5%); the plan's dense kind is the dense arms'
    verdict alone, and a plan that changes with it runs again, the lean arm (fp32 for all it
    does not factor) does not. A lean arm within the margin of fp32 loses to it."""
    job = Job({SPARSE: 1.2, LEAN: 0.9, ALLREDUCE_FP16: 0.92, ALLREDUCE: 1.0})
    plan = Replanned(job, {ALLREDUCE_FP16: 0.95, ALLREDUCE: 0.95}, kind=ALLREDUCE)
    arms = (SPARSE, ALLREDUCE_FP16, LEAN, ALLREDUCE)
    guard = StepGuard(arms, 5, np.asarray, trial_steps=3, period=10, clock=job.clock,
                      replan=plan)
    assert job.run(guard, 4 + 18 + 1) == [PLANNED] * 7 + [SPARSE] * 3 + \
        [ALLREDUCE_FP16] * 3 + [LEAN] * 3 + [ALLREDUCE] * 3 + [PLANNED] * 3 + [LEAN]
    assert guard.winner == LEAN and plan.kinds == [ALLREDUCE, ALLREDUCE_FP16]
    assert guard.dense_arms == (ALLREDUCE_FP16, ALLREDUCE)
    job.seconds.update({LEAN: (1 - MARGIN / 2) * 1.0, ALLREDUCE_FP16: 1.02})
    job.run(guard, 9 + 18 + 1)
    assert guard.winner == ALLREDUCE
    plan.seconds[ALLREDUCE] = job.seconds[PLANNED] = 0.8  # 11% faster than lean: the plan
    job.seconds[LEAN] = 0.9
    job.run(guard, 9 + 15 + 1)
    assert guard.winner == PLANNED


def guarded_policy(seconds, bandwidth=GBIT):
    """A time-aware Policy whose guard sees `seconds` a step per arm, run past its first
    comparison, with tensors "a" (LARGE) and "b" (SMALL) routed at every step."""
    job = Job(seconds)
    planner = TimePlanner(dr.Pipeline(ratio=0.01), {"allreduce": bandwidth, "allgather": bandwidth},
                          2, priors(), CANDIDATES)
    policy = Policy(planner, guard=guard_of(job, start=planner.settled_after + 1))
    for _ in range(planner.settled_after + 12 + 1):
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
    job.run(guard, 4 + 9 + 1)
    assert set(guard.compared) == {PLANNED, SPARSE, ALLREDUCE_FP16}
    assert guard.report()["skipped_ms"] == {ALLREDUCE: pytest.approx(128.0)}


@pytest.mark.parametrize("state", [None, {}, {"step": "x", "winner": PLANNED, "compared": {}, "times": {}},
                                   {"step": 3, "winner": "allgather", "compared": {}, "times": {}},
                                   {"step": 3, "winner": PLANNED, "compared": {"other": 1.0}, "times": {}},
                                   {"step": 3, "winner": PLANNED, "compared": {}, "times": {PLANNED: 1.0}},
                                   {"step": 3, "winner": PLANNED, "compared": {}, "times": {},
                                    "pending": ["allgather"]},
                                   {"step": 3, "winner": PLANNED, "compared": {}, "times": {},
                                    "pending": [PLANNED], "left": 7},
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
