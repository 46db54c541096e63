"""zlib with bounded decompression (no zip bombs, no trailing bytes).

`inflate` returns exactly `expected` bytes or raises DeepReduceError; it never inflates past
that and refuses bytes after the end of the stream.
"""
import zlib

from .errors import DeepReduceError


def deflate(data, level=9):
    return zlib.compress(bytes(data), level)


def inflate(data, expected):
    stream = zlib.decompressobj()
    try:
        out = stream.decompress(bytes(data), expected)
    except zlib.error as exc:
        raise DeepReduceError(f"deflate stream corrupted: {exc}") from None
    if len(out) != expected or stream.unconsumed_tail or not stream.eof or stream.unused_data:
        raise DeepReduceError(f"deflate stream holds other than the {expected} bytes declared")
    return out
