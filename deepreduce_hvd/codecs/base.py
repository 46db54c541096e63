"""Base classes for index and value codecs (numcodecs-style: id, config, encode, decode)."""
from typing import NamedTuple, Optional

import numpy as np

from .registry import codec_class


class Codec:
    """A codec is configured by keyword parameters, listed in `params` for get_config."""
    codec_id = None
    wire_id = None
    params = ()
    lossless = True

    def get_config(self):
        config = {"id": self.codec_id}
        config.update({name: getattr(self, name) for name in self.params})
        return config

    @classmethod
    def from_config(cls, config):
        params = dict(config)
        return codec_class(cls.kind, params.pop("id"))(**params)

    def __repr__(self):
        args = ", ".join(f"{k}={getattr(self, k)!r}" for k in self.params)
        return f"{type(self).__name__}({args})"


class IndexEncoding(NamedTuple):
    """An index codec's output: the body, and the positions the receiver will decode in the
    order the values must follow. `order` (when not None) says those positions are
    indices[order], a reordering of the selection (a context model's coding order)."""
    body: bytes
    positions: np.ndarray
    order: Optional[np.ndarray] = None


class IndexCodec(Codec):
    """Encodes a sorted, unique set of flat positions in [0, size) of a tensor of `shape`.
    `reads_dense`: it may send values at positions that were not selected, read from the
    dense tensor (which the encoder must then be given)."""
    reads_dense = False

    def encode(self, indices, size, dense=None, seed=None, shape=None):
        """-> IndexEncoding (or a (body, positions) pair).

        Lossless codecs return `indices` itself (or a reordering of it, with `order`); a Bloom
        filter may return other positions.
        """
        raise NotImplementedError

    def decode(self, body, size, count, shape=None):
        """body (bytes-like) -> unique int64 positions in [0, size), in the order the values
        follow (the order encode returned); count is the number of values."""
        raise NotImplementedError

    def max_count(self, body, size):
        """The most positions a valid body of these bytes can hold: a declared count above it
        is refused before anything is decoded."""
        return size


class ValueEncoding(NamedTuple):
    """A value codec's output: the body, the order it sorted the values by (None: kept), and
    exactly what its decoder will return from the body (in that order, the input dtype)."""
    body: bytes
    order: Optional[np.ndarray]
    delivered: np.ndarray


class ValueCodec(Codec):
    """Encodes a 1-D float array (float16/32/64 or bfloat16)."""

    def min_bits(self, dtype):
        """Fewest bits a valid body spends per value, so a decoder can check a declared count
        against the bytes present before it does any work; 0 where no such bound exists (a
        fitted curve), and then the caller's max_elements is the bound."""
        return 0

    def encode(self, values):
        """-> ValueEncoding."""
        raise NotImplementedError

    def random_state(self):
        """The state of the codec's random draws (a plain value), or None if it draws none:
        saved in checkpoints so a resumed job draws what the uninterrupted one would."""
        return None

    def set_random_state(self, state):
        pass

    def decode(self, body, count, dtype):
        raise NotImplementedError
