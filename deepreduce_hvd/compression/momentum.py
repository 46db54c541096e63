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
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from ..errors import DeepReduceError


def check_momentum(momentum) -> float:
    if isinstance(momentum, bool) or not isinstance(momentum, (int, float)) or \
            not 0.0 <= momentum < 1.0:
        raise DeepReduceError(f"momentum must be a number in [0, 1), not {momentum!r}")
    return float(momentum)


class MomentumCorrection:
    """Per named tensor: its velocity on this rank, and the last delivered velocity average."""

    def __init__(self, momentum: float, masking: bool = False) -> None:
        self.momentum, self.masking = check_momentum(momentum), masking
        self._velocity, self._delivered = {}, {}

    def velocity(self, name: str, gradient: np.ndarray) -> np.ndarray:
        """u = m*u + g for tensor `name`, in place -> u (float32, the gradient's shape)."""
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

    def for_optimizer(self, name: str, delivered: np.ndarray) -> np.ndarray:
        """What the optimizer gets for the delivered average D_t: D_t - m*D_{t-1}. A
        non-finite D passes unchanged and starts the tensor afresh (an AMP scaler skips it)."""
        current = np.array(delivered, dtype=np.float32)
        previous = self._delivered.get(name)
        if not np.isfinite(current).all():
            self.reset(name)
            return current
        self._delivered[name] = current
        if previous is None or previous.shape != current.shape:
            return current.copy()
        return current - self.momentum * previous

    def reset(self, name: Optional[str] = None) -> None:
        if name is None:
            self._velocity.clear()
            self._delivered.clear()
        else:
            self._velocity.pop(name, None)
            self._delivered.pop(name, None)

    def state_dict(self) -> dict:
        return {"velocity": dict(self._velocity), "delivered": dict(self._delivered)}

    def load_state_dict(self, state: dict) -> None:
        self._velocity = {n: np.array(a, dtype=np.float32) for n, a in state["velocity"].items()}
        self._delivered = {n: np.array(a, dtype=np.float32) for n, a in state["delivered"].items()}
