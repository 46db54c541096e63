"""zlib with bounded decompression (no zip bombs, no trailing bytes).

`inflate` returns exactly `expected` bytes or raises DeepReduceError: it refuses, before any
work, more than deflate can reach from the bytes present (MAX_RATIO), never inflates past
`expected`, and refuses bytes after the end of the stream.
"""
import zlib

from ..errors import DeepReduceError


def deflate(data, level=9):
    return zlib.compress(bytes(data), level)


MAX_RATIO = 1032  # deflate's largest expansion: 258 bytes from a 2-bit code


def inflate(data, expected):
    if expected > MAX_RATIO * len(data) + 64:
        raise DeepReduceError(f"deflate stream of {len(data)} bytes cannot hold {expected}")
    stream = zlib.decompressobj()
    try:
        out = stream.decompress(bytes(data), expected)
    except zlib.error as exc:
        raise DeepReduceError(f"deflate stream corrupted: {exc}") from None
    if len(out) != expected or stream.unconsumed_tail or not stream.eof or stream.unused_data:
        raise DeepReduceError(f"deflate stream holds other than the {expected} bytes declared")
    return out
