"""qsgd: stochastic quantisation (Alistarh et al.), unbiased.

Values are cut into buckets; each bucket sends its L2 norm (float32) and, per value, a sign bit
and a level in [0, s] with s = 2**(bits-1) - 1, rounded up or down at random so that the
expected reconstruction equals the value. The paper uses 7 bits and buckets of 512.
"""
import numpy as np

from ..bits import bits_to_fixed, fixed_to_bits, pack_bits, unpack_bits
from ..codec_base import ValueCodec
from ..errors import DeepReduceError
from ..registry import register
from ..wire import ByteReader, ByteWriter
from .checks import finite_float32


@register("value")
class QsgdValue(ValueCodec):
    codec_id = "qsgd"
    wire_id = 5
    params = ("bits", "bucket", "seed")
    lossless = False

    def __init__(self, bits=7, bucket=512, seed=None):
        if bits not in range(2, 17) or not isinstance(bucket, int) or bucket < 1:
            raise DeepReduceError(f"qsgd needs 2 <= bits <= 16 and bucket >= 1 (got {bits}, {bucket})")
        self.bits, self.bucket, self.seed = bits, bucket, seed
        self._rng = np.random.default_rng(seed)

    def encode(self, values):
        values = finite_float32(values, self.codec_id)
        s = (1 << (self.bits - 1)) - 1
        count = values.size
        bucket = min(self.bucket, max(count, 1))
        padded = np.zeros(-(-count // bucket) * bucket, dtype=np.float64)
        padded[:count] = values
        buckets = padded.reshape(-1, bucket)
        norms = np.sqrt((buckets ** 2).sum(axis=1)).astype(np.float32)
        scale = np.where(norms > 0, s / np.maximum(norms.astype(np.float64), 1e-300), 0)
        scaled = np.abs(buckets) * scale[:, None]
        levels = np.floor(scaled + self._rng.random(scaled.shape)).clip(0, s).ravel()[:count]
        fields = (levels.astype(np.uint64) << np.uint64(1)) | (values < 0).astype(np.uint64)
        out = ByteWriter().u8(self.bits).varint(bucket).raw(norms.astype("<f4").tobytes())
        return out.raw(pack_bits(fixed_to_bits(fields, self.bits))).getvalue(), None

    def decode(self, body, count, dtype):
        reader = ByteReader(body, "qsgd values")
        bits = reader.u8()
        bucket = reader.varint(limit=max(count, 1))
        if bits not in range(2, 17) or bucket < 1:
            raise DeepReduceError(f"qsgd: bad parameters bits={bits} bucket={bucket}")
        nbuckets = -(-count // bucket)
        norms = np.frombuffer(reader.raw(4 * nbuckets), dtype="<f4").astype(np.float64)
        data = reader.rest()
        if len(data) != (count * bits + 7) // 8:
            raise DeepReduceError(f"qsgd: {len(data)} bytes for {count} x {bits} bits")
        fields = bits_to_fixed(unpack_bits(data, count * bits), count, bits)
        s = (1 << (bits - 1)) - 1
        levels = (fields >> np.uint64(1)).astype(np.float64)
        if count and levels.max() > s:
            raise DeepReduceError("qsgd: level out of range")
        sign = np.where(fields & np.uint64(1), -1.0, 1.0)
        return (sign * levels / s * np.repeat(norms, bucket)[:count]).astype(dtype)
