"""The sparse allreduce route (the shape of Ok-Topk: Li and Hoefler, PPoPP 2022): bytes and
decoding per rank stay O(k) as ranks grow, where an allgather's grow with P.

The flattened index space is split into ranges, one owned by each of m ranks of the set
(m = P unless the tensor selects too few elements to be worth splitting: a range's fixed
costs are a payload to parse from every rank and one to decode on every rank) and balanced
on where the selected elements fell. Each rank encodes its selection's part in each range
as a payload of its own (the index and value codecs apply to every piece) and one alltoall
takes every piece to its range's owner. An owner decodes and sums the P pieces of its
range, selects again (the ceil(k/m) largest of the sum), encodes the survivors, and every
rank allgathers the owners' payloads: about k values in all, whatever P.

Error feedback stays exact: a sender adds back into its residual every value it sent that
did not survive, and an owner the difference between the sum and what its payload delivers
(lossy value codecs). So on every rank's books sent + residual = gradients, and over the set
the delivered total plus every residual equals the sum of the gradients.

Each owner's payload is preceded by how many elements it received, how many bytes it sent in
the alltoall and how long it took to encode them, and whether a frame follows (ranks that own
no range send none): from the first every rank re-splits the ranges identically
(`Ranges.rebalance`), the next two are the planner's costs of the route.
"""
from __future__ import annotations

import math
import struct
import time
import zlib

import numpy as np

from ..compression.pipeline import Pipeline, decode_all
from ..compression.sparsify import exact_topk
from ..engine.runs import member, merge_sum
from ..engine.scatter import densify, scatter_add
from ..errors import DeepReduceError
from ..wire import frames
from ..wire.payload import byte_view
from .planner import Measured

# before an owner's frame: elements it received, bytes it sent in the alltoall, microseconds
# it took to encode its pieces (each at most _MAX_U32), whether a frame follows
HEAD = struct.Struct("<IIIB")
_MAX_U32 = 2**32 - 1
REBALANCE = 1.25  # re-split the ranges when the busiest carries this much more than the mean
MIN_OWNED = 1024  # selected elements a step per range at least, where there are enough


