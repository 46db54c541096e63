"""deflate: zlib over gaps stored at the narrowest fixed width (1, 2, 4 or 8 bytes)."""
import zlib

import numpy as np

from ..codec_base import IndexCodec
from ..errors import DeepReduceError
from ..registry import register
from ..wire import ByteReader, ByteWriter
from .gaps import from_gaps, to_gaps

_WIDTHS = (1, 2, 4, 8)


@register("index")
class DeflateIndex(IndexCodec):
    codec_id = "deflate"
    wire_id = 4
    params = ("level",)

    def __init__(self, level=9):
        if level not in range(0, 10):
            raise DeepReduceError(f"level must be 0..9, not {level!r}")
        self.level = level

    def encode(self, indices, size, dense=None, seed=None):
        gaps = to_gaps(indices)
        top = int(gaps.max()) if gaps.size else 0
        width = next(w for w in _WIDTHS if top < 1 << (8 * w))
        data = zlib.compress(gaps.astype(f"<u{width}").tobytes(), self.level)
        return ByteWriter().u8(width).raw(data).getvalue(), indices

    def decode(self, body, size, count):
        reader = ByteReader(body, "deflate indices")
        width = reader.u8()
        if width not in _WIDTHS:
            raise DeepReduceError(f"deflate: bad gap width {width}")
        raw = inflate(reader.rest(), count * width)
        return from_gaps(np.frombuffer(raw, dtype=f"<u{width}"), size)


def inflate(data, expected):
    """zlib-decompress exactly `expected` bytes; never inflates past that (zip bombs)."""
    stream = zlib.decompressobj()
    try:
        out = stream.decompress(bytes(data), expected)
    except zlib.error as exc:
        raise DeepReduceError(f"deflate stream corrupted: {exc}") from None
    if len(out) != expected or stream.unconsumed_tail or not stream.eof:
        raise DeepReduceError(f"deflate stream holds other than the {expected} bytes declared")
    return out
