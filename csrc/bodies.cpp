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

// The gaps of a Huffman gap body (huffman.decode_gaps: extra-bits byte, table, then every
// code, then every gap's raw low bits), read one at a time by next(): callers turn them into
// positions as they come, with no array of gaps between. finish() checks the stream's end.
class GapStream {
  public:
    GapStream(Span body, uint64_t count) {
        ByteCursor in(body, "huffman gaps");
        const int extra = in.u8();
        if (extra > kGapTop) throw Error("huffman: bad extra bit count");
        std::vector<uint8_t> lengths = read_table(in, static_cast<uint64_t>(kGapLengths) << extra);
        Span data = in.rest();
        check_room(data.size, 0, count, 1, "huffman gaps");
        uint64_t code_end = 0;
        symbols_ = huffman_decode(data.data, data.size, 0, lengths.data(), lengths.size(), count,
                                  &code_end);
        // Per symbol, once: its gap less the low bits (2^(L-1) + top << width - 1) and the
        // low bits' width (kBadSymbol for a bit length outside 1..64), so that each gap costs
        // two lookups and an add where it cost the arithmetic.
        base_.assign(lengths.size(), 0);
        width_.assign(lengths.size(), kBadSymbol);
        for (size_t symbol = 0; symbol < lengths.size(); ++symbol) {
            int length = static_cast<int>(symbol >> extra);
            if (length < 1 || length > 64) continue;
            int width = std::max(length - 1 - extra, 0);
            width_[symbol] = static_cast<uint8_t>(width);
            base_[symbol] = (1ULL << (length - 1)) + ((symbol & ((1u << extra) - 1)) << width) - 1;
        }
        data_ = data;
        bits_ = BitReader(data.data, data.size, code_end);
        reversed_ = reverse64(bits_.peek());
    }

    // The next gap (count of them in all). The raw low bits, most significant first, come
    // from a 56-bit window bit-reversed once (not once a field); a field wider than the
    // window is read on its own. Reads past the end give zeros; finish() refuses a stream
    // that ran out.
    uint64_t next() {
        const uint32_t symbol = symbols_[at_++];
        const int width = width_[symbol];
        uint64_t low;
        if (width > kWindow) {
            if (width == kBadSymbol) throw Error("huffman: bad gap length symbol");
            bits_.skip(used_);
            low = bits_.field(width);
            reversed_ = reverse64(bits_.peek());
            used_ = 0;
        } else {  // no branch on width: a gap without low bits (width 0) shifts out to 0
            if (used_ + width > kWindow) {
                bits_.skip(used_);
                reversed_ = reverse64(bits_.peek());
                used_ = 0;
            }
            low = ((reversed_ << used_) >> 1) >> (63 - width);
            used_ += width;
        }
        return base_[symbol] + low;
    }

    void finish() {
        bits_.skip(used_);
        used_ = 0;
        if (bits_.pos() > bits_.total_bits()) throw Error("huffman gaps: raw bits truncated");
        expect_stream_end(data_.size, bits_.pos(), "huffman gaps");
    }

  private:
    static constexpr uint8_t kBadSymbol = 0xFF;
    static constexpr int kWindow = 56;
    std::vector<uint32_t> symbols_;
    std::vector<uint64_t> base_;
    std::vector<uint8_t> width_;
    Span data_{nullptr, 0};
    BitReader bits_{nullptr, 0, 0};
    uint64_t reversed_ = 0;
    size_t at_ = 0;
    int used_ = 0;
};

// gaps.from_gaps: the `count` gaps of a body as ascending positions below size, into out.
void read_positions(Span body, uint64_t count, int64_t size, int64_t* out) {
    GapStream gaps(body, count);
    uint64_t next = 0;  // the lowest position the next gap can lead to
    for (uint64_t i = 0; i < count; ++i) {
        uint64_t gap = gaps.next();
        if (gap >= static_cast<uint64_t>(size) - next) throw Error("decoded position outside the tensor");
        next += gap + 1;
        out[i] = static_cast<int64_t>(next - 1);
    }
    gaps.finish();
}

// Ranked columns inside the axis and distinct, in memory of the body's size (not the tensor's
// side): a bitmap of the axis where it has no more bits than the body, else a sorted copy.
void check_ranked(const std::vector<uint64_t>& ranked, uint64_t others_total, size_t body_bytes) {
    auto refuse = [] { throw Error("matrix indices: ranked columns out of range or repeated"); };
    if (others_total <= 8 * static_cast<uint64_t>(body_bytes)) {
        std::vector<uint64_t> seen((others_total + 63) / 64, 0);
        for (uint64_t c : ranked) {
            if (c >= others_total || (seen[c >> 6] >> (c & 63) & 1)) refuse();
            seen[c >> 6] |= 1ULL << (c & 63);
        }
        return;
    }
    std::vector<uint64_t> sorted(ranked);
    std::sort(sorted.begin(), sorted.end());
    for (size_t r = 0; r < sorted.size(); ++r)
        if (sorted[r] >= others_total || (r && sorted[r] == sorted[r - 1])) refuse();
}

}  // namespace

void gap_positions(const uint8_t* body, size_t nbytes, uint64_t count, int64_t size,
                   int64_t* out) {
    if (size < 0) throw Error("huffman gaps: negative tensor size");
    read_positions({body, nbytes}, count, size, out);
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
    std::vector<int64_t> lines(nlines);
    read_positions(in.section(), nlines, lines_total, lines.data());
    std::vector<uint64_t> counts(nlines);
    GapStream less_one(in.section(), nlines);
    uint64_t total = 0;  // each count is at most nranked <= count: no overflow before the check
    for (uint64_t j = 0; j < nlines; ++j) {
        counts[j] = less_one.next() + 1;
        if (counts[j] > nranked) throw Error("matrix indices: a count or gap beyond the ranked columns");
        total += counts[j];
        if (total > count) throw Error("matrix indices: line counts disagree with the header");
    }
    less_one.finish();
    if (total != count) throw Error("matrix indices: line counts disagree with the header");
    const int width = bit_length(static_cast<uint64_t>(others_total - 1));
    Span section = in.section();
    std::vector<uint64_t> ranked = read_fixed(section.data, section.size, 0, nranked, width);
    expect_stream_end(section.size, nranked * width, "matrix ranked columns");
    check_ranked(ranked, static_cast<uint64_t>(others_total), nbytes);
    // Each rank's and each line's share of a flat position, so that an element costs a
    // lookup and an add: line * cols + column, or column * cols + line when transposed.
    std::vector<int64_t> of_rank(nranked);
    for (uint64_t r = 0; r < nranked; ++r)
        of_rank[r] = transpose ? static_cast<int64_t>(ranked[r]) * cols : static_cast<int64_t>(ranked[r]);
    // every line's ranks advance by step + 1 from -1; rank r is column ranked[r]
    GapStream steps(in.rest(), count);
    for (uint64_t j = 0; j < nlines; ++j) {
        const int64_t line = transpose ? lines[j] : lines[j] * cols;
        uint64_t next = 0;  // the lowest rank the next step can lead to
        for (uint64_t left = counts[j]; left; --left) {
            uint64_t step = steps.next();
            if (step >= nranked - next) throw Error("matrix indices: rank beyond the ranked columns");
            next += step + 1;
            *out++ = line + of_rank[next - 1];
        }
    }
    steps.finish();
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
