"""bf16: the top 16 bits of float32, rounded to nearest even (full float32 range, relative
error <= 2**-8). NaN and Inf are preserved."""
import numpy as np

from ..base import ValueCodec, ValueEncoding
from ..registry import register
from .checks import expect_size


def to_bf16_bits(values):
    bits = np.asarray(values, dtype=np.float32).view(np.uint32)
    rounded = ((bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1)))
               >> np.uint32(16)).astype(np.uint16)
    nan = np.isnan(np.asarray(values, dtype=np.float32))
    rounded[nan] = ((bits[nan] >> np.uint32(16)) | np.uint32(0x40)).astype(np.uint16)
    return rounded


def from_bf16_bits(halves, dtype):
    return (halves.astype(np.uint32) << np.uint32(16)).view(np.float32).astype(dtype)


@register("value")
class Bf16Value(ValueCodec):
    codec_id = "bf16"
    wire_id = 3
    lossless = False

    def min_bits(self, dtype):
        return 16

    def encode(self, values):
        with np.errstate(over="ignore"):
            halves = to_bf16_bits(values).astype("<u2")
        return ValueEncoding(halves.tobytes(), None, from_bf16_bits(halves, values.dtype))

    def decode(self, body, count, dtype):
        expect_size(body, 2 * count, self.codec_id)
        return from_bf16_bits(np.frombuffer(body, dtype="<u2"), dtype)
