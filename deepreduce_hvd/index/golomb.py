"""golomb: Golomb-Rice code of the gaps, the Rice parameter chosen per tensor.

Near-optimal for a uniformly random subset (geometric gaps). Quotients are written in unary
(q zeros then a one) followed by all remainders, so both halves decode vectorised.
"""
import numpy as np

from ..bits import bits_to_fixed, fixed_to_bits, pack_bits, unpack_bits
from ..codec_base import IndexCodec
from ..errors import DeepReduceError
from ..registry import register
from ..wire import ByteReader
from .gaps import from_gaps, to_gaps


def rice_parameter(gaps):
    """(r, exact body bytes) for the Rice parameter that minimises the encoded size. The
    size is unimodal in r, so only a window around log2(mean gap) is evaluated."""
    if gaps.size == 0:
        return 0, 1
    centre = int(np.log2(float(gaps.mean()) + 1))
    costs = {r: int((gaps >> np.uint64(r)).sum()) + gaps.size * (r + 1)
             for r in range(max(0, centre - 2), min(40, centre + 3))}
    r = min(costs, key=costs.get)
    return r, 1 + (costs[r] + 7) // 8


def rice_bits(gaps, r):
    """Rice code of gaps with parameter r -> 0/1 array (unary quotients, then remainders)."""
    quotients = (gaps >> np.uint64(r)).astype(np.int64)
    unary = np.zeros(int(quotients.sum()) + gaps.size, dtype=np.uint8)
    unary[np.cumsum(quotients + 1) - 1] = 1
    remainders = fixed_to_bits(gaps & np.uint64((1 << r) - 1), r)
    return np.concatenate((unary, remainders))


def rice_decode(bits, count, r, limit):
    """Inverse of rice_bits; quotients above `limit` are rejected."""
    ones = np.flatnonzero(bits)[:count] if count else np.zeros(0, np.int64)
    if ones.size != count:
        raise DeepReduceError("rice stream truncated")
    quotients = np.diff(ones, prepend=-1) - 1
    tail = bits[ones[-1] + 1:] if count else bits[:0]
    if tail.size < count * r:
        raise DeepReduceError("rice stream truncated")
    if quotients.size and int(quotients.max()) > limit >> r:
        raise DeepReduceError("rice quotient larger than the tensor")
    remainders = bits_to_fixed(tail, count, r)
    return (quotients.astype(np.uint64) << np.uint64(r)) | remainders


def encode_rice(gaps, r=None):
    """Rice parameter byte, then the packed Rice code of the gaps."""
    r = rice_parameter(gaps)[0] if r is None else r
    return bytes([r]) + pack_bits(rice_bits(gaps, r))


def decode_rice(reader, count, size):
    """Inverse of encode_rice on the rest of reader -> gaps."""
    r = reader.u8()
    if r > 40:
        raise DeepReduceError(f"golomb: bad Rice parameter {r}")
    data = reader.rest()
    return rice_decode(unpack_bits(data, 8 * len(data)), count, r, size)


@register("index")
class GolombIndex(IndexCodec):
    codec_id = "golomb"
    wire_id = 6

    def encode(self, indices, size, dense=None, seed=None):
        return encode_rice(to_gaps(indices)), indices

    def decode(self, body, size, count):
        return from_gaps(decode_rice(ByteReader(body, "golomb indices"), count, size), size)
