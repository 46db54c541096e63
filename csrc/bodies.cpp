// Whole bodies of the entropy codecs decoded in one call: the matrix model's and the Huffman
// gap code's positions, the entropy value codec's values. Python parsed these bodies between
// a dozen kernel calls (over a third of a 42k-element payload's decode, all of it under the
// GIL, so a pool of decoding threads queued on it); here the parse, every check and the
// kernels run in one released call. Mirrors deepreduce_hvd/codecs/index/{huffman,matrix}.py
// and codecs/value/entropy.py, which hold the numpy twins: the same results, and the same
// refusals (dr::Error where they raise DeepReduceError).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "bitstream.h"
#include "engine.h"

namespace dr {
namespace {

struct Span {
    const uint8_t* data;
    size_t size;
};

// wire/bytestream.ByteReader over a body: bounds-checked bytes, limited LEB128 varints.
class ByteCursor {
  public:
    ByteCursor(Span body, const char* what) : body_(body), what_(what) {}

    uint8_t u8() { return take(1).data[0]; }

    uint64_t varint(uint64_t limit) {
        uint64_t value = 0;
        for (int shift = 0;; shift += 7) {
            if (shift == 70) throw Error(what_ + ": varint too long");
            uint8_t byte = take(1).data[0];
            uint64_t part = byte & 0x7F;
            if (shift > 57 && part >> (64 - shift))  // bits beyond 64: over any limit
                throw Error(what_ + ": value exceeds its limit");
            value |= part << shift;
            if (!(byte & 0x80)) break;
        }
        if (value > limit) throw Error(what_ + ": value exceeds its limit");
        return value;
    }

    Span take(size_t n) {
        if (n > remaining()) throw Error(what_ + " truncated");
        Span out{body_.data + pos_, n};
        pos_ += n;
        return out;
    }

    Span section() { return take(varint(remaining())); }
    Span rest() { return take(remaining()); }
    size_t remaining() const { return body_.size - pos_; }

