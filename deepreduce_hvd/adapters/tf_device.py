"""The TensorFlow wrapper's device path: error feedback and selection as TF ops inside the graph
(on the gradient's device, a GPU included), so that only the selected values and positions go
through the numpy function that encodes them, and only the delivered values come back.

Residuals are tf.Variables of the gradient's shape (created once per name, outside any traced
function), kept in the pipeline's ResidualMemory. The selection rule and the float32
compensation are the core's, so for the same input the payload bytes equal the numpy path's.
"""
import numpy as np
import tensorflow as tf

from .base import DevicePathBase


def topk_positions(magnitude, k):
    """Ascending positions of the k largest magnitudes, lower positions first among ties;
    k: an int, or an int32 scalar tensor known when the graph runs (k >= 1)."""
    n = tf.size(magnitude, out_type=tf.int64)
    if isinstance(k, int) and k == 0:
        return tf.zeros([0], tf.int64)
    kth = tf.reduce_min(tf.math.top_k(magnitude, k, sorted=False).values)
    above = tf.reshape(tf.where(magnitude > kth), [-1])
    ties = tf.reshape(tf.where(tf.equal(magnitude, kth)), [-1])
    ties = ties[:k - tf.size(above)]
    return tf.cond(tf.equal(n, tf.cast(k, tf.int64)), lambda: tf.range(n),
                   lambda: tf.sort(tf.concat([above, ties], 0)))


class DevicePath(DevicePathBase):
    """Compensation, selection and the residual update of one Pipeline, as TF ops."""

    def _compensated(self, name, tensor):
        """(flat float32 compensated gradient, residual variable or None)."""
        grad = tf.cast(tensor, tf.float32)
        memory = self.pipeline.memory if name is not None else None
        if memory is None:
            return tf.reshape(grad, [-1]), None
        with tf.init_scope():
            residual = memory.buffer(name, tuple(tensor.shape), zeros=lambda shape: tf.Variable(
                tf.zeros(shape, tf.float32), trainable=False, name="deepreduce_residual"),
                adopt=lambda array: tf.Variable(array, trainable=False, name="deepreduce_residual"))
        return tf.reshape(residual.assign_add(grad), [-1]), residual

    def compress(self, name, tensor, choose_codec):
        """A uint8 payload-frame tensor (as Pipeline.compress gives for the same gradient and
        residual); choose_codec(size) -> (codec, fallback) is called when the graph runs."""
        pipeline = self.pipeline
        shape, dtype = tuple(tensor.shape), tensor.dtype.as_numpy_dtype().dtype.name
        compensated, residual = self._compensated(name, tensor)
        finite = tf.reduce_all(tf.math.is_finite(compensated))
        magnitude = tf.abs(compensated)
        if pipeline.sparsifier == "topk":
            size = int(np.prod(shape))
            k = pipeline.selection_count(size, name)
            if pipeline.warmup_steps:  # the count changes with the step: read when the graph runs
                k = tf.numpy_function(lambda: np.int32(pipeline.selection_count(size, name)),
                                      [], tf.int32, stateful=True)
                k.set_shape([])
            positions = topk_positions(magnitude, k)
        else:
            positions = tf.reshape(tf.where(magnitude > pipeline.threshold), [-1])
        values = tf.gather(compensated, positions)

        def encode(values, positions, finite):
            codec, fallback = choose_codec(int(np.prod(shape)))
            if not finite:
                frame, encoded = pipeline.encode_selected(None, None, shape, dtype, name)
            else:
                frame, encoded = pipeline.encode_selected(values, positions, shape, dtype, name,
                                                          codec, fallback)
            if encoded is None:
                return np.frombuffer(frame, np.uint8), np.zeros(0, np.int64), np.zeros(0, np.float32)
            return (np.frombuffer(frame, np.uint8), np.asarray(encoded.positions, np.int64),
                    np.asarray(encoded.values, np.float32))

        frame, delivered_at, delivered = tf.numpy_function(
            encode, [values, positions, finite], [tf.uint8, tf.int64, tf.float32], stateful=True)
        frame.set_shape([None])
        if residual is None:
            return frame
        flat = tf.reshape(residual, [-1])
        updated = tf.cond(finite,
                          lambda: tf.tensor_scatter_nd_sub(flat, delivered_at[:, None], delivered),
                          lambda: tf.zeros_like(flat))
        with tf.control_dependencies([residual.assign(tf.reshape(updated, shape))]):
            return tf.identity(frame)

    def compress_dense(self, name, tensor, half):
        """A tensor for Horovod's own allreduce, compensated in the graph (fp16 if `half`, the
        residual keeping what the cast lost)."""
        compensated, residual = self._compensated(name, tensor)
        sent = tf.cast(compensated, tf.float16 if half else tf.float32)
        count = tf.numpy_function(lambda size: self._count(size, 2 if half else 4, name),
                                  [tf.size(sent)], tf.int64, stateful=True)
        updates = [count]
        if residual is not None:
            kept = compensated - tf.cast(sent, tf.float32) if half else tf.zeros_like(compensated)
            kept = tf.where(tf.reduce_all(tf.math.is_finite(kept)), kept, tf.zeros_like(kept))
            updates.append(residual.assign(tf.reshape(kept, tensor.shape)))
        with tf.control_dependencies(updates):
            return tf.reshape(tf.identity(sent), tensor.shape)

    def _count(self, size, itemsize, name):
        self.pipeline.count_dense(int(size) * itemsize, int(size), 0.0, name)
        return np.int64(0)

