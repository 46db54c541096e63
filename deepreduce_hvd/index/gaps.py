"""Sorted positions <-> gaps (the number of unselected positions before each selected one)."""
import numpy as np

from ..errors import DeepReduceError


def to_gaps(indices):
    return (np.diff(indices, prepend=-1) - 1).astype(np.uint64)


def from_gaps(gaps, size):
    gaps = np.asarray(gaps, dtype=np.uint64)
    if gaps.size and int(gaps.max()) >= size:
        raise DeepReduceError("gap larger than the tensor")
    indices = np.cumsum(gaps.astype(np.int64) + 1) - 1
    if indices.size and indices[-1] >= size:
        raise DeepReduceError(f"decoded position {indices[-1]} outside tensor of {size}")
    return indices
