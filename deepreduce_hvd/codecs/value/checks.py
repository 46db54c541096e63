"""Shared guards for value codecs."""
import numpy as np

from ...errors import DeepReduceError


def finite_float32(values, codec_id):
    """Lossy codecs reject NaN/Inf (a quantised or fitted NaN would poison every value)."""
    values = np.asarray(values, dtype=np.float32)
    if not np.isfinite(values).all():
        raise DeepReduceError(f"value codec {codec_id!r} cannot encode NaN or Inf; use 'raw', "
                              "'fp16', 'bf16' or 'deflate', which preserve them")
    return values


def finite_output(values, codec_id):
    """What a lossy decoder returns must be finite (a hostile body must not make NaN/Inf)."""
    if not np.isfinite(values).all():
        raise DeepReduceError(f"{codec_id} values: the body decodes to NaN or Inf")
    return values


def expect_size(body, nbytes, codec_id):
    if len(body) != nbytes:
        raise DeepReduceError(f"{codec_id} values: {len(body)} bytes, expected {nbytes}")
