"""The framework-neutral DeepReduce pipeline: memory -> sparsifier -> codec, and back.

The PyTorch and TensorFlow wrappers only move tensors to and from numpy and call Horovod;
everything that decides what goes on the wire is here (and, for the time-aware choice, in
comm/planner.py). Payloads travel in frames (wire/frames.py).
"""
from __future__ import annotations

import itertools
import json
import math
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, List, Optional, Sequence, Tuple

import numpy as np

from ..codecs.sparse_codec import Buffer, CodecSpec, SparseCodec, ascending, decode_unordered
from ..engine import native
from ..engine.halves import to_half
from ..engine.norms import l2_norm
from ..engine.scatter import scatter_add
from ..errors import DeepReduceError
from ..wire import frames
from ..wire.payload import check_shape, declared_count
from . import sparsify
from .density import Density
from .lowrank import LowRank, matrix_shape
from .memory import ResidualMemory
from .momentum import MomentumCorrection, check_momentum

SPARSIFIERS = ("topk", "randomk", "threshold", "none")
MEMORIES = (None, "none", "residual")


class Stats:
    """Counters a training job can log: bytes_sent, bytes_received (the other ranks' frames
    of the sparse allgathers: what this rank received and decoded), dense_bytes, ratio,
    tensors_compressed (sent as sparse payloads), tensors_allreduced (handed to Horovod's
    allreduce, fp32 or fp16, by the time-aware choice), tensors_passed_through,
    tensors_nonfinite, selections_boosted (sparse selections made at a critical phase's
    higher density), tensors_lowrank (sent as low-rank factors by two allreduces; their bytes
    count as sent, as an allreduce's do, not as received), encode_s, decode_s."""

    def __init__(self):
        self.reset()

    def reset(self):
        self.bytes_sent = self.bytes_received = self.dense_bytes = 0
        self.tensors_compressed = self.tensors_allreduced = self.tensors_passed_through = 0
        self.tensors_nonfinite = self.selections_boosted = self.tensors_lowrank = 0
        self.encode_s = self.decode_s = 0.0

    COUNTERS = ("bytes_sent", "bytes_received", "dense_bytes", "tensors_compressed",
                "tensors_allreduced", "tensors_passed_through", "tensors_nonfinite",
                "selections_boosted", "tensors_lowrank", "encode_s", "decode_s")

    def as_dict(self) -> dict[str, Any]:
        return self.combined([self])

    @classmethod
    def combined(cls, all_stats) -> dict[str, Any]:
        """The counters of several pipelines (one per process set) added up, with the ratio."""
        out = {key: sum(getattr(s, key) for s in all_stats) for key in cls.COUNTERS}
        out["ratio"] = out["dense_bytes"] / out["bytes_sent"] if out["bytes_sent"] else 0.0
        return out


_POOL = None
# Decode on worker threads (the calling thread adds each payload into the sum as it comes)
# where a rank has a spare core (native.cores_per_rank) and the payloads hold enough work:
# (elements at least, coded in bits per element at most). Measured here, one process, 32
# payloads decoded into one sum, calling thread alone against two workers: entropy-coded
# payloads (6.5-8.7 bits an element, the costliest to decode) 1.7x faster at 42k elements,
# 1.4x at 21k, even at 10k; golomb+qsgd (15 bits) 1.1-1.4x and golomb+fp16 (24) even at
# 42k, both slower at 21k; raw (64) even or slower at any size. The first payload's header
# stands for the set (one tensor's).
PARALLEL = ((16384, 12), (32768, 32))


def worth_parallel(payloads):
    """Whether a set of payloads (of one tensor) decodes faster on the pool."""
    if len(payloads) < 3:
        return False
    count, bits = declared_count(payloads[0]), 8 * len(payloads[0])
    return any(count >= least and bits <= most * count for least, most in PARALLEL) \
        and native.cores_per_rank() >= 2  # read last: it costs more than a small decode


