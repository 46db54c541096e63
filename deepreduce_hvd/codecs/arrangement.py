"""How sorted (curve-fitted) values are put back in the order of their positions.

Layout 0: the value codec kept the positions' order; nothing to send.
Layout 1: the paper's permutation, ceil(log2 count) bits per value.
Layout 2: each value's rank in the sorted order, keeping only its top r bits; the receiver
takes the fitted value at the middle of that rank bucket. A fitted curve is smooth, so a few
rank bits usually cost no more accuracy than the fit already lost: layout 2 is used with the
fewest bits whose error stays within RANK_TOLERANCE of layout 1's.
"""
import numpy as np

from ..engine.bits import expect_stream_end, pack_fixed, read_fixed
from ..engine.norms import l2_norm
from ..errors import DeepReduceError

INDEX_ORDER, PERMUTATION, RANKS = 0, 1, 2
LAYOUTS = (INDEX_ORDER, PERMUTATION, RANKS)
RANK_TOLERANCE = 1.1


def rank_width(count):
    return (count - 1).bit_length() if count > 1 else 0


def _pack(fields, width):
    return pack_fixed(fields, width)


def _unpack(data, count, width):
    fields = read_fixed(data, 0, count, width).astype(np.int64)
    expect_stream_end(data, count * width, "value arrangement")
    return fields


def _bucket_centres(buckets, bits, width, count):
    shift = width - bits
    return np.minimum((buckets << shift) + ((1 << shift) >> 1), count - 1)


def choose(values, order, fitted, mode):
    """-> (layout, arrangement bytes or None) for values encoded as values[order], given what
    the value codec delivers in that order (`fitted`)."""
    if order is None:
        return INDEX_ORDER, None
    count, width = values.size, rank_width(values.size)
    permutation = _pack(order, width)
    if mode == "permutation" or width < 2:
        return PERMUTATION, permutation
    fitted = fitted.astype(np.float64)
    target = values.astype(np.float64)
    ranks = np.empty(count, dtype=np.int64)
    ranks[order] = np.arange(count)
    budget = RANK_TOLERANCE * l2_norm(fitted[ranks] - target)

    def error(bits):
        buckets = ranks >> (width - bits)
        return l2_norm(fitted[_bucket_centres(buckets, bits, width, count)] - target)

    lo, hi = 1, width  # binary search for the fewest rank bits within budget (width: none)
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if error(mid) <= budget else (mid + 1, hi)
    if lo == width:
        return PERMUTATION, permutation
    return RANKS, bytes([lo]) + _pack(ranks >> (width - lo), lo)


def restore(layout, data, decoded):
    """Values in the positions' order, from the value codec's output and the arrangement."""
    count = decoded.size
    width = rank_width(count)
    if layout == INDEX_ORDER:
        return decoded
    if layout == PERMUTATION:
        order = _unpack(data, count, width)
        if (order >= count).any() or np.bincount(order, minlength=count).max(initial=0) > 1:
            raise DeepReduceError("value arrangement is not a permutation")
        out = np.empty_like(decoded)
        out[order] = decoded
        return out
    if not len(data) or not 1 <= data[0] < max(width, 1):
        raise DeepReduceError("value arrangement: bad rank width")
    bits = data[0]
    return decoded[_bucket_centres(_unpack(data[1:], count, bits), bits, width, count)]
