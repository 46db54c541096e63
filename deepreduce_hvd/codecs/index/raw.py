"""raw: positions as little-endian int32 (or int64 for tensors past 2**31 elements)."""
import numpy as np

from ...errors import DeepReduceError
from ..base import IndexCodec
from ..registry import register


@register("index")
class RawIndex(IndexCodec):
    codec_id = "raw"
    wire_id = 1

    def encode(self, indices, size, dense=None, seed=None, shape=None):
        dtype = "<i4" if size <= 2**31 else "<i8"
        return indices.astype(dtype).tobytes(), indices

    def max_count(self, body, size):
        return len(body) // (4 if size <= 2**31 else 8)

    def decode(self, body, size, count, shape=None):
        width = 4 if size <= 2**31 else 8
        if len(body) != count * width:
            raise DeepReduceError(f"raw indices: {len(body)} bytes for {count} positions")
        return np.frombuffer(body, dtype=f"<i{width}").astype(np.int64)
