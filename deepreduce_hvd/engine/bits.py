"""Bit streams: fields packed most significant bit first, stream bit t in byte t >> 3 at bit
(t & 7); LEB128 varints.

Every codec writes and reads through these helpers, so packing has one definition. Each has a
native kernel (csrc/bits.cpp) and a numpy twin giving identical bytes; readers check the
declared sizes against the bytes present before they allocate anything.
"""
import numpy as np

from ..errors import DeepReduceError
from . import native


def pack_bits(bits):
    """0/1 uint8 array -> bytes (first bit in the lowest bit of the first byte)."""
    return np.packbits(np.asarray(bits, dtype=np.uint8), bitorder="little").tobytes()


def unpack_bits(buf, nbits):
    """bytes -> 0/1 uint8 array of exactly nbits; raises if buf holds fewer bits."""
    buf = np.frombuffer(buf, dtype=np.uint8)
    if nbits > 8 * buf.size:
        raise DeepReduceError(f"payload truncated: need {nbits} bits, have {8 * buf.size}")
    return np.unpackbits(buf, count=nbits, bitorder="little")


def _fields_to_bits(values, widths):
    """numpy twin of pack_fields -> 0/1 array (bits above a field's low 64 are zeros)."""
    total = int(widths.sum())
    out = np.zeros(total, dtype=np.uint8)
    if total == 0:
        return out
    low = np.minimum(widths, 64)
    starts = np.cumsum(widths) - low  # where each field's low bits begin
    for j in range(int(low.max())):
        sel = low > j
        shift = (low[sel] - 1 - j).astype(np.uint64)
        out[starts[sel] + j] = ((values[sel] >> shift) & np.uint64(1)).astype(np.uint8)
    return out


def pack_fields(values, widths):
    """Each value in its own width (MSB first; a width above 64 adds leading zeros), one
    after another -> bytes."""
    values = np.ascontiguousarray(values, dtype=np.uint64)
    widths = np.ascontiguousarray(widths, dtype=np.int64)
    if native.engine is not None:
        return bytes(native.engine.pack_fields(values, widths))
    return pack_bits(_fields_to_bits(values, widths))


def pack_fixed(values, width):
    """Fields of one width (0..64 bits) -> bytes."""
    values = np.ascontiguousarray(values, dtype=np.uint64)
    if native.engine is not None:
        return bytes(native.engine.pack_fixed(values, width))
    if width == 0 or values.size == 0:
        return b""
    kind = _narrow(width)
    narrow = values.astype(kind)
    bits = np.empty(values.size * width, dtype=np.uint8)
    for j in range(width):
        bits[j::width] = (narrow >> kind(width - 1 - j)) & kind(1)
    return pack_bits(bits)


def check_room(data, start, count, bits_each, what):
    """Raise unless data holds count fields of bits_each bits after bit `start`."""
    total = 8 * len(data)
    if start > total or (bits_each and count > (total - start) // bits_each):
        raise DeepReduceError(f"{what}: stream holds fewer bits than declared")


def _narrow(width):
    return next(t for t in (np.uint8, np.uint16, np.uint32, np.uint64)
                if width <= 8 * np.dtype(t).itemsize)


def read_fixed(data, start, count, width):
    """count fields of `width` (0..64) bits from bit `start` -> uint64 array."""
    if not 0 <= width <= 64:
        raise DeepReduceError(f"field width {width} out of range")
    check_room(data, start, count, width, "fixed-width fields")
    if native.engine is not None:
        return np.frombuffer(native.engine.read_fixed(data, start, count, width), np.uint64)
    if width == 0 or count == 0:
        return np.zeros(count, dtype=np.uint64)
    kind = _narrow(width)
    grid = unpack_bits(data, start + count * width)[start:].reshape(count, width)
    out = np.zeros(count, dtype=kind)
    for j in range(width):
        out = (out << kind(1)) | grid[:, j]
    return out.astype(np.uint64)


def read_fields(data, start, widths):
    """Fields of the given widths (each 0..64) one after another from bit `start` -> uint64."""
    widths = np.ascontiguousarray(widths, dtype=np.int64)
    if widths.size and (widths.min() < 0 or widths.max() > 64):
        raise DeepReduceError("field width out of range")
    total = int(widths.sum())
    check_room(data, start, total, 1, "variable-width fields")
    if native.engine is not None:
        return np.frombuffer(native.engine.read_fields(data, start, widths), np.uint64)
    out = np.zeros(widths.size, dtype=np.uint64)
    if total == 0:
        return out
    bits = unpack_bits(data, start + total)
    starts = start + np.cumsum(widths) - widths
    for j in range(int(widths.max())):
        sel = widths > j
        out[sel] = (out[sel] << np.uint64(1)) | bits[starts[sel] + j].astype(np.uint64)
    return out


def expect_stream_end(data, end_bit, what):
    """A bit stream must end in its last byte: no trailing bytes after `end_bit`."""
    if (end_bit + 7) // 8 != len(data):
        raise DeepReduceError(f"{what}: {len(data) - (end_bit + 7) // 8} bytes after the stream")


def bit_length(values):
    """Number of bits needed for each non-negative integer (0 -> 0)."""
    values = np.asarray(values, dtype=np.uint64)
    if values.size == 0 or int(values.max()) < 1 << 52:  # exact in float64: read the exponent
        return np.frexp(values.astype(np.float64))[1].astype(np.int64)
    out = np.zeros(values.shape, dtype=np.int64)
    v = values.copy()
    for shift in (32, 16, 8, 4, 2, 1):
        big = v >= (np.uint64(1) << np.uint64(shift))
        out[big] += shift
        v[big] >>= np.uint64(shift)
    out[v > 0] += 1
    return out


def varint_sizes(values):
    """Bytes of the LEB128 encoding of each non-negative integer."""
    return np.maximum(1, (bit_length(np.asarray(values, dtype=np.uint64)) + 6) // 7)


def varint_bytes(values):
    """LEB128 encoding of an array of non-negative integers -> bytes."""
    values = np.asarray(values, dtype=np.uint64)
    if values.size == 0:
        return b""
    nbytes = varint_sizes(values)
    total = int(nbytes.sum())
    out = np.zeros(total, dtype=np.uint8)
    starts = np.cumsum(nbytes) - nbytes
    for j in range(int(nbytes.max())):
        sel = nbytes > j
        chunk = (values[sel] >> np.uint64(7 * j)) & np.uint64(0x7F)
        more = (nbytes[sel] - 1 > j).astype(np.uint8) << 7
        out[starts[sel] + j] = chunk.astype(np.uint8) | more
    return out.tobytes()


def varint_array(buf, count):
    """Decode exactly count LEB128 integers that fill buf; raises on any mismatch."""
    data = np.frombuffer(buf, dtype=np.uint8)
    ends = np.flatnonzero(data < 0x80)
    if ends.size != count or (count and ends[-1] != data.size - 1) or (not count and data.size):
        raise DeepReduceError(f"varint stream holds {ends.size} values, header says {count}")
    if count == 0:
        return np.zeros(0, dtype=np.uint64)
    starts = np.concatenate(([0], ends[:-1] + 1))
    lengths = ends - starts + 1
    if lengths.max() > 9:
        raise DeepReduceError("varint longer than 63 bits")
    pos = np.arange(data.size) - np.repeat(starts, lengths)
    parts = (data & 0x7F).astype(np.uint64) << (7 * pos).astype(np.uint64)
    return np.add.reduceat(parts, starts).astype(np.uint64)
