"""TensorFlow 2: DeepReduce as a `horovod.tensorflow` compression (Horovod 0.28.1, unpatched).

    tape = hvd.DistributedGradientTape(tape, compression=DeepReduce())
    opt = horovod.tensorflow.keras.DistributedOptimizer(opt, compression=DeepReduce())

Works eagerly and inside tf.function. The framework-neutral communicator
(deepreduce_hvd.comm.communicator) decides per tensor how it travels, as in PyTorch; its
encoding and decoding run as `tf.numpy_function` ops and payloads travel through Horovod's TF
collectives (adapters/tf_adapter.py). Inside a traced function the way a tensor travels is
chosen when the function is traced (the graph's structure is fixed then; a gradient whose
shape is known only at run time, as Horovod's sparse_as_dense makes them, takes the
allgather); the codec of a sparse tensor is still chosen at every step, and the step guard
(comm/step_guard.py) may still send every tensor traced sparse by Horovod's fp32 allreduce:
both ways are in the graph, and one op per step picks one for all of them. Payloads are the
same bytes as PyTorch's, and the hierarchical mode works here too.

Residual memory and the planner are keyed by the name Horovod was given (`allreduce_gradients`
below names them after their variables) or, in a graph, the gradient tensor's graph name
(stable across steps of one traced function; Horovod's DistributedGradientTape traces its
allreduce, so its gradients are named too). Passed through unchanged: integer tensors and
tf.IndexedSlices (Horovod allgathers those itself).

Checkpoints: DeepReduce is trackable: `tf.train.Checkpoint(model=..., optimizer=...,
compression=compression)` saves and restores this rank's residuals, steps and planner state
(save on every rank). Elastic jobs: `KerasState(model, optimizer, compression=compression)` in place of
`hvd.elastic.TensorFlowKerasState`.

Keras: Horovod 0.28.1 predates Keras 3, so use tf-keras (`pip install tf-keras`, and
`TF_USE_LEGACY_KERAS=1` before importing TensorFlow) with
`horovod.tensorflow.keras.DistributedOptimizer`. Keras 3 variables break Horovod's own
DistributedGradientTape; for Keras 3 models take gradients with a plain tf.GradientTape and
reduce them with `allreduce_gradients` below, then apply them with the Keras optimizer.
"""
from __future__ import annotations

from typing import Any, Optional, Tuple

import horovod.tensorflow as hvd
import tensorflow as tf
from horovod.tensorflow.compression import Compressor

from .adapters.horovod_frames import horovod_caller
from .adapters.tf_adapter import TFAdapter
from .comm.base import DeepReduceBase
from .comm.communicator import Flight
from .comm.elastic import ElasticHandler
from .comm.state import pack, unpack


def allreduce_gradients(gradients, variables, compression, op=hvd.Average,
                        process_set=hvd.global_process_set):
    """Reduce a list of gradients with `hvd.allreduce`, named after their variables (so
    residual memory is per variable in eager mode too). Works for Keras 3 variables, which
    Horovod 0.28.1's DistributedGradientTape cannot handle; None gradients stay None."""
    return [None if g is None else
            hvd.allreduce(g, op=op, compression=compression, process_set=process_set,
                          name="DeepReduce.grad." + getattr(v, "path", v.name).replace(":", "_"))
            for g, v in zip(gradients, variables)]


class DeepReduce(DeepReduceBase, Compressor, tf.train.experimental.PythonState):
    """A horovod.tensorflow compression; see the module docstring. Keyword arguments: those
    of deepreduce_hvd.comm.config.Options (sparsifier, ratio, index, value, memory,
    min_size, objective, bandwidth, process_set, device_path, hierarchical, warmup_steps,
    adaptive_density, momentum, momentum_masking, local_clip_norm, collective, lowrank, energy,
    seed)."""

    def __init__(self, **options: Any) -> None:
        super().__init__(TFAdapter(), **options)

    @tf.autograph.experimental.do_not_convert
    def compress(self, tensor: tf.Tensor) -> Tuple[tf.Tensor, Optional[Flight]]:
        caller = horovod_caller(self, tensor)
        name = caller.name or (None if tf.executing_eagerly() else tensor.name)
        return self.comm.compress(tensor, caller._replace(name=name))

    @tf.autograph.experimental.do_not_convert
    def decompress(self, tensor: tf.Tensor, ctx: Optional[Flight]) -> tf.Tensor:
        return self.comm.decompress(tensor, ctx)

    # tf.train.Checkpoint: the state travels as one packed string (no pickle)
    def serialize(self) -> bytes:
        return pack(self.state_dict())

    def deserialize(self, string_value: bytes) -> None:
        self.load_state_dict(unpack(string_value))


class KerasState(hvd.elastic.TensorFlowKerasState):
    """hvd.elastic.TensorFlowKerasState that also commits DeepReduce's state with the model,
    rolls it back with the model after a failure and agrees it again after a reset."""

    def __init__(self, model, optimizer=None, *, compression: DeepReduce, **kwargs):
        self._compression = ElasticHandler(compression)
        super().__init__(model, optimizer, **kwargs)

    def save(self):
        super().save()
        self._compression.save()

    def restore(self):
        super().restore()
        self._compression.restore()

    def sync(self):
        super().sync()
        self._compression.sync()
