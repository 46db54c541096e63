"""Whether the planner's routes make whole steps faster than Horovod's own allreduce.

The planner prices each tensor alone: encode + wire + decode. Inside a training step the wire
time of a dense allreduce is mostly hidden behind the rest of backward, while the CPU of
selection, encoding and decoding is taken from it; on a compute-bound model (ResNet-50 on this
CPU) routes that each look cheaper make the step slower. And the other way: measured while
more ranks than cores compete, a codec can look slower than the dense allreduce it would beat
by 3x (the wide MLP at 4 ranks on 2 cores). The guard judges the plan by what the job
observes: now and then every tensor of the set runs a few steps the planner's way, a few with
every tensor the planner may send sparse sent by its fastest sparse option (the sparse arm),
a few by Horovod's own allreduce of every tensor (fp16, where values may be lossy, and fp32),
and where the plan factors matrices a few with only its largest factored and every other
tensor by Horovod's fp32 allreduce (the lean arm); a dense arm whose wire alone (the
elements a step routes, by Horovod's allreduce at the calibrated or stated link) takes
longer than the plan's whole step cannot win and is not run. Each arm's fastest and slowest
timed steps are averaged over the ranks, and an arm that does more work of its own than
another (the lean arm over Horovod's fp32, which hands it the gradient itself; fp16, which
touches every element, over both; the sparse arm over all three; the plan over all) runs
until the next comparison only where its slowest step beats the other's fastest by MARGIN:
on a compute-bound step the arms' differences are within a few steps' noise, and there the
cheaper arm is the safer bet. The
dense arms' verdict by the same rule also sets the dtype the plan's own dense tensors take
(`replan`): calibrated alone, fp16 halves the wire; in whole steps on a CPU its casts and
half-precision sums can cost more than that (Horovod's fp16 stepped 0.88-0.97x its fp32 on
ResNet-50 here); where that changes the plan, the plan runs its trial again before the
verdict, so the plan compared is the plan that runs. A step is the time between two calls for
the first tensor ever routed (the pacer); the first step of each arm is not timed (a switch
pays Horovod's negotiation of names it has not seen).

Decisions are identical on every rank: the schedule follows the pacer's calls, which every
rank makes at the same steps, and the times compared are agreed by one small allgather. In a
traced TensorFlow graph, whose tensors keep the kind they were traced with, the pacer is one
op per graph and step (GRAPH_STEP) and the plan is compared with fp16 and fp32 for the
tensors traced sparse (comm/communicator.py, _switched).
"""
import time

from ..errors import DeepReduceError

PLANNED = "planned"  # the arm where each tensor takes the planner's route
SPARSE = "sparse"    # the arm where each tensor that may go sparse takes its fastest sparse option
# the arm where only the plan's largest factored matrices go as factors, every other tensor by
# Horovod's fp32 allreduce: on ResNet-50 at 1 Gbit/s (2 ranks on 2 cores, Horovod's 1 ms
# cycle) factoring its 5 largest matrices stepped 10% faster than fp32, all 35 the plan
# factored 5%: once the dense rest hides behind backward, each further matrix costs the
# step its factors' rounds and CPU and saves nothing (planner.py, TimePlanner.lean)
LEAN = "lean"
GRAPH_STEP = "graph step"  # the pacer of a traced graph: one op per step asks for the arm
TRIAL_STEPS = 3  # steps of each arm per comparison (the first is not timed)
PERIOD = 200     # steps on the winning arm between two comparisons
# an arm of more work must beat one of less by this share: one barely faster saves little, one
# judged faster by the noise of a few steps breaks the promise not to be slower than Horovod's
# own allreduce (ResNet-50 here: steps of 3.4-4.3 s on one arm; fp16 timed 2% faster than fp32
# by the guard in a run where Horovod's own fp16 stepped 10% slower than its fp32)
MARGIN = 0.05


