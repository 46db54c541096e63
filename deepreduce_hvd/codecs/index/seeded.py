"""seeded: random-k positions regenerated from the seed; the body is the seed alone, so the
bytes bound no count: the caller's max_elements (the tensor it expects) bounds the positions."""
import numpy as np

from ...compression.sparsify import random_positions
from ...errors import DeepReduceError
from ...wire.bytestream import ByteReader, ByteWriter
from ..base import IndexCodec
from ..registry import register


@register("index")
class SeededIndex(IndexCodec):
    codec_id = "seeded"
    wire_id = 7
    params = ("seed",)

    def __init__(self, seed=0):
        self.seed = seed

    def encode(self, indices, size, dense=None, seed=None, shape=None):
        seed = self.seed if seed is None else seed
        if not np.array_equal(random_positions(size, indices.size, seed), indices):
            raise DeepReduceError(
                f"index codec 'seeded' needs the positions of randomk(..., seed={seed}); "
                "these indices differ (pass the seed used by the sparsifier as seed=)")
        return ByteWriter().varint(seed).getvalue(), indices

    def decode(self, body, size, count, shape=None):
        reader = ByteReader(body, "seeded indices")
        seed = reader.varint(limit=2**64 - 1)
        reader.expect_end()
        return random_positions(size, count, seed)
