"""TensorFlow 2: DeepReduce as a `horovod.tensorflow` compression (Horovod 0.28.1, unpatched).

    tape = hvd.DistributedGradientTape(tape, compression=DeepReduce())
    opt = horovod.tensorflow.keras.DistributedOptimizer(opt, compression=DeepReduce())

Works eagerly and inside tf.function: encoding and decoding run as `tf.numpy_function` ops
around the shared numpy core, and payloads travel through Horovod's TF allgather on the
caller's process set. As in the PyTorch wrapper, the planner picks per tensor between
Horovod's own allreduce (fp32 or fp16) and a sparse allgather whose allreduced one-element
placeholder carries the factor the decoded sum needs (hvd.Average, hvd.Sum,
gradient_predivide_factor). Inside a traced function that choice is made when the function
is traced (the graph's structure is fixed then; a gradient whose shape is known only at run
time, as Horovod's sparse_as_dense makes them, takes the allgather); the codec of a sparse
tensor is still chosen at every step. Payloads are the same bytes as PyTorch's.

Residual memory and the planner are keyed by the name Horovod was given or, in a graph, the
gradient tensor's graph name (stable across steps of one traced function; Horovod's
DistributedGradientTape traces its allreduce, so its gradients are named too). Passed through
unchanged: integer tensors and tf.IndexedSlices (Horovod allgathers those itself).

Keras: Horovod 0.28.1 predates Keras 3, so use tf-keras (`pip install tf-keras`, and
`TF_USE_LEGACY_KERAS=1` before importing TensorFlow) with
`horovod.tensorflow.keras.DistributedOptimizer`. Keras 3 variables break Horovod's own
DistributedGradientTape; for Keras 3 models take gradients with a plain tf.GradientTape and
reduce them with `allreduce_gradients` below, then apply them with the Keras optimizer.
"""
from __future__ import annotations

import itertools
import time
from typing import Any, Optional, Tuple, Union

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf
from horovod.tensorflow.compression import Compressor

from .adapters.tf_device import DevicePath
from .comm.base import DeepReduceBase, horovod_caller
from .comm.planner import ALLGATHER, ALLREDUCE_FP16, PASS, Plan
from .errors import DeepReduceError

_AGREEMENTS = itertools.count()


def allreduce_gradients(gradients, variables, compression, op=hvd.Average,
                        process_set=hvd.global_process_set):
    """Reduce a list of gradients with `hvd.allreduce`, named after their variables (so
    residual memory is per variable in eager mode too). Works for Keras 3 variables, which
    Horovod 0.28.1's DistributedGradientTape cannot handle; None gradients stay None."""
    return [None if g is None else
            hvd.allreduce(g, op=op, compression=compression, process_set=process_set,
                          name="DeepReduce.grad." + getattr(v, "path", v.name).replace(":", "_"))
            for g, v in zip(gradients, variables)]


