"""Error feedback (the "memory" role of GRACE): what a rank did not deliver is added back later.

The residual is the compensated gradient minus what the receivers will actually reconstruct
from this rank's payload (the payload decoded again), so every loss is fed back: the
sparsifier's, and the lossy codecs' (Bloom false positives, fitting, quantisation).
"""
import numpy as np

from .errors import DeepReduceError


class ResidualMemory:
    """Residuals keyed by tensor name."""

    def __init__(self, decay=1.0):
        if not 0 < decay <= 1:
            raise DeepReduceError(f"decay must be in (0, 1], not {decay!r}")
        self.decay = decay
        self._residuals = {}

    def compensate(self, name, gradient):
        """gradient plus the residual kept for this name (a new array)."""
        residual = self._residuals.get(name)
        if residual is None:
            return np.array(gradient, dtype=np.float32, copy=True)
        if residual.shape != np.shape(gradient):
            raise DeepReduceError(f"tensor {name!r} changed shape from {residual.shape} to "
                                  f"{np.shape(gradient)}; call reset()")
        return gradient + self.decay * residual

    def update(self, name, compensated, delivered):
        """Keep compensated - delivered (both dense) for the next step."""
        self._residuals[name] = np.asarray(compensated, np.float32) - np.asarray(delivered, np.float32)

    def residual(self, name):
        return self._residuals.get(name)

    def reset(self, name=None):
        if name is None:
            self._residuals.clear()
        else:
            self._residuals.pop(name, None)
