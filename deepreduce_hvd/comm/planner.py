"""Which way each tensor travels: by least predicted time (the default), or always sparse.

For every tensor the time-aware planner compares Horovod's own allreduce of the (error-
compensated) tensor with a sparse allgather through each candidate codec pair, predicting for
each option

    encode on the sender + the bytes over the link + decoding P payloads on each receiver.

Horovod fuses allreduces into one buffer per dtype, so the dense option pays no latency of its
own, and every dense tensor of a job uses one dtype (fp16 when lossy values are allowed, else
fp32): mixing the two costs Horovod a second fused collective every cycle (measured here: 6-10
ms of waiting per step with one dtype, about 50 with both). Each sparse allgather pays the
measured allgather latency.

The link model (latency and bandwidth of allreduce and allgather) comes from a short
calibration with the job's own collectives, or from `bandwidth=`; CPU costs start from a
calibration on this host and are replaced by the costs measured in the job: every frame carries
its sender's encode time and last decode time, and the payload sizes are in the frames too.
A cost is the least of its recent measurements (on shared cores a stall only adds time).
After a few warm steps each sparse candidate is tried for a few steps before the planner
settles (one measured EXPLORE_MARGIN times slower than the best measured so far, or than
the dense option, is dropped after its first step), and the runner-up is measured again now
and then. Where the dense allreduce leads, the sparse candidates predicted within
EXPLORE_MARGIN of it are tried all the same (a noisy calibration must not keep a tensor dense
for a whole job), and the best of them is measured again now and then; so is each candidate
of the threshold sparsifier once, whose count is unknown until a step sends it.

A named matrix whose low-rank factors are worth sending (compression/lowrank.py) weighs only
two options: the factors (two allreduces, each paying the allreduce latency, and the three
rounds' CPU, measured in the job) or the dense allreduce; accuracy before time (_factored).

Every input to a decision is identical on every rank (calibrations are agreed once, the
measurements arrive in the allgathered frames, step counters advance together), and so is every
decision: a tensor never goes to an allgather on one rank and an allreduce on another.
"""
import collections
import math
from typing import NamedTuple, Optional

import numpy as np

from ..codecs.choice import is_auto
from ..codecs.sparse_codec import SparseCodec
from ..compression.lowrank import matrix_shape, worth_factoring
from ..errors import DeepReduceError
from .step_guard import LEAN, SPARSE

ALLREDUCE, ALLREDUCE_FP16, ALLGATHER, PASS = "allreduce", "allreduce_fp16", "allgather", "pass"
HIERARCHICAL, SPARSE_ALLREDUCE, LOWRANK = "hierarchical", "sparse_allreduce", "lowrank"
SPARSE_KINDS = (ALLGATHER, SPARSE_ALLREDUCE)
COLLECTIVES = ("auto", ALLGATHER, SPARSE_ALLREDUCE)  # what DeepReduce(collective=) accepts
# collective="auto" weighs the sparse allreduce from this many ranks on. Its two dependent
# rounds (alltoall, then allgather) cost more waiting than its model charges: at 4 and 8 ranks
# on this machine it stepped no faster than the allgather (at 8, slower at 1%) while receiving
# 0.5x and 0.27x the bytes (README, "Allgather or sparse allreduce"); the allgather's P
# payloads decide beyond.
SPARSE_ALLREDUCE_MIN_RANKS = 16
FALLBACK = ("golomb", "raw")  # exact for any finite values: what a failing candidate is replaced by
CANDIDATE_INDICES = ("golomb", "entropy")  # what "auto" means in the time-aware mode
CANDIDATE_VALUES = ("fp16", "entropy")     # (entropy at 0.8 x max_error: the fit's own slack)
# the threshold sparsifier sends every value above tau, and at tau = 0 a lossy codec's error
# left in the residual is itself sent at the next step, and the next: exact values keep a
# naturally sparse gradient (an embedding's rows) at its own support
THRESHOLD_CANDIDATE_VALUES = ("raw", "fp16")
WARM_STEPS = 3           # steps on the prior's choice before exploring (first steps are slow)
STEPS_PER_CANDIDATE = 3  # measurements of each sparse candidate while exploring
REVISIT = 25             # then every REVISIT steps the runner-up is measured once more
WINDOW = 8  # a cost is the least of its last WINDOW measurements: stalls only ever add time
DRIFT = 1.5  # measurements taken at a selection count this many times off are dropped
EXPLORE_MARGIN = 2.0  # a sparse candidate predicted this much slower than dense is still tried


