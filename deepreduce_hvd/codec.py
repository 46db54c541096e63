"""SparseCodec: one index codec plus one value codec, and the self-describing payload.

Payload layout (version 1), integers as LEB128 varints unless noted:

    magic "\\xd7R" | version u8 | crc32 u32 of everything after it |
    dtype u8 | layout u8 | ndim | dims... | count |
    index wire id u8 | index body length | index body |
    [arrangement length | arrangement]            (layouts 1 and 2 only)
    value wire id u8 | value body (to the end)

`count` is the number of values sent. Layout 0: values follow the positions' order. Curve
fitting sorts values, so its payloads say how to undo the sort: layout 1 sends the paper's
permutation at ceil(log2 count) bits per value; layout 2 sends each value's rank in the sorted
order rounded to fewer bits, when that adds less than 10% to the fitting error (see
`arrangement.py`). The checksum catches corruption; every declared size is checked against the
bytes present and against `max_elements` before anything is allocated.
"""
import math
import zlib

import numpy as np

from . import arrangement, registry
from .dtypes import dtype_code, dtype_from_code
from .errors import DeepReduceError
from .index.dense import DenseIndex
from .value.fp16 import Fp16Value
from .value.raw import RawValue
from .wire import ByteReader, ByteWriter

MAGIC = b"\xd7R"
VERSION = 1
DEFAULT_MAX_ELEMENTS = 1 << 31
MAX_NDIM = 32


class SparseCodec:
    """Encodes (values, indices, shape) into bytes with a chosen index and value codec.

    index / value: a codec id or config dict ({"id": ..., **params}); "auto" picks, per call,
    the smallest payload among lossless index codecs and error-bounded value codecs.
    arrangement: "auto" (layout 1 or the cheaper layout 2) or "permutation" (always layout 1),
    for value codecs that sort.

    >>> codec = SparseCodec(index="entropy", value="raw")
    >>> payload = codec.encode(values, indices, shape)
    >>> values2, indices2, shape2 = decode(payload)
    """

    def __init__(self, index="entropy", value="raw", arrangement="auto"):
        self.index = registry.from_config("index", index)
        self.value = registry.from_config("value", value)
        if arrangement not in ("auto", "permutation"):
            raise DeepReduceError(f"arrangement must be 'auto' or 'permutation', not {arrangement!r}")
        self.arrangement = arrangement

    @property
    def lossless(self):
        """True when every selected element arrives exactly."""
        return self.index.lossless and self.value.lossless

    def get_config(self):
        return {"index": self.index.get_config(), "value": self.value.get_config(),
                "arrangement": self.arrangement}

    @classmethod
    def from_config(cls, config):
        if not isinstance(config, dict):
            raise DeepReduceError(f"codec config must be a dict, not {type(config).__name__}")
        unknown = set(config) - {"index", "value", "arrangement"}
        if unknown:
            raise DeepReduceError(f"unknown codec config keys: {sorted(unknown)}")
        return cls(**config)

    def __repr__(self):
        return f"SparseCodec(index={self.index!r}, value={self.value!r})"

    def encode(self, values, indices, shape, dense=None, seed=None, delivered=False):
        """Encode a sparse tensor -> bytes (or (bytes, (values, indices)) with delivered=True).

        values: float array, indices: integer positions in the flattened tensor (unique),
        shape: the dense shape. dense: the full tensor, needed by codecs that send values the
        sparsifier did not pick (Bloom, the dense fallback of "auto"). seed: the random-k seed
        for the "seeded" index codec. delivered: also return what decode() of this payload
        gives (values decoded by the value codec exactly as a receiver does, at the positions
        the index codec chose), without decoding the index part again.
        """
        shape = _check_shape(shape)
        size = math.prod(shape)
        values = np.asarray(values).ravel()
        code = dtype_code(values.dtype)
        indices = _check_indices(indices, values.size, size)
        order = np.argsort(indices, kind="stable")
        indices, values = indices[order], values[order]
        if np.any(indices[1:] == indices[:-1]):
            raise DeepReduceError("indices must be unique")
        if dense is not None:
            dense = np.asarray(dense).ravel()
            if dense.size != size:
                raise DeepReduceError(f"dense has {dense.size} elements, shape {shape} needs {size}")
        prefix = (code, shape)
        best = None
        for index_codec in _candidates(self.index, dense, indices.size):
            index_body, positions = index_codec.encode(indices, size, dense=dense, seed=seed)
            sent = values if positions is indices else _values_at(positions, indices, values,
                                                                  dense, index_codec)
            for value_codec in _candidates(self.value, dense, positions.size):
                best = self._smaller(best, prefix, index_codec, index_body, positions,
                                     value_codec, sent)
        if self.index.codec_id == "auto" and dense is not None:
            # the dense fallback, tried only when even fp16 could beat the sparse payload
            fallback = [RawValue()] if self.value.lossless else [Fp16Value(), RawValue()]
            if best is None or 2 * size < len(best[0]):
                everything = np.arange(size, dtype=np.int64)
                for value_codec in fallback:
                    best = self._smaller(best, prefix, DenseIndex(), b"", everything,
                                         value_codec, dense.astype(values.dtype))
        if best is None:
            raise DeepReduceError("no candidate codec could encode these values")
        body, positions = best
        payload = MAGIC + bytes([VERSION]) + zlib.crc32(body).to_bytes(4, "little") + body
        if not delivered:
            return payload
        p = _parse(payload, max(size, 1), None)
        values = p.value_codec.decode(p.value_body, p.count, p.dtype)
        return payload, (arrangement.restore(p.layout, p.extra, values), positions)

    def _smaller(self, best, prefix, index_codec, index_body, positions, value_codec, values):
        """The smaller of best and this combination's (payload body, positions); best is
        kept when this combination cannot encode the values."""
        code, shape = prefix
        try:
            value_body, sort_order = value_codec.encode(values)
            layout, extra = arrangement.choose(values, sort_order, value_codec, value_body,
                                               self.arrangement)
            if self.value.codec_id == "auto" and not self.value.accepts(
                    values, value_codec, value_body, layout, extra):
                return best
        except DeepReduceError:
            if value_codec is self.value:
                raise
            return best  # an "auto" candidate that cannot take these values
        body = ByteWriter().u8(code).u8(layout).varint(len(shape))
        for dim in shape:
            body.varint(dim)
        body.varint(positions.size).u8(index_codec.wire_id).section(index_body)
        if layout:
            body.section(extra)
        body = body.u8(value_codec.wire_id).raw(value_body).getvalue()
        return (body, positions) if best is None or len(body) < len(best[0]) else best


