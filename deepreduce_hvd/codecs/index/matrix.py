"""Column-ranked gap coding of a 2-D selection: the entropy index codec's context model.

The top-k of a weight gradient (a sum over the batch of delta x activation^T) picks the
entries where a large row meets a large column, so the columns one row selects are mostly the
columns that many rows select. Ranking the columns by how many rows select them, and coding
each row's selected ranks as gaps, turns that structure into small gaps: on the 2048x2048
layer of the digits MLP about 2.2-2.7 bits per index, where LZMA over the selection bitmap
needs 2.7-3.3 and plain gap codes 5.6-5.8, by counting passes over the k positions (the
native engine; numpy sorts in its twin) instead of a pass over the bitmap. Either axis can be
the ranked one (`transpose`); the encoder sizes both (`sizes`) and codes the smaller.

Body: lines with a selection (gaps), their counts - 1, the ranked columns (fixed width), then
every line's rank gaps; each gap stream is a Huffman gap plan.
"""
import numpy as np

from ...engine import native
from ...engine.bits import bit_length, expect_stream_end, pack_fixed, read_fixed, varint_sizes
from ...errors import DeepReduceError
from ...wire.bytestream import ByteReader, ByteWriter
from .gaps import from_gaps, to_gaps
from .huffman import GapStats, decode_gaps

MIN_COUNT = 64  # below this a table-free code wins anyway


def grid(shape, size):
    """(rows, cols) of the 2-D view of a tensor (rows = first dimension), or None."""
    if shape is None or len(shape) < 2 or size == 0:
        return None
    rows = int(shape[0])
    cols = size // rows
    return (rows, cols) if rows >= 2 and cols >= 2 else None


def coding_order(line, rank, lines_total, ranks_total):
    """Stable order of the elements by (line, rank): two radix passes (numpy sorts 16-bit
    keys by radix) when both fit in 16 bits."""
    def key(values, top):
        return values.astype(np.uint16) if top <= 1 << 16 else values
    first = np.argsort(key(rank, ranks_total), kind="stable")
    return first[np.argsort(key(line[first], lines_total), kind="stable")]


def coding(indices, rows, cols, transpose):
    """(order, ranked, lines, counts - 1, rank steps) of one orientation: the other axis
    ranked by how many elements each holds, the elements in (line, rank) order, each line's
    count and the steps between its ranks (the native engine's matrix_coding, or its twin)."""
    if native.engine is not None:
        parts = native.engine.matrix_coding(np.ascontiguousarray(indices, np.int64),
                                            rows, cols, bool(transpose))
        return tuple(np.frombuffer(part, dtype) for part, dtype in
                     zip(parts, (np.int64, np.int64, np.int64, np.uint64, np.uint64)))
    line, other = np.divmod(indices, cols)
    lines_total, others_total = rows, cols
    if transpose:
        line, other, lines_total, others_total = other, line, cols, rows
    per_other = np.bincount(other, minlength=others_total)
    ranked = np.argsort(-per_other, kind="stable")[:np.count_nonzero(per_other)]
    rank_of = np.empty(others_total, dtype=np.int64)
    rank_of[ranked] = np.arange(ranked.size)
    rank = rank_of[other]
    order = coding_order(line, rank, lines_total, ranked.size)
    line, rank = line[order], rank[order]
    starts = np.flatnonzero(np.concatenate(([True], line[1:] != line[:-1])))
    counts = np.diff(np.append(starts, line.size))
    previous = np.concatenate(([-1], rank[:-1]))
    previous[starts] = -1
    return (order, ranked, line[starts], (counts - 1).astype(np.uint64),
            (rank - previous - 1).astype(np.uint64))


def ranked_width(rows, cols, transpose):
    """Bits of each ranked unit's index (the other axis: columns unless transposed)."""
    return int(bit_length((rows if transpose else cols) - 1))


