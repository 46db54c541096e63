"""Canonical, length-limited Huffman coding on small alphabets.

Code lengths are computed here (one definition for both paths); decoding runs in the native
engine (a lookup table on the next 15 bits) or, in numpy, without a Python loop: every bit
position is decoded speculatively through the table and the chain from the first bit is
followed by pointer doubling in log2(count) gathers.
"""
import heapq

import numpy as np

from ..engine import native
from ..engine.bits import check_room, pack_fields, unpack_bits, varint_sizes
from ..errors import DeepReduceError

MAX_CODE_LENGTH = 15
MAX_ALPHABET = 4096  # the native decoder's table holds 12-bit symbols


def _tree_depths(weights):
    """Leaf depths of a Huffman tree over weights (ties broken by node order)."""
    n = len(weights)
    heap = [(int(w), i) for i, w in enumerate(weights)]
    heapq.heapify(heap)
    parent = [0] * (2 * n - 1)
    node = n
    while len(heap) > 1:
        w1, a = heapq.heappop(heap)
        w2, b = heapq.heappop(heap)
        parent[a] = parent[b] = node
        heapq.heappush(heap, (w1 + w2, node))
        node += 1
    depth = [0] * node
    for child in range(node - 2, -1, -1):  # parents have larger ids than their children
        depth[child] = depth[parent[child]] + 1
    return np.array(depth[:n], dtype=np.int64)


def code_lengths(freqs, max_length=MAX_CODE_LENGTH):
    """Huffman code length per symbol (0 for unused symbols), at most max_length bits."""
    freqs = np.ascontiguousarray(freqs, dtype=np.int64)
    if native.engine is not None:
        return np.frombuffer(native.engine.huffman_lengths(freqs, max_length), np.uint8).astype(np.int64)
    used = np.flatnonzero(freqs)
    lengths = np.zeros(freqs.size, dtype=np.int64)
    if used.size == 1:
        lengths[used] = 1
    if used.size <= 1:
        return lengths
    weights = freqs[used]
    while True:
        depth = _tree_depths(weights)
        if depth.max() <= max_length:
            lengths[used] = depth
            return lengths
        weights = (weights + 1) // 2  # flatten the distribution until the code fits


def canonical_codes(lengths):
    """Canonical code of each symbol (shorter codes first, then by symbol), without a loop:
    in that order a code is 2**length times the Kraft sum of the codes before it, which, in
    units of 2**-MAX_CODE_LENGTH, is an exact integer prefix sum."""
    lengths = np.asarray(lengths, dtype=np.int64)
    codes = np.zeros(lengths.size, dtype=np.uint64)
    used = np.flatnonzero(lengths)
    ordered = used[np.argsort(lengths[used], kind="stable")]
    depth = lengths[ordered]  # at most MAX_CODE_LENGTH: code_lengths' and 4-bit tables'
    units = np.left_shift(1, MAX_CODE_LENGTH - depth)
    before = np.cumsum(units) - units
    codes[ordered] = (before >> (MAX_CODE_LENGTH - depth)).astype(np.uint64)
    return codes


def _table_span(lengths):
    """(first used symbol, count from it to the last used one) of a table."""
    used = np.flatnonzero(lengths)
    return (int(used[0]), int(used[-1] - used[0]) + 1) if used.size else (0, 0)


def table_bytes(lengths):
    """The bytes write_table writes for these lengths, without writing them."""
    first, count = _table_span(lengths)
    return int(varint_sizes([first, count]).sum()) + (count + 1) // 2


def write_table(writer, lengths):
    """Symbols first..last as 4-bit lengths, after two varints (first, count)."""
    first, count = _table_span(lengths)
    span = np.asarray(lengths[first:first + count], dtype=np.uint8)
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


def pack(symbols, lengths, bits):
    """The canonical codes of `symbols`, then each of `bits` (booleans) as one bit -> bytes
    (one native pass, or bits.pack_fields: the same bytes)."""
    symbols = np.ascontiguousarray(symbols, dtype=np.int64)
    bits = np.ascontiguousarray(bits, dtype=bool)
    codes = canonical_codes(lengths)
    if native.engine is not None:
        return bytes(native.engine.huffman_pack(symbols, codes, np.asarray(lengths, np.uint8),
                                                bits.view(np.uint8)))
    widths = np.asarray(lengths)[symbols]
    if symbols.size and not widths.all():
        raise DeepReduceError("huffman_pack: symbol without a code")
    return pack_fields(np.concatenate((codes[symbols], bits.astype(np.uint64))),
                       np.concatenate((widths, np.ones(bits.size, np.int64))))


def decode(data, start, lengths, count):
    """Decode `count` symbols from bit `start` of data -> (symbols, bit after the last);
    symbols are uint32 (native) or int64 (numpy)."""
    check_room(data, start, count, 1, "Huffman stream")
    if lengths.size > MAX_ALPHABET:
        raise DeepReduceError(f"Huffman alphabet over {MAX_ALPHABET} symbols")
    if count == 0:
        return np.zeros(0, dtype=np.int64), start
    if not lengths.any():
        raise DeepReduceError("Huffman table is empty")
    if native.engine is not None:
        symbols, end = native.engine.huffman_decode(
            data, start, np.ascontiguousarray(lengths, dtype=np.uint8), count)
        return np.frombuffer(symbols, dtype=np.uint32), end
    bits = unpack_bits(data, 8 * len(data))[start:]
    symbols, used = _decode_bits(bits, lengths, count)
    return symbols, start + used


def _decode_bits(bits, lengths, count):
    """numpy twin of the native decoder on a 0/1 array -> (symbols, bits consumed)."""
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
