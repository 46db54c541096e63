"""PyTorch: DeepReduce as a drop-in `horovod.torch` compression (Horovod 0.28.1, unpatched).

    compression = DeepReduce()                      # time-aware, top-k 1%, error feedback
    compression.name_parameters(model.named_parameters())
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression)

Horovod allreduces whatever `compress` returns. For each tensor the planner (see
deepreduce_hvd.comm.planner) picks the way it travels, identically on every rank:
- Horovod's own allreduce: `compress` returns the error-compensated tensor (fp32 or fp16)
  and `decompress` casts it back;
- a sparse allgather: `compress` starts an allgather of the payload (a uint8 CPU tensor) on
  the same process set and hands the allreduce a one-element placeholder holding 1/size;
  `decompress` waits for the allgather, decodes and sums every rank's payload and multiplies
  by the reduced placeholder, which has gone through Horovod's own op and scale factors:
  1/size for hvd.Average, 1 for hvd.Sum, gradient_predivide_factor included. (Min, Max,
  Product and Adasum are not supported.)

Names key the residual memory and the planner, and name the allgathers so that ranks match
them whatever order backward hooks fire in. `name_parameters` tags each gradient with its
parameter's name (a post-accumulate-grad hook, which runs before Horovod's); `named(t, n)`
tags a tensor for a direct hvd.allreduce; otherwise the name is read from Horovod's calling
frame, and a tensor left without a name gets no error feedback (with a warning).

Hierarchical mode (`hierarchical=True`, for jobs that span hosts): each host sums the gradient
with Horovod's dense allreduce on a process set of its own ranks, one leader per host encodes
the host's sum (with the host's error feedback) and exchanges payloads with the other leaders,
and each leader broadcasts the total to its host. Needs dynamic process sets
(HOROVOD_DYNAMIC_PROCESS_SETS=1 or hvd.init(process_sets="dynamic")) and the global set; a job
on one host, or with one rank per host, stays flat.

Process sets: the payload travels on the process set of the optimizer or allreduce that called
`compress` (or the `process_set=` given here; a different one raises DeepReduceError).
Passed through unchanged (and exact): integer tensors and sparse-layout gradients. Gradients
on a GPU are compensated and selected there (adapters/torch_device.py); only O(k) values cross to the
host.
"""
from __future__ import annotations

import itertools
import os
import time
from typing import Any, Iterable, Optional, Tuple, Union

import horovod.torch as hvd
from horovod.torch.compression import Compressor

import torch

from .adapters.torch_device import DevicePath, numpy_dtype_name
from .comm.base import DeepReduceBase, horovod_caller
from .comm.hosts import topology
from .comm.planner import ALLGATHER, ALLREDUCE_FP16, PASS
from .errors import DeepReduceError

_NAME_ATTR = "_deepreduce_name"
_AGREEMENTS = itertools.count()
_HIERARCHY = []  # the job's _Hierarchy (or False when flat), shared by every DeepReduce


def named(tensor: torch.Tensor, name: str) -> torch.Tensor:
    """Tag a tensor with the name DeepReduce keys its residual and collective by."""
    setattr(tensor, _NAME_ATTR, str(name))
    return tensor


class _Pending:
    """What decompress needs about the tensor that compress took. `out`: the gradient itself
    when the optimizer reduces it in place (a contiguous float32 CPU tensor), so the sum is
    written there instead of into a new buffer."""
    __slots__ = ("handle", "shape", "dtype", "device", "dtype_name", "name", "plan", "ranks", "out")

    def __init__(self, handle, tensor, dtype_name, name, plan, ranks, in_place=False):
        self.handle, self.shape, self.dtype = handle, tuple(tensor.shape), tensor.dtype
        self.device, self.dtype_name, self.name = tensor.device, dtype_name, name
        self.plan, self.ranks = plan, ranks
        self.out = tensor if in_place and tensor.device.type == "cpu" and \
            tensor.dtype == torch.float32 and tensor.is_contiguous() else None


class _AcrossHosts:
    """One tensor of the hierarchical mode through its stages: the host's dense sum (`local`,
    a handle started in compress), the leader's exchange between hosts (`inner`, a _Pending
    as in the flat mode, or `handle`, a dense allreduce of the host sums), and the total
    every rank of the host ends with."""
    __slots__ = ("tensor", "name", "key", "local", "inner", "handle", "total")

    def __init__(self, tensor, name, key, local):
        self.tensor, self.name, self.key, self.local = tensor, name, key, local
        self.inner = self.handle = self.total = None


