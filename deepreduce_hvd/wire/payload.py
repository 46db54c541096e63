"""The self-describing payload: writing and parsing its header and sections.

Layout (version 2), integers as LEB128 varints unless noted:

    magic "\\xd7R" | version u8 | crc32 u32 of everything after it |
    dtype u8 | layout u8 | ndim | dims... | count |
    index wire id u8 | index body length | index body |
    [arrangement length | arrangement]            (layouts 1 and 2 only)
    value wire id u8 | value body (to the end)

`count` is the number of values sent; `layout` says how they are ordered (codecs/arrangement.py).
The checksum catches corruption; every declared size is checked against the bytes present
and against `max_elements` before anything is allocated.
"""
import math
import operator
import zlib

import numpy as np

from ..codecs import arrangement, registry
from ..errors import DeepReduceError
from .bytestream import ByteReader, ByteWriter
from .dtypes import dtype_code, dtype_from_code

MAGIC = b"\xd7R"
VERSION = 2
DEFAULT_MAX_ELEMENTS = 1 << 26
MAX_NDIM = 32
HEADER = 7  # magic, version, crc32


def write(dtype, layout, shape, count, index_codec, index_body, extra, value_codec, value_body):
    """The payload bytes for these sections."""
    body = ByteWriter().u8(dtype_code(dtype)).u8(layout).varint(len(shape))
    for dim in shape:
        body.varint(dim)
    body.varint(count).u8(index_codec.wire_id).section(index_body)
    if layout:
        body.section(extra)
    body = body.u8(value_codec.wire_id).raw(value_body).getvalue()
    return MAGIC + bytes([VERSION]) + zlib.crc32(body).to_bytes(4, "little") + body


class Parsed:
    """A payload's header fields and its undecoded sections."""
    __slots__ = ("dtype", "layout", "shape", "size", "count", "index_codec", "index_body",
                 "extra", "value_codec", "value_body")


def byte_view(data):
    """A flat byte view (copied if not contiguous) of what a payload may be: bytes (numpy
    bytes scalars included), bytearray, memoryview, or a numpy array of uint8 (any shape)
    or of bytes; anything else is a DeepReduceError, so every reader accepts the same."""
    if isinstance(data, np.ndarray) and data.dtype != np.uint8 and data.dtype.kind != "S" or \
            not isinstance(data, (bytes, bytearray, memoryview, np.ndarray)):
        kind = getattr(data, "dtype", type(data).__name__)
        raise DeepReduceError(f"payload must be bytes, bytearray, memoryview or a uint8 array, "
                              f"not {kind}")
    view = memoryview(data)
    if not view.c_contiguous:
        view = memoryview(view.tobytes())
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


def check_shape(shape):
    """A shape as a tuple of non-negative Python ints (rejects floats, bools and strings)."""
    try:
        shape = tuple(operator.index(d) for d in shape)
    except TypeError:
        raise DeepReduceError(f"shape must be a sequence of integers, not {shape!r}") from None
    if len(shape) > MAX_NDIM or any(d < 0 for d in shape):
        raise DeepReduceError(f"invalid shape {shape}")
    return shape


def check_limit(max_elements):
    try:
        limit = operator.index(max_elements)
    except TypeError:
        raise DeepReduceError(f"max_elements must be an integer, not {max_elements!r}") from None
    if limit < 0:
        raise DeepReduceError(f"max_elements must be non-negative, not {limit}")
    return limit


def declared_count(payload):
    """The element count a payload's header declares, unchecked (0 where it cannot be read):
    for scheduling only; parse() checks every field, the checksum first."""
    try:
        reader = ByteReader(byte_view(payload)[HEADER + 2:])  # past dtype and layout
        for _ in range(reader.varint(limit=MAX_NDIM)):
            reader.varint()
        return reader.varint()
    except DeepReduceError:
        return 0


def parse(payload, max_elements=DEFAULT_MAX_ELEMENTS, expect_shape=None, expect_dtype=None):
    """Header fields and sections of a payload; DeepReduceError for anything malformed."""
    max_elements = check_limit(max_elements)
    expect_shape = None if expect_shape is None else check_shape(expect_shape)
    head = ByteReader(byte_view(payload))
    if head.remaining < HEADER or bytes(head.raw(2)) != MAGIC:
        raise DeepReduceError("not a DeepReduce payload (bad magic)")
    version = head.u8()
    if version != VERSION:
        raise DeepReduceError(f"unsupported payload version {version} (this build reads {VERSION})")
    crc = head.u32()
    body = head.rest()
    if zlib.crc32(body) != crc:
        raise DeepReduceError("payload checksum mismatch: corrupted bytes")
    reader, out = ByteReader(body), Parsed()
    out.dtype = dtype_from_code(reader.u8())
    if expect_dtype is not None:
        if out.dtype != expect_dtype:  # (not by .name: numpy builds that in Python)
            expected = expect_dtype if isinstance(expect_dtype, str) else np.dtype(expect_dtype).name
            raise DeepReduceError(f"payload holds {out.dtype.name} values, expected {expected}")
    out.layout = reader.u8()
    if out.layout not in arrangement.LAYOUTS:
        raise DeepReduceError(f"unknown value layout {out.layout}")
    ndim = reader.varint(limit=MAX_NDIM)
    out.shape = tuple(reader.varint(limit=max_elements) for _ in range(ndim))
    out.size = math.prod(out.shape)
    if out.size > max_elements:
        raise DeepReduceError(f"payload declares {out.size} elements, more than the limit "
                              f"{max_elements}")
    if expect_shape is not None and expect_shape != out.shape:
        raise DeepReduceError(f"payload shape {out.shape} differs from the expected {expect_shape}")
    out.count = reader.varint(limit=out.size)
    out.index_codec = registry.codec_for_wire("index", reader.u8())()
    out.index_body = reader.section()
    out.extra = reader.section() if out.layout else None
    out.value_codec = registry.codec_for_wire("value", reader.u8())()
    out.value_body = reader.rest()
    min_bits = out.value_codec.min_bits(out.dtype)
    if min_bits and out.count > 8 * len(out.value_body) // min_bits:
        raise DeepReduceError(f"payload declares {out.count} values but its {len(out.value_body)} "
                              f"value bytes hold at most {8 * len(out.value_body) // min_bits}")
    return out
