"""PyTorch: DeepReduce as a drop-in `horovod.torch` compression (Horovod 0.28.1, unpatched).

    compression = DeepReduce(sparsifier="topk", ratio=0.01, index="bloom", value="qsgd",
                             memory="residual")
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression)

Horovod allreduces whatever `compress` returns, and sparse payloads cannot be summed. So
`compress` starts an allgather of the payload itself (a uint8 CPU tensor) and hands the
allreduce a one-element placeholder holding 1/size; `decompress` waits for the allgather,
decodes and sums every rank's payload, and multiplies by the allreduced placeholder. That
placeholder has gone through Horovod's own op and scale factors, so it is exactly the factor
the sum needs: 1/size for hvd.Average, 1 for hvd.Sum, gradient_predivide_factor included.
(Only Average and Sum are meaningful for gradients; Min, Max, Product and Adasum are not
supported.)

Collectives are named after the parameter Horovod is reducing, so names agree across ranks
whatever order backward hooks fire in: `compress` reads the parameter from Horovod's calling
frame (`_allreduce_grad_async`, `_grouped_allreduce_grad_async`, or `hvd.allreduce(...,
name=...)`). Unnamed direct calls use Horovod's own call counter. Residual memory is keyed by
the same name.

Passed through unchanged (and exact): tensors below `min_size` elements, integer tensors and
sparse-layout gradients. CUDA tensors are moved to the host for encoding and the result is
returned on their device.
"""
import sys

import horovod.torch as hvd
import numpy as np
import torch
from horovod.torch.compression import Compressor

from .compressor import PipelineOwner


def _collective_name():
    """The parameter name of the Horovod call that invoked compress (None if unnamed)."""
    frame = sys._getframe(2)  # 0: here, 1: DeepReduce.compress, 2: Horovod's caller
    for _ in range(3):
        if frame is None:
            return None
        local = frame.f_locals
        if "p" in local:  # the optimizer, or the comprehension inside its grouped path
            for owner_frame in (frame, frame.f_back):
                names = getattr(owner_frame.f_locals.get("self"), "_parameter_names", None)
                if names is not None:
                    return names.get(local["p"])
        if "compression" in local and "name" in local:  # hvd.allreduce / grouped_allreduce
            return local["name"] if isinstance(local["name"], str) else None
        frame = frame.f_back
    return None


class _Pending:
    """What decompress needs: the allgather in flight and the original tensor's metadata."""
    __slots__ = ("handle", "shape", "dtype", "device", "dtype_name")

    def __init__(self, handle, tensor, dtype_name):
        self.handle, self.shape, self.dtype = handle, tuple(tensor.shape), tensor.dtype
        self.device, self.dtype_name = tensor.device, dtype_name


class DeepReduce(PipelineOwner, Compressor):
    """Sparsify, encode and allgather gradients; see the module docstring. Keyword arguments
    configure the `deepreduce_hvd.Pipeline` (sparsifier, ratio, index, value, memory, ...)."""

    def compress(self, tensor):
        if (tensor.is_sparse or not tensor.dtype.is_floating_point
                or not self.pipeline.compresses(tensor.numel(), True)):
            self.pipeline.passed_through(tensor.numel(), tensor.element_size())
            return tensor, None
        name = _collective_name()
        host = tensor.detach().to("cpu")
        if host.dtype == torch.bfloat16:
            host = host.float()
        frame = self.pipeline.compress(name, host.numpy())
        gathered = hvd.allgather_async(torch.frombuffer(bytearray(frame), dtype=torch.uint8),
                                       name=None if name is None else f"DeepReduce.{name}")
        placeholder = torch.full((1,), 1.0 / hvd.size(), dtype=torch.float32)
        return placeholder, _Pending(gathered, tensor, host.numpy().dtype.name)

    def decompress(self, tensor, ctx):
        if ctx is None:
            return tensor
        gathered = hvd.synchronize(ctx.handle)
        total = self.pipeline.decompress(gathered.numpy(), ctx.shape, ctx.dtype_name, hvd.size())
        total *= np.float32(tensor.item())
        return torch.from_numpy(total).to(device=ctx.device, dtype=ctx.dtype)
