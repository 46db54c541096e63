"""TensorFlow's side of the communicator: the numpy work as `tf.numpy_function` ops (run when
the step runs, eagerly or in a traced graph), Horovod's TF collectives as ops, and the device
path of adapters/tf_device.py. A graph's sizes are read when it runs (hvd.size_op), so an
elastic job's new world size counts without retracing.

Collectives get explicit names: without one, Horovod names a graph's op after its input
tensor, and ranks whose graphs differ (a host's leader encodes and decodes, the other ranks do
not) would wait for each other's differently named ops forever. The names keep Horovod's own
prefixes (HorovodAllgather_...), by which `hvd.elastic.run` recognises a failed collective.
"""
from __future__ import annotations

import re
import time
import weakref

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf
from tensorflow.python.ops.control_flow_v2_func_graphs import ControlFlowFuncGraph

from .base import Adapter, TensorInfo
from .tf_device import DevicePath


def op_name(name):
    """A collective's name as TensorFlow accepts an op name (the same on every rank), with
    no "/": Horovod keys a collective whose name scope it ignores by the name's last part,
    so "grads/a/MatMul" and "grads/b/MatMul" would be one collective."""
    return re.sub(r"[^A-Za-z0-9_.\-]", "_", name)


class TFAdapter(Adapter):
    hvd = hvd

    def __init__(self):
        self._per_graph = weakref.WeakKeyDictionary()  # graph -> {key: tensor made once in it}

    def info(self, tensor):
        size = tensor.shape.num_elements()
        return TensorInfo(size, tuple(tensor.shape) if size is not None else None,
                          tensor.dtype.as_numpy_dtype().dtype.name if tensor.dtype.is_floating else
                          tensor.dtype.name, tensor.dtype.is_floating,
                          isinstance(tensor, tf.IndexedSlices), tensor.dtype.size,
                          "GPU" in (tensor.device or "") or bool(tf.config.list_logical_devices("GPU")))

    def host_call(self, fn, inputs, dtype, like=None, out=None):
        result = tf.numpy_function(fn, list(inputs), tf.as_dtype(dtype), stateful=True)
        result.set_shape(like.shape if like is not None else [None])
        return result

    def dims(self, tensor):
        return tf.shape(tensor, out_type=tf.int64)

    def finish(self, total, like):
        out = tf.cast(tf.reshape(total, tf.shape(like)), like.dtype)
        out.set_shape(like.shape)
        return out

    def scaled(self, total, reduced):
        return total * reduced[0]

    def cast(self, tensor, like):
        return tf.cast(tensor, like.dtype)

    def as_float32(self, tensor):
        return tf.cast(tensor, tf.float32)

    def one(self):
        return tf.ones([1], tf.float32)

    def eagerly(self):
        return tf.init_scope()

    def traced(self):
        return not tf.executing_eagerly()

    def at_run_time(self, fn):
        if tf.executing_eagerly():
            fn()
            return

        def run():
            fn()
            return np.int32(0)
        tf.numpy_function(run, [], tf.int32, stateful=True)  # a stateful op runs every step

    def per_graph(self, key, make):
        """Made in the function graph around the control flow being traced (Horovod 0.28.1
        traces each allreduce inside a tf.cond of its own), so that every tensor's branch
        captures the same tensor."""
        graph = tf.compat.v1.get_default_graph()
        while isinstance(graph, ControlFlowFuncGraph) and graph.outer_graph is not None:
            graph = graph.outer_graph
        made = self._per_graph.setdefault(graph, {})
        if key not in made:
            with graph.as_default():
                made[key] = make()
        return made[key]

    def switch(self, index, branches):
        return tf.switch_case(tf.reshape(index, []), branches)

    def flat(self, tensor):
        return tf.reshape(tensor, [-1])

    def no_bytes(self):
        return tf.zeros([0], tf.uint8)

    # ---- process sets (the rest: Adapter's) ----
    def inverse_size(self, process_set):
        size = hvd.size_op(process_set_id=process_set.process_set_id)
        return tf.reshape(1.0 / tf.cast(size, tf.float32), [1])

    # ---- collectives ----
    def allgather(self, tensor, name, process_set):
        return hvd.allgather(tensor, name=op_name("HorovodAllgather_" + name), ignore_name_scope=True,
                             process_set=process_set)

    def allreduce_sum(self, tensor, name, process_set):
        return hvd.allreduce(tensor, op=hvd.Sum, name=op_name("HorovodAllreduce_" + name),
                             ignore_name_scope=True,
                             process_set=process_set)

    def alltoall(self, tensor, splits, name, process_set):
        return hvd.alltoall(tensor, splits=splits, name=op_name("HorovodAlltoall_" + name),
                            ignore_name_scope=True, process_set=process_set)

    def broadcast(self, tensor, root, name, process_set):
        return hvd.broadcast(tensor, root_rank=root, name=op_name("HorovodBroadcast_" + name),
                             ignore_name_scope=True,
                             process_set=process_set)

    def time_allreduce(self, elements, half, process_set, name):
        tensor = tf.zeros([elements], tf.float16 if half else tf.float32)
        start = time.perf_counter()
        hvd.allreduce(tensor, name=f"DeepReduce.calibrate.{name}", process_set=process_set).numpy()
        return time.perf_counter() - start

    def time_allgather(self, elements, process_set, name):
        tensor = tf.zeros([elements], tf.float32)
        start = time.perf_counter()
        hvd.allgather(tensor, name=f"DeepReduce.calibrate.{name}", process_set=process_set).numpy()
        return time.perf_counter() - start

    def allgather_numbers(self, values, process_set, name):
        mine = tf.constant([list(values)], tf.float64)
        return hvd.allgather(mine, name=name, process_set=process_set).numpy()

    # ---- device path and checkpoints ----
    def device_path(self, pipeline):
        return DevicePath(pipeline)

    def export_array(self, array):
        return np.array(array, dtype=np.float32)

    def import_array(self, value):
        return np.asarray(value, dtype=np.float32)

    def assign(self, buffer, array):
        """Copy a restored residual into a variable a traced graph holds (ResidualMemory.load)."""
        if isinstance(buffer, tf.Variable):
            buffer.assign(array)
            return True
        return False
