"""bitmap: one bit per tensor element; cheapest for dense selections (> ~1/32 of elements)."""
import numpy as np

from ...engine.bits import pack_bits, unpack_bits
from ...errors import DeepReduceError
from ..base import IndexCodec
from ..registry import register


@register("index")
class BitmapIndex(IndexCodec):
    codec_id = "bitmap"
    wire_id = 2

    def encode(self, indices, size, dense=None, seed=None, shape=None):
        bits = np.zeros(size, dtype=np.uint8)
        bits[indices] = 1
        return pack_bits(bits), indices

    def max_count(self, body, size):
        return 8 * len(body)  # one bit per element, selected or not

    def decode(self, body, size, count, shape=None):
        if len(body) != (size + 7) // 8:
            raise DeepReduceError(f"bitmap: {len(body)} bytes for {size} elements")
        return np.flatnonzero(unpack_bits(body, size)).astype(np.int64)
