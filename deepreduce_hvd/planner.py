"""Which way each tensor travels: by least predicted time (the default), or always sparse.

For every tensor the time-aware planner compares Horovod's own allreduce of the (error-
compensated) tensor in fp32 or fp16 with a sparse allgather through each candidate codec
pair, predicting for each option

    encode on the sender + the bytes over the link + decoding P payloads on each receiver.

The link model (latency and bandwidth of allreduce and allgather) comes from a short
calibration with the job's own collectives, or from `bandwidth=`; CPU costs start from a
calibration on this host and are replaced by the costs measured in the job: every frame carries
its sender's encode time and last decode time, and the payload sizes are in the frames too.
Each sparse candidate is tried for two steps before the planner settles (`explore_steps`).

Every input to a decision is identical on every rank (calibrations are agreed once, the
measurements arrive in the allgathered frames, step counters advance together), and so is every
decision: a tensor never goes to an allgather on one rank and an allreduce on another.
"""
import math
import time
from typing import NamedTuple, Optional

import numpy as np

from .codec import SparseCodec
from .errors import DeepReduceError

ALLREDUCE, ALLREDUCE_FP16, ALLGATHER, PASS = "allreduce", "allreduce_fp16", "allgather", "pass"
SPARSE_CANDIDATES = (("golomb", "fp16"), ("entropy", "entropy"), ("golomb", "entropy"),
                     ("entropy", "fp16"))
EXACT_CANDIDATES = (("golomb", "raw"), ("entropy", "raw"))
STEPS_PER_CANDIDATE = 2
SMOOTHING = 0.5  # weight of a new measurement in the running estimate


class Plan(NamedTuple):
    """How one tensor travels this step: kind is "allreduce", "allreduce_fp16", "allgather"
    (with codec) or "pass" (unchanged, uncompressed); label names the option in stats."""
    kind: str
    codec: Optional[SparseCodec] = None
    label: str = ""


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


def _fit_line(points):
    """(intercept, slope) through two (x, seconds) points, both non-negative."""
    (x0, y0), (x1, y1) = points
    slope = max((y1 - y0) / (x1 - x0), 0.0)
    return max(y0 - slope * x0, 0.0), slope


def calibrate_cpu(pipeline, candidates, sizes=(1 << 14, 1 << 20), repeats=3):
    """Costs of each option on this host, from a synthetic gradient (normal values): for the
    sparse candidates, compress and decompress at two sizes; for the dense options, the
    compensation and fp16 cast. -> {label: Costs}."""
    from .compressor import Pipeline  # a scratch pipeline, so the job's residuals stay clean
    rng = np.random.default_rng(0)
    grads = {n: rng.standard_normal(n).astype(np.float32) for n in sizes}
    config = pipeline.get_config()
    costs = {}

    def best(fn):
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            out = fn()
            times.append(time.perf_counter() - start)
        return min(times), out

    for index, value in candidates:
        scratch = Pipeline(**{**config, "index": index, "value": value, "memory": "residual"})
        enc, dec, bits = [], [], []
        for n in sizes:
            seconds, frame = best(lambda: scratch.compress(f"calibration.{n}", grads[n]))
            enc.append((n, seconds))
            dec.append((n, best(lambda: scratch.decompress(frame, (n,), "float32", 1))[0]))
            k = max(scratch.selection_count(n), 1)
            bits.append(8 * len(frame) / k)
        k_large = max(scratch.selection_count(sizes[1]), 1)
        enc_fixed, enc_slope = _fit_line(enc)
        dec_fixed, dec_slope = _fit_line(dec)
        costs[option_label(index, value)] = Costs(enc_fixed, enc_slope, 0.0, dec_fixed, 0.0,
                                          dec_slope * sizes[1] / k_large, bits[1])
    scratch = Pipeline(**{**config, "memory": "residual"})
    for label, half in ((ALLREDUCE, False), (ALLREDUCE_FP16, True)):
        points = [(n, best(lambda: scratch.compress_dense(f"calibration.{n}", grads[n], half))[0])
                  for n in sizes]
        scratch.memory.reset()
        fixed, slope = _fit_line(points)
        costs[label] = Costs(fixed, slope, 0.0, 0.0, 0.0, 0.0, 16.0 if half else 32.0)
    return costs


class FixedPlanner:
    """Every compressible tensor goes through the pipeline's codec (sparse allgather)."""

    def __init__(self, pipeline):
        self.pipeline = pipeline

    def plan(self, name, size, is_float, kinds=None):
        if not self.pipeline.compresses(size, is_float):
            return Plan(PASS)
        return Plan(ALLGATHER, self.pipeline.codec, "fixed")

    def observe(self, name, plan, received, decode_s):
        pass

    def report(self):
        return {}