class StepGuard:
    """arms: those compared with the plan (SPARSE, "allreduce_fp16", LEAN, "allreduce":
    from more work of their own to less, Horovod's fp32 allreduce last where it runs); start: the step of the first comparison (after the planner has explored its
    candidates); agree: list of seconds -> those seconds averaged over the set's ranks (a
    collective); floor: (arm, elements a step routes) -> the seconds its wire alone takes, or
    None (no floors); replan: dense kind -> whether the plan's dense tensors changed to it
    (None: the plan keeps its own)."""

    def __init__(self, arms, start, agree, trial_steps=TRIAL_STEPS, period=PERIOD,
                 clock=time.perf_counter, floor=None, replan=None):
        self.arms = (PLANNED,) + tuple(arms)
        self.dense_arms = tuple(arm for arm in arms if arm not in (SPARSE, LEAN))
        self.start, self.agree, self.trial_steps, self.period = start, agree, trial_steps, period
        self.clock, self.floor, self.replan = clock, floor, replan
        self.dense = None        # the dense kind the dense arms' last verdict gave the plan
        self.replanned = False   # whether the plan ran again in the comparison under way
        self.pacer = self.stamp = self.timing = None
        self.step = 0            # steps begun
        self.next = start        # the step the next comparison begins at
        self.pending = None      # arms still to run in the comparison under way (None: none)
        self.trial = None        # the arm on trial
        self.left = 0            # steps it still runs
        self.winner = PLANNED    # the arm run outside comparisons
        self.current = PLANNED   # the arm of the step under way
        self.elements = [0, 0]   # elements routed in the step under way, in the last whole one
        self.times = {}          # arm -> timed step seconds of the comparison under way
        self.compared = {}       # arm -> its agreed fastest step at the last comparison
        self.slowest = {}        # arm -> its agreed slowest step then
        self.skipped = {}        # arm -> its wire floor, where that alone lost to the plan

    def kind(self, key, size=0):
        """The arm every tensor takes in this step (SPARSE, LEAN or a dense kind), or None: the
        planner's route. Called for every routed tensor (size: its elements, where known); the
        pacer's call begins a step."""
        if self.pacer is None:
            self.pacer = key
        if key == self.pacer:
            self._begin_step()
        self.elements[0] += size
        arm = self.current
        return None if arm == PLANNED else arm

    def _begin_step(self):
        now = self.clock()
        if self.timing is not None and self.stamp is not None:
            self.times.setdefault(self.timing, []).append(now - self.stamp)
        self.stamp, self.step = now, self.step + 1
        self.elements = [0, self.elements[0] or self.elements[1]]
        if self.step == self.next:
            self.pending, self.trial, self.left, self.skipped = list(self.arms), None, 0, {}
            self.replanned = False
        self.current, self.timing = self.winner, None
        if self.pending is None:
            return
        if not self.left:  # the arm on trial ran its steps: the next one, or the verdict
            if self.trial == PLANNED and not self.replanned:
                self._drop_beaten()
            if not self.pending and self._replan():
                self.pending = [PLANNED]
            if not self.pending:
                self._decide()
                self.pending, self.next = None, self.step + self.period
                self.current = self.winner
                return
            self.trial, self.left = self.pending.pop(0), self.trial_steps
        self.current = self.trial
        self.timing = self.current if self.left < self.trial_steps else None
        self.left -= 1

    def _drop_beaten(self):
        """Once the plan's steps are timed: the dense arms whose wire alone (the elements of a
        step by Horovod's allreduce at the calibrated link) takes longer than the plan's whole
        step are not run; a dense step over a slow link costs several of the plan's (the wide
        MLP at 1 Gbit/s: 0.26 and 0.34 s against 0.06, each arm 3 steps a comparison). A
        traced graph's pacer routes no sizes: there every arm runs."""
        if self.floor is None or not self.elements[1]:
            return
        planned = self._agreed()[0][PLANNED]
        for arm in list(self.pending):
            floor = self.floor(arm, self.elements[1])
            if floor is not None and floor > planned:
                self.pending.remove(arm)
                self.skipped[arm] = floor

    def _replan(self):
        """Once every dense arm ran in this comparison (two or more): the plan's dense tensors
        take the dense arms' winner; True where that changed the plan, whose timed steps are
        then dropped, to be timed again."""
        timed = all(arm in self.times for arm in self.dense_arms)
        if self.replan is None or self.replanned or len(self.dense_arms) < 2 or not timed:
            return False
        self.replanned = True
        self.dense = _chain(self.dense_arms, *self._agreed())
        if not self.replan(self.dense):
            return False
        self.times.pop(PLANNED, None)
        return True

    def _decide(self):
        """From the arm of least work to the plan: each arm whose slowest timed step is MARGIN
        faster than the fastest of the one chosen so far takes its place (by their fastest
        steps alone, one lucky step of two decided: three interleaved runs of ResNet-50 here
        picked the plan once and fp16 once, timed 5% and 8% faster than fp32, which then ran
        2% and 6% slower than Horovod's own fp32)."""
        fastest, slowest = self._agreed()
        self.compared = {arm: fastest[arm] for arm in self.arms if arm not in self.skipped}
        self.slowest = {arm: slowest[arm] for arm in self.compared}
        self.winner = _chain(list(self.compared), fastest, slowest)
        self.times = {}

    def _agreed(self):
        """({arm: its fastest timed step}, {arm: its slowest}), each averaged over the ranks
        (inf: not timed); every call agrees on every arm, so the collective keeps its shape."""
        times = [self.times.get(arm, [float("inf")]) for arm in self.arms]
        seconds = [float(s) for s in self.agree([min(t) for t in times] + [max(t) for t in times])]
        count = len(self.arms)
        return dict(zip(self.arms, seconds[:count])), dict(zip(self.arms, seconds[count:]))

    def report(self):
        """The arm running outside comparisons, the fastest and slowest step seconds the last
        comparison saw, the wire floors of the arms it did not run, and the dense kind the
        plan's dense tensors took from it (None: the planner's own)."""
        return {"winner": self.winner, "steps": self.step, "dense": self.dense,
                "compared_ms": {arm: round(1e3 * s, 3) for arm, s in self.compared.items()},
                "slowest_ms": {arm: round(1e3 * s, 3) for arm, s in self.slowest.items()},
                "skipped_ms": {arm: round(1e3 * s, 3) for arm, s in self.skipped.items()}}

    def state_dict(self):
        return {"step": self.step, "winner": self.winner, "compared": dict(self.compared),
                "slowest": dict(self.slowest),
                "times": {arm: list(ts) for arm, ts in self.times.items()}, "next": self.next,
                "pending": None if self.pending is None else list(self.pending),
                "trial": self.trial, "left": self.left, "skipped": dict(self.skipped),
                "elements": self.elements[1], "dense": self.dense, "replanned": self.replanned}

    def load_state_dict(self, state):
        """Resume the schedule at the saved step (the first step after it is not timed); a
        state saved without its schedule (an earlier version) compares again next step."""
        try:
            step, winner = int(state["step"]), state["winner"]
            compared = {arm: float(s) for arm, s in state["compared"].items()}
            slowest = {arm: float(s) for arm, s in state.get("slowest", compared).items()}
            times = {arm: [float(t) for t in ts] for arm, ts in state["times"].items()}
            following = int(state.get("next", max(self.start, step + 1)))
            pending = state.get("pending")
            pending = None if pending is None else list(pending)
            trial, left = state.get("trial"), int(state.get("left", 0))
            skipped = {arm: float(s) for arm, s in state.get("skipped", {}).items()}
            elements = int(state.get("elements", 0))
            dense, replanned = state.get("dense"), bool(state.get("replanned", False))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise DeepReduceError(f"not a step guard state: {type(exc).__name__}: {exc}") from exc
        arms = set(compared) | set(slowest) | set(times) | set(pending or ()) | set(skipped) | \
            {winner}
        if not arms <= set(self.arms) or trial not in self.arms + (None,):
            raise DeepReduceError(f"a step guard state of other arms than {self.arms}: {state}")
        if not 0 <= left <= self.trial_steps or elements < 0 or following <= step and pending is None:
            raise DeepReduceError(f"a step guard state out of its schedule: {state}")
        if dense is not None and dense not in self.dense_arms:
            raise DeepReduceError(f"a step guard state of another dense kind than "
                                  f"{self.dense_arms}: {state}")
        if dense is not None and self.replan is not None:
            self.replan(dense)
        self.step, self.winner, self.compared, self.times = step, winner, compared, times
        self.slowest = slowest
        self.next, self.pending, self.trial, self.left = following, pending, trial, left
        self.skipped, self.elements = skipped, [0, elements]
        self.dense, self.replanned = dense, replanned
        self.pacer = self.stamp = self.timing = None


def _chain(arms, fastest, slowest):
    """The winner among arms (from more work of their own to less): from the last, each arm
    whose slowest step beats the fastest of the one chosen so far by MARGIN takes its place."""
    ordered = list(reversed(arms))
    winner = ordered[0]
    for arm in ordered[1:]:
        if slowest[arm] < (1 - MARGIN) * fastest[winner]:
            winner = arm
    return winner
