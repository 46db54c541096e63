"""Momentum correction (Deep Gradient Compression, Lin et al., ICLR 2018) for an optimizer
that keeps its own momentum, so a plain momentum-SGD training loop needs no change.

With momentum SGD, sparsifying the gradient and letting the optimizer add momentum to what
arrives delays every unsent coordinate's momentum. DGC accumulates each rank's velocity
u = m*u + g instead and sparsifies that: the residual memory then holds velocity not yet sent.
The user's optimizer (momentum m, no dampening, not Nesterov) must not add momentum a second
time, so it is handed D_t - m*D_{t-1}, where D_t is the delivered average of the velocities:
its buffer m*buf + D_t - m*D_{t-1} is then D_t exactly (buf starts at zero), and its update is
DGC's. D is the same bits on every rank, and so is the correction.

Momentum factor masking (DGC's option) clears u where a value was sent.

A sparse route tells where its delivered average can be non-zero (`arrived`): the correction
then reads and writes those positions and the last step's alone, in the delivered buffer
itself, instead of three passes over the whole tensor; the bits are the dense formula's.
"""
from __future__ import annotations

import math
from typing import Optional

import numpy as np

from ..errors import DeepReduceError


def check_momentum(momentum) -> float:
    if isinstance(momentum, bool) or not isinstance(momentum, (int, float)) or \
            not 0.0 <= momentum < 1.0:
        raise DeepReduceError(f"momentum must be a number in [0, 1), not {momentum!r}")
    return float(momentum)


class MomentumCorrection:
    """Per named tensor: its velocity on this rank, and the last delivered velocity average
    (positions or None for all, values, shape)."""

    def __init__(self, momentum: float, masking: bool = False) -> None:
        self.momentum, self.masking = check_momentum(momentum), masking
        self._velocity, self._delivered, self._arrived = {}, {}, {}

    def velocity(self, name: str, gradient: np.ndarray) -> np.ndarray:
        """u = m*u + g for tensor `name`, in place -> u (float32, the gradient's shape)."""
        self._arrived.pop(name, None)  # a new step: the last one's arrivals are stale
        gradient = np.asarray(gradient, dtype=np.float32)
        velocity = self._velocity.get(name)
        if velocity is None or velocity.shape != gradient.shape:
            velocity = self._velocity[name] = gradient.copy()
        else:
            velocity *= self.momentum
            velocity += gradient
        return velocity

    def sent(self, name: str, positions: np.ndarray) -> None:
        """The values at these flat positions were sent (masking clears their velocity)."""
        if self.masking and name in self._velocity:
            self._velocity[name].reshape(-1)[positions] = 0.0

    def arrived(self, name: str, positions: np.ndarray) -> None:
        """This step's delivered average of tensor `name` is zero outside these flat
        positions (repeats allowed), as a sparse route decodes it."""
        if name in self._velocity:
            self._arrived[name] = positions

    def for_optimizer(self, name: str, delivered: np.ndarray,
                      out: Optional[np.ndarray] = None) -> np.ndarray:
        """What the optimizer gets for the delivered average D_t: D_t - m*D_{t-1}, in `out`
        (which may be `delivered` itself) or a new array. A non-finite D passes unchanged and
        starts the tensor afresh (an AMP scaler skips it)."""
        positions = self._arrived.pop(name, None)
        current = np.asarray(delivered, dtype=np.float32)
        flat = current.reshape(-1)
        arrived = flat if positions is None else flat[positions]
        result = np.array(current) if out is None else out
        if not np.may_share_memory(result, current):  # else `out` is the delivered buffer
            np.copyto(result, current)
        if not np.isfinite(arrived).all():
            self.reset(name)
            return result
        previous = self._delivered.get(name)
        self._delivered[name] = (positions, arrived.copy() if positions is None else arrived,
                                 current.shape)
        if previous is None or previous[2] != current.shape:
            return result
        before, values, _ = previous
        corrected = result.reshape(-1)
        if before is None:
            corrected -= self.momentum * values
        else:  # read, then write: a repeated position gets the same value twice
            corrected[before] = corrected[before] - self.momentum * values
        return result

    def reset(self, name: Optional[str] = None) -> None:
        for held in (self._velocity, self._delivered, self._arrived):
            if name is None:
                held.clear()
            else:
                held.pop(name, None)

    def state_dict(self) -> dict:
        delivered = {}
        for name, (positions, values, shape) in self._delivered.items():
            if positions is None:
                dense = values.copy()
            else:
                dense = np.zeros(math.prod(shape), np.float32)
                dense[positions] = values
            delivered[name] = dense.reshape(shape)
        return {"velocity": dict(self._velocity), "delivered": delivered}

    def load_state_dict(self, state: dict) -> None:
        self._velocity = {n: np.array(a, dtype=np.float32) for n, a in state["velocity"].items()}
        self._delivered = {}
        for name, a in state["delivered"].items():
            a = np.array(a, dtype=np.float32)
            self._delivered[name] = (None, a.reshape(-1), a.shape)
        self._arrived = {}
