"""bloom: the selected positions inserted into a Bloom filter; the receiver queries every position.

The receiver finds the positives P (the true positions plus about fpr * size false ones), and a
policy decides which positions the values belong to; the sender applies the same policy to its
own filter and sends the values there ("false-positive aware"), so both sides agree:

- p0 (default): a value for every positive, false ones included (their true dense values).
  No error, but |P| values are sent instead of k. Needs `dense`.
- random: k positives drawn with a seed both sides derive from the payload.
- conflict: the paper's conflict sets (the positives hashing to one bit): positives of the
  smallest sets first (a set of one is a certain true positive), at random among equals.
- leftmost: the first k positives.
The last three are lossy (false positives take the place of true ones) and need `dense` only
when a false positive is chosen.

A filter may report at most bloom_filter.MAX_FALSE_PER_VALUE false positives per value (and a
few more): the encoder refuses a filter that reports more (a lower fpr helps, unless the
filter is a few bits over a long tensor), and the decoder refuses one before or while it
scans, so every policy holds O(values + filter) memory.
"""
import zlib

import numpy as np

from ...errors import DeepReduceError
from ...wire.bytestream import ByteReader, ByteWriter
from .. import bloom_filter
from ..base import IndexCodec
from ..registry import register

POLICIES = ("p0", "random", "conflict", "leftmost")


@register("index")
class BloomIndex(IndexCodec):
    codec_id = "bloom"
    wire_id = 9
    params = ("policy", "fpr", "seed")
    reads_dense = True  # false positives take their true values

    def __init__(self, policy="p0", fpr=None, seed=0):
        if policy not in POLICIES:
            raise DeepReduceError(f"policy must be one of {POLICIES}, not {policy!r}")
        if fpr is not None and not 0 < fpr < 1:
            raise DeepReduceError(f"fpr must be in (0, 1), not {fpr!r}")
        self.policy, self.fpr, self.seed = policy, fpr, int(seed)
        self.lossless = policy == "p0"

    def encode(self, indices, size, dense=None, seed=None, shape=None):
        m, h = bloom_filter.parameters(indices.size, size, self.fpr)
        filt = bloom_filter.insert(indices, m, h, self.seed)
        limit = bloom_filter.scan_limit(filt, m, h, indices.size, size)
        positives = bloom_filter.query(filt, m, h, self.seed, size, limit)
        chosen = select(self.policy, positives, indices.size, filt, m, h, self.seed)
        body = (ByteWriter().u8(POLICIES.index(self.policy)).u8(h).varint(m).varint(self.seed)
                .varint(indices.size).raw(filt).getvalue())
        return body, indices if np.array_equal(chosen, indices) else chosen

    def max_count(self, body, size):
        """p0 sends a value for every positive, the others one per inserted position."""
        policy, _, _, _, inserted, _ = read_header(body, size)
        return min(size, bloom_filter.max_positives(inserted)) if policy == 0 else inserted

    def decode(self, body, size, count, shape=None):
        policy, h, m, seed, inserted, filt = read_header(body, size)
        if (not bloom_filter.plausible(m, h, inserted) or len(filt) != (m + 7) // 8
                or inserted > count or (policy and inserted != count)):
            raise DeepReduceError(f"bloom: inconsistent filter (m={m}, h={h}, {len(filt)} bytes, "
                                  f"{inserted} inserted, {count} values)")
        limit = bloom_filter.scan_limit(bytes(filt), m, h, inserted, size)
        # p0 sends a value for every positive: the value count caps them too
        positives = bloom_filter.query(bytes(filt), m, h, seed, size,
                                       min(limit, count) if policy == 0 else limit)
        if positives.size < inserted:
            raise DeepReduceError("bloom: fewer positives than inserted positions")
        return select(POLICIES[policy], positives, inserted, filt, m, h, seed)


def read_header(body, size):
    """(policy, h, m, seed, inserted, filter bytes) of a body."""
    reader = ByteReader(body, "bloom indices")
    policy = reader.u8()
    if policy >= len(POLICIES):
        raise DeepReduceError(f"bloom: unknown policy #{policy}")
    h = reader.u8()
    m = reader.varint(limit=bloom_filter.MAX_BITS)
    seed = reader.varint(limit=2**64 - 1)
    inserted = reader.varint(limit=size)
    return policy, h, m, seed, inserted, reader.rest()


def select(policy, positives, k, filt, m, h, seed):
    """The positions (ascending) a policy assigns the values to."""
    if policy == "p0" or positives.size == k:
        return positives
    if policy == "leftmost":
        return positives[:k]
    rng = np.random.default_rng([zlib.crc32(filt), seed])
    if policy == "random":
        return positives[np.sort(rng.choice(positives.size, k, replace=False))]
    order = np.lexsort((rng.random(positives.size), smallest_conflict_set(positives, m, h, seed)))
    return positives[np.sort(order[:k])]


def smallest_conflict_set(positives, m, h, seed):
    """For each positive, the size of the smallest conflict set it belongs to.

    A bit's conflict set is the positives that hash to it. Every set bit was set by some
    inserted position, so a positive alone in one of its sets (size 1) is certainly true, and
    members of small sets are likelier true than members of large ones.
    """
    return bloom_filter.conflict_sizes(positives, m, h, seed)
