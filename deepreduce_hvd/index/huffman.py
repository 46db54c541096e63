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


def gap_symbols(gaps, extra_bits):
    """gap -> (symbol, raw low bits, their width). v = gap + 1 = 1 top... low."""
    v = gaps + np.uint64(1)
    length = bit_length(v)
    width = np.maximum(length - 1 - extra_bits, 0)
    top = (v - (np.uint64(1) << (length - 1).astype(np.uint64))) >> width.astype(np.uint64)
    symbols = (length << extra_bits) + top.astype(np.int64)
    low = v & ((np.uint64(1) << width.astype(np.uint64)) - np.uint64(1))
    return symbols, low, width


def encode_gaps(gaps, extra_bits):
    """Body for the gaps: extra_bits u8, Huffman table, then one bit stream (codes, raw bits)."""
    symbols, low, width = gap_symbols(gaps, extra_bits)
    lengths = huffman.code_lengths(np.bincount(symbols, minlength=1))
    out = ByteWriter().u8(extra_bits)
    huffman.write_table(out, lengths)
    bits = np.concatenate((huffman.encode(symbols, lengths), fields_to_bits(low, width)))
    return out.raw(pack_bits(bits)).getvalue()


def decode_gaps(reader, count):
    """Inverse of encode_gaps on the rest of reader."""
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
        return encode_gaps(to_gaps(indices), self.extra_bits), indices

    def decode(self, body, size, count):
        return from_gaps(decode_gaps(ByteReader(body, "huffman indices"), count), size)
