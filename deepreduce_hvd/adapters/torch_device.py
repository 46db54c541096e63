"""The PyTorch wrapper's device path: error feedback and selection as torch ops on the gradient's
own device (CUDA included), so that only the selected values and their positions cross to the
host for encoding, and only the delivered values come back for the residual.

The selection rule is the core's (compression/sparsify.py): the k largest magnitudes, ties at the boundary
broken by the lower position; compensation is the same float32 addition. So for the same input
this path sends exactly the bytes the numpy path sends. Top-k and threshold selection run here;
random-k and "none" use the host path. CPU tensors use the host path by default, where the
native engine works on the tensor's own memory without a copy.
"""
import time

import numpy as np

import torch

from .base import DevicePathBase

COPIED = {"elements": 0}  # elements moved to the host by this path (tests check it is O(k))


def to_host(tensor):
    """A device tensor as a numpy array (the only way this path moves data to the host)."""
    COPIED["elements"] += tensor.numel()
    return tensor.detach().cpu().numpy()


def topk_positions(magnitude, k):
    """Ascending positions of the k largest magnitudes, lower positions first among ties."""
    n = magnitude.numel()
    if k >= n:
        return torch.arange(n, device=magnitude.device)
    if k == 0:
        return torch.zeros(0, dtype=torch.int64, device=magnitude.device)
    kth = torch.topk(magnitude, k, sorted=False).values.min()
    above = torch.nonzero(magnitude > kth).flatten()
    ties = torch.nonzero(magnitude == kth).flatten()[:k - above.numel()]
    return torch.sort(torch.cat((above, ties))).values


def numpy_dtype_name(dtype):
    """The dtype a payload carries for a torch gradient (bfloat16 travels as float32)."""
    return {torch.float16: "float16", torch.float64: "float64"}.get(dtype, "float32")


class DevicePath(DevicePathBase):
    """Compensation, selection and the residual update of one Pipeline, on the device."""

    def _compensated(self, name, tensor):
        """(flat float32 compensated gradient, flat view of the residual buffer or None); the
        buffer has the tensor's shape, as the host path keeps it."""
        grad = tensor.detach().to(torch.float32)
        memory = self.pipeline.memory if name is not None else None
        if memory is None:
            return grad.reshape(-1), None
        residual = memory.buffer(name, grad.shape, zeros=lambda shape: torch.zeros(
            shape, dtype=torch.float32, device=grad.device),
            adopt=lambda array: torch.from_numpy(array).to(grad.device)).view(-1)
        return residual.add_(grad.reshape(-1)), residual

    def compress(self, name, tensor, choose=None):
        """-> frame bytes, as Pipeline.compress gives for the same gradient and residual;
        choose(size) -> (codec, fallback) picks the codec (default: the pipeline's)."""
        pipeline, start = self.pipeline, time.perf_counter()
        shape, dtype = tuple(tensor.shape), numpy_dtype_name(tensor.dtype)
        codec, fallback = choose(tensor.numel()) if choose is not None else (None, None)
        compensated, residual = self._compensated(name, tensor)
        if not bool(torch.isfinite(compensated).all()):
            if residual is not None:
                pipeline.memory.reset(name)
            return pipeline.encode_selected(None, None, shape, dtype, name, start=start)[0]
        magnitude = compensated.abs()
        if pipeline.sparsifier == "topk":
            positions = topk_positions(magnitude, pipeline.selection_count(magnitude.numel(), name))
        else:
            positions = torch.nonzero(magnitude > pipeline.threshold).flatten()
        frame, encoded = pipeline.encode_selected(
            to_host(compensated[positions]), to_host(positions), shape, dtype, name, codec,
            fallback, start=start)
        if encoded is not None and residual is not None:
            delivered = torch.from_numpy(np.asarray(encoded.values, dtype=np.float32))
            residual.index_add_(0, torch.from_numpy(encoded.positions).to(residual.device),
                                delivered.to(residual.device), alpha=-1)
        return frame

    def compress_dense(self, name, tensor, half):
        """A tensor for Horovod's own allreduce, compensated on the device (fp16 if `half`,
        the residual keeping what the cast lost)."""
        start = time.perf_counter()
        compensated, residual = self._compensated(name, tensor)
        if half:
            sent = compensated.to(torch.float16)
            if residual is not None:
                if bool(torch.isfinite(sent).all()):
                    residual.sub_(sent.to(torch.float32))
                else:
                    self.pipeline.memory.reset(name)
        else:
            sent = compensated.clone() if residual is not None else compensated
            if residual is not None:
                residual.zero_()
        self.pipeline.count_dense(sent.numel() * sent.element_size(), sent.numel(),
                                  time.perf_counter() - start, name)
        return sent.reshape(tensor.shape)
