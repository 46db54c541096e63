"""The Bloom filter behind the "bloom" index codec: sizing, the hash scheme, insert and query.

Hash scheme (mirrored bit for bit by csrc/bloom.cpp): key = fmix64(position + seed_key) with
seed_key = fmix64(seed ^ golden); h1, h2 = low and high 32 bits of key (h2 made odd); probe j
sets bit ((h1 + j*h2) mod 2**32) * m >> 32. Filters are little-endian bit arrays of m bits.

A receiver bounds its work by the filter's own parameters: `plausible` checks that m and h
are what `parameters` gives for the number of inserted positions; `scan_limit` refuses a
filter whose set bits or fill cannot come from that many insertions into a usable filter
(more than MAX_FALSE_PER_VALUE false positives per value, which the encoder refuses to send
too), and caps the scan, which stops as soon as the cap is passed. So a decoder holds
O(values + filter) memory, and its time is at most one scan of the tensor's positions.
"""
import math

import numpy as np

from ..engine import native
from ..errors import DeepReduceError

_GOLDEN = 0x9E3779B97F4A7C15
_M32 = np.uint64(0xFFFFFFFF)
MAX_BITS = 2**32 - 1
MAX_HASHES = 32


def fmix64(x):
    """MurmurHash3's 64-bit finaliser, on a uint64 array (wrapping arithmetic)."""
    x = np.asarray(x, dtype=np.uint64)
    with np.errstate(over="ignore"):
        x = x ^ (x >> np.uint64(33))
        x = x * np.uint64(0xFF51AFD7ED558CCD)
        x ^= x >> np.uint64(33)
        x *= np.uint64(0xC4CEB9FE1A85EC53)
        x ^= x >> np.uint64(33)
    return x


def seed_key(seed):
    return int(fmix64(np.uint64((int(seed) ^ _GOLDEN) & (2**64 - 1))))


def parameters(count, size, fpr=None):
    """(m bits, h hashes) for `count` insertions at false-positive rate `fpr`.

    Default fpr is the paper's 0.1 * count / size (about 10% of count false positives).
    m = -count * ln(fpr) / ln(2)**2, h = ceil(log2(1 / fpr)), as pybloom-live sizes them.
    """
    if fpr is None:
        fpr = min(0.5, 0.1 * count / size) if size else 0.5
    elif not 0 < fpr < 1:
        raise DeepReduceError(f"false-positive rate must be in (0, 1), not {fpr!r}")
    fpr = max(fpr, 2.0 ** -MAX_HASHES)
    hashes = max(1, math.ceil(math.log2(1 / fpr)))
    bits = max(8, math.ceil(count * -math.log(fpr) / math.log(2) ** 2))
    if bits > MAX_BITS:
        raise DeepReduceError(f"Bloom filter of {bits} bits is too large")
    return bits, hashes


def plausible(m, h, inserted):
    """Whether (m, h) is what `parameters` gives for `inserted` positions at some rate."""
    if not 1 <= h <= MAX_HASHES or not 8 <= m <= MAX_BITS:
        return False
    low = inserted * (h - 1) / math.log(2)   # -ln(fpr) > (h - 1) ln 2
    high = inserted * h / math.log(2)        # -ln(fpr) <= h ln 2
    return max(8, math.floor(low)) <= m <= max(8, math.ceil(high) + 1)


MAX_FALSE_PER_VALUE = 2  # false positives a usable filter reports per inserted position
SLACK = 64  # and a few more, so that tiny counts are not refused for a handful


def max_positives(inserted):
    """The most positives a filter of `inserted` positions may report. The encoder refuses
    to send a filter that reports more, so a decoder holds at most this many positions."""
    return inserted * (1 + MAX_FALSE_PER_VALUE) + SLACK


def scan_limit(filter_bytes, m, h, inserted, size):
    """The cap on positives for a scan of [0, size); DeepReduceError before any scan when
    the filter has more bits set than `inserted` positions can set (h each), or when its
    fill already predicts more false positives than the cap allows (a position is a false
    positive with probability about fill**h), so no scan of a hostile filter runs long."""
    set_bits = int(np.unpackbits(np.frombuffer(filter_bytes, np.uint8), count=m).sum())
    cap = max_positives(inserted)
    if set_bits > inserted * h:
        raise DeepReduceError(f"bloom: {set_bits} bits set, but {inserted} positions set at "
                              f"most {inserted * h}")
    predicted = inserted + (set_bits / m) ** h * max(size - inserted, 0)
    if predicted > cap:
        raise DeepReduceError(f"bloom: the filter predicts about {predicted:.0f} positives for "
                              f"{inserted} inserted positions, more than {cap} "
                              f"({MAX_FALSE_PER_VALUE} false positives per value); a lower fpr "
                              "or another index codec")
    return min(cap, size)