def body_bytes(nlines, nranked, width, streams):
    """-> (exact body bytes, each gap stream's smallest (nbytes, extra bits)) of an
    orientation with nlines lines and nranked ranked units, its three gap streams (line gaps,
    counts - 1, rank steps) as GapStats."""
    plans = [stream.smallest() for stream in streams]
    sections = [plans[0][0], plans[1][0], (nranked * width + 7) // 8]  # length-prefixed
    nbytes = int(varint_sizes([nlines, nranked, *sections]).sum()) + sum(sections) + plans[2][0]
    return nbytes, plans


def sizes(indices, rows, cols):
    """Both orientations (transpose 0, 1) of ascending flat positions sized exactly, so that
    only the winner is coded: [(body bytes, its three gap streams' histograms)]. The native
    engine counts the histograms without ordering the elements (matrix_histograms); the numpy
    twin codes both orientations."""
    if native.engine is None:
        plans = [MatrixPlan(indices, rows, cols, transpose) for transpose in (0, 1)]
        return [(plan.nbytes, [stream.hist for stream in plan.streams]) for plan in plans]
    parts = np.frombuffer(native.engine.matrix_histograms(
        np.ascontiguousarray(indices, np.int64), rows, cols), np.int64).reshape(2, -1)
    out = []
    for transpose, part in enumerate(parts):
        hists = list(part[2:].reshape(3, -1))
        nbytes, _ = body_bytes(int(part[0]), int(part[1]), ranked_width(rows, cols, transpose),
                               [GapStats(None, hist) for hist in hists])
        out.append((nbytes, hists))
    return out


class MatrixPlan:
    """One orientation's coding of sorted flat positions of a rows x cols tensor, sized
    exactly (`nbytes`, from the gap streams' histograms: `hists` where sizes() counted them)
    before anything is packed. `order`: the decoder returns the positions as indices[order]."""

    def __init__(self, indices, rows, cols, transpose, hists=(None, None, None)):
        self.order, self.ranked, lines, counts_less_one, steps = coding(indices, rows, cols,
                                                                        transpose)
        self.width = ranked_width(rows, cols, transpose)
        self.streams = [GapStats(gaps, hist) for gaps, hist in
                        zip((to_gaps(lines), counts_less_one, steps), hists)]
        self.nbytes, self.plans = body_bytes(lines.size, self.ranked.size, self.width,
                                             self.streams)

    def body(self):
        (lines, counts, steps), extras = self.streams, [extra for _, extra in self.plans]
        out = ByteWriter().varint(lines.gaps.size).varint(self.ranked.size)
        out.section(lines.encode(extras[0]))
        out.section(counts.encode(extras[1]))
        out.section(pack_fixed(self.ranked, self.width))
        return out.raw(steps.encode(extras[2])).getvalue()


def decode(body, count, rows, cols, transpose):
    """Inverse of encode -> flat positions in coding order (unique by construction: lines
    strictly increase, and so do ranks within a line)."""
    if native.engine is not None:  # the whole body in one call
        return np.frombuffer(native.engine.matrix_decode(body, count, rows, cols, bool(transpose)),
                             np.int64)
    lines_total, others_total = (cols, rows) if transpose else (rows, cols)
    reader = ByteReader(body, "matrix indices")
    nlines = reader.varint(limit=min(lines_total, count))
    nranked = reader.varint(limit=min(others_total, count))
    if count and not (nlines and nranked):
        raise DeepReduceError("matrix indices: no lines or columns for a non-empty selection")
    lines = from_gaps(decode_gaps(reader.section(), nlines), lines_total)
    counts = _below(decode_gaps(reader.section(), nlines), nranked) + 1
    if int(counts.sum()) != count:
        raise DeepReduceError("matrix indices: line counts disagree with the header")
    width = int(bit_length(others_total - 1))
    section = reader.section()
    ranked = read_fixed(section, 0, nranked, width).astype(np.int64)
    expect_stream_end(section, nranked * width, "matrix ranked columns")
    if nranked and (ranked.max() >= others_total or np.unique(ranked).size < nranked):
        raise DeepReduceError("matrix indices: ranked columns out of range or repeated")
    steps = _below(decode_gaps(reader.rest(), count), nranked) + 1
    if not count:
        return np.zeros(0, dtype=np.int64)
    ends = np.cumsum(steps)
    starts = np.cumsum(counts) - counts
    before = np.concatenate(([0], ends[starts[1:] - 1]))  # sum of earlier lines' steps
    rank = ends - np.repeat(before, counts) - 1
    if int(rank[starts + counts - 1].max()) >= nranked:
        raise DeepReduceError("matrix indices: rank beyond the ranked columns")
    line, other = np.repeat(lines, counts), ranked[rank]
    if transpose:
        line, other = other, line
    return line * cols + other


def _below(values, limit):
    """uint64 values as int64, each required to be below limit."""
    if values.size and int(values.max()) >= limit:
        raise DeepReduceError("matrix indices: a count or gap beyond the ranked columns")
    return values.astype(np.int64)
