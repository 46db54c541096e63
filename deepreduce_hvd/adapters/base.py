"""What a framework supplies to the framework-neutral communicator (comm/communicator.py).

The communicator decides how every tensor travels and runs the codecs on numpy arrays; an
adapter gives it the framework's side of that: what a tensor is (TensorInfo), running a numpy
function on tensors (`host_call`: a plain call in PyTorch, a `tf.numpy_function` op in a
TensorFlow graph), Horovod's collectives on a process set, and error feedback with selection
on the tensor's own device (`device_path`). Collectives return handles that `wait` resolves:
Horovod's async handles in PyTorch, the result tensor itself in TensorFlow (whose graph
orders the ops).
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, NamedTuple, Optional, Sequence, Tuple

_ADDED_SETS = {}  # ranks -> the process set DeepReduce added for them (Horovod refuses twins)


class TensorInfo(NamedTuple):
    """What routing needs to know about a tensor, at compress (or trace) time."""
    size: Optional[int]            # elements; None: known only when a traced graph runs
    shape: Optional[Tuple[int, ...]]
    dtype: str                     # numpy name of the values its payloads carry
    is_float: bool
    sparse_layout: bool            # a sparse tensor (torch sparse, tf.IndexedSlices): passed through
    itemsize: int
    on_device: bool                # held by an accelerator rather than the host


class Adapter:
    """The framework's side of the communicator; every method is implemented by a subclass."""

    # ---- tensors ----
    def info(self, tensor: Any) -> TensorInfo:
        raise NotImplementedError

    def host_call(self, fn: Callable, inputs: Sequence[Any], dtype: str, like: Any = None,
                  out: Any = None) -> Any:
        """fn(*inputs as numpy arrays) -> numpy array, as a framework tensor of `dtype` with
        the static shape and device of `like` (else a 1-D result). `out`: a framework tensor whose
        numpy view fn writes its result into (passed as fn's `out=`), returned as the result."""
        raise NotImplementedError

    def output_buffer(self, tensor: Any, in_place: bool) -> Any:
        """`tensor` itself where the reduced result may be written straight into it, else None."""
        return None

    def dims(self, tensor: Any) -> Any:
        """The tensor's shape as an int64 tensor (known when the graph runs)."""
        raise NotImplementedError

    def finish(self, total: Any, like: Any) -> Any:
        """The reduced float32 `total` in the shape, dtype and device of `like`."""
        raise NotImplementedError

    def scaled(self, total: Any, reduced: Any) -> Any:
        """total times the one-element reduced placeholder."""
        raise NotImplementedError

    def cast(self, tensor: Any, like: Any) -> Any:
        """tensor in the dtype of `like`."""
        raise NotImplementedError

    def as_float32(self, tensor: Any) -> Any:
        raise NotImplementedError

    def one(self) -> Any:
        """A one-element float32 tensor holding 1."""
        raise NotImplementedError

    def as_frame(self, frame: Any) -> Any:
        """A device path's frame (bytes, or a graph's uint8 tensor) as a uint8 tensor."""
        return frame

    # ---- running now or when the graph runs ----
    def eagerly(self):
        """A context in which collectives and Python run now, also while a graph is traced."""
        return contextlib.nullcontext()

    def traced(self) -> bool:
        """Whether compress is being traced into a graph (its work then runs at every step)."""
        return False

    def at_run_time(self, fn: Callable[[], None]) -> None:
        """Call fn now, or every time the traced graph runs."""
        fn()

    # ---- a traced graph's choice at run time (only adapters that trace implement these) ----
    def per_graph(self, key: str, make: Callable[[], Any]) -> Any:
        """make()'s tensor, made once per graph being traced (the same for every call in it)."""
        raise NotImplementedError

    def switch(self, index: Any, branches: Sequence[Callable[[], Any]]) -> Any:
        """The outputs of branches[index](), chosen when the graph runs by the one-element
        int32 `index`; only the chosen branch's ops run."""
        raise NotImplementedError

    def flat(self, tensor: Any) -> Any:
        """tensor as one dimension."""
        raise NotImplementedError

    def no_bytes(self) -> Any:
        """An empty uint8 tensor."""
        raise NotImplementedError

    # ---- process sets (hvd: the framework's horovod module) ----
    hvd: Any = None

    def global_set(self) -> Any:
        return self.hvd.global_process_set

    def set_ranks(self, process_set: Any) -> Tuple[int, ...]:
        return tuple(process_set.ranks or range(self.hvd.size()))

    def set_size(self, process_set: Any) -> int:
        return process_set.size()

    def set_id(self, process_set: Any) -> int:
        return process_set.process_set_id

    def inverse_size(self, process_set: Any) -> Any:
        """The placeholder handed to Horovod's allreduce: one float32 holding 1/size (read
        when the graph runs, so an elastic job's new size counts)."""
        raise NotImplementedError

    def rank(self) -> int:
        return self.hvd.rank()

    def host_placement(self) -> Tuple[int, int]:
        """(rank, the first rank of this rank's host)."""
        return self.hvd.rank(), self.hvd.rank() - self.hvd.local_rank()

    def add_process_set(self, ranks: Sequence[int]) -> Any:
        """Horovod's add_process_set(ranks), or the set added for the same ranks before (every
        DeepReduce of a job shares the hosts' sets; after an elastic reset they are added anew)."""
        ranks = tuple(ranks)
        try:
            _ADDED_SETS[ranks] = self.hvd.add_process_set(list(ranks))
        except ValueError:
            if ranks not in _ADDED_SETS:
                raise
        return _ADDED_SETS[ranks]

    # ---- collectives (handles resolved by wait) ----
    def allgather(self, tensor: Any, name: str, process_set: Any) -> Any:
        raise NotImplementedError

    def allreduce_sum(self, tensor: Any, name: str, process_set: Any) -> Any:
        raise NotImplementedError

    def alltoall(self, tensor: Any, splits: Any, name: str, process_set: Any) -> Any:
        """Horovod's alltoall: splits[j] (int32) elements of `tensor` go to the set's j-th
        rank; wait -> (what every rank sent this one, in rank order; the received splits)."""
        raise NotImplementedError

    def broadcast(self, tensor: Any, root: int, name: str, process_set: Any) -> Any:
        raise NotImplementedError

    def wait(self, handle: Any) -> Any:
        return handle

    def ready(self, handle: Any) -> bool:
        """Whether `wait(handle)` would return at once (False where a framework cannot tell:
        the handle is then waited for when its result is needed)."""
        return False

    # ---- blocking collectives, run eagerly (calibration, agreement, topology) ----
    def time_allreduce(self, elements: int, half: bool, process_set: Any, name: str) -> float:
        """Seconds for Horovod's allreduce of `elements` zeros (float16 if half)."""
        raise NotImplementedError

    def time_allgather(self, elements: int, process_set: Any, name: str) -> float:
        raise NotImplementedError

    def broadcast_object(self, obj: Any, process_set: Any, name: str) -> Any:
        """obj of the set's first rank, on every rank of the set."""
        return self.hvd.broadcast_object(obj, root_rank=min(self.set_ranks(process_set)),
                                         name=name, process_set=process_set)

    def allgather_numbers(self, values: Sequence[float], process_set: Any, name: str) -> Any:
        """Every rank's `values` (float64), a (ranks, len(values)) numpy array in rank order."""
        raise NotImplementedError

    # ---- error feedback on the device, and checkpoints ----
    def device_path(self, pipeline: Any) -> Any:
        """Compensation and selection on the tensor's device for this pipeline (see
        adapters/torch_device.py, adapters/tf_device.py)."""
        raise NotImplementedError

    def export_array(self, array: Any) -> Any:
        """A state array (numpy, or a device buffer) as the framework checkpoints it."""
        raise NotImplementedError

    def import_array(self, value: Any) -> Any:
        """A checkpointed array back as a float32 numpy array."""
        raise NotImplementedError

    def assign(self, buffer: Any, array: Any) -> bool:
        """Copy a restored array into a framework buffer in use; whether it did."""
        return False


class DevicePathBase:
    """Compensation, selection and the residual update of one Pipeline as framework ops on
    the tensor's device (adapters/torch_device.py, adapters/tf_device.py): top-k and threshold
    selection; random-k and "none" use the host path."""

    def __init__(self, pipeline: Any) -> None:
        self.pipeline = pipeline

    def supports(self) -> bool:
        return self.pipeline.sparsifier in ("topk", "threshold")
