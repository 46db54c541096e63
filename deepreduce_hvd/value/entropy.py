"""entropy: magnitudes quantised uniformly between their min and max, levels Huffman-coded,
signs raw. Top-k magnitudes are concentrated, so the levels cost far less than log2(levels).

`max_error` bounds the relative L2 error of the values: the fewest levels (a power of two,
4..4096) that meet it are used; `levels` fixes the count instead. Rounding is to nearest
(deterministic; error feedback carries the remainder).
"""
import numpy as np

from .. import huffman
from ..bits import pack_bits, unpack_bits
from ..codec_base import ValueCodec
from ..errors import DeepReduceError
from ..registry import register
from ..wire import ByteReader, ByteWriter
from .checks import finite_float32

MAX_LEVELS = 4096


def quantise(magnitude, lo, hi, levels):
    step = (hi - lo) / (levels - 1) if hi > lo else 1.0
    q = np.rint((magnitude - lo) / step).astype(np.int64)
    return q, lo + q * step


@register("value")
class EntropyValue(ValueCodec):
    codec_id = "entropy"
    wire_id = 8
    params = ("max_error", "levels")
    lossless = False

    def __init__(self, max_error=0.04, levels=None):
        if levels is not None and not 2 <= levels <= MAX_LEVELS:
            raise DeepReduceError(f"levels must be in [2, {MAX_LEVELS}], not {levels!r}")
        if not 0 < max_error < 1:
            raise DeepReduceError(f"max_error must be in (0, 1), not {max_error!r}")
        self.max_error, self.levels = max_error, levels

    def choose_levels(self, magnitude, lo, hi):
        if self.levels is not None:
            return self.levels
        norm = np.linalg.norm(magnitude)
        lo_bits, hi_bits = 2, 12  # binary search for the fewest levels (2**bits) within bound
        while lo_bits < hi_bits:
            mid = (lo_bits + hi_bits) // 2
            error = np.linalg.norm(quantise(magnitude, lo, hi, 1 << mid)[1] - magnitude)
            lo_bits, hi_bits = (lo_bits, mid) if error <= self.max_error * norm else (mid + 1, hi_bits)
        return 1 << lo_bits

    def encode(self, values):
        values = finite_float32(values, self.codec_id)
        magnitude = np.abs(values).astype(np.float64)
        lo, hi = (float(np.float32(magnitude.min())), float(np.float32(magnitude.max()))) \
            if values.size else (0.0, 0.0)
        levels = self.choose_levels(magnitude, lo, hi)
        q, _ = quantise(magnitude, lo, hi, levels)
        lengths = huffman.code_lengths(np.bincount(q, minlength=levels))
        out = ByteWriter().varint(levels).raw(np.array([lo, hi], "<f4").tobytes())
        huffman.write_table(out, lengths)
        bits = np.concatenate((huffman.encode(q, lengths), (values < 0).astype(np.uint8)))
        return out.raw(pack_bits(bits)).getvalue(), None

    def decode(self, body, count, dtype):
        reader = ByteReader(body, "entropy values")
        levels = reader.varint(limit=MAX_LEVELS)
        lo, hi = np.frombuffer(reader.raw(8), dtype="<f4").astype(np.float64)
        if levels < 2 or not (np.isfinite(lo) and np.isfinite(hi)):
            raise DeepReduceError("entropy values: bad quantiser")
        lengths = huffman.read_table(reader, levels)
        data = reader.rest()
        bits = unpack_bits(data, 8 * len(data))
        q, end = huffman.decode(bits, lengths, count)
        if end + count > bits.size:
            raise DeepReduceError("entropy values: sign bits truncated")
        step = (hi - lo) / (levels - 1) if hi > lo else 1.0
        sign = np.where(bits[end:end + count] == 1, -1.0, 1.0)
        return (sign * (lo + q * step)).astype(dtype)
