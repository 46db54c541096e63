"""dst[positions] += scale * values for unique positions: error feedback and the receivers'
sums both scatter sparse values into dense float32 buffers (native kernel, or numpy); and
densify, a range cleared and one payload's values written in the same pass."""
import numpy as np

from . import native


def scatter_add(dst, positions, values, scale=1.0):
    """In place on a contiguous float32 array; positions unique and within dst."""
    positions = np.ascontiguousarray(positions, dtype=np.int64)
    values = np.ascontiguousarray(values, dtype=np.float32)
    if native.engine is not None and dst.flags.c_contiguous:
        native.engine.scatter_add(dst, positions, values, scale)
    elif scale == 1.0:
        dst[positions] += values
    else:
        dst[positions] += values * np.float32(scale)


def densify(dst, positions, values, scale=1.0):
    """dst = 0 but dst[positions] = scale * values, the bits of scatter_add into zeros: one
    pass over dst where the positions ascend (a gap-coded payload decodes so), else the fill
    and the scatter. In place on a contiguous float32 array; positions unique and within dst."""
    positions = np.ascontiguousarray(positions, dtype=np.int64)
    values = np.ascontiguousarray(values, dtype=np.float32)
    if native.engine is None or not dst.flags.c_contiguous or \
            not native.engine.densify(dst, positions, values, scale):
        dst.fill(0.0)
        scatter_add(dst, positions, values, scale)
