"""The Bloom filter behind the "bloom" index codec: sizing, the hash scheme, insert and query.

Hash scheme (mirrored bit for bit by csrc/bloom.cpp): key = fmix64(position + seed_key) with
seed_key = fmix64(seed ^ golden); h1, h2 = low and high 32 bits of key (h2 made odd); probe j
sets bit ((h1 + j*h2) mod 2**32) * m >> 32. Filters are little-endian bit arrays of m bits.
"""
import math
import os

import numpy as np

from . import native
from .errors import DeepReduceError

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


def query_numpy(filter_bytes, m, h, seed, size, chunk=1 << 22):
    """Positions of [0, size) whose h bits are all set, ascending."""
    table = np.frombuffer(filter_bytes, dtype=np.uint8)
    key, out = seed_key(seed), []
    for lo in range(0, size, chunk):
        cand = np.arange(lo, min(size, lo + chunk), dtype=np.int64)
        h1, h2 = _hash_pair(cand, key)
        for j in range(h):
            bit = _probe(h1, h2, j, m)
            keep = ((table[bit >> np.uint64(3)] >> (bit & np.uint64(7)).astype(np.uint8)) & 1).astype(bool)
            cand, h1, h2 = cand[keep], h1[keep], h2[keep]
        out.append(cand)
    return np.concatenate(out) if out else np.zeros(0, np.int64)


def insert(positions, m, h, seed):
    """Filter bytes with every position inserted (C++ when available)."""
    if native.bloom is None:
        return insert_numpy(positions, m, h, seed)
    return native.bloom.insert(np.ascontiguousarray(positions, dtype=np.int64), m, h, seed_key(seed))


def query(filter_bytes, m, h, seed, size, threads=None):
    """Every position of [0, size) the filter reports as present (C++ when available)."""
    if native.bloom is None:
        return query_numpy(filter_bytes, m, h, seed, size)
    threads = threads or os.cpu_count() or 1
    raw = native.bloom.query(filter_bytes, m, h, seed_key(seed), size, threads)
    return np.frombuffer(raw, dtype=np.int64)