def decode_all(payloads, shape, dtype_name, kept=None):
    """(values, positions) of each payload, in rank order. Sets of large payloads are decoded
    on a small thread pool (the native kernels release the GIL); the caller still adds them
    in rank order, so every rank computes the same bits. Every payload must hold `dtype_name`
    values of `shape` (a list of shapes: payload i those of shape[i]). kept: (j, (values,
    positions)) where payload j is this rank's own, whose encoder kept what a decoder would
    reconstruct: not decoded, those stand in its place."""
    global _POOL
    payloads = list(payloads)
    shapes = shape if isinstance(shape, list) else [shape] * len(payloads)
    at, part = kept if kept is not None else (None, None)
    todo = [j for j in range(len(payloads)) if j != at]
    payloads, shapes = [payloads[j] for j in todo], [shapes[j] for j in todo]
    decode = lambda p, s: decode_unordered(p, max(math.prod(s), 1), s, dtype_name)[:2]  # noqa: E731
    if not worth_parallel(payloads):
        decoded = map(decode, payloads, shapes)
    else:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(max_workers=min(4, native.cores_per_rank()),
                                       thread_name_prefix="deepreduce")
        decoded = _POOL.map(decode, payloads, shapes)
    if at is None:
        return decoded
    return itertools.chain(itertools.islice(decoded, at), [part], decoded)


