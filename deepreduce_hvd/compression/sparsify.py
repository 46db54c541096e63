"""Sparsifiers: dense array -> (values, indices), indices sorted ascending, flat positions.

Top-k picks exactly the k largest magnitudes, ties at the boundary broken by the lower
position, so every path (the native engine, numpy, the torch and TF device paths) selects the
same set and sends the same bytes. `select` fuses error feedback into the pass: the residual
buffer becomes residual + gradient in place while the candidates are collected.
"""
from __future__ import annotations

from typing import Tuple

import numpy as np
from numpy.typing import ArrayLike

from ..engine import native
from ..engine.norms import l2_norm
from ..errors import DeepReduceError

SAMPLED_TOPK_MIN_SIZE = 1 << 16
_SAMPLE = 1 << 14


def selection_size(size: int, ratio: float) -> int:
    """How many of `size` elements a ratio keeps: at least one of a non-empty tensor."""
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 < ratio <= 1:
        raise DeepReduceError(f"ratio must be in (0, 1], not {ratio!r}")
    return min(size, max(1, int(round(ratio * size)))) if size else 0


def _flat(dense):
    dense = np.asarray(dense)
    if not np.issubdtype(dense.dtype, np.floating) and dense.dtype.name != "bfloat16":
        raise DeepReduceError(f"sparsifiers take float tensors, not {dense.dtype}")
    return dense.ravel()


def exact_topk(magnitude, k, candidates=None):
    """Positions (ascending) of the k largest magnitudes among candidates (ascending positions
    holding every magnitude >= the k-th largest): all above the k-th, then the first ties."""
    mags = magnitude if candidates is None else magnitude[candidates]
    if k == 0:
        return np.zeros(0, dtype=np.int64)
    kth = np.partition(mags, mags.size - k)[mags.size - k]
    chosen = mags > kth  # a mask keeps the order: no sort of the chosen positions
    chosen[np.flatnonzero(mags == kth)[:k - np.count_nonzero(chosen)]] = True
    chosen = np.flatnonzero(chosen)
    return (chosen if candidates is None else candidates[chosen]).astype(np.int64)


def topk_positions(flat, k):
    """numpy twin of the native selection: positions of the top k of a finite array."""
    magnitude = np.abs(flat.astype(np.float32, copy=False))
    n = flat.size
    if k == n:
        return np.arange(n, dtype=np.int64)
    if n >= SAMPLED_TOPK_MIN_SIZE and k < n // 4:
        sample = magnitude[np.random.default_rng(0).integers(0, n, _SAMPLE)]
        keep = (1.5 * k + 4 * np.sqrt(k)) / n  # expect 1.5 k candidates, plus sampling slack
        cut = np.quantile(sample, 1.0 - keep)
        candidates = np.flatnonzero(magnitude >= cut)
        if candidates.size >= k:
            return exact_topk(magnitude, k, candidates)
    return exact_topk(magnitude, k)


def _finite(flat):
    if not np.isfinite(flat).all():
        raise DeepReduceError("the tensor holds NaN or Inf; sparsifiers need finite values")


def topk(dense: ArrayLike, ratio: float) -> Tuple[np.ndarray, np.ndarray]:
    """The round(ratio * size) elements of largest magnitude (ties: lower positions first)."""
    flat = _flat(dense)
    k = selection_size(flat.size, ratio)
    if native.engine is not None and flat.dtype == np.float32:
        picked = native.engine.select_topk(np.ascontiguousarray(flat), None, k)
        if picked is None:
            _finite(flat)
        return np.frombuffer(picked[1], np.float32).copy(), np.frombuffer(picked[0], np.int64).copy()
    _finite(flat)
    indices = topk_positions(flat, k)
    return flat[indices], indices


def random_positions(size, k, seed):
    """k distinct positions of [0, size), sorted, determined by the seed alone."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed < 2**64:
        raise DeepReduceError(f"seed must be an integer in [0, 2**64), not {seed!r}")
    if k == size:  # every position, whatever the draw: no size-long shuffle
        return np.arange(size, dtype=np.int64)
    rng = np.random.Generator(np.random.PCG64(int(seed)))
    positions = rng.choice(size, k, replace=False).astype(np.int64, copy=False)
    positions.sort()
    return positions


def randomk(dense: ArrayLike, ratio: float, seed: int) -> Tuple[np.ndarray, np.ndarray]:
    """round(ratio * size) positions drawn uniformly with a seed; the "seeded" index codec
    regenerates them from the seed, so they cost no index bytes."""
    flat = _flat(dense)
    indices = random_positions(flat.size, selection_size(flat.size, ratio), seed)
    return flat[indices], indices


def check_threshold(tau):
    if isinstance(tau, bool) or not isinstance(tau, (int, float)) or not np.isfinite(tau) or tau < 0:
        raise DeepReduceError(f"threshold must be a finite non-negative number, not {tau!r}")
    return float(tau)


def threshold(dense: ArrayLike, tau: float) -> Tuple[np.ndarray, np.ndarray]:
    """Every element with magnitude above tau (tau=0 keeps the non-zeros)."""
    tau = check_threshold(tau)
    flat = _flat(dense)
    indices = np.flatnonzero(np.abs(flat.astype(np.float32, copy=False)) > tau).astype(np.int64)
    return flat[indices], indices


def energy_share(values, indices, count, compensated, share):
    """Of a top-k selection (values, indices) of more than `count` elements: the `count`
    largest, and as many more of the next largest as it takes to carry `share` of the
    compensated gradient's energy (all of them if that is not enough), in their order."""
    energy = values.astype(np.float64) ** 2
    largest = np.argsort(-energy, kind="stable")
    carried = np.cumsum(energy[largest])
    total = l2_norm(compensated) ** 2  # float32 squares: no float64 copy of the tensor
    keep = min(max(count, int(np.searchsorted(carried, share * total)) + 1), values.size)
    chosen = np.sort(largest[:keep])
    return values[chosen], indices[chosen]


def select(kind, grad, residual=None, k=None, tau=0.0):
    """Compensate and select in one pass: residual (a float32 buffer of grad's size, or None)
    becomes residual + grad in place; -> (values, indices) of the compensated gradient for
    kind "topk" (k elements) or "threshold" (magnitude > tau), or None if it holds NaN/Inf."""
    grad = np.ascontiguousarray(grad, dtype=np.float32).ravel()
    if native.engine is not None and (residual is None or residual.flags.c_contiguous):
        picked = (native.engine.select_topk(grad, residual, k) if kind == "topk"
                  else native.engine.select_threshold(grad, residual, tau))
        if picked is None:
            return None
        return np.frombuffer(picked[1], np.float32).copy(), np.frombuffer(picked[0], np.int64).copy()
    if residual is not None:
        residual += grad
        grad = residual.ravel()
    if not np.isfinite(grad).all():
        return None
    if kind == "topk":
        indices = topk_positions(grad, k)
    else:
        indices = np.flatnonzero(np.abs(grad) > tau).astype(np.int64)
    return grad[indices], indices
