"""auto: per tensor and call, the smallest payload among value codecs whose measured relative
L2 error (after decoding, arrangement included) is at most max_error. Exact codecs always
qualify, so there is always a choice."""
import numpy as np

from .. import arrangement
from ..codec_base import ValueCodec
from ..errors import DeepReduceError
from ..registry import register
from .bf16 import Bf16Value
from .dexp import DexpValue
from .entropy import EntropyValue
from .fp16 import Fp16Value
from .polyfit import PolyfitValue
from .qsgd import QsgdValue
from .raw import RawValue


LARGE = 1 << 20


@register("value")
class AutoValue(ValueCodec):
    codec_id = "auto"
    params = ("max_error",)
    lossless = False

    def __init__(self, max_error=0.05):
        if not 0 <= max_error < 1:
            raise DeepReduceError(f"max_error must be in [0, 1), not {max_error!r}")
        self.max_error = max_error

    def candidates(self, have_dense, count=0):
        """Exact raw always; elementwise and quantising codecs within the bound; the fitting
        codecs only below LARGE values, where sorting and rank search stay cheap."""
        exact = [RawValue()]
        if not self.max_error:
            return exact
        cheap = [Fp16Value(), Bf16Value(), QsgdValue()]
        if count > LARGE:
            return exact + cheap
        return exact + cheap + [EntropyValue(max_error=0.8 * self.max_error), PolyfitValue(),
                                DexpValue()]

    def accepts(self, values, codec, body, layout, extra):
        if codec.lossless:
            return True
        target = values.astype(np.float64)
        decoded = codec.decode(body, values.size, values.dtype)
        got = arrangement.restore(layout, extra, decoded).astype(np.float64)
        if not np.isfinite(got[np.isfinite(target)]).all():
            return False
        with np.errstate(invalid="ignore"):
            error = np.linalg.norm(np.nan_to_num(got - target))
        return error <= self.max_error * np.linalg.norm(np.nan_to_num(target))
