"""dense: every position, zero index bytes; the fallback when a sparse encoding is larger.

Values come from the dense tensor, so the receiver gets it whole (at the value codec's
precision). The count is the tensor's size, bounded by the caller's max_elements.
"""
import numpy as np

from ...errors import DeepReduceError
from ..base import IndexCodec
from ..registry import register


@register("index")
class DenseIndex(IndexCodec):
    codec_id = "dense"
    wire_id = 11
    reads_dense = True

    def encode(self, indices, size, dense=None, seed=None, shape=None):
        if indices.size == size:
            return b"", indices
        return b"", np.arange(size, dtype=np.int64)

    def decode(self, body, size, count, shape=None):
        if len(body) or count != size:
            raise DeepReduceError("dense indices: the payload must carry every element")
        return np.arange(size, dtype=np.int64)
