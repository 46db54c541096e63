"""raw: values in their own dtype, little-endian; exact, NaN and Inf included."""
import numpy as np

from ..base import ValueCodec, ValueEncoding
from ..registry import register
from .checks import expect_size


@register("value")
class RawValue(ValueCodec):
    codec_id = "raw"
    wire_id = 1

    def min_bits(self, dtype):
        return 8 * dtype.itemsize

    def encode(self, values):
        body = values.astype(values.dtype.newbyteorder("<"), copy=False).tobytes()
        return ValueEncoding(body, None, values)

    def decode(self, body, count, dtype):
        expect_size(body, count * dtype.itemsize, self.codec_id)
        return np.frombuffer(body, dtype=dtype.newbyteorder("<")).astype(dtype)