class _Parsed:
    """A payload's header fields and its undecoded sections."""
    __slots__ = ("dtype", "layout", "shape", "size", "count", "index_codec", "index_body",
                 "extra", "value_codec", "value_body")


def _parse(payload, max_elements, expect_shape):
    try:
        head = ByteReader(payload)
    except TypeError:
        raise DeepReduceError(f"payload must be bytes-like, not {type(payload).__name__}") from None
    if head.remaining < 7 or bytes(head.raw(2)) != MAGIC:
        raise DeepReduceError("not a DeepReduce payload (bad magic)")
    version = head.u8()
    if version != VERSION:
        raise DeepReduceError(f"unsupported payload version {version} (this build reads {VERSION})")
    crc = head.u32()
    body = head.rest()
    if zlib.crc32(body) != crc:
        raise DeepReduceError("payload checksum mismatch: corrupted bytes")
    reader, out = ByteReader(body), _Parsed()
    out.dtype = dtype_from_code(reader.u8())
    out.layout = reader.u8()
    if out.layout not in arrangement.LAYOUTS:
        raise DeepReduceError(f"unknown value layout {out.layout}")
    ndim = reader.varint(limit=MAX_NDIM)
    out.shape = tuple(reader.varint(limit=max_elements) for _ in range(ndim))
    out.size = math.prod(out.shape)
    if out.size > max_elements:
        raise DeepReduceError(f"payload declares {out.size} elements, more than the limit "
                              f"{max_elements}")
    if expect_shape is not None and tuple(expect_shape) != out.shape:
        raise DeepReduceError(f"payload shape {out.shape} differs from the expected "
                              f"{tuple(expect_shape)}")
    out.count = reader.varint(limit=out.size)
    out.index_codec = registry.codec_for_wire("index", reader.u8())()
    out.index_body = reader.section()
    out.extra = reader.section() if out.layout else None
    out.value_codec = registry.codec_for_wire("value", reader.u8())()
    out.value_body = reader.rest()
    return out