class _TensorState:
    __slots__ = ("step", "measured", "last", "choice", "predicted")

    def __init__(self):
        self.step = 0
        self.measured = {}   # label -> {"encode": s, "decode": s, "bytes": n}
        self.last = None     # label of the previous step's option
        self.choice = None
        self.predicted = {}


class TimePlanner:
    """Least predicted time per tensor among dense allreduce (fp32, fp16) and sparse candidates.

    link: LinkModel; ranks: how many ranks exchange payloads; priors: {label: Costs} from
    calibrate_cpu (agreed across ranks); candidates: the sparse (index, value) pairs;
    allow_fp16: whether the dense fp16 allreduce is an option (value codecs may be lossy).
    """

    def __init__(self, pipeline, link, ranks, priors, candidates, allow_fp16=True,
                 explore_steps=STEPS_PER_CANDIDATE):
        self.pipeline, self.link, self.ranks, self.priors = pipeline, link, ranks, priors
        self.candidates = {option_label(i, v): SparseCodec(index=i, value=v) for i, v in candidates}
        self.allow_fp16, self.explore_steps = allow_fp16, explore_steps
        self._tensors = {}

    def _predict(self, label, n, k, measured):
        """Predicted seconds for one option on a tensor of n elements with k selected."""
        prior = self.priors[label]
        if label in (ALLREDUCE, ALLREDUCE_FP16):
            cpu = prior.encode_fixed + prior.encode_per_element * n
            return cpu + self.link.allreduce(n * prior.bits_per_selected / 8, self.ranks)
        seen = measured.get(label)
        if seen and "bytes" in seen:
            nbytes = seen["bytes"]
        else:
            nbytes = 64 + prior.bits_per_selected * k / 8
        encode = seen["encode"] if seen and "encode" in seen else (
            prior.encode_fixed + prior.encode_per_element * n)
        decode = seen["decode"] if seen and "decode" in seen else (
            prior.decode_fixed + self.ranks * prior.decode_per_payload_selected * k)
        return encode + self.link.allgather(nbytes, self.ranks) + decode

    def _options(self, size):
        dense = [ALLREDUCE] + ([ALLREDUCE_FP16] if self.allow_fp16 else [])
        if size < max(self.pipeline.min_size, 1):
            return dense
        return dense + list(self.candidates)

    def plan(self, name, size, is_float, kinds=None):
        """The option with the least predicted time (kinds: restrict to these kinds, as a
        traced TensorFlow graph must keep the kind it was traced with)."""
        if not is_float or size == 0:
            return Plan(PASS)
        state = self._tensors.setdefault(name, _TensorState())
        k = self.pipeline.selection_count(size)
        options = [label for label in self._options(size)
                   if kinds is None or (ALLGATHER if label in self.candidates else label) in kinds]
        if not options:
            raise DeepReduceError(f"no option of kind {kinds} for a tensor of {size} elements")
        state.predicted = {label: self._predict(label, size, k, state.measured) for label in options}
        best = min(options, key=lambda label: (state.predicted[label], label))
        sparse = [label for label in options if label in self.candidates]
        exploring = state.step // self.explore_steps
        if best in self.candidates and exploring < len(sparse):
            best = sparse[exploring]  # try each candidate before settling
        state.choice = best
        state.step += 1
        if best == ALLREDUCE:
            return Plan(ALLREDUCE, None, best)
        if best == ALLREDUCE_FP16:
            return Plan(ALLREDUCE_FP16, None, best)
        return Plan(ALLGATHER, self.candidates[best], best)

    def observe(self, name, plan, received, decode_s):
        """After a sparse step: every rank's encode time and payload size for this step, and
        its decode time of the previous step (identical inputs on every rank)."""
        state = self._tensors.get(name)
        if state is None or plan.kind != ALLGATHER:
            if state is not None:
                state.last = plan.label
            return
        seen = state.measured.setdefault(plan.label, {})
        _blend(seen, "encode", max(frame.encode_s for frame in received))
        _blend(seen, "bytes", float(np.mean([len(frame.payload) for frame in received])))
        if state.last in self.candidates and any(frame.decode_s for frame in received):
            _blend(state.measured.setdefault(state.last, {}), "decode",
                   max(frame.decode_s for frame in received))
        state.last = plan.label

    def report(self):
        """Per tensor: the option chosen last, and the predicted seconds of every option."""
        return {name: {"choice": state.choice, "steps": state.step,
                       "predicted_ms": {k: round(1e3 * v, 3) for k, v in state.predicted.items()},
                       "measured": {label: dict(m) for label, m in state.measured.items()}}
                for name, state in self._tensors.items()}


def _blend(record, key, value):
    record[key] = value if key not in record else (
        SMOOTHING * value + (1 - SMOOTHING) * record[key])


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
