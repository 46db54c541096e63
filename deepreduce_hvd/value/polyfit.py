"""polyfit: the paper's piecewise-polynomial fit of the sorted values (Fit-Poly).

Each sorted run is split where the curve departs most from the chord joining the segment's
ends, again and again (largest departure first) until `segments` pieces or too few points;
each piece sends the least-squares coefficients of a degree-`degree` polynomial (float32).
"""
import heapq

import numpy as np
from numpy.polynomial import polynomial as P

from ..codec_base import ValueCodec
from ..errors import DeepReduceError
from ..registry import register
from ..wire import ByteReader, ByteWriter
from .checks import finite_float32
from .curves import sorted_runs, unit_grid


def chord_breaks(y, max_pieces, min_points):
    """Segment boundaries [0, ..., len(y)] chosen at the largest chord departures."""
    def candidate(lo, hi):
        if hi - lo < 2 * min_points:
            return None
        chord = np.linspace(y[lo], y[hi - 1], hi - lo)
        inner = np.abs(y[lo:hi] - chord)[min_points:hi - lo - min_points + 1]
        at = int(np.argmax(inner))
        return (-float(inner[at]), lo, hi, lo + min_points + at)

    heap, cuts = [], [0, len(y)]
    first = candidate(0, len(y))
    if first:
        heap.append(first)
    while heap and len(cuts) - 1 < max_pieces:
        _, lo, hi, at = heapq.heappop(heap)
        cuts.append(at)
        for piece in (candidate(lo, at), candidate(at, hi)):
            if piece:
                heapq.heappush(heap, piece)
    return sorted(cuts)


def piece_degree(n, degree):
    return max(0, min(degree, n - 1))


@register("value")
class PolyfitValue(ValueCodec):
    codec_id = "polyfit"
    wire_id = 6
    params = ("degree", "segments")
    lossless = False

    def __init__(self, degree=5, segments=8):
        if degree not in range(0, 16) or not isinstance(segments, int) or segments < 1:
            raise DeepReduceError("polyfit needs 0 <= degree <= 15 and segments >= 1")
        self.degree, self.segments = degree, segments

    def encode(self, values):
        order, runs = sorted_runs(finite_float32(values, self.codec_id))
        lengths, coefs = [], []
        for run in runs:
            cuts = chord_breaks(run, self.segments, self.degree + 1)
            for lo, hi in zip(cuts[:-1], cuts[1:]):
                lengths.append(hi - lo)
                deg = piece_degree(hi - lo, self.degree)
                if hi > lo:
                    coefs.append(P.polyfit(unit_grid(hi - lo), run[lo:hi], deg))
        out = ByteWriter().u8(self.degree).varint(len(lengths))
        for n in lengths:
            out.varint(n)
        flat = np.concatenate(coefs) if coefs else np.zeros(0)
        return out.raw(flat.astype("<f4").tobytes()).getvalue(), order

    def decode(self, body, count, dtype):
        reader = ByteReader(body, "polyfit values")
        degree = reader.u8()
        pieces = reader.varint(limit=2 * count + 2)
        lengths = [reader.varint(limit=count) for _ in range(pieces)]
        if degree > 15 or sum(lengths) != count:
            raise DeepReduceError("polyfit: segment lengths disagree with the header")
        ncoef = sum(piece_degree(n, degree) + 1 for n in lengths if n)
        coefs = np.frombuffer(reader.raw(4 * ncoef), dtype="<f4").astype(np.float64)
        reader.expect_end()
        out, at = [], 0
        for n in lengths:
            if n:
                k = piece_degree(n, degree) + 1
                out.append(P.polyval(unit_grid(n), coefs[at:at + k]))
                at += k
        return (np.concatenate(out) if out else np.zeros(0)).astype(dtype)
