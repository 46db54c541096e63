"""Byte-level framing shared by the payload header and codec bodies.

`ByteWriter` appends scalars, varints and length-prefixed sections; `ByteReader` reads them
back and turns every short read or absurd value into a `DeepReduceError`.
"""
import struct

from ..errors import DeepReduceError

_MAX_VARINT_BYTES = 10


class ByteWriter:
    def __init__(self):
        self._parts = []

    def u8(self, value):
        self._parts.append(struct.pack("<B", value))
        return self

    def varint(self, value):
        value = int(value)
        if value < 0:
            raise DeepReduceError(f"cannot write negative varint {value}")
        out = bytearray()
        while True:
            byte = value & 0x7F
            value >>= 7
            if value:
                out.append(byte | 0x80)
            else:
                out.append(byte)
                break
        self._parts.append(bytes(out))
        return self

    def raw(self, data):
        self._parts.append(bytes(data))
        return self

    def section(self, data):
        """Length-prefixed bytes."""
        return self.varint(len(data)).raw(data)

    def getvalue(self):
        return b"".join(self._parts)


class ByteReader:
    def __init__(self, data, what="payload"):
        self._view = memoryview(data)
        self._pos = 0
        self.what = what

    @property
    def remaining(self):
        return len(self._view) - self._pos

    def _truncated(self, n):
        return DeepReduceError(f"{self.what} truncated: need {n} bytes at offset {self._pos}, "
                               f"{self.remaining} left")

    def _take(self, n):
        if n < 0 or n > self.remaining:
            raise self._truncated(n)
        out = self._view[self._pos:self._pos + n]
        self._pos += n
        return out

    def u8(self):
        pos = self._pos
        if pos >= len(self._view):
            raise self._truncated(1)
        self._pos = pos + 1
        return self._view[pos]

    def u32(self):
        return struct.unpack("<I", self._take(4))[0]

    def varint(self, limit=None):
        view, pos, end = self._view, self._pos, len(self._view)
        value = shift = 0
        for _ in range(_MAX_VARINT_BYTES):
            if pos >= end:
                self._pos = pos
                raise self._truncated(1)
            byte = view[pos]
            pos += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                break
        else:
            self._pos = pos
            raise DeepReduceError(f"{self.what}: varint too long at offset {self._pos}")
        self._pos = pos
        if limit is not None and value > limit:
            raise DeepReduceError(f"{self.what}: value {value} exceeds limit {limit}")
        return value

    def raw(self, n):
        return self._take(n)

    def section(self):
        return self._take(self.varint(limit=self.remaining))

    def rest(self):
        return self._take(self.remaining)

    def expect_end(self):
        if self.remaining:
            raise DeepReduceError(f"{self.what}: {self.remaining} unexpected trailing bytes")
