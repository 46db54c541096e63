"""golomb: Golomb-Rice code of the gaps, the Rice parameter chosen per tensor.

Near-optimal for a uniformly random subset (geometric gaps). Quotients are written in unary
(q zeros then a one) followed by all remainders; the native engine decodes both halves with
word-at-a-time bit scans, numpy vectorised.
"""
import numpy as np

from ...engine import native
from ...engine.bits import check_room, expect_stream_end, pack_fields, read_fixed, unpack_bits
from ...errors import DeepReduceError
from ...wire.bytestream import ByteReader
from ..base import IndexCodec
from ..registry import register
from .gaps import from_gaps, to_gaps

MAX_RICE = 40


def rice_parameter(gaps):
    """(r, exact body bytes) for the Rice parameter that minimises the encoded size. The
    size is unimodal in r, so only a window around log2(mean gap) is evaluated (integer
    arithmetic, so every path picks the same r)."""
    if gaps.size == 0:
        return 0, 1
    centre = (int(gaps.sum()) // gaps.size + 1).bit_length() - 1
    costs = {r: int((gaps >> np.uint64(r)).sum()) + gaps.size * (r + 1)
             for r in range(max(0, centre - 2), min(MAX_RICE + 1, centre + 3))}
    r = min(costs, key=costs.get)
    return r, 1 + (costs[r] + 7) // 8


def encode_rice(gaps, r=None):
    """Rice parameter byte, then the packed Rice code of the gaps."""
    r = rice_parameter(gaps)[0] if r is None else r
    if native.engine is not None:
        return bytes([r]) + bytes(native.engine.rice_pack(np.ascontiguousarray(gaps, np.uint64), r))
    n = gaps.size
    values = np.concatenate((np.ones(n, np.uint64), gaps & np.uint64((1 << r) - 1)))
    widths = np.concatenate(((gaps >> np.uint64(r)).astype(np.int64) + 1, np.full(n, r)))
    return bytes([r]) + pack_fields(values, widths)


def decode_positions(body, count, size):
    """Inverse of encode_rice, through the gaps -> the ascending positions in a tensor of
    `size` elements; the stream must end in its last byte."""
    reader = ByteReader(body, "rice gaps")
    r = reader.u8()
    if r > MAX_RICE:
        raise DeepReduceError(f"golomb: bad Rice parameter {r}")
    data = reader.rest()
    check_room(data, 0, count, r + 1, "rice stream")
    if native.engine is not None:
        positions, end = native.engine.rice_positions(data, 0, count, r, size)
        positions = np.frombuffer(positions, np.int64)
    else:
        gaps, end = _rice_decode_numpy(data, count, r, max(size - 1, 0) >> r)
        positions = from_gaps(gaps, size)
    expect_stream_end(data, end, "rice stream")
    return positions


def _rice_decode_numpy(data, count, r, max_quotient):
    if count == 0:
        return np.zeros(0, np.uint64), 0
    bits = unpack_bits(data, 8 * len(data))
    ones = np.flatnonzero(bits)[:count]
    if ones.size != count:
        raise DeepReduceError("rice stream truncated")
    quotients = np.diff(ones, prepend=-1) - 1
    if int(quotients.max()) > max_quotient:
        raise DeepReduceError("rice quotient larger than the tensor")
    unary_end = int(ones[-1]) + 1
    remainders = read_fixed(data, unary_end, count, r)
    return (quotients.astype(np.uint64) << np.uint64(r)) | remainders, unary_end + count * r


@register("index")
class GolombIndex(IndexCodec):
    codec_id = "golomb"
    wire_id = 6

    def encode(self, indices, size, dense=None, seed=None, shape=None):
        return encode_rice(to_gaps(indices)), indices

    def max_count(self, body, size):
        return 8 * len(body)  # every position costs at least one bit

    def decode(self, body, size, count, shape=None):
        return decode_positions(body, count, size)
