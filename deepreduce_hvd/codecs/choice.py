"""Which codecs encode a sparse tensor: a fixed pair, or the smallest payload among candidates.

A selector turns (values, indices, shape) into an `Encoded` payload. Every candidate yields its
body, the positions it covers and the values a receiver will reconstruct there, so the
encoder never decodes its own output. `SparseCodec` holds one selector; "auto" in its config
picks `SmallestPayload`, anything else `FixedPair`.
"""
from typing import NamedTuple, Optional

import numpy as np

from ..engine.norms import l2_norm
from ..errors import DeepReduceError
from ..wire import payload
from . import arrangement, registry
from .base import IndexEncoding

ARRANGEMENTS = ("auto", "permutation")
LARGE = 1 << 20  # fitting codecs (sorting, rank search) are candidates only below this count


class Encoded(NamedTuple):
    """A payload, the positions its values land on (in the payload's order), and those values
    exactly as a receiver reconstructs them."""
    payload: bytes
    positions: np.ndarray
    values: np.ndarray


class Sparse(NamedTuple):
    """A sparse tensor ready to encode: values at ascending unique positions of `shape`."""
    values: np.ndarray
    indices: np.ndarray
    shape: tuple
    size: int
    dense: Optional[np.ndarray]
    seed: Optional[int]


def encode_index(index_codec, sparse):
    """-> (index body, positions, the values to send at those positions, in that order)."""
    encoding = IndexEncoding(*index_codec.encode(sparse.indices, sparse.size, dense=sparse.dense,
                                                 seed=sparse.seed, shape=sparse.shape))
    if encoding.positions is sparse.indices:
        return encoding.body, encoding.positions, sparse.values
    if encoding.order is not None:
        return encoding.body, encoding.positions, sparse.values[encoding.order]
    return encoding.body, encoding.positions, values_at(encoding.positions, sparse, index_codec)


def encode_values(index_codec, index_body, positions, value_codec, sent, sparse, mode):
    """Encoded payload for sent values (at positions) with value_codec."""
    encoding = value_codec.encode(sent)
    layout, extra = arrangement.choose(sent, encoding.order, encoding.delivered, mode)
    delivered = arrangement.restore(layout, extra, encoding.delivered)
    data = payload.write(sent.dtype, layout, sparse.shape, positions.size, index_codec,
                         index_body, extra, value_codec, encoding.body)
    return Encoded(data, positions, delivered)


def values_at(positions, sparse, codec):
    """Values for the positions a codec chose: the given values where selected, dense elsewhere."""
    indices, values = sparse.indices, sparse.values
    loc = np.minimum(np.searchsorted(indices, positions), max(indices.size - 1, 0))
    hit = indices[loc] == positions if indices.size else np.zeros(positions.size, bool)
    if not hit.all():
        if sparse.dense is None:
            raise DeepReduceError(
                f"index codec {codec!r} sends values at positions the sparsifier did not pick: "
                "pass the dense tensor as dense=")
        out = sparse.dense[positions].astype(values.dtype)
    else:
        out = np.empty(positions.size, dtype=values.dtype)
    out[hit] = values[loc[hit]]
    return out


class FixedPair:
    """One index codec and one value codec, always."""

    def __init__(self, index, value, arrangement_mode="auto"):
        self.index, self.value, self.arrangement = index, value, arrangement_mode
        self.lossless = index.lossless and value.lossless
        self.reads_dense = index.reads_dense

    def get_config(self):
        return {"index": self.index.get_config(), "value": self.value.get_config()}

    def random_state(self):
        return self.value.random_state()

    def set_random_state(self, state):
        self.value.set_random_state(state)

    def encode(self, sparse):
        body, positions, sent = encode_index(self.index, sparse)
        return encode_values(self.index, body, positions, self.value, sent, sparse,
                             self.arrangement)


def relative_error(got, want):
    want = want.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        error = l2_norm(np.nan_to_num(got.astype(np.float64) - want))
    return error / max(l2_norm(np.nan_to_num(want)), 1e-300)


