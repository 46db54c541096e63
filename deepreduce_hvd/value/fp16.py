"""fp16: IEEE half precision (16 bits, relative error <= 2**-11). NaN and Inf are preserved;
finite values beyond the half range (65504) are refused rather than turned into Inf."""
import numpy as np

from ..codec_base import ValueCodec
from ..errors import DeepReduceError
from ..registry import register
from .checks import expect_size

FP16_MAX = 65504.0


@register("value")
class Fp16Value(ValueCodec):
    codec_id = "fp16"
    wire_id = 2
    lossless = False

    def encode(self, values):
        values = np.asarray(values, dtype=np.float32)
        if (np.abs(values[np.isfinite(values)]) > FP16_MAX).any():
            raise DeepReduceError("fp16: values beyond +-65504 would become Inf; use 'bf16' or 'raw'")
        return values.astype("<f2").tobytes(), None

    def decode(self, body, count, dtype):
        expect_size(body, 2 * count, self.codec_id)
        return np.frombuffer(body, dtype="<f2").astype(dtype)