  private:
    Span body_;
    size_t pos_ = 0;
    std::string what_;
};

// huffman_code.read_table: symbols first..first + count - 1 as 4-bit lengths; a prefix code.
std::vector<uint8_t> read_table(ByteCursor& in, uint64_t alphabet) {
    uint64_t first = in.varint(alphabet);
    uint64_t count = in.varint(alphabet - first);
    Span packed = in.take((count + 1) / 2);
    std::vector<uint8_t> lengths(alphabet, 0);
    uint64_t kraft = 0;  // in units of 2**-15: at most 4096 symbols, so no overflow
    for (uint64_t i = 0; i < count; ++i) {
        uint8_t length = (packed.data[i / 2] >> (4 * (i & 1))) & 15;
        lengths[first + i] = length;
        if (length) kraft += 1ULL << (15 - length);
    }
    if (kraft > 1ULL << 15) throw Error("Huffman table is not a prefix code");
    return lengths;
}

// The `count` gaps of a Huffman gap body (huffman.decode_gaps: extra-bits byte, table, then
// every code, then every gap's raw low bits), each handed to visit(i, gap) in order: callers
// turn them into positions as they come, with no array of gaps between.
template <typename Visit>
void each_gap(Span body, uint64_t count, Visit visit) {
    ByteCursor in(body, "huffman gaps");
    const int extra = in.u8();
    if (extra > kGapTop) throw Error("huffman: bad extra bit count");
    std::vector<uint8_t> lengths = read_table(in, static_cast<uint64_t>(kGapLengths) << extra);
    Span data = in.rest();
    check_room(data.size, 0, count, 1, "huffman gaps");
    uint64_t code_end = 0;
    std::vector<uint32_t> symbols = huffman_decode(data.data, data.size, 0, lengths.data(),
                                                   lengths.size(), count, &code_end);
    // Per symbol, once: its gap less the low bits (2^(L-1) + top << width - 1) and the low
    // bits' width (kBadSymbol for a bit length outside 1..64), so that each gap costs two
    // lookups and an add where it cost the arithmetic.
    constexpr uint8_t kBadSymbol = 0xFF;
    std::vector<uint64_t> base(lengths.size(), 0);
    std::vector<uint8_t> width_of(lengths.size(), kBadSymbol);
    for (size_t symbol = 0; symbol < lengths.size(); ++symbol) {
        int length = static_cast<int>(symbol >> extra);
        if (length < 1 || length > 64) continue;
        int width = std::max(length - 1 - extra, 0);
        width_of[symbol] = static_cast<uint8_t>(width);
        base[symbol] = (1ULL << (length - 1)) + ((symbol & ((1u << extra) - 1)) << width) - 1;
    }
    BitReader bits(data.data, data.size, code_end);
    // The raw low bits, most significant first, from a 56-bit window bit-reversed once
    // (not once a field); a field wider than the window is read on its own. Reads past the
    // end give zeros; a stream that ran out is refused after the loop.
    constexpr int kWindow = 56;
    uint64_t reversed = reverse64(bits.peek());
    int used = 0;
    for (uint64_t i = 0; i < count; ++i) {
        const uint32_t symbol = symbols[i];
        const int width = width_of[symbol];
        uint64_t low;
        if (width > kWindow) {
            if (width == kBadSymbol) throw Error("huffman: bad gap length symbol");
            bits.skip(used);
            low = bits.field(width);
            reversed = reverse64(bits.peek());
            used = 0;
        } else {  // no branch on width: a gap without low bits (width 0) shifts out to 0
            if (used + width > kWindow) {
                bits.skip(used);
                reversed = reverse64(bits.peek());
                used = 0;
            }
            low = ((reversed << used) >> 1) >> (63 - width);
            used += width;
        }
        visit(i, base[symbol] + low);
    }
    bits.skip(used);
    if (bits.pos() > bits.total_bits()) throw Error("huffman gaps: raw bits truncated");
    expect_stream_end(data.size, bits.pos(), "huffman gaps");
}

// gaps.from_gaps as a visitor: ascending positions below size, written to out.
struct Positions {
    int64_t* out;
    int64_t size;
    uint64_t next = 0;  // the lowest position the next gap can lead to
    void operator()(uint64_t i, uint64_t gap) {
        if (gap >= static_cast<uint64_t>(size) - next)
            throw Error("decoded position outside the tensor");
        next += gap + 1;
        out[i] = static_cast<int64_t>(next - 1);
    }
};

}  // namespace

void gap_positions(const uint8_t* body, size_t nbytes, uint64_t count, int64_t size,
                   int64_t* out) {
    if (size < 0) throw Error("huffman gaps: negative tensor size");
    each_gap({body, nbytes}, count, Positions{out, size});
}

void matrix_decode(const uint8_t* body, size_t nbytes, uint64_t count, int64_t rows,
                   int64_t cols, bool transpose, int64_t* out) {
    if (rows < 2 || cols < 2) throw Error("matrix indices: not a 2-D grid");
    const int64_t lines_total = transpose ? cols : rows, others_total = transpose ? rows : cols;
    ByteCursor in({body, nbytes}, "matrix indices");
    uint64_t nlines = in.varint(std::min<uint64_t>(lines_total, count));
    uint64_t nranked = in.varint(std::min<uint64_t>(others_total, count));
    if (count && !(nlines && nranked))
        throw Error("matrix indices: no lines or columns for a non-empty selection");
    std::vector<int64_t> lines(nlines), counts(nlines);
    each_gap(in.section(), nlines, Positions{lines.data(), lines_total});
    uint64_t total = 0;  // each count is at most nranked <= count: no overflow before the check
    each_gap(in.section(), nlines, [&](uint64_t j, uint64_t less_one) {
        if (less_one >= nranked) throw Error("matrix indices: a count or gap beyond the ranked columns");
        counts[j] = static_cast<int64_t>(less_one) + 1;
        total += less_one + 1;
        if (total > count) throw Error("matrix indices: line counts disagree with the header");
    });
    if (total != count) throw Error("matrix indices: line counts disagree with the header");
    const int width = bit_length(static_cast<uint64_t>(others_total - 1));
    Span section = in.section();
    std::vector<uint64_t> ranked = read_fixed(section.data, section.size, 0, nranked, width);
    expect_stream_end(section.size, nranked * width, "matrix ranked columns");
    std::vector<uint64_t> sorted(ranked);  // memory of the body's size, not the tensor's side
    std::sort(sorted.begin(), sorted.end());
    for (size_t r = 0; r < sorted.size(); ++r)
        if (sorted[r] >= static_cast<uint64_t>(others_total) || (r && sorted[r] == sorted[r - 1]))
            throw Error("matrix indices: ranked columns out of range or repeated");
    // every line's ranks advance by step + 1 from -1; rank r is column ranked[r]
    uint64_t line = 0, left = nlines ? counts[0] : 0, rank = ~0ULL;
    each_gap(in.rest(), count, [&](uint64_t i, uint64_t step) {
        if (!left) {  // counts are at least 1 and sum to count: a next line exists
            left = counts[++line];
            rank = ~0ULL;
        }
        --left;
        if (step >= nranked - (rank + 1)) throw Error("matrix indices: rank beyond the ranked columns");
        rank += step + 1;
        int64_t other = static_cast<int64_t>(ranked[rank]);
        out[i] = transpose ? other * cols + lines[line] : lines[line] * cols + other;
    });
}

void entropy_values(const uint8_t* body, size_t nbytes, uint64_t count, float* out) {
    ByteCursor in({body, nbytes}, "entropy values");
    uint64_t levels = in.varint(kMaxEntropyLevels);
    float bounds[2];
    std::memcpy(bounds, in.take(8).data, 8);  // little-endian float32 lo, hi (x86)
    const double lo = bounds[0], hi = bounds[1];
    if (levels < 2 || !(std::isfinite(lo) && std::isfinite(hi) && 0 <= lo && lo <= hi))
        throw Error("entropy values: bad quantiser");
    std::vector<uint8_t> lengths = read_table(in, levels);
    Span data = in.rest();
    check_room(data.size, 0, count, 1, "Huffman stream");
    uint64_t end = 0;
    std::vector<uint32_t> q;
    if (count) q = huffman_decode(data.data, data.size, 0, lengths.data(), levels, count, &end);
    expect_stream_end(data.size, end + count, "entropy values");  // the sign bits end it
    // sign * (lo + q * step) in double, as the numpy twin computes it, then float32: once a
    // level (rounding is symmetric, so the sign can follow the cast)
    const double step = hi > lo ? (hi - lo) / static_cast<double>(levels - 1) : 1.0;
    std::vector<float> level(levels);
    for (uint64_t l = 0; l < levels; ++l) {
        level[l] = static_cast<float>(lo + static_cast<double>(l) * step);
        if (!std::isfinite(level[l])) throw Error("entropy values: the body decodes to NaN or Inf");
    }
    for (uint64_t i = 0; i < count; ++i) {
        uint64_t bit = end + i;
        float v = level[q[i]];
        out[i] = ((data.data[bit >> 3] >> (bit & 7)) & 1) ? -v : v;
    }
}

}  // namespace dr
