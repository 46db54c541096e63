"""Canonical, length-limited Huffman coding on small alphabets, vectorised with numpy.

Decoding is the sequential part of Huffman; here it is done without a Python loop: every bit
position is decoded speculatively through a lookup table (what symbol, and where the next code
would start), and the chain from bit 0 is followed by pointer doubling in log2(count) gathers.
"""
import heapq

import numpy as np

from .bits import fields_to_bits
from .errors import DeepReduceError

MAX_CODE_LENGTH = 15


def code_lengths(freqs, max_length=MAX_CODE_LENGTH):
    """Huffman code length per symbol (0 for unused symbols), at most max_length bits."""
    freqs = np.asarray(freqs, dtype=np.int64)
    used = np.flatnonzero(freqs)
    lengths = np.zeros(freqs.size, dtype=np.int64)
    if used.size == 1:
        lengths[used] = 1
    if used.size <= 1:
        return lengths
    weights = freqs[used]
    while True:
        heap = [(int(w), i, (i,)) for i, w in enumerate(weights)]
        heapq.heapify(heap)
        depth = np.zeros(used.size, dtype=np.int64)
        tie = used.size
        while len(heap) > 1:
            w1, _, a = heapq.heappop(heap)
            w2, _, b = heapq.heappop(heap)
            depth[list(a + b)] += 1
            heapq.heappush(heap, (w1 + w2, tie, a + b))
            tie += 1
        if depth.max() <= max_length:
            lengths[used] = depth
            return lengths
        weights = (weights + 1) // 2  # flatten the distribution until the code fits


def canonical_codes(lengths):
    """Canonical code of each symbol (shorter codes first, then by symbol)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    codes = np.zeros(lengths.size, dtype=np.uint64)
    code = prev = 0
    for sym in sorted(np.flatnonzero(lengths), key=lambda s: (lengths[s], s)):
        code <<= int(lengths[sym]) - prev
        prev = int(lengths[sym])
        codes[sym] = code
        code += 1
    return codes


def write_table(writer, lengths):
    """Symbols first..last as 4-bit lengths, after two varints (first, count)."""
    used = np.flatnonzero(lengths)
    first = int(used[0]) if used.size else 0
    span = np.asarray(lengths[first:int(used[-1]) + 1] if used.size else [], dtype=np.uint8)
    writer.varint(first).varint(span.size)
    if span.size % 2:
        span = np.append(span, 0)
    writer.raw((span[0::2] | (span[1::2] << 4)).astype(np.uint8).tobytes())


def read_table(reader, alphabet):
    """Inverse of write_table; checks the lengths form a valid prefix code."""
    first = reader.varint(limit=alphabet)
    count = reader.varint(limit=alphabet - first)
    packed = np.frombuffer(reader.raw((count + 1) // 2), dtype=np.uint8)
    span = np.stack([packed & 15, packed >> 4], axis=1).ravel()[:count]
    lengths = np.zeros(alphabet, dtype=np.int64)
    lengths[first:first + count] = span
    used = lengths[lengths > 0]
    if used.size and np.sum(2.0 ** -used) > 1.0:
        raise DeepReduceError("Huffman table is not a prefix code")
    return lengths


def encode(symbols, lengths):
    """Symbols -> 0/1 bit array."""
    return fields_to_bits(canonical_codes(lengths)[symbols], lengths[symbols])


def decode(bits, lengths, count):
    """Decode `count` symbols from the start of a 0/1 array -> (symbols, bits consumed)."""
    if count == 0:
        return np.zeros(0, dtype=np.int64), 0
    if not lengths.any():
        raise DeepReduceError("Huffman table is empty")
    width = int(lengths.max())
    table_sym = np.zeros(1 << width, dtype=np.int64)
    table_len = np.zeros(1 << width, dtype=np.int64)
    codes = canonical_codes(lengths)
    for sym in np.flatnonzero(lengths):
        lo = int(codes[sym]) << (width - int(lengths[sym]))
        hi = (int(codes[sym]) + 1) << (width - int(lengths[sym]))
        table_sym[lo:hi], table_len[lo:hi] = sym, lengths[sym]
    total = bits.size
    padded = np.concatenate((bits, np.zeros(width, dtype=np.uint8)))
    window = np.zeros(total, dtype=np.int32)  # the next `width` bits at every position
    for j in range(width):
        window = (window << 1) | padded[j:j + total]
    step = table_len[window]
    # next[p]: where the code after the one at p starts; total = end, total + 1 = invalid code
    index_type = np.int32 if total < 2**31 - 2 else np.int64
    nxt = np.where(step > 0, np.arange(total) + step, total + 1)
    nxt = np.minimum(nxt, total + 1)
    jump = np.concatenate((nxt, [total, total + 1])).astype(index_type)
    chain = np.zeros(1, dtype=index_type)
    while chain.size < count:
        chain = np.concatenate((chain, jump[chain]))
        if chain.size < count:
            jump = jump[jump]
    chain = chain[:count]
    last = int(chain[-1])
    if last >= total or (step[chain] == 0).any() or last + int(step[last]) > total:
        raise DeepReduceError("Huffman stream truncated or corrupted")
    return table_sym[window[chain]], last + int(step[last])