class _Hierarchy:
    """The hosts of a job (hosts.Hosts) and the Horovod process sets of the hierarchical mode."""

    def __init__(self, hosts):
        if os.environ.get("HOROVOD_DYNAMIC_PROCESS_SETS") != "1":
            raise DeepReduceError("DeepReduce(hierarchical=True) adds process sets for the hosts: "
                                  "run with HOROVOD_DYNAMIC_PROCESS_SETS=1 or "
                                  "hvd.init(process_sets=\"dynamic\")")
        self.hosts, sets = hosts, {}
        try:  # every rank adds every set, in the same order
            for ranks in (*hosts.hosts, hosts.leaders):
                if len(ranks) > 1:
                    sets[ranks] = hvd.add_process_set(list(ranks))
        except ValueError as exc:
            raise DeepReduceError(f"hierarchical mode: {exc} (remove it, or run flat)") from exc
        self.local = sets.get(hosts.local)
        self.leaders = sets[hosts.leaders]
        self.is_leader = hvd.rank() == hosts.leader


def _host(tensor):
    """The gradient as a numpy array on the host (no copy for a CPU tensor)."""
    host = tensor.detach().to("cpu")
    return (host.float() if host.dtype == torch.bfloat16 else host).numpy()


class DeepReduce(DeepReduceBase, Compressor):
    """A horovod.torch compression; see the module docstring. Keyword arguments are those of
    deepreduce_hvd.comm.base.DeepReduceBase (sparsifier, ratio, index, value, memory, min_size,
    objective, bandwidth, process_set, seed), and:

      device_path: where error feedback and selection run. "auto" (default): as torch ops on
        the gradient's device when it is not the CPU (only the selected values and positions
        go to the host); CPU gradients use the native engine on their own memory. True: torch
        ops always (top-k and threshold; random-k and "none" use the host); False: never.
    """

    def __init__(self, device_path: Union[str, bool] = "auto", hierarchical: bool = False,
                 **config: Any) -> None:
        if device_path not in ("auto", True, False):
            raise DeepReduceError(f"device_path must be 'auto', True or False, not {device_path!r}")
        if not isinstance(hierarchical, bool):
            raise DeepReduceError(f"hierarchical must be True or False, not {hierarchical!r}")
        super().__init__(**config)
        self.device_path, self.hierarchical = device_path, hierarchical
        self._in_flight = []  # hierarchical mode: tensors compressed and not yet exchanged
        self._device = DevicePath(self.pipeline)

    def name_parameters(self, named_parameters: Iterable[Tuple[str, torch.nn.Parameter]]) -> "DeepReduce":
        """Tag every gradient of these parameters with the parameter's name (call it with the
        same named_parameters given to hvd.DistributedOptimizer). Returns self."""
        def tagger(name):
            def tag(param):
                if param.grad is not None:
                    named(param.grad, name)
            return tag

        for name, param in named_parameters:
            if param.requires_grad:
                param.register_post_accumulate_grad_hook(tagger(name))
        return self

    def compress(self, tensor: torch.Tensor
                 ) -> Tuple[torch.Tensor, Union[None, _Pending, _AcrossHosts]]:
        caller = horovod_caller(self, tensor)
        name = getattr(tensor, _NAME_ATTR, None) or caller.name
        process_set = self._process_set(caller.process_set)
        if tensor.is_sparse:
            self.pipeline.passed_through(tensor.numel(), tensor.element_size())
            return tensor, None
        key = name if name is not None else \
            f"unnamed:{tuple(tensor.shape)}:{tensor.dtype}:{caller.member}"
        hierarchy = self._across_hosts(process_set)
        if hierarchy:
            return self._compress_across_hosts(tensor, name, key, hierarchy)
        plan = self.planner(process_set).plan(key, tensor.numel(), tensor.dtype.is_floating_point)
        if plan.kind == PASS:
            self.pipeline.passed_through(tensor.numel(), tensor.element_size())
            return tensor, None
        if name is None:
            self._warn_unnamed()
        return self._send(tensor, name, key, plan, process_set, caller.optimizer)

    def _send(self, tensor, name, key, plan, process_set, in_place=False):
        """What goes to the ranks of process_set under this plan -> (tensor for Horovod's
        allreduce: the compensated gradient, or the placeholder of a started allgather; ctx)."""
        dtype_name = numpy_dtype_name(tensor.dtype)
        ranks = self._set_size(process_set)
        on_device = self._on_device(tensor, plan)
        if plan.kind != ALLGATHER:
            half = plan.kind == ALLREDUCE_FP16
            if on_device:
                sent = self._device.compress_dense(name, tensor, half)
            else:
                sent = torch.from_numpy(self.pipeline.compress_dense(name, _host(tensor), half))
                sent = sent.to(tensor.device)
            return sent, _Pending(None, tensor, dtype_name, key, plan, ranks)
        if on_device:
            frame = self._device.compress(name, tensor, plan.codec, plan.fallback)
        else:
            frame = self.pipeline.compress(name, _host(tensor), plan.codec, plan.fallback)
        gathered = hvd.allgather_async(torch.frombuffer(bytearray(frame), dtype=torch.uint8),
                                       name=f"DeepReduce.{key}@{process_set.process_set_id}",
                                       process_set=process_set)
        placeholder = torch.full((1,), 1.0 / ranks, dtype=torch.float32)
        return placeholder, _Pending(gathered, tensor, dtype_name, key, plan, ranks, in_place)

    def decompress(self, tensor: torch.Tensor,
                   ctx: Union[None, _Pending, _AcrossHosts]) -> torch.Tensor:
        if ctx is None:
            return tensor
        if isinstance(ctx, _AcrossHosts):
            return self._decompress_across_hosts(tensor, ctx)
        return self._receive(tensor, ctx)

    def _receive(self, tensor, ctx):
        """The reduced tensor of a _Pending: cast back, or the allgathered payloads decoded,
        summed and scaled by the reduced placeholder `tensor`."""
        planner = self.planner()
        if ctx.handle is None:  # Horovod's own allreduce carried it
            planner.observe(ctx.name, ctx.plan, (), 0.0)
            return tensor.to(dtype=ctx.dtype)
        gathered = hvd.synchronize(ctx.handle)
        start = time.perf_counter()
        out = None if ctx.out is None else ctx.out.detach().numpy()
        total, received = self.pipeline.decompress(gathered.numpy(), ctx.shape, ctx.dtype_name,
                                                   ctx.ranks, ctx.name, out=out,
                                                   scale=tensor.item())
        planner.observe(ctx.name, ctx.plan, received, time.perf_counter() - start)
        if ctx.out is not None:
            return ctx.out
        return torch.from_numpy(total).to(device=ctx.device, dtype=ctx.dtype)

    # ---- hierarchical mode ----
    def _across_hosts(self, process_set):
        """The job's _Hierarchy when the hierarchical mode applies, else None."""
        if not self.hierarchical:
            return None
        if process_set.process_set_id != 0:
            raise DeepReduceError("hierarchical=True reduces over the global process set, "
                                  f"not process set {process_set.process_set_id}")
        if not _HIERARCHY:  # once per job: the process sets are added on every rank
            placements = hvd.allgather_object((hvd.rank(), hvd.rank() - hvd.local_rank()),
                                              name="DeepReduce.hosts")
            hosts = topology(placements, hvd.rank())
            _HIERARCHY.append(_Hierarchy(hosts) if hosts.spans_hosts else False)
        return _HIERARCHY[0] or None

    def _compress_across_hosts(self, tensor, name, key, hierarchy):
        """Start the host's dense sum; the rest waits for decompress, where every tensor in
        flight is exchanged at once (a wait per tensor would cost a Horovod cycle each)."""
        if not self.pipeline.compresses(tensor.numel(), tensor.dtype.is_floating_point):
            self.pipeline.passed_through(tensor.numel(), tensor.element_size())
            return tensor, None  # small: Horovod's flat allreduce
        if name is None:
            self._warn_unnamed()
        local = None if hierarchy.local is None else hvd.allreduce_async(
            tensor.detach(), op=hvd.Sum, name=f"DeepReduce.host.{key}", process_set=hierarchy.local)
        ctx = _AcrossHosts(tensor.detach(), name, key, local)
        self._in_flight.append(ctx)
        return torch.full((1,), 1.0 / hvd.size(), dtype=torch.float32), ctx

    def _decompress_across_hosts(self, tensor, ctx):
        """The total of every rank's gradient, times the reduced placeholder."""
        if ctx.total is None:
            self._exchange_across_hosts(_HIERARCHY[0])
        return (ctx.total * tensor.item()).to(device=ctx.tensor.device, dtype=ctx.tensor.dtype)

    def _exchange_across_hosts(self, hierarchy):
        """Every tensor in flight, stage by stage: the hosts' sums; the leaders encode them
        and exchange (sparse payloads or dense, as the planner chooses) and decode; then each
        leader broadcasts the totals to its host."""
        batch, self._in_flight = self._in_flight, []
        sums = [hvd.synchronize(c.local) if c.local is not None else c.tensor for c in batch]
        if hierarchy.is_leader:
            for c, host_sum in zip(batch, sums):
                plan = self.planner(hierarchy.leaders).plan(c.key, host_sum.numel(), True)
                sent, c.inner = self._send(host_sum, c.name, c.key, plan, hierarchy.leaders)
                if c.inner.handle is None:  # dense between hosts: the leaders sum the host sums
                    c.handle = hvd.allreduce_async(sent, op=hvd.Sum, name=f"DeepReduce.hosts.{c.key}",
                                                   process_set=hierarchy.leaders)
            for c in batch:
                reduced = hvd.synchronize(c.handle) if c.handle is not None else torch.ones(1)
                c.total = self._receive(reduced, c.inner).to(torch.float32).cpu()
        else:
            for c in batch:
                c.total = torch.zeros(c.tensor.shape, dtype=torch.float32)
        if hierarchy.local is not None:
            shares = [hvd.broadcast_async(c.total, root_rank=hierarchy.hosts.leader,
                                          name=f"DeepReduce.share.{c.key}",
                                          process_set=hierarchy.local) for c in batch]
            for c, share in zip(batch, shares):
                c.total = hvd.synchronize(share)

    def _on_device(self, tensor, plan):
        """Whether this tensor is compensated and selected with torch ops on its device."""
        if self.device_path == "auto":
            wanted = tensor.device.type != "cpu"
        else:
            wanted = bool(self.device_path)
        return wanted and (plan.kind != ALLGATHER or self._device.supports())

    def _process_set(self, caller_set):
        """The set the payload must travel on: the caller's; a different explicit one cannot
        work (the placeholder and the payload would go to different ranks)."""
        if caller_set is None:
            return self.process_set or hvd.global_process_set
        if self.process_set is not None and caller_set.process_set_id != self.process_set.process_set_id:
            raise DeepReduceError(
                f"DeepReduce(process_set={self.process_set.process_set_id}) was handed a tensor "
                f"reduced over process set {caller_set.process_set_id}; give both the same set")
        return caller_set

    # ---- collectives for calibration ----
    def _set_size(self, process_set):
        return (process_set or self.process_set or hvd.global_process_set).size()

    def _broadcast_object(self, obj, process_set):
        return hvd.broadcast_object(obj, root_rank=self._root(process_set),
                                    name="DeepReduce.calibration",
                                    process_set=process_set or hvd.global_process_set)

    def _agree_max(self, value, process_set):
        values = hvd.allgather(torch.tensor([float(value)], dtype=torch.float64),
                               name=f"DeepReduce.agree.{next(_AGREEMENTS)}",
                               process_set=process_set or hvd.global_process_set)
        return float(values.max())

    def _root(self, process_set):
        ranks = (process_set or hvd.global_process_set).ranks
        return min(ranks) if ranks else 0

    def _time_allreduce(self, elements, process_set, name, half=False):
        tensor = torch.zeros(elements, dtype=torch.float16 if half else torch.float32)
        start = time.perf_counter()
        hvd.allreduce(tensor, name=f"DeepReduce.calibrate.{name}",
                      process_set=process_set or hvd.global_process_set)
        return time.perf_counter() - start

    def _time_allgather(self, elements, process_set, name):
        tensor = torch.zeros(elements, dtype=torch.float32)
        start = time.perf_counter()
        hvd.allgather(tensor, name=f"DeepReduce.calibrate.{name}",
                      process_set=process_set or hvd.global_process_set)
        return time.perf_counter() - start