class Pipeline:
    """sparsifier + SparseCodec + residual memory, on numpy arrays.

    sparsifier: "topk" / "randomk" (keep `ratio` of the elements), "threshold" (magnitude
    above `threshold`; 0 keeps the non-zeros) or "none" (every element).
    index, value, arrangement: as for SparseCodec ("auto": smallest payload per call).
    memory: "residual" (error feedback, the default) or None.
    min_size: tensors with fewer elements are sent dense (default 1000, as in the paper).
    warmup_steps: density warm-up (Deep Gradient Compression): top-k and random-k keep 25%
    of a tensor at its first step, decaying geometrically to `ratio` over this many steps,
    so that early training, when gradients change fastest, is not starved (default 0: off).
    adaptive_density: Accordion's critical regimes (compression/density.py): a tensor whose
    delivered gradient's norm changes fast selects 4x the ratio until it settles (default off
    here; DeepReduce turns it on).
    momentum: the momentum of the job's SGD optimizer, for DGC's momentum correction
    (compression/momentum.py; 0: off); momentum_masking: DGC's momentum factor masking.
    local_clip_norm: DGC's local gradient clipping (default None: off): this rank's gradient
    of a tensor is scaled to an L2 norm of at most this before it enters the velocity or the
    residual, since each rank accumulates on its own (clipping the average would come too
    late). DGC's rule for a bound C on the averaged gradient of N ranks: C * sqrt(N).
    lowrank: the rank of the low-rank factors a matrix may travel as (compression/lowrank.py;
    the planner chooses where; default 0: never).
    energy: a share of the compensated gradient's energy that top-k must carry, keeping more
    than the step's count where that count carries less, up to 4x it (compression/density.py;
    default None: off).

    A gradient holding NaN or Inf is not encoded: every rank receives NaN for that tensor
    (as a dense allreduce would deliver NaN; an AMP loss scaler then skips the step), and its
    residual is reset.
    """

    def __init__(self, sparsifier: str = "topk", ratio: float = 0.01, threshold: float = 0.0,
                 index: CodecSpec = "auto", value: CodecSpec = "auto", arrangement: str = "auto",
                 memory: Optional[str] = "residual", min_size: int = 1000, seed: int = 0,
                 warmup_steps: int = 0, adaptive_density: bool = False, momentum: float = 0.0,
                 momentum_masking: bool = False, local_clip_norm: Optional[float] = None,
                 lowrank: int = 0, energy: Optional[float] = None) -> None:
        if sparsifier not in SPARSIFIERS:
            raise DeepReduceError(f"sparsifier must be one of {SPARSIFIERS}, not {sparsifier!r}")
        sparsify.check_threshold(threshold)
        if memory not in MEMORIES:
            raise DeepReduceError(f"memory must be None or 'residual', not {memory!r}")
        if isinstance(min_size, bool) or not isinstance(min_size, int) or min_size < 0:
            raise DeepReduceError(f"min_size must be a non-negative int, not {min_size!r}")
        if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 0:
            raise DeepReduceError(f"warmup_steps must be a non-negative int, not {warmup_steps!r}")
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**64:
            raise DeepReduceError(f"seed must be an integer in [0, 2**64), not {seed!r}")
        for flag, setting in (("adaptive_density", adaptive_density),
                              ("momentum_masking", momentum_masking)):
            if not isinstance(setting, bool):
                raise DeepReduceError(f"{flag} must be True or False, not {setting!r}")
        if local_clip_norm is not None and (
                isinstance(local_clip_norm, bool) or not isinstance(local_clip_norm, (int, float))
                or not math.isfinite(local_clip_norm) or local_clip_norm <= 0):
            raise DeepReduceError("local_clip_norm must be None or a positive finite number, "
                                  f"not {local_clip_norm!r}")
        self.local_clip_norm = None if local_clip_norm is None else float(local_clip_norm)
        if energy is not None and sparsifier != "topk":
            raise DeepReduceError("energy applies to the top-k sparsifier, not "
                                  f"{sparsifier!r}")
        self.density = Density(ratio, warmup_steps, adaptive_density, energy)
        if check_momentum(momentum) and memory != "residual":
            raise DeepReduceError("momentum correction needs memory='residual' (the velocity "
                                  "not yet sent waits in the residual)")
        self.momentum = MomentumCorrection(momentum, momentum_masking) if momentum else None
        self.sparsifier, self.ratio, self.threshold = sparsifier, ratio, float(threshold)
        self.codec = SparseCodec(index=index, value=value, arrangement=arrangement)
        self.memory = ResidualMemory() if memory == "residual" else None
        self.factors = LowRank(lowrank, seed)
        self._lowrank_s = {}  # name -> [this step's encode seconds, the last one reported]
        self.min_size, self.seed, self.warmup_steps = min_size, seed, warmup_steps
        self.stats = Stats()
        self._steps = {}
        self._last_decode = {}
        self._sent = {}  # name -> the Encoded of this rank's last frame (not decoded again)
        self._config_json, self._fingerprints = None, {}

    def get_config(self) -> dict:
        return {"sparsifier": self.sparsifier, "ratio": self.ratio, "threshold": self.threshold,
                **self.codec.get_config(), "memory": "residual" if self.memory else None,
                "min_size": self.min_size, "warmup_steps": self.warmup_steps,
                "adaptive_density": self.density.adaptive,
                "momentum": self.momentum.momentum if self.momentum else 0.0,
                "momentum_masking": bool(self.momentum and self.momentum.masking),
                "local_clip_norm": self.local_clip_norm, "lowrank": self.factors.rank,
                "energy": self.density.energy}

    def state_dict(self) -> dict:
        """What this pipeline's next steps depend on: the residuals (error feedback), each
        tensor's step count (density warm-up, random-k seeds), its last decode time (sent in
        frames), the codec's random state, the critical-phase detector's sums and the
        momentum correction's velocities, the low-rank route's warm starts. Residuals as the
        memory holds them."""
        return {"residuals": self.memory.items() if self.memory is not None else {},
                "steps": self.steps(), "last_decode": dict(self._last_decode),
                "codec": self.codec.random_state(), "density": self.density.state_dict(),
                "momentum": self.momentum.state_dict() if self.momentum else None,
                "lowrank": self.factors.state_dict()}

    def steps(self) -> dict:
        """How many steps each named tensor has taken."""
        return dict(self._steps)

    def set_steps(self, steps: dict) -> None:
        self._steps = {name: int(step) for name, step in steps.items()}

    def load_state_dict(self, state: dict, assign: Optional[Callable] = None) -> None:
        """Restore what state_dict returned (residuals as float32 numpy arrays; `assign`: see
        ResidualMemory.load)."""
        if self.memory is not None:
            self.memory.load(state["residuals"], assign)
        self.set_steps(state["steps"])
        self._last_decode = {name: float(s) for name, s in state["last_decode"].items()}
        self.codec.set_random_state(state["codec"])
        self.density.load_state_dict(state["density"])
        if self.momentum is not None:
            self.momentum.load_state_dict(state["momentum"])
        self.factors.load_state_dict(state.get("lowrank", {}))

    def current_ratio(self, name=None):
        """The ratio of tensor `name`'s next selection (compression/density.py). Every rank
        compresses a tensor the same number of times and decodes the same sums, so every rank
        selects the same count."""
        return self.density.ratio(name, self._steps.get(name, 0))

    def selection_count(self, size, name=None):
        """How many elements the sparsifier sends from a tensor of `size` (at most) at tensor
        `name`'s next step."""
        if self.sparsifier in ("topk", "randomk"):
            return sparsify.selection_size(size, self.current_ratio(name))
        return size

    @property
    def count_unknown(self) -> bool:
        """Whether the count selected is known only once a step selects (the threshold
        sparsifier): selection_count is then the whole tensor, a bound."""
        return self.sparsifier == "threshold"

    def _advance(self, name):
        """One more step of tensor `name` (sent sparse or dense)."""
        if name is not None:
            self._steps[name] = self._steps.get(name, 0) + 1

    def fingerprint(self, shape, dtype_name):
        """crc32 of JSON [shape, dtype, config] (made once per shape and dtype: the sparse
        allreduce fingerprints a frame per range at every step)."""
        key = (tuple(int(d) for d in shape), dtype_name)
        if key not in self._fingerprints:
            if len(self._fingerprints) >= 4096:  # re-split ranges keep making new sizes
                self._fingerprints.clear()
            if self._config_json is None:
                self._config_json = json.dumps(self.get_config(), sort_keys=True)
            text = f"[{json.dumps(list(key[0]))}, {json.dumps(dtype_name)}, {self._config_json}]"
            self._fingerprints[key] = zlib.crc32(text.encode())
        return self._fingerprints[key]

    def _compensated_selection(self, name, dense):
        """(values, indices, seed, compensated flat array) or None when it holds NaN/Inf."""
        memory = self.memory if name is not None else None
        residual = memory.buffer(name, dense.shape).reshape(-1) if memory else None
        if self.sparsifier in ("topk", "threshold"):
            k = self.selection_count(dense.size, name)
            grown = self.density.energy is not None and name is not None  # top-k only
            cap = self.density.energy_cap(dense.size, k) if grown else k
            picked = sparsify.select(self.sparsifier, dense, residual, k=cap, tau=self.threshold)
            compensated = residual if residual is not None else dense.reshape(-1)
            if picked is not None and cap > k:
                picked = sparsify.energy_share(*picked, k, compensated, self.density.energy)
            return None if picked is None else (*picked, None, compensated)
        compensated = residual if residual is not None else dense.astype(np.float32).reshape(-1)
        if residual is not None:
            residual += dense.reshape(-1)
        if not np.isfinite(compensated).all():
            return None
        if self.sparsifier == "none":
            return compensated.copy(), np.arange(compensated.size, dtype=np.int64), None, compensated
        seed = zlib.crc32(f"{name}:{self._steps.get(name, 0)}".encode()) ^ self.seed
        ratio = self.current_ratio(name)
        return (*sparsify.randomk(compensated, ratio, seed), seed, compensated)

    def compress(self, name: Optional[str], dense: np.ndarray, codec: Optional[SparseCodec] = None,
                 fallback: Optional[SparseCodec] = None) -> bytes:
        """dense numpy gradient -> frame bytes for the allgather. The residual memory, if any,
        is keyed by name; tensors without a name (None) get no error feedback. codec: the
        SparseCodec to use this time (default: the pipeline's); fallback: a codec to use if
        that one cannot encode these values (else every rank raises the error)."""
        start = time.perf_counter()
        picked = self._pick(name, dense)
        values, indices, seed, compensated = picked if picked is not None else (None,) * 4
        frame, encoded = self.encode_selected(values, indices, dense.shape, dense.dtype, name,
                                              codec, fallback, compensated, seed, start)
        self._feed_back(name, picked, encoded and (encoded.positions, encoded.values))
        return frame

    def _pick(self, name, dense):
        """The (clipped) gradient's velocity (momentum correction), compensated and selected:
        see _compensated_selection."""
        work = np.asarray(dense, dtype=np.float32) if dense.dtype.name in ("bfloat16", "float16") else dense
        work = self._clipped(work)
        if self.momentum is not None and name is not None:
            work = self.momentum.velocity(name, work)
        return self._compensated_selection(name, work)

    def _clipped(self, gradient):
        """The gradient scaled to L2 norm local_clip_norm if it is longer (a new array), else
        itself; a non-finite one is left for the non-finite path."""
        if self.local_clip_norm is None:
            return gradient
        norm = l2_norm(np.asarray(gradient, dtype=np.float32))
        if not math.isfinite(norm) or norm <= self.local_clip_norm:
            return gradient
        return np.multiply(gradient, np.float32(self.local_clip_norm / norm), dtype=np.float32)

    def _feed_back(self, name, picked, delivered):
        """Error feedback once encoded: the receivers get `delivered` = (positions, values),
        None when nothing could be encoded; a non-finite gradient (picked None) starts afresh."""
        if self.memory is None or name is None:
            return
        if picked is None:
            self._forget(name)
        elif delivered is not None:
            self.memory.deliver(name, *delivered)
            if self.momentum is not None:
                self.momentum.sent(name, delivered[0])

    def _forget(self, name):
        """Tensor `name`'s gradient was not finite: its error feedback starts afresh."""
        self.memory.reset(name)
        if self.momentum is not None:
            self.momentum.reset(name)

    def encode_selected(self, values, indices, shape, dtype, name=None, codec=None,
                        fallback=None, dense=None, seed=None, start=None):
        """Frame for values already selected (and compensated) elsewhere, e.g. on a GPU:
        values None means the gradient held NaN or Inf. -> (frame bytes, the selector's
        Encoded, or None when nothing was encoded): the caller delivers Encoded.values at
        Encoded.positions to its residual."""
        start = time.perf_counter() if start is None else start
        frame, encoded = self.frame(values, indices, shape, dtype, name, codec, fallback, dense,
                                    seed, start)
        self.stats.bytes_sent += len(frame)
        if name is not None:  # the values as a receiver decodes them: in the frame's dtype
            self._sent[name] = encoded and encoded._replace(
                values=np.asarray(encoded.values).astype(dtype, copy=False))
        self._count_sparse(name, shape, time.perf_counter() - start, values is None)
        return frame, encoded

    def frame(self, values, indices, shape, dtype, name=None, codec=None, fallback=None,
              dense=None, seed=None, start=None):
        """(frame bytes, Encoded or None) of one selection, not counted in the stats: a
        payload, NONFINITE (values None), or the error every rank raises when neither the
        codec nor the fallback can encode it (so no rank waits forever)."""
        start = time.perf_counter() if start is None else start
        dtype = np.dtype(dtype)
        codec, encoded = codec or self.codec, None
        if values is None:
            kind, payload = frames.NONFINITE, b""
        else:
            values = np.asarray(values).astype(dtype, copy=False)
            try:
                try:
                    encoded = codec.encode_full(values, indices, shape, dense=dense, seed=seed)
                except DeepReduceError:
                    if fallback is None:
                        raise
                    encoded = fallback.encode_full(values, indices, shape, dense=dense, seed=seed)
                kind, payload = frames.PAYLOAD, encoded.payload
            except DeepReduceError as exc:  # sent to every rank, raised there: no rank hangs
                kind, payload = frames.ERROR, str(exc).encode()
        return frames.write(self.fingerprint(shape, dtype.name), kind, payload,
                            time.perf_counter() - start, self._last_decode.get(name, 0.0)), encoded

    def _count_sparse(self, name, shape, encode_s, nonfinite=None):
        """Stats (and the step) of one tensor sent as sparse payloads."""
        self.stats.encode_s += encode_s
        self.stats.dense_bytes += 4 * math.prod(shape)
        self.stats.tensors_compressed += 1
        self.stats.tensors_nonfinite += bool(nonfinite)
        if self.sparsifier in ("topk", "randomk") and self.density.critical(name):
            self.stats.selections_boosted += 1
        self._advance(name)

    def compress_pieces(self, name: Optional[str], dense: np.ndarray, bounds: Sequence[int],
                        own: int, codec: Optional[SparseCodec] = None,
                        fallback: Optional[SparseCodec] = None):
        """The sender's side of the sparse allreduce (comm/sparse_allreduce.py): one frame per
        range [bounds[j], bounds[j+1]) of the flattened gradient (b"" where it is empty),
        holding this rank's selection in that range at positions relative to its start (each
        piece encoded on its own). Error feedback as in compress; `own` is this rank's range
        (its piece stays here: not counted as sent). -> (frames, positions, values, starts):
        what the receivers will reconstruct, flat positions of the whole tensor, range j's
        at [starts[j], starts[j+1])."""
        start = time.perf_counter()
        bounds = [int(b) for b in bounds]
        picked = self._pick(name, dense)
        pieces, positions, values, counts = [], [], [], np.zeros(len(bounds), np.int64)
        if picked is not None:
            chosen, indices, _, compensated = picked
            if not ascending(indices):  # top-k and threshold select in ascending order
                order = np.argsort(indices, kind="stable")
                chosen, indices = chosen[order], indices[order]
            cuts = np.searchsorted(indices, bounds)
        for j, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:])):
            if lo == hi:  # a rank without a range of this tensor: no piece
                pieces.append(b"")
                continue
            if picked is None:
                frame, encoded = self.frame(None, None, (hi - lo,), dense.dtype, name)
            else:
                part = slice(cuts[j], cuts[j + 1])
                frame, encoded = self.frame(chosen[part], indices[part] - lo, (hi - lo,),
                                            dense.dtype, name, codec, fallback, compensated[lo:hi])
            pieces.append(frame)
            if encoded is not None:
                positions.append(encoded.positions + lo)
                values.append(np.asarray(encoded.values, np.float32))
                counts[j + 1] = len(encoded.positions)
        positions = np.concatenate(positions) if positions else np.zeros(0, np.int64)
        values = np.concatenate(values) if values else np.zeros(0, np.float32)
        self._feed_back(name, picked, (positions, values))
        self.stats.bytes_sent += sum(len(p) for j, p in enumerate(pieces) if j != own)
        self._count_sparse(name, dense.shape, time.perf_counter() - start, picked is None)
        return pieces, positions, values, np.cumsum(counts)

    def decompress(self, gathered: Buffer, shape: Sequence[int], dtype_name: str, ranks: int,
                   name: Optional[str] = None, out: Optional[np.ndarray] = None,
                   scale: float = 1.0, own: Optional[int] = None
                   ) -> Tuple[np.ndarray, List[frames.Frame]]:
        """The concatenated frames of every rank (an allgather's output) -> scale times their
        sum, dense float32, added in rank order so that every rank computes the same bits.
        out: a float32 buffer of the tensor's size to write the sum into (else a new one).
        own: this rank's position among the frames (None: not among them). Its frame is not
        counted as received, nor decoded where it holds the payload this rank last encoded
        for `name`: the values the encoder kept are those a decoder would reconstruct.
        Returns (sum, frames); the frames carry each rank's measured costs."""
        start = time.perf_counter()
        shape = check_shape(shape)
        if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
            raise DeepReduceError(f"ranks must be a positive int, not {ranks!r}")
        if own is not None and not 0 <= own < ranks:
            raise DeepReduceError(f"own must be a position among {ranks} frames, not {own!r}")
        expected = self.fingerprint(shape, dtype_name)
        received = frames.read_all(gathered, ranks, expected, f"shape {shape}, {dtype_name}")
        self.stats.bytes_received += sum(frames.HEADER + len(frame.payload)
                                         for j, frame in enumerate(received) if j != own)
        for frame in received:
            if frame.kind == frames.ERROR:
                raise DeepReduceError(f"rank {frame.rank} could not encode this tensor: "
                                      f"{bytes(frame.payload).decode(errors='replace')}")
        nonfinite = any(frame.kind == frames.NONFINITE for frame in received)
        sent = self._sent.pop(name, None) if own is not None and name is not None else None
        if sent is not None and not (received[own].kind == frames.PAYLOAD and
                                     received[own].payload == sent.payload):
            sent = None
        # a pool starts decoding here, while this thread clears the sum
        decoded = () if nonfinite else decode_all(
            [frame.payload for frame in received], shape, dtype_name,
            sent and (own, (sent.values, sent.positions)))
        if out is None:
            total = np.zeros(math.prod(shape), dtype=np.float32)
        else:
            total = out.reshape(-1)
            total.fill(0.0)
        positions = None
        if nonfinite:
            total[:] = np.nan
        else:
            arrived = []
            for values, indices in decoded:
                scatter_add(total, indices, values, scale)
                arrived.append(indices)
            if self.density.adaptive or self.momentum is not None:  # the only readers
                positions = np.concatenate(arrived) if arrived else np.zeros(0, np.int64)
        self.decoded(name, total, time.perf_counter() - start, positions=positions)
        return total.reshape(shape), received

    def decoded(self, name, total, seconds, feedback_s=0.0, positions=None):
        """Tensor `name`'s delivered `total` took `seconds` to decode, and `feedback_s` of
        error feedback on receipt (the sparse allreduce's settling: encode time in the stats,
        as compress's residual update is); their sum goes to the planner in the next frames.
        positions: the flat positions outside which the total is zero, for the critical-phase
        detector and the momentum correction, which read those alone (None: the total is NaN,
        or neither is on)."""
        if positions is not None:
            self.density.observe(name, total, positions)
            if self.momentum is not None and name is not None:
                self.momentum.arrived(name, positions)
        self._last_decode[name] = seconds + feedback_s
        self.stats.decode_s += seconds
        self.stats.encode_s += feedback_s

    def compress_dense(self, name: Optional[str], dense: np.ndarray, half: bool = False) -> np.ndarray:
        """A tensor for Horovod's own allreduce (the time-aware choice): the compensated
        gradient, as float16 if `half`; the residual keeps what fp16 rounding lost (and is
        reset if the gradient or its fp16 cast is not finite)."""
        start = time.perf_counter()
        memory = self.memory if name is not None else None
        dense = self._clipped(dense)
        if memory is not None and not half and self.holds_nothing(name):
            memory = None  # nothing held back (the last fp32 send cleared it): the gradient as is
        if memory is not None:
            if self.momentum is not None:
                dense = self.momentum.velocity(name, dense)
            work = memory.compensate(name, dense)
        else:
            work = np.array(dense, dtype=np.float32) if half else np.asarray(dense, np.float32)
        if half:
            sent, finite = to_half(work, keep_error=memory is not None)
            if memory is not None and not finite:
                self._forget(name)
        else:
            sent = work.copy() if memory is not None else work
            if memory is not None:
                work.fill(0.0)  # receivers got everything
                memory.cleared(name)
                if self.momentum is not None and not np.isfinite(sent).all():
                    self.momentum.reset(name)
        self.count_dense(sent.nbytes, dense.size, time.perf_counter() - start, name)
        return sent

    def holds_nothing(self, name: Optional[str]) -> bool:
        """Whether an fp32 send of `name` is the gradient as it is and what the optimizer is
        handed is the average itself: no local clipping, no momentum correction, and no
        residual held back (none kept, or the last fp32 send cleared it)."""
        return self.local_clip_norm is None and self.momentum is None and (
            self.memory is None or name is None or self.memory.is_zero(name))

    def count_dense(self, nbytes, size, seconds, name=None):
        """Stats (and the step) of one tensor handed to Horovod's own allreduce."""
        self._advance(name)
        self.stats.encode_s += seconds
        self.stats.bytes_sent += nbytes
        self.stats.dense_bytes += 4 * size
        self.stats.tensors_allreduced += 1

    # ---- the low-rank route (compression/lowrank.py): project, settle, reconstruct ----
    TIMES = 2  # a P sent carries this rank's last encode and decode seconds, summed with it

    def project(self, name: str, dense: np.ndarray) -> np.ndarray:
        """The first round for named matrix `name`: its (clipped) gradient's velocity, with
        the residual added, times the warm-start factor -> P_i flattened, then this rank's
        last encode and decode seconds of the tensor (summed over ranks with P: the planner's
        measurements, identical on every rank; 0: none, as after a tensor's first step, whose
        encode pays for first touching its residual and velocity)."""
        start = time.perf_counter()
        work = self._clipped(np.asarray(dense, dtype=np.float32))
        if self.momentum is not None:
            work = self.momentum.velocity(name, work)
        compensated = self.memory.compensate(name, work) if self.memory is not None else \
            np.array(work, dtype=np.float32)
        p = self.factors.project(name, compensated.reshape(matrix_shape(dense.shape)))
        self._advance(name)
        first = name not in self._lowrank_s
        times = self._lowrank_s.setdefault(name, [0.0, 0.0])
        tail = np.array([times[1], self._last_decode.get(name, 0.0)], np.float32)
        seconds = time.perf_counter() - start
        self.stats.encode_s += seconds
        times[0] = math.inf if first else seconds
        self.stats.bytes_sent += p.nbytes
        self.stats.dense_bytes += 4 * dense.size
        self.stats.tensors_lowrank += 1
        return np.concatenate([p.reshape(-1), tail])

    def settle(self, name: str, p_sum: np.ndarray, ranks: int) -> Tuple[np.ndarray, tuple]:
        """The second round, from the reduced P: (Q_i flattened, the mean over the `ranks`
        of their last encode and decode seconds). Error feedback keeps M_i - P^ Q_i^T; a
        non-finite P (every rank's is the same) starts the tensor afresh."""
        start = time.perf_counter()
        p_sum = np.asarray(p_sum, dtype=np.float32).reshape(-1)
        measured = tuple(float(t) / ranks for t in p_sum[-self.TIMES:])
        q_own, finite = self.factors.settle(name, p_sum[:-self.TIMES],
                                            keep_error=self.memory is not None)
        if not finite and self.memory is not None:
            self._forget(name)
        self.stats.bytes_sent += q_own.nbytes
        times = self._lowrank_s[name]
        seconds = time.perf_counter() - start
        self.stats.encode_s += seconds
        times[0] += seconds
        times[1] = times[0] if math.isfinite(times[0]) else 0.0
        return q_own.reshape(-1), measured

    def reconstruct(self, name: str, q_sum: np.ndarray, shape: Sequence[int], scale: float = 1.0,
                    out: Optional[np.ndarray] = None) -> np.ndarray:
        """The delivered total of the low-rank route: scale * P^ Q^T (flat float32, into
        `out` where given; NaN where the tensor was not finite on some rank)."""
        start = time.perf_counter()
        q_sum = np.asarray(q_sum, dtype=np.float32).reshape(-1)
        total = self.factors.reconstruct(name, q_sum, matrix_shape(shape), scale, out)
        self.decoded(name, total, time.perf_counter() - start)
        return total

    def passed_through(self, size, itemsize):
        self.stats.tensors_passed_through += 1
        self.stats.bytes_sent += size * itemsize
        self.stats.dense_bytes += size * 4