class SmallestPayload:
    """"auto": per call, the smallest payload among candidate codecs, by exact sizes.

    Index candidates: the given codec, or for "auto" the exact coders entropy and bitmap, and
    (with the dense tensor at hand) sending every element, fp32 or fp16 under a lossy value
    choice, when even fp16 could beat the sparse payload. Value candidates: the given codec,
    or for "auto" every codec whose measured relative L2 error is at most `max_error` (exact
    raw always qualifies). A candidate that fails to encode is skipped.
    """

    def __init__(self, index=None, value=None, max_error=0.05, arrangement_mode="auto"):
        if not 0 <= max_error < 1:
            raise DeepReduceError(f"max_error must be in [0, 1), not {max_error!r}")
        self.index, self.value, self.max_error = index, value, max_error
        self.arrangement = arrangement_mode
        self.lossless = (index is None or index.lossless) and (
            value.lossless if value is not None else max_error == 0)
        self.reads_dense = index is None or index.reads_dense  # "auto": its dense fallback

    def get_config(self):
        index = {"id": "auto"} if self.index is None else self.index.get_config()
        value = ({"id": "auto", "max_error": self.max_error} if self.value is None
                 else self.value.get_config())
        return {"index": index, "value": value}

    def random_state(self):  # its candidates are made afresh (seeded) at every call
        return None

    def set_random_state(self, state):
        pass

    def index_candidates(self):
        if self.index is not None:
            return [self.index]
        return [registry.codec_class("index", "entropy")(), registry.codec_class("index", "bitmap")()]

    def value_candidates(self, count):
        if self.value is not None:
            return [self.value]
        make = lambda name, **kw: registry.codec_class("value", name)(**kw)  # noqa: E731
        exact = [make("raw")]
        if not self.max_error:
            return exact
        cheap = [make("fp16"), make("bf16"), make("qsgd")]
        if count > LARGE:
            return exact + cheap
        return exact + cheap + [make("entropy", max_error=0.8 * self.max_error), make("polyfit"),
                                make("dexp")]

    def encode(self, sparse):
        best = None
        for index_codec in self.index_candidates():
            try:
                body, positions, sent = encode_index(index_codec, sparse)
            except DeepReduceError:
                if index_codec is self.index:
                    raise
                continue
            best = self._smallest(best, index_codec, body, positions, sent, sparse)
        if self.index is None and sparse.dense is not None:
            best = self._dense_fallback(best, sparse)
        if best is None:
            raise DeepReduceError("no candidate codec could encode these values")
        return best

    def _smallest(self, best, index_codec, body, positions, sent, sparse):
        for value_codec in self.value_candidates(positions.size):
            try:
                encoded = encode_values(index_codec, body, positions, value_codec, sent, sparse,
                                        self.arrangement)
            except Exception:  # noqa: BLE001 - a candidate that cannot take these values
                if value_codec is self.value:
                    raise
                continue
            if (self.value is None and not value_codec.lossless
                    and not relative_error(encoded.values, sent) <= self.max_error):
                continue
            if best is None or len(encoded.payload) < len(best.payload):
                best = encoded
        return best

    def _dense_fallback(self, best, sparse):
        """Every element, fp32 (or fp16 under a lossy value choice), when that is smaller."""
        if best is not None and 2 * sparse.size >= len(best.payload):
            return best
        everything = np.arange(sparse.size, dtype=np.int64)
        full = sparse.dense.astype(sparse.values.dtype)
        dense_index = registry.codec_class("index", "dense")()
        lossy = self.value is None and self.max_error > 0 or self.value is not None and not self.value.lossless
        for name in (["fp16", "raw"] if lossy else ["raw"]):
            try:
                encoded = encode_values(dense_index, b"", everything,
                                        registry.codec_class("value", name)(), full, sparse,
                                        self.arrangement)
            except DeepReduceError:
                continue
            if name == "fp16" and not relative_error(encoded.values, full) <= max(self.max_error, 1e-3):
                continue
            if best is None or len(encoded.payload) < len(best.payload):
                best = encoded
        return best


def is_auto(config):
    return config == "auto" or isinstance(config, dict) and config.get("id") == "auto"


def build(index, value, arrangement_mode="auto"):
    """The selector a SparseCodec config names."""
    if arrangement_mode not in ARRANGEMENTS:
        raise DeepReduceError(f"arrangement must be one of {ARRANGEMENTS}, not {arrangement_mode!r}")
    index_auto, value_auto = is_auto(index), is_auto(value)
    index_codec = None if index_auto else registry.from_config("index", index)
    value_codec = None if value_auto else registry.from_config("value", value)
    if not (index_auto or value_auto):
        return FixedPair(index_codec, value_codec, arrangement_mode)
    if index_auto and isinstance(index, dict) and set(index) - {"id"}:
        raise DeepReduceError(f"index 'auto' takes no parameters: {index!r}")
    params = dict(value) if value_auto and isinstance(value, dict) else {}
    params.pop("id", None)
    max_error = params.pop("max_error", 0.05)
    if params:
        raise DeepReduceError(f"value 'auto' takes only max_error: {value!r}")
    return SmallestPayload(index_codec, value_codec, max_error, arrangement_mode)
