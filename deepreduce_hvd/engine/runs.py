"""Sorted runs for the sparse allreduce: an owner's sum of its range's pieces, in rank order,
and a sender's test of which of its positions survived (native kernel, or numpy; the same
bits either way)."""
import numpy as np

from . import native


def merge_sum(pieces):
    """Sorted unique positions and float32 sums there of a list of (values, positions)
    pieces, each sum 0 + the pieces' values in piece (rank) order. O(k log P) when each
    piece's positions ascend (gap-coded payloads decode so); any order is accepted."""
    if not pieces:
        return np.zeros(0, np.int64), np.zeros(0, np.float32)
    positions = np.concatenate([np.asarray(p, np.int64) for _, p in pieces])
    values = np.concatenate([np.asarray(v, np.float32) for v, _ in pieces])
    if native.engine is not None:
        starts = np.cumsum([0] + [p.size for _, p in pieces], dtype=np.int64)
        union, sums = np.empty_like(positions), np.empty_like(values)
        unique = native.engine.merge_sum(positions, values, starts, union, sums)
        if unique is not None:
            return union[:unique], sums[:unique]
    order = np.argsort(positions, kind="stable")  # equal positions stay in piece order
    positions, values = positions[order], values[order]
    starts = np.flatnonzero(np.concatenate([[True], positions[1:] != positions[:-1]]))
    counts = np.diff(np.append(starts, positions.size))
    sums = np.zeros(starts.size, np.float32)
    for i in range(int(counts.max()) if counts.size else 0):  # the i-th piece to add there
        has = counts > i
        sums[has] += values[starts[has] + i]
    return positions[starts], sums


def member(positions, among):
    """Which of the unique `positions` are in the unique `among` (a merge when both ascend,
    else a binary search in `among`, sorted first unless it ascends)."""
    positions = np.ascontiguousarray(positions, np.int64)
    among = np.ascontiguousarray(among, np.int64)
    if native.engine is not None:
        found = native.engine.member_sorted(positions, among)
        if found is not None:
            return np.frombuffer(found, np.bool_)
    if not among.size:
        return np.zeros(positions.size, dtype=bool)
    if among.size > 1 and not (among[1:] > among[:-1]).all():
        among = np.sort(among)
    at = np.minimum(np.searchsorted(among, positions), among.size - 1)
    return among[at] == positions
