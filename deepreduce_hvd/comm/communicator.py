"""The communicator (GRACE's third role): one object owns every tensor's route.

For each tensor Horovod hands to `compress` the communicator resolves its name and process
set, asks the policy how it travels (passed through, Horovod's own allreduce as fp32 or fp16,
a sparse allgather of payloads, the sparse allreduce of comm/sparse_allreduce.py, low-rank
factors by two allreduces (compression/lowrank.py), or the hierarchical exchange), runs the
pipeline (error feedback, sparsifier, codec) on the host or on the tensor's device, starts
the collectives, and in `decompress` decodes, sums, scales and feeds the measured costs back
to the planner. It is framework-neutral: an adapter (adapters/) supplies the framework's tensors and
Horovod's collectives. Two phases, so a TensorFlow graph can trace it: the route is chosen at
compress (trace) time, the encoding and decoding run when the step runs (`host_call`).

Sparse payloads cannot be summed by an allreduce, so for the sparse routes `compress` hands
Horovod's allreduce a one-element placeholder holding 1/size and `decompress` multiplies the
decoded sum by the reduced placeholder, which has gone through Horovod's own op and scale
factors: 1/size for hvd.Average, 1 for hvd.Sum, gradient_predivide_factor included.
"""
from __future__ import annotations

import warnings
from typing import Any, NamedTuple, Optional

import numpy as np

from ..codecs.choice import is_auto
from ..compression.pipeline import Pipeline, Stats
from ..errors import DeepReduceError
from .calibration import calibrate
from .config import Options
from .hierarchy import discover
from .planner import (ALLGATHER, ALLREDUCE, ALLREDUCE_FP16, HIERARCHICAL, LOWRANK, PASS,
                      SPARSE_ALLREDUCE, FixedPlanner, Measured, Plan, Policy, TimePlanner,
                      candidates)
from .sparse_allreduce import Exchange
from .state import FORMAT, SetState, check_state, set_key
from .step_guard import GRAPH_STEP, LEAN, SPARSE, StepGuard

GRAPH_ARMS = (None, ALLREDUCE_FP16, ALLREDUCE)  # what a traced graph's switch runs: the plan, dense


class Caller(NamedTuple):
    """What compress knows about the Horovod call that invoked it."""
    name: Optional[str] = None
    process_set: object = None
    optimizer: bool = False       # a DistributedOptimizer reducing a gradient in place
    member: Optional[int] = None  # the tensor's position in a grouped allreduce


class Flight:
    """One tensor between compress and decompress: its plan and what decompress needs."""
    __slots__ = ("plan", "state", "process_set", "name", "key", "tensor", "info", "in_place",
                 "handle", "plans", "local", "inner", "dense", "total", "exchange", "switch")

    def __init__(self, plan, state, process_set, name, key, tensor, info, in_place=False):
        self.plan, self.state, self.process_set = plan, state, process_set
        self.name, self.key, self.tensor, self.info, self.in_place = name, key, tensor, info, in_place
        self.plans = {"current": plan}  # the plan of the step that runs (a traced graph re-plans)
        self.handle = self.local = self.inner = self.dense = self.total = self.exchange = None
        self.switch = None  # a traced graph's (guard's arm, dense sum): see _switched


