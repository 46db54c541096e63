"""huffman: each gap's bit length (plus its top `extra_bits` bits) Huffman-coded, the remaining
low bits raw. A real canonical table is sent with the codes; sizes are never estimated.

`GapStats` works out the exact size of every extra_bits choice from one histogram of (bit
length, top three bits) per gap, so choosing costs one pass; only the winner is written. The
per-gap passes run in the native engine (csrc/gaps.cpp) or their numpy twins here.
"""
import functools

import numpy as np

from ...engine import native
from ...engine.bits import bit_length, check_room, expect_stream_end, pack_fields, read_fields
from ...errors import DeepReduceError
from ...wire.bytestream import ByteReader, ByteWriter
from .. import huffman_code
from ..base import IndexCodec
from ..registry import register
from .gaps import from_gaps, to_gaps

MAX_EXTRA_BITS = 3
_MAX_LENGTH = 64
_TOP = 3  # the histogram keeps this many bits below each value's leading one


class GapStats:
    """Gaps and their (bit length of gap + 1, top three bits below its leading one) histogram."""

    CELLS = (_MAX_LENGTH + 1) << _TOP  # the histogram's size

    def __init__(self, gaps, hist=None):
        """hist: the gaps' histogram where it is known already (the matrix model's sizing);
        gaps None then sizes the plans only (encode needs the gaps)."""
        self.gaps = None if gaps is None else np.ascontiguousarray(gaps, dtype=np.uint64)
        if hist is not None:
            self.hist = np.asarray(hist, np.int64)
        elif native.engine is not None:
            self.hist = np.frombuffer(native.engine.gap_histogram(self.gaps), np.int64)
        else:
            v = self.gaps + np.uint64(1)
            length = bit_length(v)
            shift = length - 1 - _TOP
            right = v >> np.maximum(shift, 0).astype(np.uint64)
            left = v << np.maximum(-shift, 0).astype(np.uint64)
            top = (np.where(shift >= 0, right, left) & np.uint64((1 << _TOP) - 1)).astype(np.int64)
            self.hist = np.bincount(length * (1 << _TOP) + top, minlength=self.CELLS)
        self.hist = self.hist.reshape(-1, 1 << _TOP)
        self._per_length = self.hist.sum(axis=1)  # gaps of each bit length
        self._plans = {}

    def plan(self, extra):
        """(exact body bytes, code length per symbol) for extra_bits = extra; remembered, so
        that encoding the winner does not plan it again."""
        planned = self._plans.get(extra)
        if planned is None:
            symbols, raw_width = _cells(self.hist.shape[0], extra)
            counts = np.bincount(symbols, weights=self.hist.ravel(),
                                 minlength=self.hist.shape[0] << extra).astype(np.int64)
            lengths = huffman_code.code_lengths(counts)
            nbits = int(counts @ lengths) + int(self._per_length @ raw_width)
            head = 1 + huffman_code.table_bytes(lengths)  # the extra-bits byte, the table
            planned = self._plans[extra] = (head + (nbits + 7) // 8, lengths)
        return planned

    def smallest(self):
        """(nbytes, extra) of the smallest plan (the native engine sizes all four in one
        call, the same bytes as plan() gives: twelve Python plans cost a matrix-coded
        tensor's encoder a third of a millisecond)."""
        if native.engine is not None:
            sizes = np.frombuffer(native.engine.gap_plan_bytes(self.hist.ravel()), np.int64)
            return min((int(size), extra) for extra, size in enumerate(sizes))
        return min((self.plan(extra)[0], extra) for extra in range(MAX_EXTRA_BITS + 1))

    def encode(self, extra):
        """Body: extra_bits u8, Huffman table, then one bit stream (codes, then raw bits)."""
        _, lengths = self.plan(extra)
        head = ByteWriter().u8(extra)
        huffman_code.write_table(head, lengths)
        head = head.getvalue()
        codes = huffman_code.canonical_codes(lengths)
        if native.engine is not None:
            return head + bytes(native.engine.gap_pack(self.gaps, extra, codes,
                                                       lengths.astype(np.uint8)))
        v = self.gaps + np.uint64(1)
        length = bit_length(v)
        width = np.maximum(length - 1 - extra, 0)
        shift = width.astype(np.uint64)
        top = (v - (np.uint64(1) << (length - 1).astype(np.uint64))) >> shift
        symbols = (length << extra) + top.astype(np.int64)
        low = v & ((np.uint64(1) << shift) - np.uint64(1))
        return head + pack_fields(np.concatenate((codes[symbols], low)),
                                  np.concatenate((lengths[symbols], width)))


@functools.lru_cache(maxsize=None)
def _cells(rows, extra):
    """For a histogram of `rows` bit lengths: the Huffman symbol of each (bit length, top
    three bits) cell when `extra` top bits are modelled, and the raw low bits a gap of each
    bit length then keeps (the same for every tensor: computed once)."""
    length = np.arange(rows)[:, None]
    kept = np.minimum(extra, np.maximum(length - 1, 0))
    symbols = (length << extra) + (np.arange(1 << _TOP)[None, :] >> (_TOP - kept))
    cells = symbols.ravel(), np.maximum(np.arange(rows) - 1 - extra, 0)
    for array in cells:
        array.setflags(write=False)  # shared by every GapStats
    return cells


def decode_gaps(body, count):
    """Inverse of GapStats.encode (the whole of body) -> uint64 gaps: the numpy twin of the
    native engine's body decoders (csrc/bodies.cpp), which decode a body whole."""
    reader = ByteReader(body, "huffman gaps")
    extra_bits = reader.u8()
    if extra_bits > MAX_EXTRA_BITS:
        raise DeepReduceError(f"huffman: bad extra bit count {extra_bits}")
    lengths = huffman_code.read_table(reader, (_MAX_LENGTH + 1) << extra_bits)
    data = reader.rest()
    check_room(data, 0, count, 1, "huffman gaps")
    symbols, end = huffman_code.decode(data, 0, lengths, count)
    symbols = symbols.astype(np.int64)
    length = symbols >> extra_bits
    if count and (length.min() < 1 or length.max() > _MAX_LENGTH):
        raise DeepReduceError("huffman: bad gap length symbol")
    width = np.maximum(length - 1 - extra_bits, 0)
    low = read_fields(data, end, width)
    expect_stream_end(data, end + int(width.sum()), "huffman gaps")
    top = (symbols & ((1 << extra_bits) - 1)).astype(np.uint64)
    v = (np.uint64(1) << (length - 1).astype(np.uint64)) + (top << width.astype(np.uint64)) + low
    return v - np.uint64(1)


def decode_positions(body, count, size):
    """A gap body (GapStats.encode) -> its `count` ascending positions below size (the native
    engine parses and decodes the body in one call)."""
    if native.engine is not None:
        return np.frombuffer(native.engine.gap_positions(body, count, size), np.int64)
    return from_gaps(decode_gaps(body, count), size)


@register("index")
class HuffmanIndex(IndexCodec):
    codec_id = "huffman"
    wire_id = 8
    params = ("extra_bits",)

    def __init__(self, extra_bits=0):
        if extra_bits not in range(MAX_EXTRA_BITS + 1):
            raise DeepReduceError(f"extra_bits must be 0..{MAX_EXTRA_BITS}, not {extra_bits!r}")
        self.extra_bits = extra_bits

    def encode(self, indices, size, dense=None, seed=None, shape=None):
        return GapStats(to_gaps(indices)).encode(self.extra_bits), indices

    def max_count(self, body, size):
        return 8 * len(body)  # every position costs at least one bit

    def decode(self, body, size, count, shape=None):
        return decode_positions(body, count, size)
