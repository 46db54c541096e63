"""The Bloom filter behind the "bloom" index codec: sizing, the hash scheme, insert and query.

Hash scheme (mirrored bit for bit by csrc/bloom.cpp): key = fmix64(position + seed_key) with
seed_key = fmix64(seed ^ golden); h1, h2 = low and high 32 bits of key (h2 made odd); probe j
sets bit ((h1 + j*h2) mod 2**32) * m >> 32. Filters are little-endian bit arrays of m bits.

A receiver can bound its work by the filter's own parameters: `plausible` checks that m and h
are what `parameters` gives for the number of inserted positions, and `max_positives` caps
how many positives such a filter can report (its false-positive rate, with a wide margin), so
a hostile filter (all bits set, say) is refused as soon as the cap is passed.
"""
import math
import os

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


MAX_FILL = 0.75  # a filter sized by `parameters` is about half full


def max_positives(m, h, inserted, size, filter_bytes=None):
    """Positives a filter of these parameters reports with overwhelming probability at most:
    the inserted positions plus twice the expected false positives and a wide margin. The
    expected rate adds 4/m for double hashing's degenerate keys (probes that all land on a
    few bits of a small filter). A filter fuller than MAX_FILL is refused outright."""
    if filter_bytes is not None and m:
        fill = int(np.unpackbits(np.frombuffer(filter_bytes, np.uint8), count=m).sum()) / m
        if fill > MAX_FILL:
            raise DeepReduceError(f"bloom: filter is {fill:.0%} full; a real one is about half")
    rate = min(1.0, ((1 - math.exp(-h * inserted / m)) ** h if m else 1.0) + 4 / max(m, 1))
    expected = rate * max(size - inserted, 0)
    return min(size, int(inserted + 2 * expected + 8 * math.sqrt(expected) + 64))


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


def query_numpy(filter_bytes, m, h, seed, size, limit=None, chunk=1 << 22):
    """Positions of [0, size) whose h bits are all set, ascending (at most `limit`)."""
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
    threads = threads or os.cpu_count() or 1
    limit = size if limit is None else limit
    raw = native.engine.bloom_query(filter_bytes, m, h, seed_key(seed), size, threads, limit)
    return np.frombuffer(raw, dtype=np.int64)