class Communicator:
    """Routes, encodes, exchanges and decodes every tensor of one DeepReduce compressor."""

    def __init__(self, adapter: Any, options: Options) -> None:
        self.adapter, self.options = adapter, options
        self.pipeline = Pipeline(**options.pipeline)  # the default process set's
        self.sets = {}
        self._in_flight = []  # hierarchical flights waiting for the exchange between hosts
        self._reducing = []   # sparse allreduces waiting for their owners' reduction
        self._projecting = []  # low-rank flights waiting for their reduced P
        self._warned_unnamed = False

    # ---- process sets and their state ----
    def process_set(self, caller_set: Any) -> Any:
        """The set the payload must travel on: the caller's; a different explicit one cannot
        work (the placeholder and the payload would go to different ranks)."""
        chosen = self.options.process_set
        if caller_set is None:
            return chosen or self.adapter.global_set()
        if chosen is not None and self.adapter.set_id(caller_set) != self.adapter.set_id(chosen):
            raise DeepReduceError(
                f"DeepReduce(process_set={self.adapter.set_id(chosen)}) was handed a tensor "
                f"reduced over process set {self.adapter.set_id(caller_set)}; give both the same set")
        return caller_set

    def _key(self, process_set):
        adapter = self.adapter
        return set_key(adapter.set_ranks(process_set),
                       adapter.set_id(process_set) == adapter.set_id(adapter.global_set()))

    def set_state(self, process_set: Any) -> SetState:
        key = self._key(process_set)
        if key not in self.sets:
            default = self.process_set(None)
            mine = key == self._key(default)
            self.sets[key] = SetState(self.pipeline if mine else Pipeline(**self.options.pipeline))
        return self.sets[key]

    def set_momentum(self, momentum: float) -> None:
        """Turn on momentum correction for an optimizer of this momentum (before any step)."""
        if any(s.pipeline.steps() for s in self.sets.values()) or self.pipeline.steps():
            raise DeepReduceError("set the optimizer's momentum before the first step")
        options = dict(self.options.pipeline, momentum=momentum)
        self.pipeline = Pipeline(**options)  # validates it
        self.options.pipeline, self.sets = options, {}

    def policy(self, state: SetState, process_set: Any, traced: bool) -> Policy:
        """The set's policy, built on first use (traced: in a graph being traced): the
        planner (calibrated on the set, or on the hosts' leaders in the hierarchical mode),
        the hierarchy of hosts and the step guard."""
        if state.policy is None:
            exchange = process_set
            if self.options.hierarchical:
                if self.adapter.set_id(process_set) != self.adapter.set_id(self.adapter.global_set()):
                    raise DeepReduceError("hierarchical=True reduces over the global process set, "
                                          f"not process set {self.adapter.set_id(process_set)}")
                if state.hierarchy is None:
                    state.hierarchy = discover(self.adapter, process_set) or False
                if state.hierarchy:
                    exchange = state.hierarchy.leaders
            planner = self._planner(state, exchange) if not state.hierarchy or \
                state.hierarchy.is_leader else FixedPlanner(state.pipeline)
            guard = None
            if isinstance(planner, TimePlanner) and not state.hierarchy:
                guard = self._guard(planner, process_set, traced)
                if state.saved_guard:
                    guard.load_state_dict(state.saved_guard)
                state.saved_guard = None
            state.policy = Policy(planner, hierarchical=bool(state.hierarchy), guard=guard)
        return state.policy

    def _guard(self, planner, process_set, traced):
        """The step guard of a time-aware set: the plan against the sparse arm, the lean arm
        (where matrices may be factored) and Horovod's allreduce of every tensor (fp16 where
        values may be lossy, and fp32), first once the planner settled (a dense arm whose
        wire alone outlasts the plan's step is not run; the dense arms' verdict sets the
        plan's dense dtype). In a traced graph the plan against fp16 and fp32 (see
        _switched), whose traced dense kinds stay."""
        adapter = self.adapter
        arms = (SPARSE, ALLREDUCE_FP16) if planner.allow_fp16 else (SPARSE,)
        arms += (LEAN, ALLREDUCE) if planner.pipeline.factors.rank else (ALLREDUCE,)
        if traced:  # a graph's tensors keep their traced kinds (see _switched)
            arms = tuple(arm for arm in arms if arm in GRAPH_ARMS)

        def agree(seconds):
            return adapter.allgather_numbers(seconds, process_set, "DeepReduce.guard").mean(axis=0)

        def floor(arm, elements):  # a dense arm's wire alone
            return planner.wire(arm, elements) if arm in (ALLREDUCE, ALLREDUCE_FP16) else None
        return StepGuard(arms, planner.settled_after + 1, agree, floor=floor,
                         replan=None if traced else planner.use_dense)

    def _planner(self, state, process_set):
        options, pipeline = self.options, state.pipeline
        collective = ALLGATHER if state.hierarchy else options.collective  # leaders: payloads
        if not options.time_aware:
            return FixedPlanner(pipeline, collective)
        max_error = pipeline.codec.get_config()["value"].get("max_error", 0.05) \
            if is_auto(options.value) else None
        pairs = candidates(options.index, options.value, max_error, pipeline.sparsifier)
        ranks = self.adapter.set_size(process_set)
        if state.calibration is None or state.calibration[2] != ranks:
            links, priors = calibrate(self.adapter, process_set, pipeline, pairs, options.bandwidth)
            state.calibration = (links, priors, ranks)
        links, priors, _ = state.calibration
        planner = TimePlanner(pipeline, links, ranks, priors, pairs,
                              allow_fp16=not pipeline.codec.lossless, collective=collective)
        if state.saved_planner:
            planner.load_state_dict(state.saved_planner)
            state.saved_planner = None
        return planner

    # ---- compress ----
    def compress(self, tensor: Any, caller: Caller) -> tuple:
        """-> (what Horovod's allreduce gets, the flight decompress takes; None: unchanged)."""
        adapter = self.adapter
        if self._projecting:
            self._settle_ready()
        info = adapter.info(tensor)
        process_set = self.process_set(caller.process_set)
        state = self.set_state(process_set)
        if Policy.passes_through(info):
            plan = Plan(PASS)
        else:
            key = caller.name if caller.name is not None else \
                f"unnamed:{info.shape}:{info.dtype}:{caller.member}"
            traced = adapter.traced()
            with adapter.eagerly():  # calibration (once) runs now, also while tracing a graph
                plan = self.policy(state, process_set, traced).route(
                    key, info, not traced, factorable=caller.name is not None and not traced)
            if traced:  # the graph keeps this kind: one traced after an elastic
                kind = state.traced_kinds.setdefault(key, plan.kind)  # reset keeps rank 0's
                plan = plan if kind == plan.kind else Plan(kind, label=kind)
        if plan.kind == PASS:
            adapter.at_run_time(lambda: state.pipeline.passed_through(info.size or 0, info.itemsize))
            return tensor, None
        if caller.name is None:
            self._warn_unnamed()
        if plan.kind == ALLREDUCE and self._as_is(state, caller.name, info):
            state.pipeline.count_dense(4 * info.size, info.size, 0.0, caller.name)
            state.policy.planner.observe(key, plan, None)
            return tensor, None
        flight = Flight(plan, state, process_set, caller.name, key, tensor, info, caller.optimizer)
        if plan.kind == HIERARCHICAL:
            return self._start_across_hosts(flight)
        if plan.kind == SPARSE_ALLREDUCE:
            return self._scatter(flight)
        if plan.kind == LOWRANK:
            return self._project(flight)
        if plan.kind == ALLGATHER and adapter.traced() and state.policy.guard is not None \
                and info.size is not None:
            return self._switched(flight)
        return self._send(flight), flight

    def _as_is(self, state, name, info):
        """Whether an fp32 allreduce hands Horovod the float32 gradient itself, to average as
        its own dense allreduce does (no residual or velocity to add, no clipping; not in a
        traced graph, whose routes the step guard switches while it runs): then `compress`
        returns it with no context and `decompress` takes Horovod's average unchanged: the
        step guard's fp32 arm is Horovod's dense step itself, not a pass through host arrays
        and a context for every tensor (README, "Horovod's synthetic benchmark")."""
        return info.dtype == "float32" and info.itemsize == 4 and not self.adapter.traced() and \
            state.pipeline.holds_nothing(name)

    def _switched(self, flight):
        """A traced graph's sparse flight, which the step guard may send by Horovod's fp16 or
        fp32 allreduce instead: every way is in the graph and one op per graph and step asks
        the guard which runs (every tensor of the step, and every rank, alike). Horovod's
        allreduce around compress always gets the placeholder; a dense arm sums the tensor
        in an allreduce of its own and scales the sum by it, as the sparse routes do."""
        adapter, state, process_set = self.adapter, flight.state, flight.process_set
        arm = adapter.per_graph(f"DeepReduce.guard@{adapter.set_id(process_set)}",
                                lambda: adapter.host_call(lambda: np.array(
                                    [GRAPH_ARMS.index(self._graph_arm(state))], np.int32), [], "int32"))

        def planned():
            placeholder = self._send(flight)
            return placeholder, flight.handle, adapter.as_float32(adapter.no_bytes())

        def dense(kind):
            def by_allreduce():
                alone = Flight(Plan(kind, None, kind), state, process_set, flight.name, flight.key,
                               flight.tensor, flight.info, flight.in_place)
                summed = adapter.wait(adapter.allreduce_sum(
                    self._send(alone), f"DeepReduce.{kind}.{flight.key}", process_set))
                return (adapter.inverse_size(process_set), adapter.no_bytes(),
                        adapter.flat(adapter.as_float32(summed)))
            return by_allreduce
        sent, flight.handle, summed = adapter.switch(arm, [planned] + [dense(k) for k in GRAPH_ARMS[1:]])
        flight.switch = (arm, summed)
        return sent, flight

    @staticmethod
    def _graph_arm(state):
        """The step guard's arm for this step of a traced graph (None: the traced routes). None
        for good after an elastic reset: graphs are not traced again, so the old ranks' hold
        the guard of before and a rank that joined would start another."""
        guarded = state.policy is not None and state.policy.guard is not None
        arm = state.policy.guard.kind(GRAPH_STEP) if guarded and not state.graphs_unguarded \
            else None
        return arm if arm in GRAPH_ARMS else None

    def _send(self, flight):
        """What goes to Horovod's allreduce: the compensated tensor (dense plans), or the
        placeholder of the started allgather of this rank's payload."""
        adapter, plan, state, name = self.adapter, flight.plan, flight.state, flight.name
        if plan.kind in (ALLREDUCE, ALLREDUCE_FP16):
            half = plan.kind == ALLREDUCE_FP16
            if self._on_device(flight):
                return self._device(state).compress_dense(name, flight.tensor, half)
            return adapter.host_call(lambda dense: state.pipeline.compress_dense(name, dense, half),
                                     [flight.tensor], "float16" if half else "float32",
                                     like=flight.tensor)
        choose = self._chooser(flight)
        if self._on_device(flight):
            frame = adapter.as_frame(self._device(state).compress(name, flight.tensor, choose))
        else:
            def encode(dense):
                codec, fallback = choose(dense.size)
                return np.frombuffer(bytearray(state.pipeline.compress(name, dense, codec, fallback)),
                                     np.uint8)
            frame = adapter.host_call(encode, [flight.tensor], "uint8")
        process_set = flight.process_set
        flight.handle = adapter.allgather(
            frame, f"DeepReduce.{flight.key}@{adapter.set_id(process_set)}", process_set)
        return adapter.inverse_size(process_set)

    def _chooser(self, flight):
        """size -> (codec, fallback): the plan's codec, or where the step is traced into a
        graph (or its shape known only then) the planner's choice each time the graph runs."""
        plan = flight.plan
        if plan.codec is not None and not self.adapter.traced():
            return lambda size: (plan.codec, plan.fallback)
        planner = flight.state.policy.planner

        def choose(size):
            step = planner.plan(flight.key, size, True, kinds=(plan.kind,))
            flight.plans["current"] = step
            return step.codec, step.fallback
        return choose

    def _on_device(self, flight):
        """Whether this tensor is compensated and selected by framework ops on its device
        (momentum correction keeps its velocities on the host; local clipping and the energy
        share run there)."""
        info, device_path = flight.info, self.options.device_path
        wanted = info.on_device if device_path == "auto" else bool(device_path)
        pipeline = flight.state.pipeline
        wanted = wanted and pipeline.momentum is None and pipeline.local_clip_norm is None and \
            pipeline.density.energy is None
        return wanted and info.size is not None and flight.plan.kind != SPARSE_ALLREDUCE and (
            flight.plan.kind != ALLGATHER or self._device(flight.state).supports())

    def _device(self, state):
        if state.device is None:
            state.device = self.adapter.device_path(state.pipeline)
        return state.device

    # ---- decompress ----
    def decompress(self, reduced: Any, flight: Optional[Flight]) -> Any:
        if flight is None:
            return reduced
        if flight.plan.kind == HIERARCHICAL:
            if flight.total is None:
                self._exchange_across_hosts(flight.state.hierarchy)
            out = self.adapter.finish(self.adapter.scaled(flight.total, reduced), flight.tensor)
        elif flight.plan.kind == SPARSE_ALLREDUCE:
            if any(f is flight for f in self._reducing):
                self._reduce_all()
            out = self._gather(reduced, flight)
        elif flight.plan.kind == LOWRANK:
            if any(f is flight for f in self._projecting):
                self._settle_all()
            out = self._reconstruct(reduced, flight)
        elif flight.switch is not None:
            arm, summed = flight.switch
            adapter, planner = self.adapter, flight.state.policy.planner

            def dense(kind):
                def scaled():
                    adapter.at_run_time(lambda: planner.observe(flight.key, Plan(kind, None, kind), None))
                    return adapter.finish(adapter.scaled(summed, reduced), flight.tensor)
                return scaled
            out = adapter.switch(arm, [lambda: self._receive(reduced, flight)] +
                                 [dense(kind) for kind in GRAPH_ARMS[1:]])
        else:
            out = self._receive(reduced, flight)
        return self._for_optimizer(out, flight)

    def _for_optimizer(self, delivered, flight):
        """With momentum correction, what the optimizer is handed for the delivered average
        (compression/momentum.py), on every route alike."""
        momentum = flight.state.pipeline.momentum
        if momentum is None or flight.name is None:
            return delivered
        corrected = self.adapter.host_call(
            lambda d, out=None: momentum.for_optimizer(flight.name, d, out), [delivered],
            "float32", like=flight.tensor, out=self.adapter.output_buffer(delivered, True))
        return self.adapter.finish(corrected, flight.tensor)

    def _receive(self, reduced, flight):
        """The reduced tensor of a flight: cast back, or every rank's payload decoded, summed
        in rank order (the same bits on every rank) and scaled by the reduced placeholder."""
        adapter, state, planner = self.adapter, flight.state, flight.state.policy.planner
        if flight.handle is None:  # Horovod's own allreduce carried it
            adapter.at_run_time(lambda: planner.observe(flight.key, flight.plan, None))
            return adapter.cast(reduced, flight.tensor)
        gathered = adapter.wait(flight.handle)
        process_set = flight.process_set

        def decode(frames, scale, dims, out=None):
            total, received = state.pipeline.decompress(
                frames, tuple(int(d) for d in dims), flight.info.dtype,
                adapter.set_size(process_set), flight.key, out=out, scale=float(np.ravel(scale)[0]),
                own=adapter.set_ranks(process_set).index(adapter.rank()))
            planner.observe(flight.key, flight.plans["current"], Measured.of(received))
            return total.reshape(-1)

        total = adapter.host_call(decode, [gathered, reduced, adapter.dims(flight.tensor)],
                                  "float32", out=adapter.output_buffer(flight.tensor, flight.in_place))
        return adapter.finish(total, flight.tensor)

    # ---- the sparse allreduce (comm/sparse_allreduce.py) ----
    def _scatter(self, flight):
        """Encode this rank's piece of each rank's range and start the alltoall that takes
        them to their owners; the rest waits for decompress, where every sparse allreduce
        in flight is reduced and gathered at once."""
        adapter, state, process_set = self.adapter, flight.state, flight.process_set
        exchange = flight.exchange = Exchange(state.pipeline, flight.name, flight.info.dtype)
        choose = self._chooser(flight)

        def scatter(dense):  # the ranges and the set's size as they are when the step runs
            ranks = adapter.set_ranks(process_set)
            bounds = state.ranges.bounds(flight.key, dense.size, len(ranks),
                                         state.pipeline.selection_count(dense.size, flight.name))
            return exchange.scatter(dense, bounds, ranks.index(adapter.rank()), *choose(dense.size))
        pieces = adapter.host_call(scatter, [flight.tensor], "uint8")
        splits = adapter.host_call(lambda _: exchange.splits, [pieces], "int32")
        flight.handle = adapter.alltoall(
            pieces, splits, f"DeepReduce.pieces.{flight.key}@{adapter.set_id(process_set)}", process_set)
        self._reducing.append(flight)
        return adapter.inverse_size(process_set), flight

    def _reduce_all(self):
        """Every sparse allreduce in flight: the owners reduce the pieces they received, then
        the allgathers of their survivors start together (one negotiation, which Horovod may
        fuse), all before decompress waits for any."""
        adapter, batch, self._reducing = self.adapter, self._reducing, []
        reduced = [adapter.host_call(f.exchange.reduce, [adapter.wait(f.handle)[0]], "uint8")
                   for f in batch]
        for f, survivors in zip(batch, reduced):
            f.handle = adapter.allgather(
                survivors, f"DeepReduce.reduced.{f.key}@{adapter.set_id(f.process_set)}", f.process_set)

    def _gather(self, reduced, flight):
        """Every owner's survivors decoded, scaled by the reduced placeholder, into the
        gradient's own buffer where it may be (as for the allgather)."""
        adapter, exchange = self.adapter, flight.exchange

        def gather(buffer, scale, out=None):
            total, measured = exchange.gather(buffer, flight.state.ranges, flight.key, out=out,
                                              scale=float(np.ravel(scale)[0]))
            flight.state.policy.planner.observe(flight.key, flight.plans["current"], measured)
            return total
        total = adapter.host_call(gather, [adapter.wait(flight.handle), reduced], "float32",
                                  out=adapter.output_buffer(flight.tensor, flight.in_place))
        return adapter.finish(total, flight.tensor)

    # ---- the low-rank route (compression/lowrank.py) ----
    def _project(self, flight):
        """Start the allreduce of this rank's P_i; the second round waits for decompress,
        where every low-rank flight's Q_i is computed and sent at once."""
        adapter, pipeline, process_set = self.adapter, flight.state.pipeline, flight.process_set
        p_own = adapter.host_call(lambda dense: pipeline.project(flight.name, dense),
                                  [flight.tensor], "float32")
        flight.handle = _agreed(adapter.allreduce_sum, p_own,
                                f"DeepReduce.P.{flight.key}@{adapter.set_id(process_set)}", process_set)
        self._projecting.append(flight)
        return adapter.inverse_size(process_set), flight

    def _settle_all(self):
        """Every low-rank flight: Q_i from the reduced P, and the allreduces of the Q_i (all
        started before decompress waits for any)."""
        batch, self._projecting = self._projecting, []
        for f in batch:
            self._settle(f)

    def _settle_ready(self):
        """The low-rank flights whose reduced P has arrived, settled now, while backward still
        runs: their Q round overlaps the rest of it instead of queuing behind the last
        tensors' allreduces at decompress (ranks may start the Q allreduces in different
        orders: Horovod matches them by name). Oldest first, up to the first still on the
        wire: Horovod completes them in about the order they were started, and polling
        every one at every compress made a step's polls quadratic in its matrices."""
        pending = self._projecting
        while pending and self.adapter.ready(pending[0].handle):
            self._settle(pending.pop(0))

    def _settle(self, f):
        """Q_i of one low-rank flight from its reduced P, and the start of its allreduce."""
        adapter, ranks, planner = self.adapter, self.adapter.set_size(f.process_set), \
            f.state.policy.planner

        def settle(p_sum):
            q_own, (encode_s, decode_s) = f.state.pipeline.settle(f.name, p_sum, ranks)
            nbytes = 4.0 * (p_sum.size - f.state.pipeline.TIMES + q_own.size)
            planner.observe(f.key, f.plans["current"], Measured(encode_s, nbytes, decode_s))
            return q_own
        q_own = adapter.host_call(settle, [_agreed(adapter.wait, f.handle)], "float32")
        f.handle = _agreed(adapter.allreduce_sum, q_own,
                           f"DeepReduce.Q.{f.key}@{adapter.set_id(f.process_set)}", f.process_set)

    def _reconstruct(self, reduced, flight):
        """P^ Q^T scaled by the reduced placeholder, into the gradient's own buffer where
        it may be."""
        adapter = self.adapter

        def reconstruct(q_sum, scale, dims, out=None):
            return flight.state.pipeline.reconstruct(
                flight.name, q_sum, tuple(int(d) for d in dims), float(np.ravel(scale)[0]), out)
        total = adapter.host_call(reconstruct, [_agreed(adapter.wait, flight.handle), reduced,
                                                adapter.dims(flight.tensor)], "float32",
                                  out=adapter.output_buffer(flight.tensor, flight.in_place))
        return adapter.finish(total, flight.tensor)

    # ---- the hierarchical mode ----
    def _start_across_hosts(self, flight):
        """Start the host's dense sum; the rest waits for decompress, where every tensor in
        flight is exchanged at once (a wait per tensor would cost a Horovod cycle each)."""
        hierarchy = flight.state.hierarchy
        if hierarchy.local is not None:
            flight.local = self.adapter.allreduce_sum(flight.tensor, f"DeepReduce.host.{flight.key}",
                                                      hierarchy.local)
        self._in_flight.append(flight)
        return self.adapter.inverse_size(flight.process_set), flight

    def _exchange_across_hosts(self, hierarchy):
        """Every tensor in flight, stage by stage: the hosts' sums; the leaders encode them
        and exchange (sparse payloads or dense, as the planner chooses) and decode; then each
        leader broadcasts the totals to its host."""
        adapter = self.adapter
        batch, self._in_flight = self._in_flight, []
        sums = [adapter.wait(f.local) if f.local is not None else f.tensor for f in batch]
        if hierarchy.is_leader:
            for f, host_sum in zip(batch, sums):
                plan = f.state.policy.planner.plan(f.key, f.info.size, True)
                f.inner = Flight(plan, f.state, hierarchy.leaders, f.name, f.key, host_sum, f.info)
                sent = self._send(f.inner)
                if f.inner.handle is None:  # dense between hosts: the leaders sum the host sums
                    f.dense = adapter.allreduce_sum(sent, f"DeepReduce.hosts.{f.key}",
                                                    hierarchy.leaders)
            for f in batch:
                reduced = adapter.wait(f.dense) if f.dense is not None else adapter.one()
                f.total = adapter.as_float32(self._receive(reduced, f.inner))
        else:  # the leader's broadcast overwrites it; sending the host sum keeps it computed
            for f, host_sum in zip(batch, sums):  # (a traced graph prunes unused collectives)
                f.total = adapter.as_float32(host_sum)
        if hierarchy.local is not None:
            shares = [adapter.broadcast(f.total, hierarchy.hosts.leader, f"DeepReduce.share.{f.key}",
                                        hierarchy.local) for f in batch]
            for f, share in zip(batch, shares):
                f.total = adapter.wait(share)

    # ---- names ----
    def _warn_unnamed(self):
        if self.pipeline.memory is not None and not self._warned_unnamed:
            self._warned_unnamed = True
            warnings.warn("DeepReduce: a compressed tensor has no name, so it gets no error "
                          "feedback (residual memory). Name it: pass named_parameters to the "
                          "optimizer and call compression.name_parameters(...), or give "
                          "hvd.allreduce a name=.", RuntimeWarning, stacklevel=4)

    # ---- stats and state ----
    def stats(self) -> dict[str, Any]:
        """bytes_sent, bytes_received, dense_bytes, ratio, tensors_compressed,
        tensors_allreduced, tensors_passed_through, tensors_nonfinite, selections_boosted,
        encode_s, decode_s (this rank, every process set, since the last reset) and, in the
        time-aware mode, "tensors": each tensor's choice with the predicted and measured
        costs behind it, and "guard": per process set ("global", "ranks:0,2"), the step
        guard's winning arm and the step times of its last comparison."""
        states = self.sets.values() or [SetState(self.pipeline)]
        out = Stats.combined([s.pipeline.stats for s in states])
        if self.options.time_aware:  # empty before the first step
            out["tensors"], out["guard"] = {}, {}
            for key, s in self.sets.items():
                if s.policy is not None:
                    out["tensors"].update(s.policy.planner.report())
                    if s.policy.guard is not None:
                        out["guard"][key] = s.policy.guard.report()
        return out

    def reset_stats(self) -> None:
        self.pipeline.stats.reset()
        for s in self.sets.values():
            s.pipeline.stats.reset()

    def config(self) -> dict:
        return self.pipeline.get_config()

    def state_dict(self) -> dict[str, Any]:
        """This rank's state (residuals differ between ranks: save it on every rank)."""
        return {"format": FORMAT, "config": self.config(),
                "sets": {key: s.state_dict(self.adapter.export_array) for key, s in self.sets.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what state_dict returned (on this rank), before the next step."""
        sets = check_state(state, self.config())
        default = self._key(self.process_set(None))
        for key, saved in sets.items():
            if key not in self.sets:
                pipeline = self.pipeline if key == default else Pipeline(**self.options.pipeline)
                self.sets[key] = SetState(pipeline)
            self.sets[key].load_state_dict(saved, self.adapter.import_array, self.adapter.assign)

    def rejoin(self) -> None:
        """After an elastic job's ranks changed (every rank calls it): the sets other than
        the global one are gone; routing, calibration and hosts are measured again on every
        rank alike; each tensor's step count, and the way each tensor of a traced graph
        travels (graphs are not traced again), are rank 0's, and the step guard stays out of
        traced graphs from then on. Residuals stay with their ranks."""
        adapter, everyone = self.adapter, self.adapter.global_set()
        self._in_flight, self._reducing, self._projecting = [], [], []
        self.sets = {key: s for key, s in self.sets.items() if key == self._key(everyone)}
        state = self.set_state(everyone)
        state.reset_routing()
        steps, state.traced_kinds = adapter.broadcast_object(
            (state.pipeline.steps(), state.traced_kinds), everyone, "DeepReduce.rejoin")
        state.graphs_unguarded = bool(state.traced_kinds)
        state.pipeline.set_steps(steps)


def _agreed(collective, *args):
    """collective(*args) for the low-rank route, whose factors' sizes follow each rank's
    options and shapes: where ranks disagree Horovod fails the allreduce, and that failure
    leaves as a DeepReduceError."""
    try:
        return collective(*args)
    except DeepReduceError:
        raise
    except Exception as exc:  # noqa: BLE001 - only DeepReduceError leaves the API
        raise DeepReduceError(
            f"the low-rank factors' allreduce failed ({exc}); give every rank the same "
            "DeepReduce options (lowrank=) and each tensor the same shape on every rank") from exc