def decode(payload, max_elements=DEFAULT_MAX_ELEMENTS, expect_shape=None):
    """Decode a payload -> (values, indices, shape); the payload names its own codecs.

    Raises DeepReduceError for truncated, corrupted, oversized (more than max_elements) or
    otherwise malformed bytes, and when expect_shape is given and differs.
    """
    p = _parse(payload, max_elements, expect_shape)
    indices = p.index_codec.decode(p.index_body, p.size, p.count)
    if indices.size != p.count:
        raise DeepReduceError(f"index codec {p.index_codec.codec_id!r} decoded {indices.size} "
                              f"positions, header says {p.count}")
    if p.count and (indices[0] < 0 or indices[-1] >= p.size or (np.diff(indices) <= 0).any()):
        raise DeepReduceError("decoded positions are out of range or not strictly increasing")
    values = p.value_codec.decode(p.value_body, p.count, p.dtype)
    return arrangement.restore(p.layout, p.extra, values), indices, p.shape


def describe(payload, max_elements=DEFAULT_MAX_ELEMENTS):
    """What a payload holds, without decoding it: codecs chosen, counts and section sizes."""
    p = _parse(payload, max_elements, None)
    return {"shape": p.shape, "dtype": p.dtype.name, "count": p.count,
            "index": p.index_codec.codec_id, "value": p.value_codec.codec_id,
            "layout": p.layout, "index_bytes": len(p.index_body),
            "arrangement_bytes": len(p.extra) if p.extra is not None else 0,
            "value_bytes": len(p.value_body), "total_bytes": len(payload)}


def densify(values, indices, shape, dtype=None):
    """Scatter a decoded sparse tensor into a dense array."""
    out = np.zeros(math.prod(shape), dtype=dtype or values.dtype)
    out[indices] = values
    return out.reshape(shape)


def _candidates(codec, dense, count):
    return codec.candidates(dense is not None, count) if codec.codec_id == "auto" else [codec]


def _check_shape(shape):
    try:
        shape = tuple(int(d) for d in shape)
    except TypeError:
        raise DeepReduceError(f"shape must be a sequence of ints, not {shape!r}") from None
    if len(shape) > MAX_NDIM or any(d < 0 for d in shape):
        raise DeepReduceError(f"invalid shape {shape}")
    return shape


def _check_indices(indices, count, size):
    indices = np.asarray(indices)
    if indices.size and not np.issubdtype(indices.dtype, np.integer):
        raise DeepReduceError(f"indices must be integers, not {indices.dtype}")
    indices = indices.astype(np.int64, copy=False).ravel()
    if indices.size != count:
        raise DeepReduceError(f"{indices.size} indices for {count} values")
    if indices.size and (indices.min() < 0 or indices.max() >= size):
        raise DeepReduceError(f"indices out of range [0, {size})")
    return indices


def _values_at(positions, indices, values, dense, codec):
    """Values for the positions a codec chose: the given values where selected, dense elsewhere."""
    loc = np.minimum(np.searchsorted(indices, positions), max(indices.size - 1, 0))
    hit = indices[loc] == positions if indices.size else np.zeros(positions.size, bool)
    if not hit.all():
        if dense is None:
            raise DeepReduceError(
                f"index codec {codec!r} sends values at positions the sparsifier did not pick: "
                "pass the dense tensor as dense=")
        out = dense[positions].astype(values.dtype)
    else:
        out = np.empty(positions.size, dtype=values.dtype)
    out[hit] = values[loc[hit]]
    return out
