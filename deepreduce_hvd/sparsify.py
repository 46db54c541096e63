"""Sparsifiers: dense array -> (values, indices), indices sorted ascending, flat positions."""
import numpy as np

from .errors import DeepReduceError


def selection_size(size, ratio):
    """How many of `size` elements a ratio keeps: at least one of a non-empty tensor."""
    if not isinstance(ratio, (int, float)) or not 0 < ratio <= 1:
        raise DeepReduceError(f"ratio must be in (0, 1], not {ratio!r}")
    return min(size, max(1, int(round(ratio * size)))) if size else 0


def _flat(dense):
    dense = np.asarray(dense)
    if not np.issubdtype(dense.dtype, np.floating) and dense.dtype.name != "bfloat16":
        raise DeepReduceError(f"sparsifiers take float tensors, not {dense.dtype}")
    return dense.ravel()


def topk(dense, ratio):
    """The round(ratio * size) elements of largest magnitude."""
    flat = _flat(dense)
    k = selection_size(flat.size, ratio)
    magnitude = np.abs(flat.astype(np.float32, copy=False))
    if k == flat.size:
        indices = np.arange(k, dtype=np.int64)
    else:
        indices = np.sort(np.argpartition(magnitude, flat.size - k)[flat.size - k:]).astype(np.int64)
    return flat[indices], indices


def random_positions(size, k, seed):
    """k distinct positions of [0, size), sorted, determined by the seed alone."""
    if not isinstance(seed, (int, np.integer)) or not 0 <= seed < 2**64:
        raise DeepReduceError(f"seed must be an integer in [0, 2**64), not {seed!r}")
    rng = np.random.Generator(np.random.PCG64(int(seed)))
    return np.sort(rng.choice(size, k, replace=False)).astype(np.int64)


def randomk(dense, ratio, seed):
    """round(ratio * size) positions drawn uniformly with a seed; the "seeded" index codec
    regenerates them from the seed, so they cost no index bytes."""
    flat = _flat(dense)
    indices = random_positions(flat.size, selection_size(flat.size, ratio), seed)
    return flat[indices], indices


def threshold(dense, tau):
    """Every element with magnitude above tau (tau=0 keeps the non-zeros)."""
    if not np.isfinite(tau) or tau < 0:
        raise DeepReduceError(f"threshold must be a finite non-negative number, not {tau!r}")
    flat = _flat(dense)
    indices = np.flatnonzero(np.abs(flat.astype(np.float32, copy=False)) > tau).astype(np.int64)
    return flat[indices], indices
