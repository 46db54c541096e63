"""float32 <-> float16: to half for the dense fp16 allreduce, keeping the rounding error for
error feedback, and back, scaled, for the fp16 value codec: one native pass (F16C) where the
processor has it, numpy elsewhere (same bits)."""
import numpy as np

from . import native


def to_half(work, keep_error):
    """-> (float16 copy of the float32 array `work`, whether all of it is finite). With
    keep_error, work becomes work - float32(half) in place."""
    out = np.empty(work.shape, dtype=np.float16)
    if native.engine is not None and native.engine.have_f16c() and work.flags.c_contiguous:
        finite = native.engine.to_half(work, out.view(np.uint16), keep_error)
        return out, finite
    with np.errstate(over="ignore", invalid="ignore"):
        out[...] = work
        if keep_error:
            work -= out.astype(np.float32)
    return out, bool(np.isfinite(out).all())


def from_half(halves, exponent):
    """float32 array of the float16 array `halves` times 2**-exponent (-128..127), rounded
    once, as np.ldexp of their float32 cast rounds."""
    halves = np.ascontiguousarray(halves, dtype=np.float16)
    if native.engine is not None and native.engine.have_f16c():
        out = np.empty(halves.shape, dtype=np.float32)
        native.engine.from_half(halves.view(np.uint16), out, int(exponent))
        return out
    return np.ldexp(halves.astype(np.float32), -exponent)