class Plan(NamedTuple):
    """How one tensor travels this step: kind is "allreduce", "allreduce_fp16", "allgather"
    or "sparse_allreduce" (with codec, and a fallback codec if that one cannot encode),
    "lowrank" (factors) or "pass" (unchanged, uncompressed); label names the option in stats."""
    kind: str
    codec: Optional[SparseCodec] = None
    label: str = ""
    fallback: Optional[SparseCodec] = None


class LinkModel(NamedTuple):
    """Seconds for a collective: latency + bytes each rank moves / bandwidth (bytes/s)."""
    latency: float
    bandwidth: float

    def allreduce(self, nbytes, ranks):
        return self.latency + 2 * (ranks - 1) / ranks * nbytes / self.bandwidth

    def allgather(self, nbytes_each, ranks):
        return self.latency + (ranks - 1) * nbytes_each / self.bandwidth

    @classmethod
    def fit(cls, small, large):
        """From (bytes moved per rank, seconds) at a small and a large size."""
        (b0, t0), (b1, t1) = small, large
        slope = max((t1 - t0) / max(b1 - b0, 1), 1e-12)
        return cls(latency=max(t0 - slope * b0, 1e-6), bandwidth=1.0 / slope)


class Measured(NamedTuple):
    """What one sparse step cost, identical on every rank: the slowest rank's encode and
    (previous step's) decode seconds, and the mean bytes a rank sent."""
    encode_s: float
    nbytes: float
    decode_s: float

    @classmethod
    def of(cls, received):
        """From every rank's frame of an allgather."""
        return cls(max(f.encode_s for f in received),
                   float(np.mean([len(f.payload) for f in received])),
                   max(f.decode_s for f in received))


class Costs(NamedTuple):
    """Seconds as a + b * elements (+ c * selected) for one way of sending a tensor."""
    encode_fixed: float
    encode_per_element: float
    encode_per_selected: float
    decode_fixed: float
    decode_per_element: float
    decode_per_payload_selected: float
    bits_per_selected: float


def option_label(index, value):
    """"golomb+fp16" for a candidate (index, value) pair of codec ids or configs."""
    name = lambda config: config if isinstance(config, str) else config["id"]  # noqa: E731
    return f"{name(index)}+{name(value)}"


def candidates(index, value, max_error, sparsifier="topk"):
    """The sparse (index, value) pairs the time-aware planner chooses among: the given codec,
    or for "auto" each of CANDIDATE_INDICES / CANDIDATE_VALUES (THRESHOLD_CANDIDATE_VALUES
    for the threshold sparsifier; exact values when max_error is 0)."""
    if is_auto(value):
        values = ["raw"] if max_error == 0 else [
            {"id": "entropy", "max_error": 0.8 * max_error} if v == "entropy" else v
            for v in (THRESHOLD_CANDIDATE_VALUES if sparsifier == "threshold"
                      else CANDIDATE_VALUES)]
    else:
        values = [value]
    indices = list(CANDIDATE_INDICES) if is_auto(index) else [index]
    return [(i, v) for i in indices for v in values]


