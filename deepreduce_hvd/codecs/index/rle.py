"""rle: run lengths of the selection bitmap (zeros, ones, zeros, ...), bit-packed.

Every run length takes ceil(log2(longest run + 1)) bits; the final run of zeros is implicit.
One run describes any number of positions, so no count is too large for a few bytes: the
caller's max_elements (the tensor it expects) bounds the positions.
"""
import numpy as np

from ...engine.bits import bit_length, expect_stream_end, pack_fixed, read_fixed
from ...errors import DeepReduceError
from ...wire.bytestream import ByteReader, ByteWriter
from ..base import IndexCodec
from ..registry import register


@register("index")
class RunLengthIndex(IndexCodec):
    codec_id = "rle"
    wire_id = 3

    def encode(self, indices, size, dense=None, seed=None, shape=None):
        runs = np.zeros(0, dtype=np.uint64)
        if indices.size:
            breaks = np.flatnonzero(np.diff(indices) != 1) + 1
            starts = indices[np.concatenate(([0], breaks))]
            ones = np.diff(np.concatenate(([0], breaks, [indices.size])))
            zeros = starts - np.concatenate(([0], (starts + ones)[:-1]))
            runs = np.stack([zeros, ones], axis=1).ravel().astype(np.uint64)
        width = int(bit_length(runs.max())) if runs.size else 0
        out = ByteWriter().u8(width).varint(runs.size // 2)
        return out.raw(pack_fixed(runs, width)).getvalue(), indices

    def decode(self, body, size, count, shape=None):
        reader = ByteReader(body, "rle indices")
        width = reader.u8()
        pairs = reader.varint(limit=count)
        if width > 63 or (pairs and width == 0):
            raise DeepReduceError(f"rle: bad run width {width}")
        data = reader.rest()
        runs = read_fixed(data, 0, 2 * pairs, width).reshape(pairs, 2)
        expect_stream_end(data, 2 * pairs * width, "rle runs")
        zeros, ones = runs[:, 0], runs[:, 1]
        if runs.size and int(runs.max()) > size or int(ones.sum()) != count or int(runs.sum()) > size:
            raise DeepReduceError("rle: run lengths disagree with the header")
        ends = np.cumsum(zeros + ones).astype(np.int64)
        starts = ends - ones.astype(np.int64)
        offsets = np.repeat(starts - (np.cumsum(ones) - ones).astype(np.int64), ones.astype(np.int64))
        return np.arange(count, dtype=np.int64) + offsets
