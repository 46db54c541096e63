"""bf16: the top 16 bits of float32, rounded to nearest even (full float32 range, relative
error <= 2**-8). NaN and Inf are preserved."""
import numpy as np

from ..codec_base import ValueCodec
from ..registry import register
from .checks import expect_size


def to_bf16_bits(values):
    bits = np.asarray(values, dtype=np.float32).view(np.uint32)
    rounded = ((bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1)))
               >> np.uint32(16)).astype(np.uint16)
    nan = np.isnan(np.asarray(values, dtype=np.float32))
    rounded[nan] = ((bits[nan] >> np.uint32(16)) | np.uint32(0x40)).astype(np.uint16)
    return rounded


@register("value")
class Bf16Value(ValueCodec):
    codec_id = "bf16"
    wire_id = 3
    lossless = False

    def encode(self, values):
        with np.errstate(over="ignore"):
            return to_bf16_bits(values).astype("<u2").tobytes(), None

    def decode(self, body, count, dtype):
        expect_size(body, 2 * count, self.codec_id)
        bits = np.frombuffer(body, dtype="<u2").astype(np.uint32) << np.uint32(16)
        return bits.view(np.float32).astype(dtype)
