"""Vectorised bit packing: fixed- and variable-width fields, MSB first, and LEB128 varints.

Every codec writes through these helpers so that packing has one definition, and a reader
checks sizes against the bytes it holds before it allocates anything.
"""
import numpy as np

from .errors import DeepReduceError


def pack_bits(bits):
    """0/1 uint8 array -> bytes (first bit in the lowest bit of the first byte)."""
    return np.packbits(np.asarray(bits, dtype=np.uint8), bitorder="little").tobytes()


def unpack_bits(buf, nbits):
    """bytes -> 0/1 uint8 array of exactly nbits; raises if buf holds fewer bits."""
    buf = np.frombuffer(buf, dtype=np.uint8)
    if nbits > 8 * buf.size:
        raise DeepReduceError(f"payload truncated: need {nbits} bits, have {8 * buf.size}")
    return np.unpackbits(buf, count=nbits, bitorder="little")


def fields_to_bits(values, widths):
    """Write each value in its own width (MSB first) -> 0/1 uint8 array of sum(widths) bits."""
    values = np.asarray(values, dtype=np.uint64)
    widths = np.asarray(widths, dtype=np.int64)
    total = int(widths.sum())
    out = np.zeros(total, dtype=np.uint8)
    if total == 0:
        return out
    starts = np.cumsum(widths) - widths
    for j in range(int(widths.max())):
        sel = widths > j
        shift = (widths[sel] - 1 - j).astype(np.uint64)
        out[starts[sel] + j] = ((values[sel] >> shift) & np.uint64(1)).astype(np.uint8)
    return out


def bits_to_fields(bits, starts, widths):
    """Read fields of the given widths at the given bit offsets (MSB first) -> uint64 array."""
    widths = np.asarray(widths, dtype=np.int64)
    starts = np.asarray(starts, dtype=np.int64)
    out = np.zeros(widths.size, dtype=np.uint64)
    if widths.size == 0:
        return out
    for j in range(int(widths.max())):
        sel = widths > j
        out[sel] = (out[sel] << np.uint64(1)) | bits[starts[sel] + j].astype(np.uint64)
    return out


def _narrow(width):
    return next(t for t in (np.uint8, np.uint16, np.uint32, np.uint64)
                if width <= 8 * np.dtype(t).itemsize)


def fixed_to_bits(values, width):
    """Fixed-width fields, MSB first (one pass per bit, in the narrowest integer type)."""
    if width == 0 or np.size(values) == 0:
        return np.zeros(0, dtype=np.uint8)
    kind = _narrow(width)
    values = np.asarray(values).astype(kind, copy=False)
    out = np.empty(values.size * width, dtype=np.uint8)
    for j in range(width):
        out[j::width] = (values >> kind(width - 1 - j)) & kind(1)
    return out


def bits_to_fixed(bits, count, width):
    """Inverse of fixed_to_bits on the first count*width bits -> uint64 array."""
    if width == 0 or count == 0:
        return np.zeros(count, dtype=np.uint64)
    kind = _narrow(width)
    grid = bits[: count * width].reshape(count, width)
    out = np.zeros(count, dtype=kind)
    for j in range(width):
        out = (out << kind(1)) | grid[:, j]
    return out.astype(np.uint64)


def bit_length(values):
    """Number of bits needed for each non-negative integer (0 -> 0)."""
    values = np.asarray(values, dtype=np.uint64)
    out = np.zeros(values.shape, dtype=np.int64)
    v = values.copy()
    for shift in (32, 16, 8, 4, 2, 1):
        big = v >= (np.uint64(1) << np.uint64(shift))
        out[big] += shift
        v[big] >>= np.uint64(shift)
    out[v > 0] += 1
    return out


def varint_bytes(values):
    """LEB128 encoding of an array of non-negative integers -> bytes."""
    values = np.asarray(values, dtype=np.uint64)
    if values.size == 0:
        return b""
    nbytes = np.maximum(1, (bit_length(values) + 6) // 7)
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
