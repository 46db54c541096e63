"""What the PyTorch and TensorFlow compressors share: configuration, the planner, names, stats.

A framework wrapper subclasses `DeepReduceBase` and supplies four collectives on its process
set (`_broadcast_object`, `_time_allreduce`, `_time_allgather`, `_set_size`); everything
else, including the calibration that the time-aware planner starts from, is here.
"""
from __future__ import annotations

import sys
import warnings
from typing import Any, NamedTuple, Optional, Union

from ..codecs.choice import is_auto
from ..codecs.sparse_codec import CodecSpec
from ..compression.pipeline import Pipeline
from ..errors import DeepReduceError
from .planner import (EXACT_CANDIDATES, SPARSE_CANDIDATES, FixedPlanner, LinkModel, TimePlanner,
                      calibrate_cpu, parse_bandwidth)

OBJECTIVES = ("time", "bytes")
_CALIBRATIONS = {}  # (process set id, size, config) -> (link models, priors): once per process


class DeepReduceBase:
    """Sparsify, encode and allgather gradients (see the framework modules for the mechanics).

    Keyword arguments:
      sparsifier: "topk" (default), "randomk", "threshold" or "none"; ratio (0.01), threshold.
      index, value: codec ids or configs (see deepreduce_hvd.SparseCodec); "auto" (the default
        for both) lets the planner choose per tensor; value {"id": "auto", "max_error": e}
        bounds the relative L2 error of lossy value codecs (default 0.05).
      memory: "residual" (error feedback, the default) or None.
      min_size: tensors with fewer elements are never sparsified (default 1000).
      warmup_steps: density warm-up: each tensor starts at 25% density, decaying
        geometrically to `ratio` over this many steps (default 0: off; see Pipeline).
      objective: "time" (default): with an "auto" codec, each tensor takes the way with the
        least predicted time, Horovod's own fp32 or fp16 allreduce included; "bytes": the
        smallest payload every time.
      bandwidth: the link's bits per second (a number or "1gbit", "100mbit"); by default it is
        measured once with the job's own collectives.
      process_set: the Horovod process set the gradients are reduced over (default: the
        optimizer's or allreduce's own, else the global set).
      seed: for random-k.
    """

    def __init__(self, sparsifier: str = "topk", ratio: float = 0.01, threshold: float = 0.0,
                 index: CodecSpec = "auto", value: CodecSpec = "auto", arrangement: str = "auto",
                 memory: Optional[str] = "residual", min_size: int = 1000, seed: int = 0,
                 objective: str = "time", bandwidth: Union[None, float, str] = None,
                 process_set: Any = None, warmup_steps: int = 0, **unknown: Any) -> None:
        if unknown:
            raise DeepReduceError(f"DeepReduce got unknown options {sorted(unknown)}")
        if objective not in OBJECTIVES:
            raise DeepReduceError(f"objective must be one of {OBJECTIVES}, not {objective!r}")
        self.pipeline = Pipeline(sparsifier=sparsifier, ratio=ratio, threshold=threshold,
                                 index=index, value=value, arrangement=arrangement, memory=memory,
                                 min_size=min_size, seed=seed, warmup_steps=warmup_steps)
        self.objective, self.bandwidth = objective, parse_bandwidth(bandwidth)
        self.process_set = process_set
        self.time_aware = objective == "time" and (is_auto(index) or is_auto(value))
        self._index, self._value = index, value
        self._planner = None
        self._warned_unnamed = False

    # ---- planning ----
    def candidates(self):
        """The sparse (index, value) pairs the time-aware planner chooses among."""
        config = self.pipeline.codec.get_config()
        max_error = config["value"].get("max_error", 0.05) if is_auto(self._value) else None
        if is_auto(self._value):
            values = ["raw"] if max_error == 0 else ["fp16", {"id": "entropy",
                                                              "max_error": 0.8 * max_error}]
        else:
            values = [self._value]
        indices = ["golomb", "entropy"] if is_auto(self._index) else [self._index]
        return [(i, v) for i in indices for v in values]

    def planner(self, process_set=None):
        """The planner (built, and for the time-aware mode calibrated, on first use)."""
        if self._planner is None:
            if not self.time_aware:
                self._planner = FixedPlanner(self.pipeline)
            else:
                links, priors = self._calibration(process_set)
                lossy = not self.pipeline.codec.lossless
                self._planner = TimePlanner(self.pipeline, links, self._set_size(process_set),
                                            priors, self.candidates(), allow_fp16=lossy)
        return self._planner

    def _calibration(self, process_set):
        """Link models and CPU priors, measured once per process and agreed across ranks
        (rank 0's numbers are broadcast), so every rank predicts the same."""
        size = self._set_size(process_set)
        key = (id(process_set), size, repr(self.candidates()), self.bandwidth,
               repr(self.pipeline.get_config()))
        if key not in _CALIBRATIONS:
            priors = calibrate_cpu(self.pipeline, self.candidates())
            if self.bandwidth is not None:
                link = LinkModel(latency=1e-4, bandwidth=self.bandwidth / 8)
                links = {"allreduce": link, "allgather": link}
            else:
                links = self._measure_links(process_set, size)
            _CALIBRATIONS[key] = self._broadcast_object((links, priors), process_set)
        return _CALIBRATIONS[key]

    def _measure_links(self, process_set, size, small=1 << 10, repeats=3, long_enough=0.03,
                       largest=1 << 23):
        """Latency and bandwidth of allreduce and allgather from timed collectives: a small one,
        and one grown until it takes `long_enough` seconds (so a link's burst allowance does
        not pass for its rate); the median of a few tries each."""
        links = {}
        for kind, timer, moved in (
                ("allreduce", self._time_allreduce, lambda n: 2 * (size - 1) / size * 4 * n),
                ("allreduce_fp16", lambda n, s, name: self._time_allreduce(n, s, name, half=True),
                 lambda n: 2 * (size - 1) / size * 2 * n),
                ("allgather", self._time_allgather, lambda n: (size - 1) * 4 * n)):
            def median_time(n):
                return sorted(timer(n, process_set, f"{kind}.{n}.{i}") for i in range(repeats))[repeats // 2]
            small_time = median_time(small)
            large = small * 16
            large_time = self._agree_max(median_time(large), process_set)
            while large_time < long_enough and large < largest:  # agreed times: every rank
                large *= 8                                       # runs the same collectives
                large_time = self._agree_max(median_time(large), process_set)
            links[kind] = LinkModel.fit((max(moved(small), 1.0), small_time),
                                        (moved(large), large_time))
        return links

    # ---- names ----
    def _warn_unnamed(self):
        if self.pipeline.memory is not None and not self._warned_unnamed:
            self._warned_unnamed = True
            warnings.warn("DeepReduce: a compressed tensor has no name, so it gets no error "
                          "feedback (residual memory). Name it: pass named_parameters to the "
                          "optimizer and call compression.name_parameters(...), or give "
                          "hvd.allreduce a name=.", RuntimeWarning, stacklevel=3)

    # ---- stats ----
    def stats(self) -> dict[str, Any]:
        """bytes_sent, dense_bytes, ratio, tensors_compressed, tensors_allreduced,
        tensors_passed_through, tensors_nonfinite, encode_s, decode_s (this rank, since the
        last reset) and, in the time-aware mode, "tensors": each tensor's choice with the
        predicted and measured costs behind it."""
        out = self.pipeline.stats.as_dict()
        if self.time_aware:  # empty before the first step, and on hierarchical non-leaders
            out["tensors"] = self._planner.report() if self._planner is not None else {}
        return out

    def reset_stats(self) -> None:
        self.pipeline.stats.reset()

    # ---- what a framework supplies ----
    def _set_size(self, process_set):
        raise NotImplementedError

    def _broadcast_object(self, obj, process_set):
        raise NotImplementedError

    def _agree_max(self, value, process_set):
        """The largest of every rank's value (a float), identical on every rank."""
        raise NotImplementedError

    def _time_allreduce(self, elements, process_set, name, half=False):
        """Seconds for Horovod's allreduce of `elements` zeros (float16 if half, else float32)."""
        raise NotImplementedError

    def _time_allgather(self, elements, process_set, name):
        raise NotImplementedError


class Caller(NamedTuple):
    """What compress learns about the Horovod call that invoked it."""
    name: Optional[str] = None
    process_set: object = None
    optimizer: bool = False  # a DistributedOptimizer reducing a gradient (in place)
    member: Optional[int] = None  # the tensor's position in a grouped allreduce


def horovod_caller(compression, tensor, depth=2, limit=16):
    """The Horovod call that invoked `compression.compress(tensor)`, read from its frames: the
    optimizer's parameter name and process set (torch: `_allreduce_grad_async` and the grouped
    path), or the `name=` and `process_set=` given to hvd.allreduce / grouped_allreduce (and
    the tensor's position in a group). Up to `limit` frames are searched, since TensorFlow's
    autograph puts its own frames in between.

    This reads Horovod 0.28's private frames; explicit names (name_parameters, named) take
    precedence, and a missing name is warned about when error feedback is on."""
    try:
        frame = sys._getframe(depth)
    except ValueError:
        return Caller()
    for _ in range(limit):
        if frame is None:
            break
        local = frame.f_locals
        if "p" in local:  # torch optimizer, or the comprehension of its grouped path
            for owner_frame in (frame, frame.f_back):
                holder = owner_frame.f_locals.get("self") if owner_frame else None
                names = getattr(holder, "_parameter_names", None)
                if names is not None:
                    return Caller(names.get(local["p"]), getattr(holder, "process_set", None), True)
        if local.get("compression") is compression and ("name" in local or "process_set" in local):
            name = local.get("name")
            group = local.get("tensors", local.get("tensor_list"))
            member = next((i for i, t in enumerate(group or ()) if t is tensor), None)
            if isinstance(name, str) and member is not None:
                name = f"{name}.{member}"
            return Caller(name if isinstance(name, str) else None, local.get("process_set"),
                          member=member)
        frame = frame.f_back
    return Caller()
