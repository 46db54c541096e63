"""Base classes for index and value codecs (numcodecs-style: id, config, encode, decode)."""
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


class IndexCodec(Codec):
    """Encodes a sorted, unique set of flat positions in [0, size)."""

    def encode(self, indices, size, dense=None, seed=None):
        """-> (body bytes, positions the receiver will decode, in the order values follow).

        Lossless codecs return `indices` itself; a Bloom filter may return other positions.
        """
        raise NotImplementedError

    def decode(self, body, size, count):
        """body (bytes-like) -> int64 positions; count is the number of values sent."""
        raise NotImplementedError


class ValueCodec(Codec):
    """Encodes a 1-D float array (float16/32/64 or bfloat16)."""

    def encode(self, values):
        raise NotImplementedError

    def decode(self, body, count, dtype):
        raise NotImplementedError
