"""PyTorch's side of the communicator: tensors to and from numpy, Horovod's torch collectives
(async handles that `wait` resolves), and the device path of adapters/torch_device.py."""
from __future__ import annotations

import time

import horovod.torch as hvd
import numpy as np
import torch

from .base import Adapter, TensorInfo
from .torch_device import DevicePath, numpy_dtype_name


def host_array(tensor):
    """A tensor as a numpy array on the host (no copy for a CPU tensor; bf16 as float32)."""
    host = tensor.detach().to("cpu")
    return (host.float() if host.dtype == torch.bfloat16 else host).numpy()


class TorchAdapter(Adapter):
    hvd = hvd

    def info(self, tensor):
        return TensorInfo(tensor.numel(), tuple(tensor.shape), numpy_dtype_name(tensor.dtype),
                          tensor.dtype.is_floating_point, tensor.is_sparse, tensor.element_size(),
                          tensor.device.type != "cpu")

    def host_call(self, fn, inputs, dtype, like=None, out=None):
        arrays = [host_array(t) if isinstance(t, torch.Tensor) else t for t in inputs]
        if out is not None:
            fn(*arrays, out=out.detach().numpy())
            return out
        result = torch.from_numpy(np.asarray(fn(*arrays)))
        return result.to(like.device) if like is not None else result

    def output_buffer(self, tensor, in_place):
        """The gradient itself, when the optimizer reduces it in place and it is a contiguous
        float32 CPU tensor: the decoded sum is written straight into it."""
        if in_place and tensor.device.type == "cpu" and tensor.dtype == torch.float32 and \
                tensor.is_contiguous():
            return tensor
        return None

    def dims(self, tensor):
        return np.array(tensor.shape, dtype=np.int64)

    def finish(self, total, like):
        return total.reshape(like.shape).to(device=like.device, dtype=like.dtype)

    def scaled(self, total, reduced):
        return total * reduced.item()

    def cast(self, tensor, like):
        return tensor.to(dtype=like.dtype)

    def as_float32(self, tensor):
        return tensor.to(device="cpu", dtype=torch.float32)

    def one(self):
        return torch.ones(1)

    def as_frame(self, frame):
        return torch.frombuffer(bytearray(frame), dtype=torch.uint8)

    # ---- process sets (the rest: Adapter's) ----
    def inverse_size(self, process_set):
        return torch.full((1,), 1.0 / process_set.size(), dtype=torch.float32)

    # ---- collectives ----
    def allgather(self, tensor, name, process_set):
        return hvd.allgather_async(tensor, name=name, process_set=process_set)

    def allreduce_sum(self, tensor, name, process_set):
        return hvd.allreduce_async(tensor.detach(), op=hvd.Sum, name=name, process_set=process_set)

    def alltoall(self, tensor, splits, name, process_set):
        return hvd.alltoall_async(tensor, splits=splits, name=name, process_set=process_set)

    def broadcast(self, tensor, root, name, process_set):
        return hvd.broadcast_async(tensor, root_rank=root, name=name, process_set=process_set)

    def wait(self, handle):
        return hvd.synchronize(handle)

    def ready(self, handle):
        return hvd.poll(handle)

    def time_allreduce(self, elements, half, process_set, name):
        tensor = torch.zeros(elements, dtype=torch.float16 if half else torch.float32)
        start = time.perf_counter()
        hvd.allreduce(tensor, name=f"DeepReduce.calibrate.{name}", process_set=process_set)
        return time.perf_counter() - start

    def time_allgather(self, elements, process_set, name):
        tensor = torch.zeros(elements, dtype=torch.float32)
        start = time.perf_counter()
        hvd.allgather(tensor, name=f"DeepReduce.calibrate.{name}", process_set=process_set)
        return time.perf_counter() - start

    def allgather_numbers(self, values, process_set, name):
        mine = torch.tensor([list(values)], dtype=torch.float64)
        return hvd.allgather(mine, name=name, process_set=process_set).numpy()

    # ---- device path and checkpoints ----
    def device_path(self, pipeline):
        return DevicePath(pipeline)

    def export_array(self, array):
        if isinstance(array, torch.Tensor):
            return array.detach().to("cpu", copy=True)
        return torch.from_numpy(np.array(array, dtype=np.float32))

    def import_array(self, value):
        return host_array(value) if isinstance(value, torch.Tensor) else np.asarray(value, np.float32)

    def assign(self, buffer, array):
        """Copy a restored residual into a device buffer in use (see ResidualMemory.load)."""
        buffer.copy_(torch.from_numpy(array))
        return True
