"""Float dtypes a payload may carry, with one-byte wire codes."""
import numpy as np

from ..errors import DeepReduceError

try:  # bfloat16 arrays come from ml_dtypes (a TensorFlow and JAX dependency)
    from ml_dtypes import bfloat16
except ImportError:  # pragma: no cover - ml_dtypes ships with tensorflow
    bfloat16 = None

_CODES = {"float32": 0, "float16": 1, "bfloat16": 2, "float64": 3}
_NAMES = {code: name for name, code in _CODES.items()}


def dtype_code(dtype):
    name = np.dtype(dtype).name
    if name not in _CODES:
        raise DeepReduceError(
            f"values must be float16, bfloat16, float32 or float64, not {name}")
    return _CODES[name]


def dtype_from_code(code):
    name = _NAMES.get(code)
    if name is None:
        raise DeepReduceError(f"payload has unknown dtype code {code}")
    if name == "bfloat16":
        if bfloat16 is None:
            raise DeepReduceError("payload holds bfloat16 values but ml_dtypes is not installed")
        return np.dtype(bfloat16)
    return np.dtype(name)
