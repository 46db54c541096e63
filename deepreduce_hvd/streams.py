"""General-purpose byte compressors with bounded decompression (no zip bombs).

Each `unpack_*` returns exactly `expected` bytes or raises DeepReduceError; it never inflates
past that.
"""
import lzma
import zlib

from .errors import DeepReduceError

_LZMA_FILTERS = [{"id": lzma.FILTER_LZMA2, "preset": 6, "dict_size": 1 << 22}]


def deflate(data, level=9):
    return zlib.compress(bytes(data), level)


def inflate(data, expected):
    stream = zlib.decompressobj()
    try:
        out = stream.decompress(bytes(data), expected)
    except zlib.error as exc:
        raise DeepReduceError(f"deflate stream corrupted: {exc}") from None
    if len(out) != expected or stream.unconsumed_tail or not stream.eof:
        raise DeepReduceError(f"deflate stream holds other than the {expected} bytes declared")
    return out


def lzma_pack(data):
    return lzma.compress(bytes(data), format=lzma.FORMAT_RAW, filters=_LZMA_FILTERS)


def lzma_unpack(data, expected):
    stream = lzma.LZMADecompressor(format=lzma.FORMAT_RAW, filters=_LZMA_FILTERS)
    try:
        out = stream.decompress(bytes(data), max_length=expected)
    except lzma.LZMAError as exc:
        raise DeepReduceError(f"lzma stream corrupted: {exc}") from None
    if len(out) != expected or not stream.eof and not stream.needs_input:
        raise DeepReduceError(f"lzma stream holds other than the {expected} bytes declared")
    return out
