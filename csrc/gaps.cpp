// The encoders' element-by-element passes: the histogram the Huffman gap coder sizes its
// choices from and the packing of the chosen code, the matrix model's sizing of both
// orientations and its coding of one; and the receivers' scatter into a dense sum
// (bodies.cpp decodes whole bodies). The model (which orientation, extra bits, code lengths)
// is chosen in deepreduce_hvd/codecs/index/{huffman,matrix}.py, which hold numpy twins.
#include <algorithm>
#include <cstring>

#include "bitstream.h"
#include "engine.h"

namespace dr {
namespace {

// v = gap + 1 (wrapping only for the impossible gap 2^64 - 1), its length and extra-bit symbol.
struct GapParts {
    uint64_t v;
    int length, width;
    uint64_t symbol;
    GapParts(uint64_t gap, int extra) : v(gap + 1), length(bit_length(v)) {
        width = std::max(length - 1 - extra, 0);
        uint64_t top = (v - (1ULL << (length - 1))) >> width;
        symbol = (static_cast<uint64_t>(length) << extra) + top;
    }
};

// The row and column of flat positions of a grid `cols` wide, taken in turn: a division where
// the row changes, not an element (ascending positions change rows at most `rows` times).
struct RowCursor {
    int64_t cols, row = 0, start = 0;
    int64_t column(int64_t position) {  // also moves `row` to the position's
        if (static_cast<uint64_t>(position - start) >= static_cast<uint64_t>(cols)) {
            row = position / cols;
            start = row * cols;
        }
        return position - start;
    }
};

// The histogram cell of a gap: (bit length of gap + 1, its top kGapTop bits below the lead).
inline size_t gap_cell(uint64_t gap) {
    // without a branch (one on the length was mispredicted for most gaps of a 1% selection,
    // whose lengths fall on both sides of kGapTop + 1): the length as bit_length (0 for v = 0)
    // and the top bits by a rotation, which shifts left where v is shorter than kGapTop + 1
    // (its high bits, rotated in, are zeros) and right elsewhere
    uint64_t v = gap + 1;
    int length = 63 - __builtin_clzll(v | 1) + (v != 0);
    unsigned shift = static_cast<unsigned>(length - 1 - kGapTop) & 63;
    uint64_t top = ((v >> shift) | (v << ((64 - shift) & 63))) & ((1u << kGapTop) - 1);
    return (static_cast<size_t>(length) << kGapTop) + top;
}

// The units of an axis that hold elements, ranked by how many (descending, ties by index, as
// matrix_coding ranks).
std::vector<int64_t> rank_axis(const std::vector<int64_t>& per_other) {
    std::vector<int64_t> ranked;
    for (size_t c = 0; c < per_other.size(); ++c)
        if (per_other[c]) ranked.push_back(static_cast<int64_t>(c));
    std::stable_sort(ranked.begin(), ranked.end(),
                     [&](int64_t a, int64_t b) { return per_other[a] > per_other[b]; });
    return ranked;
}

// Histograms of one orientation's line gaps and counts - 1 (lines: the units of an axis that
// hold elements, per_line[j] of them), and the number of lines.
void line_histograms(const std::vector<int64_t>& per_line, int64_t* gaps_hist,
                     int64_t* counts_hist, int64_t* nlines) {
    int64_t previous = -1;
    for (size_t j = 0; j < per_line.size(); ++j) {
        if (!per_line[j]) continue;
        ++gaps_hist[gap_cell(static_cast<uint64_t>(static_cast<int64_t>(j) - previous - 1))];
        ++counts_hist[gap_cell(static_cast<uint64_t>(per_line[j] - 1))];
        previous = static_cast<int64_t>(j);
        ++*nlines;
    }
}

// Histogram of every line's rank steps with no ordering of the elements: the ranked units
// visited in rank order (unit u's elements at [start[u], start[u + 1]), their lines in
// line_of), so that each line sees its ranks ascending.
void step_histogram(const std::vector<int64_t>& ranked, const std::vector<int64_t>& start,
                    const std::vector<int64_t>& line_of, size_t lines_total, int64_t* hist) {
    std::vector<int64_t> last(lines_total, -1);
    for (size_t r = 0; r < ranked.size(); ++r) {
        const int64_t rank = static_cast<int64_t>(r), lo = start[ranked[r]], hi = start[ranked[r] + 1];
        for (int64_t e = lo; e < hi; ++e) {
            int64_t& previous = last[line_of[e]];
            ++hist[gap_cell(static_cast<uint64_t>(rank - previous - 1))];
            previous = rank;
        }
    }
}

}  // namespace

std::vector<int64_t> gap_histogram(const uint64_t* gaps, size_t n) {
    std::vector<int64_t> hist(kGapLengths << kGapTop, 0);
    for (size_t i = 0; i < n; ++i) ++hist[gap_cell(gaps[i])];
    return hist;
}

std::vector<int64_t> matrix_histograms(const int64_t* indices, size_t count, int64_t rows,
                                       int64_t cols) {
    if (rows < 1 || cols < 1) throw Error("matrix coding: empty grid");
    const int64_t size = rows * cols;
    std::vector<int64_t> per_row(rows, 0), per_col(cols, 0), row_of(count), col_of(count);
    RowCursor at{cols};
    for (size_t i = 0; i < count; ++i) {
        if (indices[i] < 0 || indices[i] >= size) throw Error("matrix coding: position out of range");
        if (i && indices[i] <= indices[i - 1]) throw Error("matrix coding: positions must ascend");
        col_of[i] = at.column(indices[i]);
        row_of[i] = at.row;
        ++per_row[at.row];
        ++per_col[col_of[i]];
    }
    std::vector<int64_t> out(2 * kMatrixHistogram, 0);
    auto prefix = [](const std::vector<int64_t>& per) {
        std::vector<int64_t> start(per.size() + 1, 0);
        for (size_t u = 0; u < per.size(); ++u) start[u + 1] = start[u] + per[u];
        return start;
    };
    for (int transpose = 0; transpose < 2; ++transpose) {
        int64_t* part = out.data() + transpose * kMatrixHistogram;
        const std::vector<int64_t>& per_line = transpose ? per_col : per_row;
        const std::vector<int64_t>& per_other = transpose ? per_row : per_col;
        int64_t* hist = part + 2;
        const size_t cells = kGapLengths << kGapTop;
        line_histograms(per_line, hist, hist + cells, &part[0]);
        std::vector<int64_t> ranked = rank_axis(per_other);
        part[1] = static_cast<int64_t>(ranked.size());
        std::vector<int64_t> start = prefix(per_other);
        if (transpose) {  // ranked rows: their elements already lie row by row
            step_histogram(ranked, start, col_of, cols, hist + 2 * cells);
        } else {  // ranked columns: each column's rows, by a counting pass
            std::vector<int64_t> fill(start.begin(), start.end() - 1), by_col(count);
            for (size_t i = 0; i < count; ++i) by_col[fill[col_of[i]]++] = row_of[i];
            step_histogram(ranked, start, by_col, rows, hist + 2 * cells);
        }
    }
    return out;
}

std::vector<int64_t> gap_plan_bytes(const int64_t* hist) {
    constexpr int kExtras = 4, kCells = 1 << kGapTop;
    std::vector<int64_t> out(kExtras);
    for (int extra = 0; extra < kExtras; ++extra) {
        std::vector<int64_t> counts(static_cast<size_t>(kGapLengths) << extra, 0);
        uint64_t nbits = 0;
        for (int length = 0; length < kGapLengths; ++length) {
            int kept = std::min(extra, std::max(length - 1, 0));
            int64_t of_length = 0;
            for (int top = 0; top < kCells; ++top) {
                int64_t n = hist[length * kCells + top];
                if (n < 0) throw Error("gap plan: negative count");
                counts[(static_cast<size_t>(length) << extra) + (top >> (kGapTop - kept))] += n;
                of_length += n;
            }
            nbits += static_cast<uint64_t>(of_length) * std::max(length - 1 - extra, 0);
        }
        std::vector<uint8_t> lengths = huffman_lengths(counts.data(), counts.size(), 15);
        size_t first = 0, last = 0;
        bool any = false;
        for (size_t s = 0; s < counts.size(); ++s) {
            nbits += static_cast<uint64_t>(counts[s]) * lengths[s];
            if (lengths[s]) {
                if (!any) first = s;
                last = s;
                any = true;
            }
        }
        size_t span = any ? last - first + 1 : 0;
        auto varint_size = [](uint64_t v) { return v < 128 ? 1 : (64 - __builtin_clzll(v) + 6) / 7; };
        int64_t head = 1 + varint_size(any ? first : 0) + varint_size(span) + (span + 1) / 2;
        out[extra] = head + static_cast<int64_t>((nbits + 7) / 8);
    }
    return out;
}

std::vector<uint8_t> gap_pack(const uint64_t* gaps, size_t n, int extra, const uint64_t* codes,
                              const uint8_t* lengths, size_t alphabet) {
    uint64_t total = 0;
    for (size_t i = 0; i < n; ++i) {
        GapParts part(gaps[i], extra);
        if (part.symbol >= alphabet || !lengths[part.symbol]) throw Error("gap_pack: symbol without a code");
        total += lengths[part.symbol] + part.width;
    }
    std::vector<uint64_t> streamed = stream_order_codes(codes, lengths, alphabet, "gap_pack");
    BitWriter out(total);
    for (size_t i = 0; i < n; ++i) {
        GapParts part(gaps[i], extra);
        out.put(streamed[part.symbol], lengths[part.symbol]);
    }
    // the low bits, most significant first: up to 11 of them reversed by a table (the gaps of
    // a 1% selection keep a few), wider ones by the general field
    static const std::vector<uint16_t> reversed11 = [] {
        std::vector<uint16_t> table(1 << 11);
        for (uint64_t v = 0; v < table.size(); ++v) table[v] = static_cast<uint16_t>(to_stream(v, 11));
        return table;
    }();
    for (size_t i = 0; i < n; ++i) {
        GapParts part(gaps[i], extra);
        uint64_t low = part.v & ((1ULL << part.width) - 1);
        if (part.width <= 11)
            out.put(reversed11[low] >> (11 - part.width), part.width);
        else
            out.field(low, part.width);
    }
    return out.finish();
}

std::vector<uint8_t> rice_pack(const uint64_t* gaps, size_t n, int r) {
    if (r < 0 || r > 63) throw Error("Rice parameter out of range");
    uint64_t total = 0;
    for (size_t i = 0; i < n; ++i) total += (gaps[i] >> r) + 1 + r;
    BitWriter out(total);
    for (size_t i = 0; i < n; ++i) {  // q zeros then a one: in stream order, bit q alone
        uint64_t q = gaps[i] >> r;
        if (q < 63)
            out.put(1ULL << q, static_cast<int>(q) + 1);
        else
            out.field(1, static_cast<int64_t>(q) + 1);
    }
    const uint64_t mask = r ? (~0ULL >> (64 - r)) : 0;
    for (size_t i = 0; i < n; ++i) out.field(gaps[i] & mask, r);
    return out.finish();
}

MatrixCoding matrix_coding(const int64_t* indices, size_t count, int64_t rows, int64_t cols,
                           bool transpose) {
    if (rows < 1 || cols < 1) throw Error("matrix coding: empty grid");
    const int64_t size = rows * cols;
    const int64_t lines_total = transpose ? cols : rows, others_total = transpose ? rows : cols;
    std::vector<int64_t> line(count), rank(count), per_other(others_total, 0);
    bool grouped = true;  // every line's elements already together, lines ascending
    RowCursor at{cols};
    for (size_t i = 0; i < count; ++i) {
        if (indices[i] < 0 || indices[i] >= size) throw Error("matrix coding: position out of range");
        const int64_t col = at.column(indices[i]), row = at.row;
        line[i] = transpose ? col : row;
        rank[i] = transpose ? row : col;  // the other axis' index until ranked below
        ++per_other[rank[i]];
        grouped = grouped && (i == 0 || line[i] >= line[i - 1]);
    }
    MatrixCoding out;
    out.ranked = rank_axis(per_other);
    std::vector<int64_t>& rank_of = per_other;  // its counts are no longer needed
    for (size_t r = 0; r < out.ranked.size(); ++r) rank_of[out.ranked[r]] = static_cast<int64_t>(r);
    for (size_t i = 0; i < count; ++i) rank[i] = rank_of[rank[i]];
    // The elements line by line (a stable counting pass unless they already are: a row-major
    // orientation of sorted positions), then each line's in rank order from a bitmap of its
    // ranks: one pass and a word per 64 ranks a line, where two counting passes scattered
    // every element twice.
    std::vector<int64_t> by_line;
    if (!grouped) {
        std::vector<int64_t> starts(lines_total + 1, 0);
        for (size_t i = 0; i < count; ++i) ++starts[line[i] + 1];
        for (int64_t j = 0; j < lines_total; ++j) starts[j + 1] += starts[j];
        by_line.resize(count);
        for (size_t i = 0; i < count; ++i) by_line[starts[line[i]]++] = static_cast<int64_t>(i);
    }
    auto element = [&](size_t at) { return grouped ? static_cast<int64_t>(at) : by_line[at]; };
    const size_t nranked = out.ranked.size();
    std::vector<uint64_t> bits((nranked + 63) / 64, 0);
    std::vector<int64_t> slot(nranked);
    out.order.reserve(count);
    out.steps.reserve(count);
    for (size_t at = 0; at < count;) {
        const int64_t this_line = line[element(at)];
        size_t first_word = bits.size(), last_word = 0, n = 0;
        for (; at < count && line[element(at)] == this_line; ++at, ++n) {
            int64_t e = element(at), r = rank[e];
            slot[r] = e;
            bits[r >> 6] |= 1ULL << (r & 63);
            first_word = std::min<size_t>(first_word, r >> 6);
            last_word = std::max<size_t>(last_word, r >> 6);
        }
        out.lines.push_back(this_line);
        out.counts_less_one.push_back(n - 1);
        int64_t previous_rank = -1;
        for (size_t w = first_word; w <= last_word; ++w) {
            for (uint64_t word = bits[w]; word; word &= word - 1) {
                int64_t r = static_cast<int64_t>(64 * w) + __builtin_ctzll(word);
                out.order.push_back(slot[r]);
                out.steps.push_back(static_cast<uint64_t>(r - previous_rank - 1));
                previous_rank = r;
            }
            bits[w] = 0;
        }
    }
    return out;
}

namespace {

// dst[p] += v * scale for every (position p, value v), by blocks of 2^kBlockShift elements
// (256 KB of floats, within a core's L2): a counting pass by block, then the adds block by
// block, each block's in their given order (the same bits as adding them in order). Throws
// before adding any of them if a position lies outside [0, n).
constexpr int kBlockShift = 16;

void scatter_blocked(float* dst, int64_t n, const int64_t* positions, const float* values,
                     size_t count, float scale) {
    const size_t blocks = static_cast<size_t>((n - 1) >> kBlockShift) + 1;
    std::vector<size_t> next(blocks + 1, 0);
    for (size_t i = 0; i < count; ++i) {
        if (static_cast<uint64_t>(positions[i]) >= static_cast<uint64_t>(n))
            throw Error("scatter: position out of range");
        ++next[(positions[i] >> kBlockShift) + 1];
    }
    for (size_t b = 0; b < blocks; ++b) next[b + 1] += next[b];
    std::vector<size_t> ends(next.begin() + 1, next.end());
    std::vector<uint32_t> offset(count);  // within its block
    std::vector<float> value(count);
    for (size_t i = 0; i < count; ++i) {
        size_t at = next[positions[i] >> kBlockShift]++;
        offset[at] = static_cast<uint32_t>(positions[i] & ((int64_t{1} << kBlockShift) - 1));
        value[at] = values[i];
    }
    for (size_t b = 0, at = 0; b < blocks; ++b) {
        float* block = dst + (static_cast<int64_t>(b) << kBlockShift);
        for (; at < ends[b]; ++at) block[offset[at]] += value[at] * scale;
    }
}

}  // namespace

void scatter_add(float* dst, int64_t n, const int64_t* positions, const float* values,
                 size_t count, float scale) {
    // The first kProbe elements are added directly, counting the jumps between them wider
    // than kNear elements. Where most are (a column-major coding order: the matrix model's
    // transposed orientation jumps a row's width at every element) and the tensor is larger
    // than a few blocks, the rest go by blocks: adding them in that order missed the cache at
    // every element (32 payloads of 42k into a 2048 x 2048 sum: 9.1 ms, 1.8 in row order).
    constexpr size_t kProbe = 256, kBlockedFrom = 4096;
    constexpr int64_t kNear = 4096;
    constexpr size_t kAhead = 16;
    size_t i = 0, far = 0;
    for (const size_t probe = std::min(count, kProbe); i < probe; ++i) {
        if (static_cast<uint64_t>(positions[i]) >= static_cast<uint64_t>(n))
            throw Error("scatter: position out of range");
        far += i && static_cast<uint64_t>(positions[i] - positions[i - 1] + kNear) > 2 * kNear;
        dst[positions[i]] += values[i] * scale;
    }
    if (4 * far >= i && count - i >= kBlockedFrom && n >= (int64_t{4} << kBlockShift)) {
        scatter_blocked(dst, n, positions + i, values + i, count - i, scale);
        return;
    }
    for (; i < count; ++i) {
        if (static_cast<uint64_t>(positions[i]) >= static_cast<uint64_t>(n))
            throw Error("scatter: position out of range");
        if (i + kAhead < count && static_cast<uint64_t>(positions[i + kAhead]) < static_cast<uint64_t>(n))
            __builtin_prefetch(dst + positions[i + kAhead], 1);
        dst[positions[i]] += values[i] * scale;
    }
}

bool densify(float* dst, int64_t n, const int64_t* positions, const float* values, size_t count,
             float scale) {
    for (size_t i = 0; i < count; ++i)
        if (positions[i] < (i ? positions[i - 1] + 1 : 0) || positions[i] >= n) return false;
    constexpr int64_t kBlock = 4096;  // floats: 16 KB, cleared, then its positions written
    size_t i = 0;
    for (int64_t start = 0; start < n; start += kBlock) {
        const int64_t end = std::min(n, start + kBlock);
        std::memset(dst + start, 0, static_cast<size_t>(end - start) * sizeof(float));
        for (; i < count && positions[i] < end; ++i) dst[positions[i]] = 0.0f + values[i] * scale;
    }
    return true;
}

}  // namespace dr
