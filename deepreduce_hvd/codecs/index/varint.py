"""varint: gaps as LEB128 varints (one byte per gap below 128)."""
from ...engine.bits import varint_array, varint_bytes
from ..base import IndexCodec
from ..registry import register
from .gaps import from_gaps, to_gaps


@register("index")
class VarintIndex(IndexCodec):
    codec_id = "varint"
    wire_id = 5

    def encode(self, indices, size, dense=None, seed=None, shape=None):
        return varint_bytes(to_gaps(indices)), indices

    def max_count(self, body, size):
        return len(body)  # every position costs at least one byte

    def decode(self, body, size, count, shape=None):
        return from_gaps(varint_array(body, count), size)