class Policy:
    """Every decision about how a tensor travels, in one place: passed through unchanged
    (sparse layouts, integers, empty tensors; small tensors when the codec is fixed), the
    hierarchical exchange, or the planner's choice of Horovod's allreduce (fp32/fp16) or a
    sparse allgather with a codec, unless the step guard (comm/step_guard.py) runs this step
    by Horovod's allreduce of every tensor, or by the fastest sparse option of every tensor
    that may go sparse. Pipeline only executes what it is told."""

    def __init__(self, planner, hierarchical=False, guard=None):
        self.planner, self.hierarchical, self.guard = planner, hierarchical, guard

    @staticmethod
    def passes_through(info):
        """Tensors no codec takes: sparse layouts, integers, empty tensors."""
        return info.sparse_layout or not info.is_float or info.size == 0

    def route(self, key, info, guarded=True, factorable=False):
        """The Plan of a tensor (adapters.base.TensorInfo) at this step (guarded: whether the
        step guard may overrule the planner; not in a traced graph, whose routes are fixed;
        factorable: whether it may travel as low-rank factors, which need a name to keep
        their warm start by)."""
        if self.passes_through(info):
            return Plan(PASS)
        small = info.size is not None and info.size < max(self.planner.pipeline.min_size, 1)
        if self.hierarchical:  # small tensors: Horovod's flat allreduce, on every rank alike
            return Plan(PASS if small else HIERARCHICAL)
        arm = self.guard.kind(key, info.size or 0) if guarded and self.guard is not None \
            else None
        shape = info.shape if factorable else None
        sparse = arm == SPARSE and info.size is not None and \
            self.planner.sparse(key, info.size, shape)
        if sparse:
            return sparse
        if arm == LEAN:
            return self.planner.lean(key, shape)
        if arm not in (None, SPARSE):
            return Plan(arm, None, arm)
        if info.size is None:  # a traced graph's shape known only at run time: the allgather,
            return Plan(ALLGATHER)  # its codec chosen when the graph runs
        return self.planner.plan(key, info.size, True, shape=shape)


class FixedPlanner:
    """Every compressible tensor goes through the pipeline's codec, by allgather (also for
    collective="auto": without costs there is nothing to weigh) or the sparse allreduce."""

    def __init__(self, pipeline, collective=ALLGATHER):
        self.pipeline = pipeline
        self.kind = SPARSE_ALLREDUCE if collective == SPARSE_ALLREDUCE else ALLGATHER

    def plan(self, name, size, is_float, kinds=None, shape=None):
        if kinds is None and (not is_float or size < max(self.pipeline.min_size, 1)):
            return Plan(PASS)
        return Plan(kinds[0] if kinds else self.kind, self.pipeline.codec, "fixed")

    def observe(self, name, plan, measured):
        pass

    def report(self):
        return {}

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass


class _TensorState:
    __slots__ = ("step", "measured", "last", "choice", "predicted", "ranked", "k", "k_measured",
                 "explore_start", "explore_order", "dims")

    def __init__(self):
        self.step = 0
        self.measured = {}   # label -> {"encode": [s], "decode": [s], "bytes": [n]}
        self.last = None     # label of the previous step's option
        self.choice = None
        self.predicted = {}
        self.ranked = None   # options by predicted time; None: to be recomputed
        self.k = None        # the selection count the ranking was predicted for
        self.k_measured = None  # the selection count the measurements were taken at
        self.explore_start = None  # the step its exploration began at
        self.explore_order = ()    # the candidates it tries then, in turn
        self.dims = None  # (rows, cols) where low-rank factors of it are worth sending


