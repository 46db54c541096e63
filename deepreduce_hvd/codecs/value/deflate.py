"""deflate: zlib over the values' bytes, split into byte planes first (exponent bytes compress,
mantissa bytes barely do). Exact, NaN and Inf included."""
import numpy as np

from ..base import ValueCodec, ValueEncoding
from ..registry import register
from ..streams import MAX_RATIO, deflate, inflate


@register("value")
class DeflateValue(ValueCodec):
    codec_id = "deflate"
    wire_id = 4

    def min_bits(self, dtype):
        return 8 * dtype.itemsize / MAX_RATIO

    def encode(self, values):
        raw = np.ascontiguousarray(values.astype(values.dtype.newbyteorder("<"), copy=False))
        planes = raw.view(np.uint8).reshape(-1, values.dtype.itemsize).T
        return ValueEncoding(deflate(planes.tobytes()), None, values)

    def decode(self, body, count, dtype):
        planes = np.frombuffer(inflate(body, count * dtype.itemsize), dtype=np.uint8)
        raw = np.ascontiguousarray(planes.reshape(dtype.itemsize, count).T)
        return raw.view(dtype.newbyteorder("<")).ravel().astype(dtype)
