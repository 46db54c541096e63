"""polyfit: the paper's piecewise-polynomial fit of the sorted values (Fit-Poly).

Each sorted run is split where the curve departs most from the chord joining the segment's
ends, again and again (largest departure first) until `segments` pieces or too few points;
each piece sends the least-squares coefficients of a degree-`degree` polynomial (float32).
Body: degree (u8), piece count, a section of piece lengths (varints), the coefficients.
"""
import heapq

import numpy as np
from numpy.polynomial import polynomial as P

from ...engine.bits import varint_array, varint_bytes
from ...errors import DeepReduceError
from ...wire.bytestream import ByteReader, ByteWriter
from ..base import ValueCodec, ValueEncoding
from ..registry import register
from .checks import finite_float32, finite_output
from .curves import sorted_runs, unit_grid, unit_grid_chunks

MAX_SEGMENTS = 1024


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


def evaluate(lengths, coefs, degree, dtype):
    """The fitted values of every piece, in sorted order (what a receiver reconstructs),
    evaluated in chunks so temporaries stay small whatever the piece lengths."""
    out = np.empty(int(sum(lengths)), dtype=dtype)
    at = start = 0
    with np.errstate(all="ignore"):
        for n in lengths:
            if n:
                k = piece_degree(n, degree) + 1
                for offset, x in unit_grid_chunks(n):
                    out[start + offset:start + offset + x.size] = P.polyval(x, coefs[at:at + k])
                at += k
                start += n
    return out


@register("value")
class PolyfitValue(ValueCodec):
    codec_id = "polyfit"
    wire_id = 6
    params = ("degree", "segments")
    lossless = False

    def __init__(self, degree=5, segments=8):
        if degree not in range(0, 16) or not isinstance(segments, int) or not 1 <= segments <= MAX_SEGMENTS:
            raise DeepReduceError(f"polyfit needs 0 <= degree <= 15 and 1 <= segments <= {MAX_SEGMENTS}")
        self.degree, self.segments = degree, segments

    def min_bits(self, dtype):
        """No bound: a piece's few coefficients describe any count, so only the caller's
        max_elements (the tensor it expects) bounds what a body expands to."""
        return 0

    def encode(self, values):
        order, runs = sorted_runs(finite_float32(values, self.codec_id))
        lengths, coefs = [], []
        with np.errstate(all="ignore"):
            for run in runs:
                cuts = chord_breaks(run, self.segments, self.degree + 1)
                for lo, hi in zip(cuts[:-1], cuts[1:]):
                    lengths.append(hi - lo)
                    if hi > lo:
                        coefs.append(P.polyfit(unit_grid(hi - lo), run[lo:hi],
                                               piece_degree(hi - lo, self.degree)))
        flat = (np.concatenate(coefs) if coefs else np.zeros(0)).astype("<f4")
        if not np.isfinite(flat).all():
            raise DeepReduceError("polyfit: the fit does not fit in float32")
        delivered = finite_output(evaluate(lengths, flat.astype(np.float64), self.degree,
                                           values.dtype), self.codec_id)
        body = (ByteWriter().u8(self.degree).varint(len(lengths)).section(varint_bytes(lengths))
                .raw(flat.tobytes()).getvalue())
        return ValueEncoding(body, order, delivered)

    def decode(self, body, count, dtype):
        reader = ByteReader(body, "polyfit values")
        degree = reader.u8()
        pieces = reader.varint(limit=2 * MAX_SEGMENTS)
        lengths = varint_array(reader.section(), pieces)
        if degree > 15 or int(lengths.sum()) != count or np.count_nonzero(lengths == 0) > 2:
            raise DeepReduceError("polyfit: segment lengths disagree with the header")
        ncoef = int(sum(piece_degree(int(n), degree) + 1 for n in lengths if n))
        coefs = np.frombuffer(reader.raw(4 * ncoef), dtype="<f4")
        reader.expect_end()
        if not np.isfinite(coefs).all():
            raise DeepReduceError("polyfit: coefficients must be finite")
        return finite_output(evaluate([int(n) for n in lengths], coefs.astype(np.float64),
                                      degree, dtype), self.codec_id)
