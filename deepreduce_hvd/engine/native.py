"""Loads the optional C++ engine (`deepreduce_hvd._native`, built from csrc/).

Every kernel has a numpy twin that gives identical bytes, so the engine only changes speed.
Set DEEPREDUCE_NATIVE=0 to force the numpy path.
"""
import os
import warnings

engine = None
if os.environ.get("DEEPREDUCE_NATIVE", "1") != "0":
    try:
        from .. import _native as engine
    except ImportError as exc:  # the extension failed to build or load
        warnings.warn(f"deepreduce_hvd: C++ engine unavailable ({exc}); using the numpy path "
                      "(same bytes, slower)", RuntimeWarning, stacklevel=2)


def backend():
    """'native' when the C++ engine is loaded, else 'numpy'."""
    return "native" if engine is not None else "numpy"