def conflict_sizes(positives, m, h, seed):
    """For each positive, the size of the smallest conflict set (positives sharing a bit) it
    belongs to; chunked so memory stays O(m + chunk * h)."""
    positives = np.ascontiguousarray(positives, dtype=np.int64)
    if native.engine is not None:
        return np.frombuffer(native.engine.bloom_conflicts(positives, m, h, seed_key(seed)),
                             dtype=np.int64)
    chunk = max(1, (1 << 20) // max(h, 1))
    members = np.zeros(m, dtype=np.int64)
    for lo in range(0, positives.size, chunk):
        members += np.bincount(bit_positions(positives[lo:lo + chunk], m, h, seed).ravel(),
                               minlength=m)
    out = np.empty(positives.size, dtype=np.int64)
    for lo in range(0, positives.size, chunk):
        out[lo:lo + chunk] = members[bit_positions(positives[lo:lo + chunk], m, h, seed)].min(axis=1)
    return out


def _hash_pair(positions, key):
    with np.errstate(over="ignore"):
        mixed = fmix64(np.asarray(positions, dtype=np.uint64) + np.uint64(key))
    return mixed & _M32, (mixed >> np.uint64(32)) | np.uint64(1)


def _probe(h1, h2, j, m):
    return (((h1 + np.uint64(j) * h2) & _M32) * np.uint64(m)) >> np.uint64(32)


def bit_positions(positions, m, h, seed):
    """(len(positions), h) array of the filter bits each position sets."""
    h1, h2 = _hash_pair(positions, seed_key(seed))
    return np.stack([_probe(h1, h2, j, m) for j in range(h)], axis=1).astype(np.int64)


def insert_numpy(positions, m, h, seed):
    bits = np.zeros(m, dtype=np.uint8)
    bits[bit_positions(positions, m, h, seed).ravel()] = 1
    return np.packbits(bits, bitorder="little").tobytes()


def query_numpy(filter_bytes, m, h, seed, size, limit=None, chunk=1 << 18):
    """Positions of [0, size) whose h bits are all set, ascending (at most `limit`); chunks
    of positions keep the temporaries small whatever the size."""
    table = np.frombuffer(filter_bytes, dtype=np.uint8)
    key, out, found = seed_key(seed), [], 0
    for lo in range(0, size, chunk):
        cand = np.arange(lo, min(size, lo + chunk), dtype=np.int64)
        h1, h2 = _hash_pair(cand, key)
        for j in range(h):
            bit = _probe(h1, h2, j, m)
            keep = ((table[bit >> np.uint64(3)] >> (bit & np.uint64(7)).astype(np.uint8)) & 1).astype(bool)
            cand, h1, h2 = cand[keep], h1[keep], h2[keep]
        found += cand.size
        if limit is not None and found > limit:
            raise DeepReduceError("bloom: the filter reports more positives than its "
                                  "parameters allow")
        out.append(cand)
    return np.concatenate(out) if out else np.zeros(0, np.int64)


def insert(positions, m, h, seed):
    """Filter bytes with every position inserted (C++ when available)."""
    if native.engine is None:
        return insert_numpy(positions, m, h, seed)
    return native.engine.bloom_insert(np.ascontiguousarray(positions, dtype=np.int64), m, h,
                                      seed_key(seed))


def query(filter_bytes, m, h, seed, size, limit=None, threads=None):
    """Every position of [0, size) the filter reports as present (C++ when available);
    DeepReduceError as soon as more than `limit` are found."""
    if native.engine is None:
        return query_numpy(filter_bytes, m, h, seed, size, limit)
    threads = threads or native.cores_per_rank()
    limit = size if limit is None else limit
    raw = native.engine.bloom_query(filter_bytes, m, h, seed_key(seed), size, threads, limit)
    return np.frombuffer(raw, dtype=np.int64)