class DeepReduce(DeepReduceBase, Compressor):
    """A horovod.tensorflow compression; see the module docstring. Keyword arguments are
    those of deepreduce_hvd.comm.base.DeepReduceBase (sparsifier, ratio, index, value, memory,
    min_size, objective, bandwidth, process_set, seed), and:

      device_path: where error feedback and selection run. "auto" (default): as TF ops in the
        graph when TensorFlow has a GPU (only the selected values and positions reach the numpy
        encoder); on CPU-only hosts, in the native engine. True: TF ops always (top-k and
        threshold; random-k, "none" and shapes unknown until run time use the host); False.
    """

    def __init__(self, device_path: Union[str, bool] = "auto", hierarchical: bool = False,
                 **config: Any) -> None:
        if device_path not in ("auto", True, False):
            raise DeepReduceError(f"device_path must be 'auto', True or False, not {device_path!r}")
        if hierarchical is not False:
            raise DeepReduceError("hierarchical mode is implemented in deepreduce_hvd.torch only")
        super().__init__(**config)
        self.device_path = device_path
        self._device = DevicePath(self.pipeline)

    @tf.autograph.experimental.do_not_convert
    def compress(self, tensor: tf.Tensor) -> Tuple[tf.Tensor, Optional[tuple]]:
        caller = horovod_caller(self, tensor)
        name, process_set = caller.name, self._process_set(caller.process_set)
        size = tensor.shape.num_elements()  # None: known only when the graph runs
        if isinstance(tensor, tf.IndexedSlices) or not tensor.dtype.is_floating or size == 0:
            self._count_passed_through(size or 0, tensor.dtype.size)
            return tensor, None
        eager = tf.executing_eagerly()
        name = name or (None if eager else tensor.name)
        key = name if name is not None else \
            f"unnamed:{tuple(tensor.shape)}:{tensor.dtype.name}:{caller.member}"
        with tf.init_scope():  # calibration (once) runs eagerly, also while tracing
            planner = self.planner(process_set)
        # a shape unknown until run time (sparse_as_dense in a graph) takes the allgather,
        # its codec chosen when the graph runs
        plan = planner.plan(key, size, True) if size is not None else Plan(ALLGATHER)
        if plan.kind == PASS:
            self._count_passed_through(size, tensor.dtype.size)
            return tensor, None
        if name is None:
            self._warn_unnamed()
        pipeline, ranks = self.pipeline, self._set_size(process_set)
        on_device = self._on_device(tensor, plan)
        if plan.kind != ALLGATHER:
            half = plan.kind == ALLREDUCE_FP16
            if on_device:
                return self._device.compress_dense(name, tensor, half), ("dense", tensor.dtype)
            sent = tf.numpy_function(lambda dense: pipeline.compress_dense(name, dense, half),
                                     [tensor], tf.float16 if half else tf.float32, stateful=True)
            sent.set_shape(tensor.shape)
            return sent, ("dense", tensor.dtype)
        plans = {}

        def choose(size):
            step = plan if eager and plan.codec is not None else \
                planner.plan(key, size, True, kinds=(ALLGATHER,))
            plans["current"] = step
            return step.codec, step.fallback

        if on_device:
            payload = self._device.compress(name, tensor, choose)
        else:
            def encode(dense):
                codec, fallback = choose(dense.size)
                return np.frombuffer(pipeline.compress(name, dense, codec, fallback), np.uint8)

            payload = tf.numpy_function(encode, [tensor], tf.uint8, stateful=True)
            payload.set_shape([None])
        gathered = hvd.allgather(payload, process_set=process_set)
        placeholder = tf.fill([1], tf.constant(1.0 / ranks, tf.float32))
        return placeholder, ("sparse", gathered, tensor.shape, tf.shape(tensor), tensor.dtype,
                             key, plans, ranks)

    @tf.autograph.experimental.do_not_convert
    def decompress(self, tensor: tf.Tensor, ctx: Optional[tuple]) -> tf.Tensor:
        if ctx is None:
            return tensor
        if ctx[0] == "dense":
            return tf.cast(tensor, ctx[1])
        _, gathered, static_shape, shape, dtype, key, plans, ranks = ctx
        pipeline, planner = self.pipeline, self.planner()
        dtype_name = dtype.as_numpy_dtype().dtype.name

        def decode(frames, scale, dims):
            start = time.perf_counter()
            total, received = pipeline.decompress(frames, tuple(int(d) for d in dims), dtype_name,
                                                  ranks, key, scale=float(scale[0]))
            planner.observe(key, plans["current"], received, time.perf_counter() - start)
            return total

        out = tf.numpy_function(decode, [gathered, tensor, shape], tf.float32, stateful=True)
        out = tf.cast(tf.reshape(out, shape), dtype)
        out.set_shape(static_shape)
        return out

    def _on_device(self, tensor, plan):
        """Whether this tensor is compensated and selected with TF ops in the graph."""
        if not tensor.shape.is_fully_defined():
            return False
        if self.device_path == "auto":
            wanted = "GPU" in (tensor.device or "") or bool(tf.config.list_logical_devices("GPU"))
        else:
            wanted = bool(self.device_path)
        return wanted and (plan.kind != ALLGATHER or self._device.supports())

    def _process_set(self, caller_set):
        if caller_set is None:
            return self.process_set or hvd.global_process_set
        if self.process_set is not None and caller_set.process_set_id != self.process_set.process_set_id:
            raise DeepReduceError(
                f"DeepReduce(process_set={self.process_set.process_set_id}) was handed a tensor "
                f"reduced over process set {caller_set.process_set_id}; give both the same set")
        return caller_set

    def _count_passed_through(self, size, itemsize):
        if tf.executing_eagerly():
            self.pipeline.passed_through(size, itemsize)
            return

        def count():
            self.pipeline.passed_through(size, itemsize)
            return np.int32(0)

        tf.numpy_function(count, [], tf.int32, stateful=True)  # runs each step (stateful op)

    # ---- collectives for calibration (run eagerly) ----
    def _set_size(self, process_set):
        return (process_set or self.process_set or hvd.global_process_set).size()

    def _broadcast_object(self, obj, process_set):
        process_set = process_set or hvd.global_process_set
        root = min(process_set.ranks) if process_set.ranks else 0
        return hvd.broadcast_object(obj, root_rank=root, name="DeepReduce.calibration",
                                    process_set=process_set)

    def _agree_max(self, value, process_set):
        values = hvd.allgather(tf.constant([float(value)], tf.float64),
                               name=f"DeepReduce.agree.{next(_AGREEMENTS)}",
                               process_set=process_set or hvd.global_process_set)
        return float(tf.reduce_max(values).numpy())

    def _time_allreduce(self, elements, process_set, name, half=False):
        tensor = tf.zeros([elements], tf.float16 if half else tf.float32)
        start = time.perf_counter()
        hvd.allreduce(tensor, name=f"DeepReduce.calibrate.{name}",
                      process_set=process_set or hvd.global_process_set).numpy()
        return time.perf_counter() - start

    def _time_allgather(self, elements, process_set, name):
        tensor = tf.zeros([elements], tf.float32)
        start = time.perf_counter()
        hvd.allgather(tensor, name=f"DeepReduce.calibrate.{name}",
                      process_set=process_set or hvd.global_process_set).numpy()
        return time.perf_counter() - start
