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


SAMPLED_TOPK_MIN_SIZE = 1 << 16
_SAMPLE = 1 << 14


def topk(dense, ratio):
    """The round(ratio * size) elements of largest magnitude (exactly k, ties broken arbitrarily).

    Large tensors take a sampled threshold: the k-th magnitude is estimated from a fixed-seed
    sample, set a little low, and one pass keeps every element above it; the exact top k are
    then picked among those few candidates (topped up by the exact method if the estimate
    was too high).
    """
    flat = _flat(dense)
    k = selection_size(flat.size, ratio)
    if k == flat.size:
        return flat.copy(), np.arange(k, dtype=np.int64)
    if flat.size >= SAMPLED_TOPK_MIN_SIZE and k < flat.size // 4:
        indices = _sampled_topk(flat, k)
    else:
        magnitude = np.abs(flat.astype(np.float32, copy=False))
        indices = np.argpartition(magnitude, flat.size - k)[flat.size - k:]
    indices = np.sort(indices).astype(np.int64)
    return flat[indices], indices


def _sampled_topk(flat, k):
    sample = np.abs(flat[np.random.default_rng(0).integers(0, flat.size, _SAMPLE)]).astype(np.float32)
    # a quantile set so that the sample expects 1.5x k candidates (plus sampling slack)
    keep = min(1.0, (1.5 * k + 4 * np.sqrt(k)) / flat.size)
    cut = np.quantile(sample, 1.0 - keep) if keep < 1 else 0.0
    candidates = np.flatnonzero((flat >= cut) | (flat <= -cut))
    if candidates.size < k:  # the estimate was too high: exact fallback
        magnitude = np.abs(flat.astype(np.float32, copy=False))
        return np.argpartition(magnitude, flat.size - k)[flat.size - k:]
    magnitude = np.abs(flat[candidates].astype(np.float32, copy=False))
    return candidates[np.argpartition(magnitude, candidates.size - k)[candidates.size - k:]]


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
