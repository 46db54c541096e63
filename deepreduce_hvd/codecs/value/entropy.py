"""entropy: magnitudes quantised uniformly between their min and max, levels Huffman-coded,
signs raw. Top-k magnitudes are concentrated, so the levels cost far less than log2(levels).

`max_error` bounds the relative L2 error of the values: the fewest levels (a power of two,
4..4096) that meet it are used; `levels` fixes the count instead. Rounding is to nearest
(deterministic; error feedback carries the remainder).
"""
import math

import numpy as np

from ...engine import native
from ...engine.bits import expect_stream_end, read_fixed
from ...engine.norms import l2_norm
from ...errors import DeepReduceError
from ...wire.bytestream import ByteReader, ByteWriter
from .. import huffman_code
from ..base import ValueCodec, ValueEncoding
from ..registry import register
from .checks import finite_float32, finite_output

MAX_LEVELS = 4096


def step_size(lo, hi, levels):
    return (hi - lo) / (levels - 1) if hi > lo else 1.0


def quantise(magnitude, lo, hi, levels):
    return np.rint((magnitude - lo) / step_size(lo, hi, levels)).astype(np.int64)


def dequantise(q, negative, lo, hi, levels, dtype):
    """What a receiver makes of the levels and sign bits: sign * (lo + q * step) in float64,
    then dtype, computed once a level (the cast rounds symmetrically, so the sign can follow
    it; the native decoder does the same)."""
    level = (lo + np.arange(levels) * step_size(lo, hi, levels)).astype(dtype)
    magnitude = level[q]
    return np.negative(magnitude, out=magnitude, where=negative)


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

    def min_bits(self, dtype):
        return 2  # a sign bit and at least one code bit

    def choose_levels(self, magnitude, lo, hi):
        """The fewest levels (2**bits, bits 2..12) whose rounding error is within the bound,
        assuming it shrinks as levels grow: searched from the bits that uniform rounding
        noise (step / sqrt(12) an element) predicts, rounded (it is within a few percent on real
        gradients), one level count either way: two error passes usually decide where a
        bisection of 2..12 took four."""
        if self.levels is not None:
            return self.levels
        norm = l2_norm(magnitude)
        bound = self.max_error * norm
        shifted = magnitude - lo
        work = np.empty_like(shifted)

        def within(bits):
            step = step_size(lo, hi, 1 << bits)
            # lo + quantise(...) * step - magnitude, in place (the levels stay whole floats,
            # exact as the int64 quantise makes them: the same error to the last bit)
            np.rint(np.divide(shifted, step, out=work), out=work)
            np.subtract(np.add(np.multiply(work, step, out=work), lo, out=work), magnitude,
                        out=work)
            return l2_norm(work) <= bound

        noise = (hi - lo) * math.sqrt(magnitude.size / 12.0)  # the error at one level step
        guess = round(math.log2(noise / bound + 1.0)) if bound > 0 and noise > 0 else 2
        bits = min(max(guess, 2), 12)
        if within(bits):  # the answer is bits or fewer
            while bits > 2 and within(bits - 1):
                bits -= 1
        else:  # more: the first that is within (or the most there is)
            while bits < 12 and not within(bits + 1):
                bits += 1
            bits = min(bits + 1, 12)
        return 1 << bits

    def encode(self, values):
        finite = finite_float32(values, self.codec_id)
        magnitude = np.abs(finite).astype(np.float64)
        lo, hi = (float(np.float32(magnitude.min())), float(np.float32(magnitude.max()))) \
            if values.size else (0.0, 0.0)
        levels = self.choose_levels(magnitude, lo, hi)
        q = quantise(magnitude, lo, hi, levels)
        negative = finite < 0
        lengths = huffman_code.code_lengths(np.bincount(q, minlength=levels))
        out = ByteWriter().varint(levels).raw(np.array([lo, hi], "<f4").tobytes())
        huffman_code.write_table(out, lengths)
        stream = huffman_code.pack(q, lengths, negative)
        return ValueEncoding(out.raw(stream).getvalue(), None,
                             dequantise(q, negative, lo, hi, levels, values.dtype))

    def decode(self, body, count, dtype):
        if native.engine is not None and dtype == np.float32:  # the whole body in one call
            return np.frombuffer(native.engine.entropy_values(body, count), np.float32)
        reader = ByteReader(body, "entropy values")
        levels = reader.varint(limit=MAX_LEVELS)
        lo, hi = np.frombuffer(reader.raw(8), dtype="<f4").astype(np.float64)
        if levels < 2 or not (np.isfinite(lo) and np.isfinite(hi) and 0 <= lo <= hi):
            raise DeepReduceError("entropy values: bad quantiser")
        lengths = huffman_code.read_table(reader, levels)
        data = reader.rest()
        q, end = huffman_code.decode(data, 0, lengths, count)
        expect_stream_end(data, end + count, "entropy values")
        negative = read_fixed(data, end, count, 1).astype(bool)
        return finite_output(dequantise(q, negative, lo, hi, levels, dtype), self.codec_id)
