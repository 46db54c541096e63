"""auto: per tensor and call, the smallest payload among the exact index codecs. With the dense
tensor at hand, SparseCodec also tries sending it whole (fp32, or fp16 under a lossy value
codec) when that could be smaller. The payload names the codec that won."""
from ..codec_base import IndexCodec
from ..registry import register
from .bitmap import BitmapIndex
from .entropy import EntropyIndex


@register("index")
class AutoIndex(IndexCodec):
    codec_id = "auto"

    def candidates(self, have_dense, count=0):
        return [EntropyIndex(), BitmapIndex()]
