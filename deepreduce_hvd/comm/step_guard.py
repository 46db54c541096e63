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
longer than the plan's whole step cannot win and is not run. A comparison visits every arm
twice, in this order and then in reverse (the last arm's two visits are one): drift of the
host within a comparison falls alike on every arm (the plan runs first and last). Each
visit's first step is not timed (a switch pays Horovod's negotiation of names it has not
seen, and flushes what the arm before left in the residuals). Each arm's median timed step is
averaged over the ranks, and an arm that does more work of its own than another (the lean
arm over Horovod's fp32, which hands it the gradient itself; fp16, which touches every
element, over both; the sparse arm over all three; the plan over all) runs until the next
comparison only where its median step beats the other's by MARGIN: on a compute-bound step
the arms' differences are within a few steps' noise, and there the cheaper arm is the safer
bet. The dense arms' verdict by the same rule also sets the dtype the plan's own dense tensors
take (`replan`): calibrated alone, fp16 halves the wire; in whole steps on a CPU its casts and
half-precision sums can cost more than that (Horovod's fp16 stepped 0.88-0.97x its fp32 on
ResNet-50 here); where that changes the plan, the plan's last visit is timed alone and twice
as long, so the plan compared is the plan that runs. A step is the time between two calls for
the first tensor ever routed (the pacer).

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
TIMED_STEPS = 2  # timed steps of an arm per visit (two visits a comparison)
PERIOD = 200     # steps on the winning arm between two comparisons
# an arm of more work must beat one of less by this share of its median step: one barely
# faster saves little, one judged faster by noise breaks the promise not to be slower than
# Horovod's own allreduce. ResNet-50 here, 2 ranks at 1 Gbit/s: one arm's steps spread over
# 15% (2.30-2.73 s), the lean arm stepped 10% under fp32 in 24 alternating pairs; judged by
# its slowest of two steps against fp32's fastest with a 5% margin (the rule before), the
# guard kept fp32 in 2 of 3 jobs and those jobs ran 0.94-0.96x dense
MARGIN = 0.04


