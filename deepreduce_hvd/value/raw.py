"""raw: values in their own dtype, little-endian; exact, NaN and Inf included."""
import numpy as np

from ..codec_base import ValueCodec
from ..errors import DeepReduceError
from ..registry import register


@register("value")
class RawValue(ValueCodec):
    codec_id = "raw"
    wire_id = 1

    def encode(self, values):
        return values.astype(values.dtype.newbyteorder("<"), copy=False).tobytes()

    def decode(self, body, count, dtype):
        if len(body) != count * dtype.itemsize:
            raise DeepReduceError(f"raw values: {len(body)} bytes for {count} x {dtype.name}")
        return np.frombuffer(body, dtype=dtype.newbyteorder("<")).astype(dtype)
