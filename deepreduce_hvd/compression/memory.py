"""Error feedback (the "memory" role of GRACE): what a rank did not deliver is added back later.

The residual is the compensated gradient minus what the receivers will actually reconstruct
from this rank's payload (the encoder reports those values), so every loss is fed back: the
sparsifier's, and the lossy codecs' (Bloom false positives, fitting, quantisation). Buffers are
updated in place: compensation writes gradient + residual into the residual buffer (fused with
selection in the native engine), and delivery subtracts what was sent.
"""
import numpy as np

from ..engine.scatter import scatter_add
from ..errors import DeepReduceError


def _numpy_zeros(shape):
    return np.zeros(shape, dtype=np.float32)


class ResidualMemory:
    """Residuals keyed by tensor name, float32, one buffer per name."""

    def __init__(self):
        self._residuals = {}
        self._zero = set()  # names whose buffer is known to hold zeros (nothing handed out since)

    def buffer(self, name, shape, zeros=None, adopt=None):
        """The residual buffer of `name`, to compensate into in place; the first time, a
        float32 numpy array of zeros, or what `zeros(shape)` makes (a framework tensor on the
        gradient's device, for the wrappers' device path). `adopt(array)` turns a numpy
        residual (a restored checkpoint's) into such a framework buffer; without it a
        framework buffer comes back as numpy."""
        shape = tuple(shape)
        self._zero.discard(name)  # the caller may write into it
        residual = self._residuals.get(name)
        if residual is None:
            residual = self._residuals[name] = (zeros or _numpy_zeros)(shape)
        elif tuple(residual.shape) != shape:
            raise DeepReduceError(f"tensor {name!r} changed shape from {residual.shape} to "
                                  f"{shape}; call reset()")
        elif adopt is not None and isinstance(residual, np.ndarray):
            residual = self._residuals[name] = adopt(residual)
        elif adopt is None and not isinstance(residual, np.ndarray):
            residual = self._residuals[name] = np.array(residual, dtype=np.float32)
        return residual

    def compensate(self, name, gradient):
        """residual += gradient, in place; -> the buffer (the compensated gradient)."""
        residual = self.buffer(name, np.shape(gradient))
        residual += np.asarray(gradient, dtype=np.float32)
        return residual

    def cleared(self, name):
        """`name`'s buffer was just filled with zeros (everything was sent)."""
        self._zero.add(name)

    def is_zero(self, name):
        """Whether `name`'s buffer holds zeros: cleared, and not handed out since."""
        return name in self._zero

    def deliver(self, name, positions, values):
        """Receivers got `values` at flat `positions`: the rest stays for the next step."""
        self._zero.discard(name)
        scatter_add(self._residuals[name].reshape(-1), positions, values, -1.0)

    def deliver_dense(self, name, delivered):
        """Receivers got the whole (compensated) tensor as `delivered`."""
        self._zero.discard(name)
        residual = self._residuals[name]
        residual -= np.asarray(delivered, dtype=np.float32).reshape(residual.shape)

    def residual(self, name):
        self._zero.discard(name)
        return self._residuals.get(name)

    def items(self):
        """{name: buffer} (numpy arrays, or the framework buffers of a device path)."""
        self._zero.clear()
        return dict(self._residuals)

    def load(self, residuals, assign=None):
        """Replace every residual with these float32 arrays (a device path adopts them when it
        next compensates). assign(buffer, array): copies the array into a framework buffer
        already in use (a traced graph holds on to it) and says whether it did."""
        loaded = {}
        for name, value in residuals.items():
            array = np.array(value, dtype=np.float32)
            current = self._residuals.get(name)
            keep = (current is not None and not isinstance(current, np.ndarray) and assign is not None
                    and tuple(current.shape) == array.shape and assign(current, array))
            loaded[name] = current if keep else array
        self._residuals, self._zero = loaded, set()

    def names(self):
        return set(self._residuals)

    def reset(self, name=None):
        if name is None:
            self._residuals.clear()
            self._zero.clear()
        else:
            self._residuals.pop(name, None)
            self._zero.discard(name)
