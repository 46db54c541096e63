"""deflate: zlib over gaps stored at the narrowest fixed width (1, 2, 4 or 8 bytes)."""
import numpy as np

from ...errors import DeepReduceError
from ...wire.bytestream import ByteReader
from ..base import IndexCodec
from ..registry import register
from ..streams import MAX_RATIO, deflate, inflate
from .gaps import check_gap_width, from_gaps, gap_bytes, to_gaps


@register("index")
class DeflateIndex(IndexCodec):
    codec_id = "deflate"
    wire_id = 4
    params = ("level",)

    def __init__(self, level=9):
        if level not in range(0, 10):
            raise DeepReduceError(f"level must be 0..9, not {level!r}")
        self.level = level

    def encode(self, indices, size, dense=None, seed=None, shape=None):
        width, data = gap_bytes(to_gaps(indices))
        return bytes([width]) + deflate(data, self.level), indices

    def max_count(self, body, size):
        return MAX_RATIO * len(body)  # at least a byte per gap, at most MAX_RATIO per input byte

    def decode(self, body, size, count, shape=None):
        reader = ByteReader(body, "deflate indices")
        width = check_gap_width(reader.u8(), size)
        raw = inflate(reader.rest(), count * width)
        return from_gaps(np.frombuffer(raw, dtype=f"<u{width}"), size)
