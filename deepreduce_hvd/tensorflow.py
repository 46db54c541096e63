"""TensorFlow 2: DeepReduce as a `horovod.tensorflow` compression (Horovod 0.28.1, unpatched).

    tape = hvd.DistributedGradientTape(tape, compression=DeepReduce(sparsifier="topk",
                                       ratio=0.01, index="bloom", value="qsgd"))
    opt = horovod.tensorflow.keras.DistributedOptimizer(opt, compression=DeepReduce(...))

Works eagerly and inside tf.function: encoding and decoding run as `tf.numpy_function` ops
around the shared numpy core, and the payload travels through Horovod's TF allgather op. As in
the PyTorch wrapper, the allreduce Horovod performs only carries a one-element placeholder
holding 1/size, whose reduced value is the factor the decoded sum needs (hvd.Average,
hvd.Sum, gradient_predivide_factor). Payloads are the same bytes as PyTorch's.

Residual memory is keyed by the name Horovod was given or, in graph mode, by the gradient
tensor's graph name (stable across steps of one traced function); eager tensors without a
name get no error feedback. Passed through unchanged: tensors below `min_size` elements,
integer tensors and tf.IndexedSlices (Horovod allgathers those itself).

Keras: Horovod 0.28.1 predates Keras 3, so use tf-keras (`pip install tf-keras`, and
`TF_USE_LEGACY_KERAS=1` before importing TensorFlow) with
`horovod.tensorflow.keras.DistributedOptimizer`. Keras 3 variables break Horovod's own
DistributedGradientTape; for Keras 3 models take gradients with a plain tf.GradientTape and
reduce them with `allreduce_gradients` below, then apply them with the Keras optimizer.
"""
import sys

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf
from horovod.tensorflow.compression import Compressor

from .compressor import PipelineOwner


def _given_name():
    """The `name` argument of the Horovod allreduce that called compress, if any."""
    frame = sys._getframe(2)  # 0: here, 1: DeepReduce.compress, 2: Horovod's caller
    for _ in range(2):
        if frame is None:
            return None
        local = frame.f_locals
        if "compression" in local and "name" in local:
            return local["name"] if isinstance(local["name"], str) else None
        frame = frame.f_back
    return None


def allreduce_gradients(gradients, variables, compression, op=hvd.Average):
    """Reduce a list of gradients with `hvd.allreduce`, named after their variables (so
    residual memory is per variable in eager mode too). Works for Keras 3 variables, which
    Horovod 0.28.1's DistributedGradientTape cannot handle; None gradients stay None."""
    return [None if g is None else
            hvd.allreduce(g, op=op, compression=compression,
                          name="DeepReduce.grad." + getattr(v, "path", v.name).replace(":", "_"))
            for g, v in zip(gradients, variables)]


class DeepReduce(PipelineOwner, Compressor):
    """Sparsify, encode and allgather gradients; see the module docstring. Keyword arguments
    configure the `deepreduce_hvd.Pipeline` (sparsifier, ratio, index, value, memory, ...)."""

    def compress(self, tensor):
        size = tensor.shape.num_elements()
        if (isinstance(tensor, tf.IndexedSlices) or size is None
                or not self.pipeline.compresses(size, tensor.dtype.is_floating)):
            self._count_passed_through(size or 0, tensor.dtype.size)
            return tensor, None
        key = _given_name() or (None if tf.executing_eagerly() else tensor.name)
        pipeline = self.pipeline

        def encode(dense):
            return np.frombuffer(pipeline.compress(key, dense), dtype=np.uint8)

        payload = tf.numpy_function(encode, [tensor], tf.uint8, stateful=True)
        payload.set_shape([None])
        gathered = hvd.allgather(payload)
        placeholder = tf.fill([1], tf.constant(1.0 / hvd.size(), tf.float32))
        return placeholder, (gathered, tensor.shape, tensor.dtype)

    def decompress(self, tensor, ctx):
        if ctx is None:
            return tensor
        gathered, shape, dtype = ctx
        pipeline, ranks = self.pipeline, hvd.size()
        dtype_name = dtype.as_numpy_dtype().dtype.name

        def decode(frames, scale):
            total = pipeline.decompress(frames, tuple(shape), dtype_name, ranks)
            return total * scale[0]

        out = tf.numpy_function(decode, [gathered, tensor], tf.float32, stateful=True)
        return tf.cast(tf.reshape(out, shape), dtype)

    def _count_passed_through(self, size, itemsize):
        if tf.executing_eagerly():
            self.pipeline.passed_through(size, itemsize)
            return

        def count():
            self.pipeline.passed_through(size, itemsize)
            return np.int32(0)

        tf.numpy_function(count, [], tf.int32, stateful=True)  # runs each step (stateful op)
