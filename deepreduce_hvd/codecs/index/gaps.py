"""Sorted positions <-> gaps (the number of unselected positions before each selected one)."""
import numpy as np

from ...errors import DeepReduceError

GAP_WIDTHS = (1, 2, 4, 8)


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


def narrowest_width(top):
    """Bytes per gap for gaps up to `top`."""
    return next(w for w in GAP_WIDTHS if top < 1 << (8 * w))


def gap_bytes(gaps):
    """Gaps at the narrowest fixed width -> (width in bytes, little-endian bytes)."""
    width = narrowest_width(int(gaps.max()) if gaps.size else 0)
    return width, gaps.astype(f"<u{width}").tobytes()


def check_gap_width(width, size):
    """A declared gap width must be one the encoder could have chosen for this tensor."""
    if width not in GAP_WIDTHS or width > narrowest_width(max(size - 1, 0)):
        raise DeepReduceError(f"bad gap width {width} for a tensor of {size} elements")
    return width
