"""Low-rank factors of a compensated matrix (PowerSGD, Vogels et al., NeurIPS 2019).

A minibatch gradient of a fully connected layer is a sum of one outer product per example:
r * (rows + cols) numbers can carry the few directions in which the ranks' gradients agree
from step to step. On the wide MLP rank-4 factors followed dense training where top-k at 1%
lagged by epochs, though they sent less of the compensated tensor's energy (2-7% a step after
the first epoch, top-k 6-8%): which directions go matters, not how much energy.
One step of subspace iteration, warm-started from the last step's factor:

    P_i = M_i Q          (every rank; allreduced: P = sum P_i)
    P^ = orthonormal(P)  (the same bits on every rank: P is)
    Q_i = M_i^T P^       (allreduced: Q = sum Q_i; the next step's Q)
    delivered = P^ Q^T   (times the reduced scale: 1/size for an average)

Rank i's own share of the delivered sum is P^ Q_i^T, and error feedback keeps the rest,
M_i - P^ Q_i^T: what is not sent stays on the rank it came from, nothing is lost (PowerSGD's
hook keeps M_i minus the average instead; the two differ by a term that sums to zero over ranks).
"""
from __future__ import annotations

import math
import zlib
from typing import Optional, Tuple

import numpy as np

from ..errors import DeepReduceError

MIN_SAVING = 8  # a matrix is factored only where the factors hold 8x fewer numbers than it


def check_rank(rank) -> int:
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank <= 1024:
        raise DeepReduceError(f"lowrank must be an int in [0, 1024] (0: off), not {rank!r}")
    return rank


def matrix_shape(shape) -> Optional[Tuple[int, int]]:
    """(rows, cols) a tensor is factored as: its first dimension by the rest (a conv kernel's
    output channels by its fan-in), or None for a vector or scalar."""
    if shape is None or len(shape) < 2:
        return None
    return int(shape[0]), int(math.prod(shape[1:]))


def worth_factoring(shape, rank) -> bool:
    """Whether rank-`rank` factors of a tensor of this shape are MIN_SAVING times smaller."""
    dims = matrix_shape(shape)
    return bool(rank) and dims is not None and \
        MIN_SAVING * rank * sum(dims) <= dims[0] * dims[1] and rank < min(dims)


class LowRank:
    """Per named tensor: the warm-start factor Q (agreed: every rank holds the same bits) and,
    between the two rounds of a step, the orthonormal P^ and this rank's compensated matrix."""

    def __init__(self, rank: int, seed: int = 0) -> None:
        self.rank, self.seed = check_rank(rank), seed
        self._q, self._basis, self._held = {}, {}, {}

    def project(self, name: str, matrix: np.ndarray) -> np.ndarray:
        """P_i = M_i Q (float32, rows x rank); M_i is held for `settle`."""
        rows, cols = matrix.shape
        q = self._q.get(name)
        if q is None or q.shape != (cols, self.rank):
            seed = zlib.crc32(f"lowrank:{name}".encode()) ^ self.seed
            q = self._q[name] = np.random.default_rng(seed).standard_normal(
                (cols, self.rank)).astype(np.float32)
        self._held[name] = matrix
        p = np.empty((rows, self.rank), np.float32)
        with np.errstate(invalid="ignore", over="ignore"):  # NaN/Inf: settle resets everyone
            for part in blocks(rows, cols, self.rank):
                np.matmul(matrix[part], q, out=p[part])
        return p

    def settle(self, name: str, p_sum: np.ndarray,
               keep_error: bool = True) -> Tuple[np.ndarray, bool]:
        """From the reduced P: (Q_i = M_i^T P^, cols x rank; True), and with keep_error the
        held M_i (the residual buffer) becomes M_i - P^ Q_i^T, in place; (zeros, False)
        where P is not finite (every rank sees the same P: all deliver NaN)."""
        matrix = self._held.pop(name)
        if not np.isfinite(p_sum).all():
            self._basis[name] = None
            self._q.pop(name, None)
            return np.zeros((matrix.shape[1], self.rank), np.float32), False
        basis = np.linalg.qr(p_sum.reshape(matrix.shape[0], self.rank).astype(np.float64))[0]
        basis = self._basis[name] = basis.astype(np.float32)
        q_own = np.zeros((matrix.shape[1], self.rank), np.float32)
        for rows in blocks(*matrix.shape, self.rank):
            q_own += matrix[rows].T @ basis[rows]
        if keep_error:
            subtract_outer(matrix, basis, q_own)
        return q_own, True

    def reconstruct(self, name: str, q_sum: np.ndarray, dims: Tuple[int, int], scale: float,
                    out: Optional[np.ndarray] = None) -> np.ndarray:
        """scale * P^ Q^T as a flat float32 array of rows x cols (`dims`), into `out` where
        given; Q becomes the next warm start. NaN where P or Q was not finite."""
        basis = self._basis.pop(name, None)
        total = (np.empty(dims[0] * dims[1], np.float32) if out is None else out).reshape(-1)
        if basis is None or not np.isfinite(q_sum).all():
            self._q.pop(name, None)
            total.fill(np.nan)
            return total
        q = q_sum.reshape(dims[1], self.rank).astype(np.float32)
        q_t, matrix = np.ascontiguousarray(q.T), total.reshape(dims)
        for rows in blocks(*dims, self.rank):
            np.matmul(basis[rows], q_t, out=matrix[rows])
        total *= np.float32(scale)
        self._q[name] = q
        return total

    def state_dict(self) -> dict:
        return {name: q.copy() for name, q in self._q.items()}

    def load_state_dict(self, state: dict) -> None:
        self._q = {name: np.array(q, dtype=np.float32) for name, q in state.items()}
        self._basis, self._held = {}, {}


# Row blocks small enough that OpenBLAS runs each product on the calling thread (it threads a
# product of m x k by k x n from m * n * k = 2^18 on): with two ranks on two cores its worker
# threads, woken for every product, made a step's three rounds 50 ms instead of 8 in a job.
SINGLE_THREAD_WORK = 1 << 18


def blocks(rows: int, cols: int, rank: int):
    """Slices of rows, in order, for products of a rows x cols matrix with rank columns."""
    step = max(1, SINGLE_THREAD_WORK // max(1, rank * cols) - 1)
    return [slice(start, start + step) for start in range(0, rows, step)]


def subtract_outer(target: np.ndarray, left: np.ndarray, right: np.ndarray) -> None:
    """target -= left @ right.T, in place, a block of rows at a time (no temporary of the
    target's size; BLAS is handed contiguous factors: with a transposed view OpenBLAS took
    12 ms instead of 2 for a 2048 x 2048 product of rank 4)."""
    right_t = np.ascontiguousarray(right.T)
    for rows in blocks(*target.shape, right.shape[1]):
        target[rows] -= left[rows] @ right_t
