"""fp16: IEEE half precision after scaling by a power of two, so that the largest finite
magnitude lands in [2**14, 2**15): no finite value overflows, and the small top-k values of a
gradient stay in half precision's normal range instead of its coarse subnormal one.

Bound: every value whose magnitude is at least max|v| * 2**-28 (the normal range after
scaling) comes back within 2**-11 relative error; smaller ones are rounded to the subnormal
grid (to zero below its smallest step), with absolute error at most max|v| * 2**-39. NaN and
Inf are preserved. Body: the scale exponent + 128 (one byte), then
the half-precision values.
"""
import numpy as np

from ...engine import halves as half_precision
from ...errors import DeepReduceError
from ..base import ValueCodec, ValueEncoding
from ..registry import register
from .checks import expect_size


def scale_exponent(values):
    """e such that the largest finite |v| * 2**e lies in [2**14, 2**15) (0 if none)."""
    finite = np.abs(values[np.isfinite(values)])
    top = float(finite.max()) if finite.size else 0.0
    if top == 0.0:
        return 0
    return int(np.clip(15 - np.frexp(top)[1], -128, 127))


def from_half(halves, exponent, dtype):
    """What a receiver reconstructs: the halves scaled back, in the values' dtype. For
    float32 the scaling runs in float32: every half is exact there and ldexp rounds once,
    as the float64 route's final cast does (the same bits)."""
    if np.dtype(dtype) == np.float32:
        return half_precision.from_half(halves, exponent)
    return np.ldexp(halves.astype(np.float64), -exponent).astype(dtype)


@register("value")
class Fp16Value(ValueCodec):
    codec_id = "fp16"
    wire_id = 2
    lossless = False

    def min_bits(self, dtype):
        return 16

    def encode(self, values):
        if values.dtype == np.float32:  # scaling by 2**e is exact in float32 down to its
            # subnormals, which round to zero in half precision either way: one native pass
            exponent = scale_exponent(values)
            halves, _ = half_precision.to_half(np.ldexp(values, exponent), keep_error=False)
        else:
            wide = np.asarray(values, dtype=np.float64)
            exponent = scale_exponent(wide)
            with np.errstate(over="ignore"):
                halves = np.ldexp(wide, exponent).astype("<f2")
        return ValueEncoding(bytes([exponent + 128]) + halves.astype("<f2", copy=False).tobytes(),
                             None, from_half(halves, exponent, values.dtype))

    def decode(self, body, count, dtype):
        if not len(body):
            raise DeepReduceError("fp16 values: missing scale byte")
        expect_size(body, 1 + 2 * count, self.codec_id)
        return from_half(np.frombuffer(body, dtype="<f2", offset=1), body[0] - 128, dtype)
