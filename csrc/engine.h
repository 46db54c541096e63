// DeepReduce's native codec engine: plain C++ kernels, no Python. module.cpp exposes them.
//
// Conventions shared with the numpy path (deepreduce_hvd/bits.py, bloom_filter.py,
// sparsify.py), which produces identical bytes:
// - a bit stream puts stream bit t in byte t >> 3 at bit (t & 7) (numpy's packbits
//   bitorder="little"); a field of width w is written most significant bit first;
// - kernels throw dr::Error for malformed input; the glue turns it into DeepReduceError, and
//   std::bad_alloc into MemoryError, so nothing reaches std::terminate.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <stdexcept>
#include <thread>
#include <vector>

namespace dr {

struct Error : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// work(0) .. work(n - 1), each but the first on a thread of its own (here, when no thread can
// start); once all have ended, the first failure among them is rethrown.
template <typename Work>
void run_parallel(int n, Work work) {
    std::vector<std::exception_ptr> failures(n);
    auto guarded = [&](int t) {
        try {
            work(t);
        } catch (...) {
            failures[t] = std::current_exception();
        }
    };
    std::vector<std::thread> pool;
    try {
        for (int t = 1; t < n; ++t) pool.emplace_back(guarded, t);
    } catch (...) {
        for (int t = static_cast<int>(pool.size()) + 1; t < n; ++t) guarded(t);
    }
    guarded(0);
    for (auto& th : pool) th.join();
    for (auto& f : failures)
        if (f) std::rethrow_exception(f);
}

// ---- bit streams (bits.cpp) ----
// Fields of the given widths (any width >= 0; bits above 64 are zeros) -> packed bytes.
std::vector<uint8_t> pack_fields(const uint64_t* values, const int64_t* widths, size_t n);
// Each symbol's canonical code (codes[s], lengths[s] bits, at most 15) reversed into stream
// order once, for the packers that put one code per element; `what` names the caller.
std::vector<uint64_t> stream_order_codes(const uint64_t* codes, const uint8_t* lengths,
                                         size_t alphabet, const char* what);
// The canonical codes (codes[s], lengths[s] bits) of the symbols, then `nbits` single bits
// (0 or non-zero): the entropy value codec's levels and sign bits, as pack_fields packs them.
std::vector<uint8_t> huffman_pack(const int64_t* symbols, size_t n, const uint64_t* codes,
                                  const uint8_t* lengths, size_t alphabet, const uint8_t* bits,
                                  size_t nbits);
// Same with one width for every field.
std::vector<uint8_t> pack_fixed(const uint64_t* values, size_t n, int width);
// count fields of `width` (<= 64) bits starting at bit `start`.
std::vector<uint64_t> read_fixed(const uint8_t* data, size_t nbytes, uint64_t start,
                                 uint64_t count, int width);
// Fields of the given widths (each <= 64) read one after another from bit `start`.
std::vector<uint64_t> read_fields(const uint8_t* data, size_t nbytes, uint64_t start,
                                  const int64_t* widths, size_t n);
constexpr size_t kMaxHuffmanAlphabet = 4096;  // huffman_code.MAX_ALPHABET (12-bit symbols)
// Canonical Huffman decode of `count` symbols (lengths[s] = code length of symbol s, 0 if
// unused, at most 15) from bit `start`; returns the symbols and sets *end to the bit after.
std::vector<uint32_t> huffman_decode(const uint8_t* data, size_t nbytes, uint64_t start,
                                     const uint8_t* lengths, size_t alphabet, uint64_t count,
                                     uint64_t* end);
// Huffman code lengths of the symbols with non-zero frequency, at most max_length bits; the
// same algorithm and tie-breaking as huffman.code_lengths (so both give the same code).
std::vector<uint8_t> huffman_lengths(const int64_t* freqs, size_t n, int max_length);
// Rice code (all unary quotients, then all r-bit remainders) of `count` gaps from bit
// `start` -> the ascending positions they lead to in a tensor of `size` elements (one past
// would be an error: a gap beyond the tensor). Sets *end to the bit after.
std::vector<int64_t> rice_positions(const uint8_t* data, size_t nbytes, uint64_t start,
                                    uint64_t count, int r, int64_t size, uint64_t* end);

// ---- gap codes (gaps.cpp): a gap g is coded through v = g + 1, its bit length L, and the
// `extra` bits below v's leading one: symbol = (L << extra) + top, then the low bits raw ----
constexpr int kGapTop = 3;       // bits below the leading one kept by the histogram
constexpr int kGapLengths = 65;  // bit lengths 0..64
// (length, top kGapTop bits) histogram of gaps + 1: kGapLengths x 2^kGapTop counts.
std::vector<int64_t> gap_histogram(const uint64_t* gaps, size_t n);
// The exact body bytes of the Huffman gap code for extra = 0..3 from such a histogram (the
// extra byte, the 4-bit table, codes and raw bits), as huffman.GapStats.plan computes them.
std::vector<int64_t> gap_plan_bytes(const int64_t* hist);
// All codes (codes[symbol], lengths[symbol]), then all low bits.
std::vector<uint8_t> gap_pack(const uint64_t* gaps, size_t n, int extra, const uint64_t* codes,
                              const uint8_t* lengths, size_t alphabet);
// Rice code of the gaps with parameter r (unary quotients, then r-bit remainders).
std::vector<uint8_t> rice_pack(const uint64_t* gaps, size_t n, int r);
// The matrix model's coding of sorted flat positions of a rows x cols tensor (the encoder's
// side of matrix_decode; rows and columns swapped when transpose): the other axis ranked by
// how many elements each holds (descending, ties by index), the elements ordered by (line,
// rank) (a counting pass by line where they are not grouped already, then each line's ranks
// from a bitmap), then each line's rank steps. Same results as the numpy twin in
// deepreduce_hvd/codecs/index/matrix.py.
struct MatrixCoding {
    std::vector<int64_t> order, ranked, lines;
    std::vector<uint64_t> counts_less_one, steps;
};
MatrixCoding matrix_coding(const int64_t* indices, size_t count, int64_t rows, int64_t cols,
                           bool transpose);
// Both orientations' sizes without their coding: per orientation (transpose 0, then 1) the
// number of lines and of ranked units, then the gap histograms (as gap_histogram) of the line
// gaps, the counts - 1 and the rank steps that matrix_coding would make. Positions ascending.
constexpr size_t kMatrixHistogram = 2 + 3 * (kGapLengths << kGapTop);
std::vector<int64_t> matrix_histograms(const int64_t* indices, size_t count, int64_t rows,
                                       int64_t cols);
// ---- whole entropy-codec bodies (bodies.cpp), each as its numpy twin decodes it ----
constexpr uint64_t kMaxEntropyLevels = 4096;  // value/entropy.py's MAX_LEVELS
// Each writes `count` items to out; the caller makes room only after checking that count
// fits the body (every position costs at least one bit, every value two).
// A Huffman gap body (huffman.decode_gaps) -> the ascending positions below size.
void gap_positions(const uint8_t* body, size_t nbytes, uint64_t count, int64_t size,
                   int64_t* out);
// A matrix-model body (matrix.decode) -> flat positions in coding order.
void matrix_decode(const uint8_t* body, size_t nbytes, uint64_t count, int64_t rows,
                   int64_t cols, bool transpose, int64_t* out);
// An entropy value body (EntropyValue.decode) -> finite float32 values.
void entropy_values(const uint8_t* body, size_t nbytes, uint64_t count, float* out);

// dst[positions[i]] += values[i] * scale; positions must lie in [0, n) (callers pass decoded,
// range-checked positions: one outside throws, after some of the others were added; a
// separate checking pass over the positions cost a quarter of a receiver's scatter). Where
// the positions wander (a column-major order), by cache-sized blocks of the destination:
// each position's adds stay in the given order, so the bits are the same.
void scatter_add(float* dst, int64_t n, const int64_t* positions, const float* values,
                 size_t count, float scale);
// dst[0:n] = 0 but dst[positions[i]] = 0 + values[i] * scale (the bits of scatter_add into
// zeros) in one pass over dst, for strictly ascending positions within [0, n): the clearing
// and the scatter of one payload's range, each cache-sized block written while it is hot.
// False (nothing written) otherwise.
bool densify(float* dst, int64_t n, const int64_t* positions, const float* values, size_t count,
             float scale);

// ---- sorted runs (merge.cpp) ----
// The unique positions of runs[r] = positions[starts[r]:starts[r+1]] and the float32 sums
// there, each sum 0 + the runs' values in run order, written to out_positions / out_sums
// (room for every input element); returns how many. -1 (nothing written) when a run is not
// strictly ascending.
int64_t merge_sum(const int64_t* positions, const float* values, const int64_t* starts,
                  size_t runs, int64_t* out_positions, float* out_sums);
// in[i] = whether a[i] is in b. False (nothing written) unless both are strictly ascending.
bool member_sorted(const int64_t* a, size_t na, const int64_t* b, size_t nb, uint8_t* in);

// ---- selection with error feedback (select.cpp) ----
// When residual is given it is replaced by residual + grad (the compensated gradient) in the
// same pass that selects. Returns false (nothing selected) if any compensated value is NaN or
// Inf. Top-k: the k largest magnitudes, ties broken by the lower position; output ascending.
bool select_topk(const float* grad, float* residual, int64_t n, int64_t k,
                 std::vector<int64_t>* indices, std::vector<float>* values);
// Every position whose compensated magnitude exceeds tau.
bool select_threshold(const float* grad, float* residual, int64_t n, float tau,
                      std::vector<int64_t>* indices, std::vector<float>* values);

// ---- half precision (half.cpp) ----
// Whether the processor converts float32 <-> float16 in hardware (x86 F16C); the kernels
// below need it (the numpy path is used elsewhere).
bool have_f16c();
// dst = float16(src), round to nearest even; when keep_error, src -= float32(dst) in the same
// pass (what fp16 rounding lost, kept for error feedback). Returns whether every half is
// finite (no NaN, no Inf, nothing beyond half precision's range).
bool to_half(float* src, uint16_t* dst, size_t n, bool keep_error);
// dst = float(src) * 2**-exponent, as numpy's ldexp of the float32 cast gives (F16C only).
void from_half(const uint16_t* src, float* dst, size_t n, int exponent);

// ---- Bloom filter (bloom.cpp) ----
std::vector<uint8_t> bloom_insert(const int64_t* positions, size_t n, uint64_t m, int h,
                                  uint64_t seed_key);
// Positions of [0, size) whose h bits are all set, ascending; throws dr::Error as soon as
// more than max_positives are found.
std::vector<int64_t> bloom_query(const uint8_t* bits, uint64_t m, int h, uint64_t seed_key,
                                 int64_t size, int threads, int64_t max_positives);

// For each positive, the size of the smallest conflict set (positives sharing one of its
// bits) it belongs to.
std::vector<int64_t> bloom_conflicts(const int64_t* positives, size_t n, uint64_t m, int h,
                                     uint64_t seed_key);

}  // namespace dr