class TimePlanner:
    """Least predicted time per tensor among dense allreduce (fp32, fp16) and sparse candidates.

    links: {"allreduce": LinkModel, "allgather": LinkModel, and optionally "allreduce_fp16"
    (Horovod's fp16 allreduce measured on its own: on a CPU, summing halves can cost more than
    the bytes it saves)}; ranks: how many ranks exchange payloads; priors: {label: Costs} from
    calibrate_cpu (agreed across ranks); candidates: the sparse (index, value) pairs;
    allow_fp16: whether dense tensors may travel as fp16 (value codecs may be lossy). Every
    dense tensor of a job uses one dtype: fp16 when allowed and predicted faster on a large
    tensor, else fp32. collective: how sparse payloads travel: "allgather", "sparse_allreduce"
    (comm/sparse_allreduce.py; its options are labelled "sar:<pair>") or "auto", both from
    SPARSE_ALLREDUCE_MIN_RANKS on.
    """

    def __init__(self, pipeline, links, ranks, priors, candidates, allow_fp16=True,
                 warm_steps=WARM_STEPS, explore_steps=STEPS_PER_CANDIDATE, revisit=REVISIT,
                 collective=ALLGATHER):
        self.pipeline, self.links, self.ranks, self.priors = pipeline, links, ranks, priors
        kinds = {ALLGATHER: (ALLGATHER,), SPARSE_ALLREDUCE: (SPARSE_ALLREDUCE,),
                 "auto": SPARSE_KINDS if ranks >= SPARSE_ALLREDUCE_MIN_RANKS else (ALLGATHER,)
                 }[collective]
        self.candidates, self.kind_of, self.pair_of = {}, {}, {}
        for kind in kinds:
            for i, v in candidates:
                pair = option_label(i, v)
                label = pair if kind == ALLGATHER else f"sar:{pair}"
                self.candidates[label] = SparseCodec(index=i, value=v)
                self.kind_of[label], self.pair_of[label] = kind, pair
        self.fallback = SparseCodec(*FALLBACK)
        self.allow_fp16, self.warm_steps = allow_fp16, warm_steps
        self.explore_steps, self.revisit = explore_steps, revisit
        self._tensors = {}
        self._lean = None  # the names the lean arm factors (None: to be found again)
        large = 1 << 22
        self.dense = ALLREDUCE if not allow_fp16 else min(
            (ALLREDUCE_FP16, ALLREDUCE), key=lambda label: self._predict(label, large, 0, {}))

    @property
    def settled_after(self):
        """The step by which every tensor has explored its candidates (if it does)."""
        warm = max(self.warm_steps, self.pipeline.warmup_steps)
        return warm + self.explore_steps * len(self.candidates)

    def use_dense(self, kind):
        """Every dense tensor of the plan takes `kind` from now on (the step guard's verdict
        of whole steps, comm/step_guard.py); True where a tensor the plan sent dense changes."""
        if kind == self.dense or kind not in (ALLREDUCE, ALLREDUCE_FP16) or \
                kind == ALLREDUCE_FP16 and not self.allow_fp16:
            return False
        old, self.dense = self.dense, kind
        for state in self._tensors.values():
            state.ranked = None
        return any(state.choice == old for state in self._tensors.values())

    def _predict(self, label, n, k, measured, dims=None):
        """Predicted seconds for one option on a tensor of n elements with k selected (dims:
        the matrix low-rank factors would factor)."""
        prior = self.priors[self.pair_of.get(label, label)]
        if label in (ALLREDUCE, ALLREDUCE_FP16):
            return prior.encode_fixed + prior.encode_per_element * n + self.wire(label, n)
        seen = measured.get(label, {})
        if label == LOWRANK:  # two dependent allreduces, each a cycle of its own
            link, rank = self.links["allreduce"], self.pipeline.factors.rank
            encode = min(seen["encode"]) if "encode" in seen else \
                prior.encode_fixed + prior.encode_per_element * n
            decode = min(seen["decode"]) if "decode" in seen else \
                prior.decode_fixed + prior.decode_per_element * n
            return encode + decode + sum(link.allreduce(4 * rank * d, self.ranks) for d in dims)
        nbytes = min(seen["bytes"]) if "bytes" in seen else 64 + prior.bits_per_selected * k / 8
        if "bytes" in seen and self.pipeline.count_unknown:  # the count it was measured to send
            k = min(k, 8 * nbytes / max(prior.bits_per_selected, 1e-9))
        encode = min(seen["encode"]) if "encode" in seen else (
            prior.encode_fixed + prior.encode_per_element * n + prior.encode_per_selected * k)
        link = self.links["allgather"]
        if self.kind_of[label] == SPARSE_ALLREDUCE:  # pieces of ~k/P to each owner, ~k/P back
            decode = min(seen["decode"]) if "decode" in seen else (   # from each: ~2k decoded
                2 * prior.decode_fixed + 2 * prior.decode_per_payload_selected * k)
            return encode + 2 * link.allgather(nbytes / self.ranks, self.ranks) + decode
        decode = min(seen["decode"]) if "decode" in seen else (
            prior.decode_fixed + (self.ranks - 1) * prior.decode_per_payload_selected * k)
        return encode + link.allgather(nbytes, self.ranks) + decode

    def wire(self, label, n):
        """Seconds the calibrated link takes to allreduce n elements by Horovod's allreduce
        (label: fp32 or fp16), fused with the others: bytes, no latency."""
        link = self.links.get("allreduce_fp16" if label == ALLREDUCE_FP16 else "allreduce",
                              self.links["allreduce"])
        return link.allreduce(n * self.priors[label].bits_per_selected / 8, self.ranks) - link.latency

    def _options(self, size, kinds=None):
        dense = [self.dense]
        if size < max(self.pipeline.min_size, 1) and not set(kinds or ()) & set(SPARSE_KINDS):
            return dense
        return dense + list(self.candidates)

    def plan(self, name, size, is_float, kinds=None, shape=None):
        """The option with the least predicted time (kinds: restrict to these kinds, as a
        traced TensorFlow graph must keep the kind it was traced with), or low-rank factors
        where _factored prefers them (shape: the tensor's, where it may be factored)."""
        if not is_float or size == 0:
            return Plan(PASS)
        state = self._tensors.setdefault(name, _TensorState())
        k = self.pipeline.selection_count(size, name)  # the warm-up and critical phases move it
        if state.ranked is None or state.k != k:  # else predictions change only with measurements
            state.k = k
            if state.k_measured and not 1 / DRIFT <= k / state.k_measured <= DRIFT:
                state.k_measured = None  # costs of another density: priors (factors' stay)
                state.measured = {label: seen for label, seen in state.measured.items()
                                  if label == LOWRANK}
            options = [label for label in self._options(size, kinds) if kinds is None or
                       self.kind_of.get(label, label) in kinds]
            if not options:
                raise DeepReduceError(f"no option of kind {kinds} for a tensor of {size} elements")
            state.predicted = {label: self._predict(label, size, k, state.measured)
                               for label in options}
            state.ranked = sorted(options, key=lambda label: (state.predicted[label], label))
        factored = self._factored(state, size, shape) if kinds is None else None
        best = factored or self._explore(state) or state.ranked[0]
        if LOWRANK in (best, state.choice) and best != state.choice:
            self._lean = None  # the lean arm's matrices are the plan's largest factored
        state.choice = best
        state.step += 1
        if best == LOWRANK:
            return Plan(LOWRANK, None, LOWRANK)
        if best == ALLREDUCE:
            return Plan(ALLREDUCE, None, best)
        if best == ALLREDUCE_FP16:
            return Plan(ALLREDUCE_FP16, None, best)
        return Plan(self.kind_of[best], self.candidates[best], best, self.fallback)

    def sparse(self, name, size, shape=None):
        """The Plan of the compressed option for a tensor now (the step guard's sparse arm;
        no exploration): low-rank factors for a matrix worth factoring, else the sparse
        option predicted fastest; None where it is too small to go sparse."""
        if size < max(self.pipeline.min_size, 1):
            return None
        state = self._tensors.setdefault(name, _TensorState())
        if self._factored(state, size, shape) is not None:
            return Plan(LOWRANK, None, LOWRANK)
        k = self.pipeline.selection_count(size, name)
        best = min(self.candidates, key=lambda label: (
            self._predict(label, size, k, state.measured), label))
        return Plan(self.kind_of[best], self.candidates[best], best, self.fallback)

    def lean(self, name, shape):
        """The Plan of a tensor in the step guard's lean arm: factors where the plan factors it
        and it is among the plan's largest factored matrices, those that hold half the
        elements it factors (by size, then name: the same on every rank); Horovod's fp32
        allreduce for every other tensor (shape: None where it may not be factored)."""
        if self._lean is None:
            factored = sorted(((state.dims[0] * state.dims[1], key)
                               for key, state in self._tensors.items()
                               if state.choice == LOWRANK and state.dims is not None),
                              key=lambda matrix: (-matrix[0], matrix[1]))
            half, held, self._lean = sum(size for size, _ in factored) / 2, 0, set()
            for size, key in factored:
                if held >= half:
                    break
                held += size
                self._lean.add(key)
        if shape is not None and name in self._lean:
            return Plan(LOWRANK, None, LOWRANK)
        return Plan(ALLREDUCE, None, ALLREDUCE)

    def _factored(self, state, size, shape):
        """For a matrix whose low-rank factors are worth sending (compression/lowrank.py):
        the factors or Horovod's dense allreduce, whichever is predicted faster once the
        factors' rounds are measured in the job (until then the factors: calibrated while
        other ranks used the cores, their prior was 10-20x their cost, and the wide MLP's
        first epoch went dense); None for any other tensor. Accuracy before time: a sparse
        option is not weighed for such a matrix even where it is predicted faster. On the
        wide MLP top-k at 1% lagged dense training by epochs; rank-4 factors reached dense's
        accuracy in the same epochs (README, "Low-rank factors for matrices"). The shape
        comes with each plan (None: the tensor may not be factored)."""
        rank = self.pipeline.factors.rank
        dims = matrix_shape(shape) if worth_factoring(shape, rank) else None
        if dims != state.dims:
            state.dims, self._lean = dims, None
        if state.dims is None or LOWRANK not in self.priors:
            return None
        state.predicted[LOWRANK] = self._predict(LOWRANK, size, 0, state.measured, state.dims)
        dense = state.predicted[self.dense] = self._predict(self.dense, size, 0, {})
        measured = "encode" in state.measured.get(LOWRANK, {})
        return LOWRANK if state.predicted[LOWRANK] <= dense or not measured else self.dense

    def _contenders(self, state):
        """The sparse options worth measuring, best predicted first: all of them where one
        leads, else those within EXPLORE_MARGIN of the dense option that leads, and, while none
        is measured yet, every one when the count selected is unknown before it is sent (the
        threshold sparsifier: its prior prices every element, as if the whole tensor were
        sent; the first measurement tells whether sending it sparse can pay)."""
        sparse = [label for label in state.ranked if label in self.candidates]
        leader = state.ranked[0]
        if leader in self.candidates:
            return sparse
        if self.pipeline.count_unknown and not state.measured:
            return sparse
        return [label for label in sparse
                if state.predicted[label] <= EXPLORE_MARGIN * state.predicted[leader]]

    def _explore(self, state):
        """The candidate to measure at this step, or None. From the first step past the warm
        ones and the density warm-up with a contender, each contender in candidate order for
        explore_steps steps; then once every `revisit` steps the best contender that is not
        the choice. (Measured during the warm-up, a codec is timed at densities the job then
        leaves: at 25% a slow candidate's turn costs seconds, and its figures are dropped.)"""
        contenders = self._contenders(state)
        if state.explore_start is None:
            warm = max(self.warm_steps, self.pipeline.warmup_steps)
            if state.step < warm or not contenders:
                return None
            state.explore_start = state.step
            state.explore_order = tuple(label for label in self.candidates if label in contenders)
        since = state.step - state.explore_start
        explored = self.explore_steps * len(state.explore_order)
        while since < explored:
            label = state.explore_order[since // self.explore_steps]
            if label in contenders and not self._outrun(state, label):
                return label
            state.explore_start -= self.explore_steps - since % self.explore_steps
            since = state.step - state.explore_start
        others = [label for label in contenders if label != state.ranked[0]]
        if others and (since - explored) % self.revisit == self.revisit - 1:
            return others[0]
        return None

    def _outrun(self, state, label):
        """Whether a contender already measured is predicted more than EXPLORE_MARGIN times
        slower than the best measured one or the dense option: its remaining exploration
        steps are skipped (a slow codec tried for its full turn costs more than its
        measurement is worth)."""
        best = [state.predicted[other] for other in state.explore_order
                if other in state.measured and other in state.predicted]
        if self.dense in state.predicted:  # absent where a traced graph allows sparse kinds only
            best.append(state.predicted[self.dense])
        return label in state.measured and label in state.predicted and \
            state.predicted[label] > EXPLORE_MARGIN * min(best)

    def observe(self, name, plan, measured):
        """After a step: for a sparse one, what it cost (Measured: every rank's encode time
        and bytes for this step, and its decode time of the previous step; identical inputs
        on every rank); for factors, the ranks' mean encode and decode of their last step."""
        state = self._tensors.get(name)
        if state is not None and plan.kind == LOWRANK:  # the last step's costs (none at first)
            seen = state.measured.setdefault(LOWRANK, {})
            for key, seconds in (("encode", measured.encode_s), ("decode", measured.decode_s)):
                if seconds > 0:
                    _record(seen, key, seconds)
            state.last = plan.label
            return
        if state is None or plan.kind not in SPARSE_KINDS:
            if state is not None:
                state.last = plan.label
            return
        state.ranked, state.k_measured = None, state.k_measured or state.k
        seen = state.measured.setdefault(plan.label, {})
        _record(seen, "encode", measured.encode_s)
        _record(seen, "bytes", measured.nbytes)
        if state.last in self.candidates and measured.decode_s:
            _record(state.measured.setdefault(state.last, {}), "decode", measured.decode_s)
        state.last = plan.label

    def state_dict(self):
        """Every tensor's step, measurements and last choice (plain Python values)."""
        return {name: {"step": s.step, "last": s.last, "choice": s.choice,
                       "k_measured": s.k_measured, "explore_start": s.explore_start,
                       "explore_order": list(s.explore_order),
                       "dims": None if s.dims is None else list(s.dims),
                       "measured": {label: {key: list(values) for key, values in m.items()}
                                    for label, m in s.measured.items()}}
                for name, s in self._tensors.items()}

    def load_state_dict(self, state):
        self._tensors, self._lean = {}, None
        for name, saved in state.items():
            s = self._tensors[name] = _TensorState()
            s.step, s.last, s.choice = int(saved["step"]), saved["last"], saved["choice"]
            s.k_measured = saved["k_measured"]
            s.explore_start = saved.get("explore_start")
            s.explore_order = tuple(saved.get("explore_order", ()))
            dims = saved.get("dims")
            s.dims = None if dims is None else (int(dims[0]), int(dims[1]))
            for label, measured in saved["measured"].items():
                for key, values in measured.items():
                    for value in values:
                        _record(s.measured.setdefault(label, {}), key, float(value))

    def report(self):
        """Per tensor: the option chosen last, and the predicted seconds of every option."""
        return {name: {"choice": state.choice, "steps": state.step,
                       "predicted_ms": {k: round(1e3 * v, 3) for k, v in state.predicted.items()},
                       "measured": {label: {key: min(values) for key, values in m.items()}
                                    for label, m in state.measured.items()}}
                for name, state in self._tensors.items()}


def _record(record, key, value):
    """Append a measurement (the slowest rank's, every rank the same) to its window."""
    record.setdefault(key, collections.deque(maxlen=WINDOW)).append(value)


def parse_bandwidth(value):
    """bandwidth= as bits per second (a number, or a string like "1gbit", "100mbit")."""
    if value is None:
        return None
    if isinstance(value, str):
        text = value.strip().lower()
        for suffix, scale in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3), ("bit", 1.0)):
            if text.endswith(suffix):
                try:
                    return float(text[:-len(suffix)]) * scale
                except ValueError:
                    break
        raise DeepReduceError(f"bandwidth must be bits/s or like '1gbit', not {value!r}")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value <= 0:
        raise DeepReduceError(f"bandwidth must be a positive number of bits/s, not {value!r}")
    return float(value)
