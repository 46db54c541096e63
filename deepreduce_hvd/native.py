"""Loads the optional C++ extension; everything has a numpy path that gives identical bytes.

Set DEEPREDUCE_NATIVE=0 to force the numpy path.
"""
import os
import warnings

bloom = None
if os.environ.get("DEEPREDUCE_NATIVE", "1") != "0":
    try:
        from . import _bloom as bloom
    except ImportError as exc:  # the extension failed to build or load
        warnings.warn(f"deepreduce_hvd: C++ Bloom op unavailable ({exc}); using the numpy path "
                      "(same bytes, slower)", RuntimeWarning, stacklevel=2)


def backend():
    """'native' when the C++ op is loaded, else 'numpy'."""
    return "native" if bloom is not None else "numpy"
