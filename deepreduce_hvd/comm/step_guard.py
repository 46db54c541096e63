"""Whether the planner's routes make whole steps faster than Horovod's own allreduce.

The planner prices each tensor alone: encode + wire + decode. Inside a training step the wire
time of a dense allreduce is mostly hidden behind the rest of backward, while the CPU of
selection, encoding and decoding is taken from it; on a compute-bound model (ResNet-50 on this
CPU) routes that each look cheaper make the step slower. And the other way: measured while
more ranks than cores compete, a codec can look slower than the dense allreduce it would beat
by 3x (the wide MLP at 4 ranks on 2 cores). The guard judges the plan by what the job
observes: now and then every tensor of the set runs a few steps the planner's way, a few with
every tensor the planner may send sparse sent by its fastest sparse option (the sparse arm),
and a few by Horovod's own allreduce of every tensor (fp16, where values may be lossy, and
fp32); the step times (the least of each arm's timed steps, averaged over the ranks) are
compared, and the fastest other arm runs until the next comparison unless the plan beats it
by PLAN_MARGIN. A step is the time between two calls for the first tensor ever routed (the
pacer); the first step of each arm is not timed (a switch pays Horovod's negotiation of names
it has not seen).

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
GRAPH_STEP = "graph step"  # the pacer of a traced graph: one op per step asks for the arm
TRIAL_STEPS = 3  # steps of each arm per comparison (the first is not timed)
PERIOD = 200     # steps on the winning arm between two comparisons
# the plan must beat the fastest other arm by this share: a plan barely faster saves little,
# one judged faster by the noise of a few steps breaks the promise not to be slower than
# Horovod's own allreduce (ResNet-50 here: steps of 3.4-4.3 s on one arm)
PLAN_MARGIN = 0.05


class StepGuard:
    """arms: those compared with the plan (SPARSE, "allreduce_fp16", "allreduce"); start:
    the step of the first comparison (after the planner has explored its candidates); agree:
    list of seconds -> those seconds averaged over the set's ranks (a collective)."""

    def __init__(self, arms, start, agree, trial_steps=TRIAL_STEPS, period=PERIOD,
                 clock=time.perf_counter):
        self.arms = (PLANNED,) + tuple(arms)
        self.start, self.agree, self.trial_steps, self.period = start, agree, trial_steps, period
        self.clock = clock
        self.pacer = self.stamp = self.timing = None
        self.step = 0            # steps begun
        self.winner = PLANNED    # the arm run outside comparisons
        self.current = PLANNED   # the arm of the step under way
        self.times = {}          # arm -> timed step seconds of the comparison under way
        self.compared = {}       # arm -> agreed seconds at the last comparison

    def kind(self, key):
        """The arm every tensor takes in this step (SPARSE or a dense kind), or None: the
        planner's route. Called for every routed tensor; the pacer's call begins a step."""
        if self.pacer is None:
            self.pacer = key
        if key == self.pacer:
            self._begin_step()
        arm = self.current
        return None if arm == PLANNED else arm

    def _begin_step(self):
        now = self.clock()
        if self.timing is not None and self.stamp is not None:
            self.times.setdefault(self.timing, []).append(now - self.stamp)
        self.stamp, self.step = now, self.step + 1
        trial = len(self.arms) * self.trial_steps
        since = self.step - self.start
        into = since % (trial + self.period) if since >= 0 else None  # steps into the cycle
        if into == trial:
            self._decide()
        self.current, self.timing = self.winner, None
        if into is not None and into < trial:
            self.current = self.arms[into // self.trial_steps]
            self.timing = self.current if into % self.trial_steps else None

    def _decide(self):
        """The other arm with the least agreed step time, unless the plan is PLAN_MARGIN
        faster still."""
        seconds = self.agree([min(self.times.get(arm, [float("inf")])) for arm in self.arms])
        self.compared = dict(zip(self.arms, (float(s) for s in seconds)))
        other = min(self.arms[1:], key=self.compared.get)
        planned = self.compared[PLANNED] < (1 - PLAN_MARGIN) * self.compared[other]
        self.winner = PLANNED if planned else other
        self.times = {}

    def report(self):
        """The arm running outside comparisons, and the step seconds the last comparison saw."""
        return {"winner": self.winner, "steps": self.step,
                "compared_ms": {arm: round(1e3 * s, 3) for arm, s in self.compared.items()}}

    def state_dict(self):
        return {"step": self.step, "winner": self.winner, "compared": dict(self.compared),
                "times": {arm: list(ts) for arm, ts in self.times.items()}}

    def load_state_dict(self, state):
        """Resume the schedule at the saved step (the first step after it is not timed)."""
        try:
            step, winner = int(state["step"]), state["winner"]
            compared = {arm: float(s) for arm, s in state["compared"].items()}
            times = {arm: [float(t) for t in ts] for arm, ts in state["times"].items()}
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise DeepReduceError(f"not a step guard state: {type(exc).__name__}: {exc}") from exc
        if winner not in self.arms or not set(compared) | set(times) <= set(self.arms):
            raise DeepReduceError(f"a step guard state of other arms than {self.arms}: {state}")
        self.step, self.winner, self.compared, self.times = step, winner, compared, times
        self.pacer = self.stamp = self.timing = None
