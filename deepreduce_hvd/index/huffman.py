"""huffman: each gap's bit length (plus its top `extra_bits` bits) Huffman-coded, the remaining
low bits raw. A real canonical table is sent with the codes; sizes are never estimated.
"""
import numpy as np

from .. import huffman
from ..bits import bit_length, bits_to_fields, fields_to_bits, pack_bits, unpack_bits
from ..codec_base import IndexCodec
from ..errors import DeepReduceError
from ..registry import register
from ..wire import ByteReader, ByteWriter
from .gaps import from_gaps, to_gaps

MAX_EXTRA_BITS = 3
_MAX_LENGTH = 64


class GapPlan:
    """A Huffman gap encoding worked out but not yet written; `nbytes` is its exact size."""

    def __init__(self, gaps, extra_bits, length=None):
        v = gaps + np.uint64(1)
        length = bit_length(v) if length is None else length
        self.extra_bits = extra_bits
        self.width = np.maximum(length - 1 - extra_bits, 0)
        shift = self.width.astype(np.uint64)
        top = (v - (np.uint64(1) << (length - 1).astype(np.uint64))) >> shift
        self.symbols = (length << extra_bits) + top.astype(np.int64)
        self.low = v & ((np.uint64(1) << shift) - np.uint64(1))
        counts = np.bincount(self.symbols, minlength=1)
        self.lengths = huffman.code_lengths(counts)
        self.head = ByteWriter().u8(extra_bits)
        huffman.write_table(self.head, self.lengths)
        self.head = self.head.getvalue()
        nbits = int(counts @ self.lengths[:counts.size]) + int(self.width.sum())
        self.nbytes = len(self.head) + (nbits + 7) // 8

    def encode(self):
        """Body: extra_bits u8, Huffman table, then one bit stream (codes, then raw bits)."""
        bits = np.concatenate((huffman.encode(self.symbols, self.lengths),
                               fields_to_bits(self.low, self.width)))
        return self.head + pack_bits(bits)


def decode_gaps(reader, count):
    """Inverse of GapPlan.encode on the rest of reader."""
    extra_bits = reader.u8()
    if extra_bits > MAX_EXTRA_BITS:
        raise DeepReduceError(f"huffman: bad extra bit count {extra_bits}")
    lengths = huffman.read_table(reader, (_MAX_LENGTH + 1) << extra_bits)
    data = reader.rest()
    bits = unpack_bits(data, 8 * len(data))
    symbols, end = huffman.decode(bits, lengths, count)
    length = symbols >> extra_bits
    if count and (length.min() < 1 or length.max() > _MAX_LENGTH):
        raise DeepReduceError("huffman: bad gap length symbol")
    width = np.maximum(length - 1 - extra_bits, 0)
    if end + int(width.sum()) > bits.size:
        raise DeepReduceError("huffman: raw bits truncated")
    low = bits_to_fields(bits, end + np.cumsum(width) - width, width)
    top = (symbols & ((1 << extra_bits) - 1)).astype(np.uint64)
    v = (np.uint64(1) << (length - 1).astype(np.uint64)) + (top << width.astype(np.uint64)) + low
    return v - np.uint64(1)


@register("index")
class HuffmanIndex(IndexCodec):
    codec_id = "huffman"
    wire_id = 8
    params = ("extra_bits",)

    def __init__(self, extra_bits=0):
        if extra_bits not in range(MAX_EXTRA_BITS + 1):
            raise DeepReduceError(f"extra_bits must be 0..{MAX_EXTRA_BITS}, not {extra_bits!r}")
        self.extra_bits = extra_bits

    def encode(self, indices, size, dense=None, seed=None):
        return GapPlan(to_gaps(indices), self.extra_bits).encode(), indices

    def decode(self, body, size, count):
        return from_gaps(decode_gaps(ByteReader(body, "huffman indices"), count), size)
