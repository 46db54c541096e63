"""PyTorch: DeepReduce as a drop-in `horovod.torch` compression (Horovod 0.28.1, unpatched).

    compression = DeepReduce()                      # time-aware, top-k 1%, error feedback
    compression.name_parameters(model.named_parameters())
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression)

Horovod allreduces whatever `compress` returns; the framework-neutral communicator
(deepreduce_hvd.comm.communicator) decides per tensor how it travels (Horovod's own fp32 or
fp16 allreduce of the error-compensated tensor, a sparse allgather of payloads, or the
hierarchical exchange), identically on every rank. This class is its face: the adapter of
adapters/torch_adapter.py, names, checkpoints and elastic jobs.

Names key the residual memory and the planner, and name the collectives so that ranks match
them whatever order backward hooks fire in: `name_parameters` tags each gradient with its
parameter's name (a post-accumulate-grad hook, which runs before Horovod's); `named(t, n)`
tags a tensor for a direct hvd.allreduce (Horovod's `name=` works too); without either the
name is read from Horovod's call frames (adapters/horovod_frames.py), and a tensor left
without a name gets no error feedback, with a warning.

Checkpoints: `state_dict()` / `load_state_dict()` (this rank's residuals, steps, planner
state; save on every rank). Elastic jobs: pass the compressor to `hvd.elastic.TorchState(
model, optimizer, compression=compression)`; its state is committed, rolled back and agreed
again with the model's.
"""
from __future__ import annotations

from typing import Any, Iterable, Optional, Tuple

import torch
from horovod.torch.compression import Compressor
from horovod.torch.elastic.state import get_handler_registry

from .adapters.horovod_frames import horovod_caller
from .adapters.torch_adapter import TorchAdapter
from .comm.base import DeepReduceBase
from .comm.communicator import Flight
from .comm.elastic import ElasticHandler
from .errors import DeepReduceError

_NAME_ATTR = "_deepreduce_name"


def named(tensor: torch.Tensor, name: str) -> torch.Tensor:
    """Tag a tensor with the name DeepReduce keys its residual and collective by."""
    setattr(tensor, _NAME_ATTR, str(name))
    return tensor


def sgd_momentum(optimizer: torch.optim.Optimizer) -> float:
    """The momentum every parameter group of an SGD optimizer shares, for momentum correction."""
    groups = optimizer.param_groups
    if not isinstance(optimizer, torch.optim.SGD) or any(
            g.get("nesterov") or g.get("dampening", 0) for g in groups):
        raise DeepReduceError("momentum correction works with torch.optim.SGD (no Nesterov, no "
                              f"dampening), not {type(optimizer).__name__} {optimizer.defaults}")
    momenta = {float(g.get("momentum", 0.0)) for g in groups}
    if len(momenta) != 1:
        raise DeepReduceError(f"the optimizer's parameter groups differ in momentum: {momenta}")
    return momenta.pop()


class DeepReduce(DeepReduceBase, Compressor):
    """A horovod.torch compression; see the module docstring. Keyword arguments: those of
    deepreduce_hvd.comm.config.Options (sparsifier, ratio, index, value, memory, min_size,
    objective, bandwidth, process_set, device_path, hierarchical, warmup_steps,
    adaptive_density, momentum, momentum_masking, local_clip_norm, collective, lowrank, energy,
    seed)."""

    def __init__(self, **options: Any) -> None:
        super().__init__(TorchAdapter(), **options)

    def name_parameters(self, named_parameters: Iterable[Tuple[str, torch.nn.Parameter]],
                        optimizer: Optional[torch.optim.Optimizer] = None) -> "DeepReduce":
        """Tag every gradient of these parameters with the parameter's name (call it with the
        same named_parameters given to hvd.DistributedOptimizer). With `optimizer` (a
        momentum SGD, before hvd.DistributedOptimizer wraps it), momentum correction takes
        its momentum. Returns self."""
        if optimizer is not None:
            self.comm.set_momentum(sgd_momentum(optimizer))
        def tagger(name):
            def tag(param):
                if param.grad is not None:
                    named(param.grad, name)
            return tag

        for name, param in named_parameters:
            if param.requires_grad:
                param.register_post_accumulate_grad_hook(tagger(name))
        return self

    def compress(self, tensor: torch.Tensor) -> Tuple[torch.Tensor, Optional[Flight]]:
        caller = horovod_caller(self, tensor)
        return self.comm.compress(tensor, caller._replace(
            name=getattr(tensor, _NAME_ATTR, None) or caller.name))

    def decompress(self, tensor: torch.Tensor, ctx: Optional[Flight]) -> torch.Tensor:
        return self.comm.decompress(tensor, ctx)


get_handler_registry().append((DeepReduce, ElasticHandler))  # hvd.elastic.TorchState(compression=...)
