"""qsgd: stochastic quantisation (Alistarh et al.), unbiased.

Values are cut into buckets; each bucket sends its L2 norm (float32) and, per value, a sign bit
and a level in [0, s] with s = 2**(bits-1) - 1, rounded up or down at random so that the
expected reconstruction equals the value. The paper uses 7 bits and buckets of 512. The random
numbers come from a counter-based hash of one 63-bit key per call (drawn from `seed`), so every
path rounds the same way.
"""
import numpy as np

from ...engine.bits import expect_stream_end, pack_fixed, read_fixed
from ...errors import DeepReduceError
from ...wire.bytestream import ByteReader, ByteWriter
from ..base import ValueCodec, ValueEncoding
from ..bloom_filter import fmix64
from ..registry import register
from .checks import finite_float32, finite_output


def uniforms(key, count):
    """count uniform numbers in [0, 1) from a 63-bit key (counter-based: fmix64(key + i))."""
    with np.errstate(over="ignore"):
        mixed = fmix64(np.uint64(key) + np.arange(count, dtype=np.uint64))
    return (mixed >> np.uint64(11)).astype(np.float64) * 2.0 ** -53


def reconstruct(fields, norms, s, bucket, dtype):
    """What a receiver makes of the fields (level << 1 | sign) and the bucket norms."""
    levels = (fields >> np.uint64(1)).astype(np.float64)
    sign = np.where(fields & np.uint64(1), -1.0, 1.0)
    return (sign * levels / s * np.repeat(norms.astype(np.float64), bucket)[:fields.size]).astype(dtype)


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

    def min_bits(self, dtype):
        return 2

    def random_state(self):
        return self._rng.bit_generator.state

    def set_random_state(self, state):
        self._rng.bit_generator.state = state

    def encode(self, values):
        values = finite_float32(values, self.codec_id)
        s = (1 << (self.bits - 1)) - 1
        count = values.size
        bucket = min(self.bucket, max(count, 1))
        padded = np.zeros(-(-count // bucket) * bucket, dtype=np.float64)
        padded[:count] = values
        buckets = padded.reshape(-1, bucket)
        norms = np.sqrt((buckets ** 2).sum(axis=1)).astype("<f4")
        scale = np.where(norms > 0, s / np.maximum(norms.astype(np.float64), 1e-300), 0)
        scaled = (np.abs(buckets) * scale[:, None]).ravel()[:count]
        key = int(self._rng.integers(0, 2**63))
        levels = np.floor(scaled + uniforms(key, count)).clip(0, s)
        fields = (levels.astype(np.uint64) << np.uint64(1)) | (values < 0).astype(np.uint64)
        body = (ByteWriter().u8(self.bits).varint(bucket).raw(norms.tobytes())
                .raw(pack_fixed(fields, self.bits)).getvalue())
        return ValueEncoding(body, None, reconstruct(fields, norms, s, bucket, values.dtype))

    def decode(self, body, count, dtype):
        reader = ByteReader(body, "qsgd values")
        bits = reader.u8()
        bucket = reader.varint(limit=max(count, 1))
        if bits not in range(2, 17) or bucket < 1:
            raise DeepReduceError(f"qsgd: bad parameters bits={bits} bucket={bucket}")
        norms = np.frombuffer(reader.raw(4 * -(-count // bucket)), dtype="<f4")
        if not (np.isfinite(norms).all() and (norms >= 0).all()):
            raise DeepReduceError("qsgd: bucket norms must be finite and non-negative")
        data = reader.rest()
        fields = read_fixed(data, 0, count, bits)
        expect_stream_end(data, count * bits, "qsgd values")
        s = (1 << (bits - 1)) - 1
        if count and int((fields >> np.uint64(1)).max()) > s:
            raise DeepReduceError("qsgd: level out of range")
        return finite_output(reconstruct(fields, norms, s, bucket, dtype), self.codec_id)