def owner_count(selected: int, ranks: int) -> int:
    """How many ranks own a range of a tensor whose step selects `selected` elements: one per
    MIN_OWNED of them, at least 1, at most P."""
    return max(1, min(ranks, selected // MIN_OWNED))


def owning(bounds: np.ndarray) -> np.ndarray:
    """The ranks whose ranges of these P+1 boundaries are not empty."""
    return np.flatnonzero(np.diff(bounds))


def even_bounds(size: int, ranks: int, owners: int = None, first: int = 0) -> np.ndarray:
    """P+1 boundaries splitting range(size) into `owners` (default P) nearly equal ranges,
    owned by ranks first, first + 1, ... (mod P); the other ranks' ranges are empty."""
    owners = ranks if owners is None else owners
    lengths = np.zeros(ranks, dtype=np.int64)
    lengths[np.sort((first + np.arange(owners)) % ranks)] = np.diff(
        [size * j // owners for j in range(owners + 1)])
    return np.concatenate([[0], np.cumsum(lengths)])


class Ranges:
    """Each tensor's split of its index space into the ranks' ranges. Every rank computes the
    same split from the same loads (the owners report them in their payloads)."""

    def __init__(self) -> None:
        self._bounds = {}

    def bounds(self, key: str, size: int, ranks: int, selected: int) -> np.ndarray:
        """The ranges of tensor `key` (P+1 boundaries) for a step selecting `selected`
        elements: split anew (evenly; the first owner by the key's crc32, so that the
        small tensors' owners spread over the ranks) when the world size or the owner
        count changed."""
        owners = owner_count(selected, ranks)
        bounds = self._bounds.get(key)
        if bounds is None or len(bounds) != ranks + 1 or bounds[-1] != size or \
                len(owning(bounds)) != min(owners, size):
            bounds = self._bounds[key] = even_bounds(size, ranks, owners,
                                                     zlib.crc32(key.encode()) % ranks)
        return bounds

    def rebalance(self, key: str, bounds: np.ndarray, loads: np.ndarray) -> None:
        """Re-split where the loads (elements each range's owner received) are uneven: the new
        boundaries cut the load, spread evenly within each old range, into equal parts among
        the same owners; every owner's range keeps at least one element."""
        owners = owning(bounds)
        loads = np.asarray(loads, dtype=np.float64)[owners]
        total, size = loads.sum(), int(bounds[-1])
        if total <= 0 or loads.max() <= REBALANCE * total / len(owners):
            return
        cumulative = np.concatenate([[0.0], np.cumsum(loads)])
        edges = np.append(bounds[owners], size).astype(np.float64)
        parts = len(owners)
        inner = np.round(np.interp(total * np.arange(1, parts) / parts, cumulative, edges))
        inner = inner.astype(np.int64)
        for j in range(parts - 1):  # every range keeps at least one element
            inner[j] = min(max(inner[j], (inner[j - 1] if j else 0) + 1), size - (parts - 1 - j))
        lengths = np.zeros(len(bounds) - 1, dtype=np.int64)
        lengths[owners] = np.diff(np.concatenate([[0], inner, [size]]))
        self._bounds[key] = np.concatenate([[0], np.cumsum(lengths)])

    def state_dict(self) -> dict:
        return {key: [int(b) for b in bounds] for key, bounds in self._bounds.items()}

    def load_state_dict(self, state: dict) -> None:
        self._bounds = {key: np.array(bounds, dtype=np.int64) for key, bounds in state.items()}


class Exchange:
    """One tensor's sparse allreduce between compress and decompress, on one rank: `scatter`
    (the sender), `reduce` (the owner), `gather` (everyone), each when the step runs."""

    def __init__(self, pipeline: Pipeline, name, dtype_name: str) -> None:
        self.pipeline, self.name, self.dtype_name = pipeline, name, dtype_name
        self.bounds = self.own = self.keep = self.codecs = None
        self.sent = self.splits = None  # (positions, values) this rank's pieces deliver
        self.sent_starts = None  # where each range's part of `sent` starts
        self.survivors = None  # the owner's Encoded: what its payload delivers
        self.owner_feedback = None  # (positions, sum - delivered) where the owner's payload lands
        self.sent_bytes, self.encode_s, self.decode_s = 0, 0.0, 0.0
        self.ranks = 0

    def _range(self, j):
        lo, hi = int(self.bounds[j]), int(self.bounds[j + 1])
        return lo, hi, self.pipeline.fingerprint((hi - lo,), self.dtype_name)

    def scatter(self, dense, bounds, own, codec, fallback) -> np.ndarray:
        """This rank's pieces for the ranges `bounds` (its own: range `own`), concatenated
        in rank order (their sizes in `self.splits`)."""
        start = time.perf_counter()
        self.bounds, self.own, self.ranks, self.codecs = bounds, own, len(bounds) - 1, (codec, fallback)
        self.keep = keep_count(self.pipeline.selection_count(dense.size, self.name),
                               max(1, len(owning(bounds))))
        pieces, positions, values, self.sent_starts = self.pipeline.compress_pieces(
            self.name, dense, bounds, own, codec, fallback)
        self.sent = positions, values
        self.splits = np.array([len(p) for p in pieces], dtype=np.int32)
        self.sent_bytes = int(self.splits.sum() - self.splits[own])
        self.encode_s = time.perf_counter() - start
        return np.frombuffer(b"".join(pieces), np.uint8)

    def reduce(self, received) -> np.ndarray:
        """The owner's side: every rank's piece of this rank's range decoded and summed in rank
        order, the `keep` largest of the sum encoded; -> HEAD + frame for the allgather. Work
        and memory are O(k) (the pieces' elements), not O(range), unless the codec reads the
        dense range (Bloom p0, "dense", the dense fallback of "auto"). Pieces that cannot be
        read or decoded (malformed, truncated, another config) make the frame an error that
        every rank raises at the gather: only this owner saw them, and no rank may wait."""
        start = time.perf_counter()
        lo, hi, fingerprint = self._range(self.own)
        self.survivors = self.owner_feedback = None
        try:
            if lo == hi and not len(received):  # this rank owns no range of this tensor
                frame, load, decoded = b"", 0, None
            elif lo == hi:
                raise DeepReduceError(f"{len(received)} bytes arrived for an empty range")
            else:
                frame, load, decoded = self._reduced(received, lo, hi, fingerprint)
        except DeepReduceError as exc:
            frame, load, decoded = frames.write(fingerprint, frames.ERROR, (
                f"the pieces of range {lo}:{hi} of this tensor: {exc}").encode()), 0, None
        self.pipeline.stats.bytes_sent += HEAD.size + len(frame)
        done = time.perf_counter()
        self.decode_s = (decoded or done) - start
        encode_s = done - (decoded or done)  # the survivors' selection and encoding
        self.pipeline.stats.encode_s += encode_s
        self.encode_s += encode_s
        head = (min(_MAX_U32, n) for n in (load, self.sent_bytes, int(round(self.encode_s * 1e6))))
        return np.frombuffer(HEAD.pack(*head, bool(frame)) + frame, np.uint8)

    def _reduced(self, received, lo, hi, fingerprint):
        """(the owner's frame, elements received, when decoding ended or None)."""
        pieces = frames.read_all(received, self.ranks, fingerprint, f"range {lo}:{hi}")
        stats = self.pipeline.stats
        stats.bytes_received += sum(frames.HEADER + len(p.payload) for p in pieces) - \
            int(self.splits[self.own])
        errors = [p for p in pieces if p.kind == frames.ERROR]
        if errors:
            message = f"rank {errors[0].rank} could not encode this tensor: " + \
                bytes(errors[0].payload).decode(errors="replace")
            return frames.write(fingerprint, frames.ERROR, message.encode()), 0, None
        if any(p.kind == frames.NONFINITE for p in pieces):
            frame, _ = self.pipeline.frame(None, None, (hi - lo,), self.dtype_name, self.name)
            return frame, 0, None
        parts = self._decoded(dict(enumerate(pieces)), self._own_piece(lo), (hi - lo,))
        union, sums = merge_sum(parts)
        decoded = time.perf_counter()
        load = sum(positions.size for _, positions in parts)
        return self._select_and_encode(union, sums, hi - lo), load, decoded

    def _own_piece(self, lo):
        """(values, positions in the range) of this rank's own piece (its range starts at lo),
        as its payload decodes (the encoder's Encoded values): not decoded again."""
        positions, values = self.sent
        first, end = self.sent_starts[self.own], self.sent_starts[self.own + 1]
        return values[first:end], positions[first:end] - lo

    def _decoded(self, frames_, own, shape=None):
        """(values, positions) of each frame's payload ({rank: frame} -> a list in rank order),
        this rank's own from `own` (None: decoded like the others). Every frame of `shape`,
        or (None) frame j of range j's."""
        ranks = sorted(frames_)
        shapes = [shape or (int(self.bounds[j + 1] - self.bounds[j]),) for j in ranks]
        kept = (ranks.index(self.own), own) if own is not None and self.own in frames_ else None
        return list(decode_all([frames_[j].payload for j in ranks], shapes, self.dtype_name, kept))

    def _select_and_encode(self, union, sums, size):
        """The owner's frame of the `keep` largest of the range's sum (at positions `union`,
        ascending); notes what the payload will not deliver for _settle."""
        nonzero = sums != 0
        keep, kept = union[nonzero], sums[nonzero]
        if keep.size > self.keep:  # the keep largest magnitudes of the sum, ties: lowest first
            chosen = exact_topk(np.abs(kept), self.keep)
            keep, kept = keep[chosen], kept[chosen]
        dense = None
        if any(codec is not None and codec.reads_dense for codec in self.codecs):
            dense = np.zeros(size, np.float32)
            dense[union] = sums
        frame, encoded = self.pipeline.frame(kept, keep, (size,), self.dtype_name, self.name,
                                             *self.codecs, dense)
        if encoded is not None:  # the sum where the payload lands, less what it delivers
            self.survivors = encoded
            if np.array_equal(encoded.positions, keep):  # exact index codecs: where it was kept
                there = kept
            else:
                at = np.minimum(np.searchsorted(union, encoded.positions), max(union.size - 1, 0))
                there = np.where(union[at] == encoded.positions, sums[at], 0) if union.size else 0
            self.owner_feedback = (encoded.positions,
                                   there - np.asarray(encoded.values, np.float32))
        return frame

    def gather(self, gathered, ranges: Ranges, key: str, out=None, scale: float = 1.0):
        """Every owner's survivors decoded into scale times the dense float32 total (the same
        bits on every rank; into `out` if given), the residuals settled, the ranges
        rebalanced. -> (total, what the step cost: planner.Measured)."""
        start, decoded = time.perf_counter(), None
        size = int(self.bounds[-1])
        view, at, heads, framed, own_bytes = byte_view(gathered), 0, [], {}, 0
        for j in range(self.ranks):
            if len(view) - at < HEAD.size:
                raise DeepReduceError(f"rank {j}'s reduced range is truncated")
            load, sent, encode_us, has_frame = HEAD.unpack_from(view, at)
            heads.append((min(load, size * self.ranks), sent, encode_us / 1e6))
            start_j, at = at, at + HEAD.size
            if has_frame:
                lo, hi, fingerprint = self._range(j)
                framed[j], at = frames.read_one(view, at, j, fingerprint, f"range {lo}:{hi}")
            own_bytes = at - start_j if j == self.own else own_bytes
        if at != len(view):
            raise DeepReduceError(f"{len(view) - at} bytes left after {self.ranks} reduced ranges")
        self.pipeline.stats.bytes_received += at - own_bytes
        for frame in framed.values():
            if frame.kind == frames.ERROR:
                raise DeepReduceError(bytes(frame.payload).decode(errors="replace"))
        if sorted(framed) != owning(self.bounds).tolist():
            raise DeepReduceError("the owners' reduced ranges are not this rank's ranges "
                                  f"(frames from ranks {sorted(framed)})")
        total = np.empty(size, dtype=np.float32) if out is None else out.reshape(-1)
        delivered = None
        if any(frame.kind == frames.NONFINITE for frame in framed.values()):
            total.fill(np.nan)
        else:  # the owners' ranges cover the tensor; each is cleared as its payload lands
            delivered = [np.zeros(0, np.int64)]
            own = self.survivors and (self.survivors.values, self.survivors.positions)
            for j, (values, positions) in zip(sorted(framed), self._decoded(framed, own)):
                lo = int(self.bounds[j])
                densify(total[lo:int(self.bounds[j + 1])], positions, values, scale)
                delivered.append(positions + lo)
            decoded, delivered = time.perf_counter(), np.concatenate(delivered)
            self._settle(delivered)
            ranges.rebalance(key, self.bounds, [head[0] for head in heads])
        self.decode_s += (decoded or time.perf_counter()) - start
        self.pipeline.decoded(self.name, total, self.decode_s,
                              time.perf_counter() - decoded if decoded else 0.0, delivered)
        return total, Measured(max(head[2] for head in heads),
                               float(np.mean([head[1] for head in heads])),
                               max((frame.decode_s for frame in framed.values()), default=0.0))

    def _settle(self, delivered_positions):
        """Error feedback of what the owners dropped: each sender takes back its values that
        did not survive, each owner the difference between its range's sum and what its
        payload delivers there."""
        memory = self.pipeline.memory
        if memory is None or self.name is None:
            return
        residual = memory.residual(self.name)
        if residual is None:
            return
        flat = residual.reshape(-1)
        positions, values = self.sent
        dropped = ~member(positions, delivered_positions)
        scatter_add(flat, positions[dropped], values[dropped])
        if self.owner_feedback is not None:
            lo = int(self.bounds[self.own])
            scatter_add(flat[lo:int(self.bounds[self.own + 1])], *self.owner_feedback)


def keep_count(selected: int, ranks: int) -> int:
    """How many of its range's sum each owner keeps: k/P, rounded up."""
    return max(1, math.ceil(selected / ranks))