class StepGuard:
    """arms: those compared with the plan (SPARSE, "allreduce_fp16", LEAN, "allreduce":
    from more work of their own to less, Horovod's fp32 allreduce last where it runs); start:
    the step of the first comparison (after the planner has explored its candidates); agree:
    list of seconds -> those seconds averaged over the set's ranks (a collective); floor:
    (arm, elements a step routes) -> the seconds its wire alone takes, or None (no floors);
    replan: dense kind -> whether the plan's dense tensors changed to it (None: the plan keeps
    its own); timed_steps: an arm's timed steps per visit."""

    def __init__(self, arms, start, agree, timed_steps=TIMED_STEPS, period=PERIOD,
                 clock=time.perf_counter, floor=None, replan=None):
        self.arms = (PLANNED,) + tuple(arms)
        self.dense_arms = tuple(arm for arm in arms if arm not in (SPARSE, LEAN))
        self.start, self.agree, self.timed_steps, self.period = start, agree, timed_steps, period
        self.clock, self.floor, self.replan = clock, floor, replan
        self.dense = None        # the dense kind the dense arms' last verdict gave the plan
        self.replanned = False   # whether the plan ran again in the comparison under way
        self.pacer = self.stamp = self.timing = None
        self.step = 0            # steps begun
        self.next = start        # the step the next comparison begins at
        self.pending = None      # [arm, steps] visits still to come in the comparison under way
        self.trial = None        # the arm of the visit under way
        self.left = 0            # steps it still runs
        self.winner = PLANNED    # the arm run outside comparisons
        self.current = PLANNED   # the arm of the step under way
        self.elements = [0, 0]   # elements routed in the step under way, in the last whole one
        self.times = {}          # arm -> timed step seconds of the comparison under way
        self.compared = {}       # arm -> its agreed median step at the last comparison
        self.fastest = {}        # arm -> its agreed fastest step then
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
            self.pending, self.trial, self.left, self.skipped = self._visits(), None, 0, {}
            self.replanned = False
        self.current, self.timing = self.winner, None
        if self.pending is None:
            return
        if self.left:  # a visit's later steps are timed
            self.timing = self.trial
        else:  # the visit ran its steps: the next one, or the verdict
            if self.trial == PLANNED and self.pending:  # the plan's first visit (its last ends it)
                self._drop_beaten()
            if len(self.pending) == 1 and self.pending[0][0] == PLANNED and self._replan():
                self.pending[0][1] += self.timed_steps  # timed alone: twice as long
            if not self.pending:
                self._decide()
                self.pending, self.next = None, self.step + self.period
                self.current = self.winner
                return
            self.trial, self.left = self.pending.pop(0)
        self.current = self.trial
        self.left -= 1

    def _visits(self):
        """A comparison's [arm, steps] visits: every arm in turn, then in reverse."""
        return _merged([[arm, 1 + self.timed_steps] for arm in self.arms + self.arms[::-1]])

    def _drop_beaten(self):
        """Once the plan's first visit is timed: the dense arms whose wire alone (the elements
        of a step by Horovod's allreduce at the calibrated link) takes longer than the plan's
        whole step are not run; a dense step over a slow link costs several of the plan's
        (the wide MLP at 1 Gbit/s: 0.26 and 0.34 s against 0.06). A traced graph's pacer
        routes no sizes: there every arm runs."""
        if self.floor is None or not self.elements[1]:
            return
        planned = self._agreed()[0][PLANNED]
        for arm in self.dense_arms:
            floor = self.floor(arm, self.elements[1])
            if floor is not None and floor > planned:
                self.pending = _merged([visit for visit in self.pending if visit[0] != arm])
                self.skipped[arm] = floor

    def _replan(self):
        """Before the plan's last visit, once every dense arm ran (two or more): the plan's
        dense tensors take the dense arms' winner; True where that changed the plan, whose
        timed steps are then dropped, to be timed again."""
        timed = all(arm in self.times for arm in self.dense_arms)
        if self.replan is None or self.replanned or len(self.dense_arms) < 2 or not timed:
            return False
        self.replanned = True
        self.dense = _chain(self.dense_arms, self._agreed()[0])
        if not self.replan(self.dense):
            return False
        self.times.pop(PLANNED, None)
        return True

    def _decide(self):
        """From the arm of least work to the plan: each arm whose median step is MARGIN under
        the median of the one chosen so far takes its place (by their fastest steps alone, one
        lucky step of two decided: three interleaved runs of ResNet-50 here picked the plan
        once and fp16 once, timed 5% and 8% faster than fp32, which then ran 2% and 6% slower
        than Horovod's own fp32)."""
        median, fastest, slowest = self._agreed()
        self.compared = {arm: median[arm] for arm in self.arms if arm not in self.skipped}
        self.fastest = {arm: fastest[arm] for arm in self.compared}
        self.slowest = {arm: slowest[arm] for arm in self.compared}
        self.winner = _chain(list(self.compared), median)
        self.times = {}

    def _agreed(self):
        """({arm: its median timed step}, {arm: its fastest}, {arm: its slowest}), each
        averaged over the ranks (inf: not timed); every call agrees on every arm, so the
        collective keeps its shape."""
        times = [sorted(self.times.get(arm, [float("inf")])) for arm in self.arms]
        medians = [(t[(len(t) - 1) // 2] + t[len(t) // 2]) / 2 for t in times]
        seconds = [float(s) for s in self.agree(medians + [t[0] for t in times] +
                                                [t[-1] for t in times])]
        count = len(self.arms)
        return tuple(dict(zip(self.arms, seconds[i * count:(i + 1) * count])) for i in range(3))

    def report(self):
        """The arm running outside comparisons, the median, fastest and slowest step seconds
        the last comparison saw, the wire floors of the arms it did not run, and the dense kind
        the plan's dense tensors took from it (None: the planner's own)."""
        def ms(seconds):
            return {arm: round(1e3 * s, 3) for arm, s in seconds.items()}
        return {"winner": self.winner, "steps": self.step, "dense": self.dense,
                "compared_ms": ms(self.compared), "fastest_ms": ms(self.fastest),
                "slowest_ms": ms(self.slowest), "skipped_ms": ms(self.skipped)}

    def state_dict(self):
        return {"step": self.step, "winner": self.winner, "compared": dict(self.compared),
                "fastest": dict(self.fastest), "slowest": dict(self.slowest),
                "times": {arm: list(ts) for arm, ts in self.times.items()}, "next": self.next,
                "pending": None if self.pending is None else [list(v) for v in self.pending],
                "trial": self.trial, "left": self.left, "skipped": dict(self.skipped),
                "elements": self.elements[1], "dense": self.dense, "replanned": self.replanned}

    def load_state_dict(self, state):
        """Resume the schedule at the saved step (the first step after it is not timed); a
        state saved without its schedule (an earlier version) compares again next step, one
        whose visits were arms (an earlier version) visits each of them once."""
        try:
            step, winner = int(state["step"]), state["winner"]
            compared = {arm: float(s) for arm, s in state["compared"].items()}
            fastest = {arm: float(s) for arm, s in state.get("fastest", compared).items()}
            slowest = {arm: float(s) for arm, s in state.get("slowest", compared).items()}
            times = {arm: [float(t) for t in ts] for arm, ts in state["times"].items()}
            following = int(state.get("next", max(self.start, step + 1)))
            pending = state.get("pending")
            pending = None if pending is None else [
                [visit, 1 + self.timed_steps] if isinstance(visit, str) else
                [visit[0], int(visit[1])] for visit in pending]
            trial, left = state.get("trial"), int(state.get("left", 0))
            skipped = {arm: float(s) for arm, s in state.get("skipped", {}).items()}
            elements = int(state.get("elements", 0))
            dense, replanned = state.get("dense"), bool(state.get("replanned", False))
            arms = set(compared) | set(fastest) | set(slowest) | set(times) | \
                {arm for arm, _ in pending or ()} | set(skipped) | {winner}
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
            raise DeepReduceError(f"not a step guard state: {type(exc).__name__}: {exc}") from exc
        if not arms <= set(self.arms) or trial not in self.arms + (None,):
            raise DeepReduceError(f"a step guard state of other arms than {self.arms}: {state}")
        longest = 1 + 2 * self.timed_steps
        if not 0 <= left <= longest or elements < 0 or following <= step and pending is None or \
                any(not 1 <= steps <= longest for _, steps in pending or ()):
            raise DeepReduceError(f"a step guard state out of its schedule: {state}")
        if dense is not None and dense not in self.dense_arms:
            raise DeepReduceError(f"a step guard state of another dense kind than "
                                  f"{self.dense_arms}: {state}")
        if dense is not None and self.replan is not None:
            self.replan(dense)
        self.step, self.winner, self.compared, self.times = step, winner, compared, times
        self.fastest, self.slowest = fastest, slowest
        self.next, self.pending, self.trial, self.left = following, pending, trial, left
        self.skipped, self.elements = skipped, [0, elements]
        self.dense, self.replanned = dense, replanned
        self.pacer = self.stamp = self.timing = None


def _merged(visits):
    """[arm, steps] visits with each run of one arm's visits made one: its first step is the
    only one not timed."""
    merged = []
    for arm, steps in visits:
        if merged and merged[-1][0] == arm:
            merged[-1][1] += steps - 1
        else:
            merged.append([arm, steps])
    return merged


def _chain(arms, median):
    """The winner among arms (from more work of their own to less): from the last, each arm
    whose median step is MARGIN under that of the one chosen so far takes its place."""
    ordered = list(reversed(arms))
    winner = ordered[0]
    for arm in ordered[1:]:
        if median[arm] < (1 - MARGIN) * median[winner]:
            winner = arm
    return winner
