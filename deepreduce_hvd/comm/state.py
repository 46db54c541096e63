"""The state behind a compressor's traffic: one SetState per process set, checkpointable.

Everything a step depends on lives here, not in module globals: per set, the pipeline's
residuals, per-tensor steps and codec random state; the planner's calibration, measurements
and choices; the step guard's schedule and verdict; the hosts of the hierarchical mode.
`state_dict` gives plain values and arrays (`torch.save`-able, or packed to bytes for a
TensorFlow checkpoint) and `load_state_dict` puts them back, so a restored job continues bit
for bit as if it had never stopped.
"""
from __future__ import annotations

import io
import json
from typing import Any, Callable, Optional

import numpy as np

from ..compression.pipeline import Pipeline
from ..errors import DeepReduceError
from .planner import Costs, LinkModel
from .sparse_allreduce import Ranges

FORMAT = 1
GLOBAL = "global"


def map_arrays(value: Any, fn: Callable[[Any], Any]) -> Any:
    """`value` with fn applied to every array in it (dicts and lists walked, plain values kept)."""
    if isinstance(value, dict):
        return {k: map_arrays(v, fn) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [map_arrays(v, fn) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return fn(value)


def set_key(ranks, is_global):
    """A process set's name in the state: "global", or its ranks ("ranks:0,2")."""
    return GLOBAL if is_global else "ranks:" + ",".join(map(str, ranks))


class SetState:
    """What the traffic of the tensors reduced over one process set depends on.

    pipeline: residuals, per-tensor steps and the codec's random state (compression.Pipeline).
    policy: how each tensor travels (comm.planner.Policy, with its step guard), built and
      calibrated on first use.
    calibration: (links, priors, ranks) agreed across the set's ranks when it was measured.
    hierarchy: the hosts and their process sets (the hierarchical mode, global set only).
    device: the pipeline's device path (adapters), made on first use.
    traced_kinds: how each tensor travels in a traced (TensorFlow) graph, fixed at tracing.
    graphs_unguarded: whether the step guard stays out of traced graphs (after an elastic
      reset: the graphs traced before it hold the guard of before).
    ranges: each tensor's split into the ranks' ranges for the sparse allreduce.
    """

    def __init__(self, pipeline: Pipeline):
        self.pipeline = pipeline
        self.policy = None
        self.calibration = None
        self.hierarchy = None
        self.device = None
        self.saved_planner = None  # a restored planner state, applied when the policy is built
        self.saved_guard = None    # and the step guard's
        self.traced_kinds = {}     # key -> the kind a traced graph fixed for that tensor
        self.graphs_unguarded = False
        self.ranges = Ranges()

    def reset_routing(self):
        """Forget everything measured about the world (an elastic job's ranks changed): the
        next step calibrates again and every rank starts the planner afresh, together."""
        self.policy = self.calibration = self.hierarchy = self.saved_planner = None
        self.saved_guard = None
        self.ranges = Ranges()

    def state_dict(self, export: Callable[[Any], Any]) -> dict:
        planner = self.policy.planner.state_dict() if self.policy is not None else self.saved_planner
        guard = self.policy.guard.state_dict() if self.policy is not None and \
            self.policy.guard is not None else self.saved_guard
        pipeline = map_arrays(self.pipeline.state_dict(), export)
        calibration = None
        if self.calibration is not None:
            links, priors, ranks = self.calibration
            calibration = {"links": {k: list(v) for k, v in links.items()},
                           "priors": {k: list(v) for k, v in priors.items()}, "ranks": ranks}
        return {"pipeline": pipeline, "planner": planner, "guard": guard,
                "calibration": calibration, "ranges": self.ranges.state_dict()}

    def load_state_dict(self, state: dict, to_numpy: Callable[[Any], np.ndarray],
                        assign: Optional[Callable] = None) -> None:
        self.pipeline.load_state_dict(map_arrays(state["pipeline"], to_numpy), assign)
        self.policy = self.hierarchy = None
        self.saved_planner, self.saved_guard = state["planner"], state.get("guard")
        self.ranges.load_state_dict(state.get("ranges", {}))
        saved = state["calibration"]
        self.calibration = None if saved is None else (
            {k: LinkModel(*v) for k, v in saved["links"].items()},
            {k: Costs(*v) for k, v in saved["priors"].items()}, int(saved["ranks"]))


def check_state(state: Any, config: dict) -> dict:
    """The sets of a state_dict made by a compressor of this config, or DeepReduceError."""
    if not isinstance(state, dict) or state.get("format") != FORMAT or "sets" not in state:
        raise DeepReduceError("not a DeepReduce state_dict (or one of another version)")
    if state.get("config") != config:
        raise DeepReduceError(f"the state was saved by a DeepReduce with config {state.get('config')}, "
                              f"not {config}")
    return state["sets"]


def pack(state: dict) -> bytes:
    """A state_dict (numpy arrays inside plain values) as bytes: JSON for the structure, the
    arrays in an .npz beside it (no pickle, so loading cannot run code)."""
    arrays = []

    def strip(value):
        if isinstance(value, np.ndarray):
            arrays.append(value)
            return {"__array__": len(arrays) - 1}
        if isinstance(value, dict):
            return {"__dict__": [[strip(k), strip(v)] for k, v in value.items()]}
        if isinstance(value, (list, tuple)):
            return [strip(v) for v in value]
        return value

    text = json.dumps(strip(state)).encode()
    buffer = io.BytesIO()
    np.savez(buffer, *arrays)
    return len(text).to_bytes(8, "little") + text + buffer.getvalue()


def unpack(data: bytes) -> dict:
    """The state_dict that pack() made; DeepReduceError for anything else."""
    try:
        data = bytes(data)
        length = int.from_bytes(data[:8], "little")
        tree = json.loads(data[8:8 + length].decode())
        with np.load(io.BytesIO(data[8 + length:]), allow_pickle=False) as npz:
            arrays = [npz[f"arr_{i}"] for i in range(len(npz.files))]
    except Exception as exc:  # noqa: BLE001 - only DeepReduceError leaves the API
        raise DeepReduceError(f"not a packed DeepReduce state: {type(exc).__name__}: {exc}") from exc

    def build(value):
        if isinstance(value, dict):
            if "__array__" in value:
                return arrays[value["__array__"]]
            return {build(k): build(v) for k, v in value["__dict__"]}
        if isinstance(value, list):
            return [build(v) for v in value]
        return value

    try:
        return build(tree)
    except (KeyError, IndexError, TypeError) as exc:
        raise DeepReduceError(f"corrupted packed DeepReduce state: {exc}") from exc
