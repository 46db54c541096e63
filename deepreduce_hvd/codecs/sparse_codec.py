"""SparseCodec: encodes a sparse tensor into a self-describing payload; decode reads any payload.

The payload format is in wire/payload.py; which codecs encode a tensor is choice.py's business.
Curve fitting sorts values, so its payloads say how to undo the sort (arrangement.py).
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Any, Optional, Sequence, Tuple, Union

import numpy as np
from numpy.typing import ArrayLike, DTypeLike

from ..errors import DeepReduceError
from ..wire import payload
from ..wire.dtypes import dtype_code
from ..wire.payload import DEFAULT_MAX_ELEMENTS
from . import arrangement, choice

CodecSpec = Union[str, dict]  # a codec id, or a config dict {"id": ..., **params}
Shape = Tuple[int, ...]
Buffer = Union[bytes, bytearray, memoryview, np.ndarray]


class SparseCodec:
    """Encodes (values, indices, shape) into bytes with a chosen index and value codec.

    index / value: a codec id or config dict ({"id": ..., **params}); "auto" picks, per call,
    the smallest payload among lossless index codecs and error-bounded value codecs
    ({"id": "auto", "max_error": 0.05}). arrangement: "auto" (layout 1 or the cheaper layout
    2) or "permutation" (always layout 1), for value codecs that sort.

    >>> codec = SparseCodec(index="entropy", value="raw")
    >>> payload = codec.encode(values, indices, shape)
    >>> values2, indices2, shape2 = decode(payload)
    """

    def __init__(self, index: CodecSpec = "entropy", value: CodecSpec = "raw",
                 arrangement: str = "auto") -> None:
        self.selector = choice.build(index, value, arrangement)
        self.arrangement = arrangement

    @property
    def lossless(self) -> bool:
        """True when every selected element arrives exactly."""
        return self.selector.lossless

    @property
    def reads_dense(self) -> bool:
        """True when encoding may read values the sparsifier did not pick from `dense`."""
        return self.selector.reads_dense

    def get_config(self) -> dict:
        return {**self.selector.get_config(), "arrangement": self.arrangement}

    def random_state(self) -> Any:
        """The state of its codecs' random draws (qsgd's), a plain value; None if none."""
        return self.selector.random_state()

    def set_random_state(self, state: Any) -> None:
        self.selector.set_random_state(state)

    @classmethod
    def from_config(cls, config: dict) -> "SparseCodec":
        if not isinstance(config, dict):
            raise DeepReduceError(f"codec config must be a dict, not {type(config).__name__}")
        unknown = set(config) - {"index", "value", "arrangement"}
        if unknown:
            raise DeepReduceError(f"unknown codec config keys: {sorted(unknown)}")
        return cls(**config)

    def __repr__(self):
        config = self.selector.get_config()
        return f"SparseCodec(index={config['index']!r}, value={config['value']!r})"

    def encode(self, values: ArrayLike, indices: ArrayLike, shape: Sequence[int],
               dense: Optional[ArrayLike] = None, seed: Optional[int] = None) -> bytes:
        """Encode a sparse tensor -> payload bytes.

        values: float array, indices: integer positions in the flattened tensor (unique),
        shape: the dense shape. dense: the full tensor, needed by codecs that send values the
        sparsifier did not pick (Bloom, the dense fallback of "auto"). seed: the random-k seed
        for the "seeded" index codec.
        """
        return self.encode_full(values, indices, shape, dense, seed).payload

    def encode_full(self, values: ArrayLike, indices: ArrayLike, shape: Sequence[int],
                    dense: Optional[ArrayLike] = None,
                    seed: Optional[int] = None) -> choice.Encoded:
        """Like encode, -> choice.Encoded: the payload, the positions its values land on and
        those values exactly as decode() returns them (for error feedback)."""
        with failures_as("encoding failed"):
            return self.selector.encode(prepare(values, indices, shape, dense, seed))


@contextmanager
def failures_as(what):
    """Only DeepReduceError leaves the API: any other failure inside becomes one."""
    try:
        yield
    except DeepReduceError:
        raise
    except Exception as exc:  # noqa: BLE001 - only DeepReduceError leaves the API
        raise DeepReduceError(f"{what}: {type(exc).__name__}: {exc}") from exc


def prepare(values, indices, shape, dense, seed):
    """Validated choice.Sparse with indices sorted ascending and values in their order."""
    shape = payload.check_shape(shape)
    size = math.prod(shape)
    values = np.asarray(values).ravel()
    dtype_code(values.dtype)
    indices = np.asarray(indices)
    if indices.size and not np.issubdtype(indices.dtype, np.integer):
        raise DeepReduceError(f"indices must be integers, not {indices.dtype}")
    indices = indices.astype(np.int64, copy=False).ravel()
    if indices.size != values.size:
        raise DeepReduceError(f"{indices.size} indices for {values.size} values")
    if indices.size and (indices.min() < 0 or indices.max() >= size):
        raise DeepReduceError(f"indices out of range [0, {size})")
    if indices.size > 1 and not (np.diff(indices) > 0).all():
        order = np.argsort(indices, kind="stable")
        indices, values = indices[order], values[order]
        if np.any(indices[1:] == indices[:-1]):
            raise DeepReduceError("indices must be unique")
    if dense is not None:
        dense = np.asarray(dense).ravel()
        if dense.size != size:
            raise DeepReduceError(f"dense has {dense.size} elements, shape {shape} needs {size}")
    return choice.Sparse(values, indices, shape, size, dense, seed)


def decode(payload_bytes: Buffer, max_elements: int = DEFAULT_MAX_ELEMENTS,
           expect_shape: Optional[Sequence[int]] = None, expect_dtype: DTypeLike = None
           ) -> Tuple[np.ndarray, np.ndarray, Shape]:
    """Decode a payload -> (values, indices, shape), indices ascending; the payload names its
    own codecs.

    Raises DeepReduceError for truncated, corrupted, oversized (more than max_elements) or
    otherwise malformed bytes, and when expect_shape / expect_dtype are given and differ.
    """
    values, indices, shape = decode_unordered(payload_bytes, max_elements, expect_shape,
                                              expect_dtype)
    if not ascending(indices):
        order = np.argsort(indices, kind="stable")
        values, indices = values[order], indices[order]
        if not ascending(indices):
            raise DeepReduceError("decoded positions repeat")
    return values, indices, shape


def ascending(indices, chunk=1 << 20):
    """Whether the positions strictly increase; checked a chunk at a time, so the check of a
    tensor-sized result needs no tensor-sized temporary."""
    for lo in range(0, indices.size - 1, chunk):
        part = indices[lo:lo + chunk + 1]
        if not (part[1:] > part[:-1]).all():
            return False
    return True


def decode_unordered(payload_bytes: Buffer, max_elements: int = DEFAULT_MAX_ELEMENTS,
                     expect_shape: Optional[Sequence[int]] = None, expect_dtype: DTypeLike = None
                     ) -> Tuple[np.ndarray, np.ndarray, Shape]:
    """Like decode, with the positions in the payload's own order (each index codec
    guarantees they are unique); what a receiver that only sums needs.

    A declared count is held against the bytes of both sections before anything is decoded;
    then the values are decoded, then the positions.
    """
    with failures_as("payload could not be decoded"):
        p = payload.parse(payload_bytes, max_elements, expect_shape, expect_dtype)
        if p.count > p.index_codec.max_count(p.index_body, p.size):
            raise DeepReduceError(f"payload declares {p.count} values but its {len(p.index_body)} "
                                  f"index bytes ({p.index_codec.codec_id}) cannot hold them")
        values = arrangement.restore(p.layout, p.extra,
                                     p.value_codec.decode(p.value_body, p.count, p.dtype))
        indices = p.index_codec.decode(p.index_body, p.size, p.count, shape=p.shape)
    if indices.size != p.count:
        raise DeepReduceError(f"index codec {p.index_codec.codec_id!r} decoded {indices.size} "
                              f"positions, header says {p.count}")
    if p.count and (indices.min() < 0 or indices.max() >= p.size):
        raise DeepReduceError("decoded positions are out of range")
    return values, indices, p.shape


def describe(payload_bytes: Buffer) -> dict[str, Any]:
    """What a payload holds, without decoding it: codecs, shape, count and section sizes.
    Accepts what decode accepts; raises only DeepReduceError."""
    with failures_as("payload could not be described"):
        view = payload.byte_view(payload_bytes)
        p = payload.parse(view, max_elements=2**63)
        return {"index": p.index_codec.codec_id, "value": p.value_codec.codec_id,
                "dtype": p.dtype.name, "shape": p.shape, "count": p.count, "layout": p.layout,
                "index_bytes": len(p.index_body), "value_bytes": len(p.value_body),
                "total_bytes": len(view)}


def densify(values: np.ndarray, indices: np.ndarray, shape: Sequence[int],
            dtype: DTypeLike = None) -> np.ndarray:
    """Scatter a decoded sparse tensor into a dense array."""
    out = np.zeros(math.prod(shape), dtype=dtype or values.dtype)
    out[indices] = values
    return out.reshape(shape)
