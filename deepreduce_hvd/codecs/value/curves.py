"""What the curve-fitting value codecs share: sorting values into two monotone runs.

Values are sorted descending, so the non-negatives come first (largest first) and the
negatives after; each run is fitted on its own (the sign change is always a break).
`encode` of a fitting codec returns the order it sorted by, and the payload carries the
permutation that undoes it.
"""
import numpy as np


def sorted_runs(values):
    """-> (order, [non-negative run, negative run]) with values[order] = concatenated runs."""
    order = np.argsort(-values, kind="stable")
    ordered = values[order].astype(np.float64)
    split = int((ordered >= 0).sum())
    return order, [ordered[:split], ordered[split:]]


def unit_grid(n):
    """x coordinates of a run of n sorted values, in [0, 1] for good conditioning."""
    return np.linspace(0.0, 1.0, n) if n > 1 else np.zeros(n)


CHUNK = 1 << 20


def unit_grid_chunks(n, chunk=CHUNK):
    """(offset, x) pieces of unit_grid(n), bit for bit, chunk points at a time: a curve can be
    evaluated over any number of points with small temporaries."""
    step = 1.0 / (n - 1) if n > 1 else 0.0
    for at in range(0, n, chunk):
        x = np.arange(at, min(n, at + chunk), dtype=np.float64) * step
        if at + x.size == n and n > 1:
            x[-1] = 1.0  # linspace ends exactly at its stop
        yield at, x
