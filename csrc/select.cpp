// Selection fused with error feedback: one pass over the dense gradient adds the residual in
// place and collects the candidates, each with its compensated value (read while its line is
// still in cache: picking among them later re-read the tensor at ~60k scattered positions,
// as much time as the pass); the exact top k are then picked among those few.
//
// The selected set is defined exactly (deepreduce_hvd/sparsify.py computes the same): the k
// largest magnitudes, ties at the boundary broken by the lower position, so the numpy path
// and this one produce identical payloads.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <thread>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "engine.h"

namespace dr {
namespace {

constexpr int64_t kChunks = 64, kChunk = 256;  // the sample: 64 runs of 256 elements
constexpr float kFloatMax = std::numeric_limits<float>::max();

// Positions (ascending) and their compensated values: `count` of them, in buffers sized
// ahead (for about 2k candidates, growing geometrically past that), trimmed by finish().
struct Candidates {
    std::vector<int64_t> positions;
    std::vector<float> values;
    size_t count = 0;
    void room(size_t extra) {  // grows geometrically: amortised O(1) a candidate
        if (count + extra <= positions.size()) return;
        size_t size = std::max(2 * positions.size(), count + extra + 1024);
        positions.resize(size);
        values.resize(size);
    }
    void add(int64_t i, float v) {
        room(1);
        positions[count] = i;
        values[count++] = v;
    }
    void finish() {
        positions.resize(count);
        values.resize(count);
    }
};

inline float compensated(const float* grad, const float* residual, int64_t i) {
    return residual ? residual[i] + grad[i] : grad[i];
}

// A magnitude below which at most about 1.5 k + slack elements are expected (0: take all),
// from evenly spaced contiguous runs (cache friendly; any bias only costs candidates).
float estimate_cut(const float* grad, const float* residual, int64_t n, int64_t k) {
    const int64_t samples = kChunks * kChunk;
    double keep = (1.5 * k + 4.0 * std::sqrt(static_cast<double>(k))) / n;
    if (n < 4 * samples || keep >= 1.0) return 0.0f;
    std::vector<float> sample(samples);
    for (int64_t c = 0; c < kChunks; ++c) {
        int64_t base = c * ((n - kChunk) / (kChunks - 1));
        for (int64_t j = 0; j < kChunk; ++j)
            sample[c * kChunk + j] = std::fabs(compensated(grad, residual, base + j));
    }
    int64_t at = static_cast<int64_t>((1.0 - keep) * (samples - 1));
    std::nth_element(sample.begin(), sample.begin() + at, sample.end());
    return sample[at];
}

// The fused pass: compensate in place (when a residual is given) and collect the positions
// whose magnitude is >= cut (> cut when kStrict). Returns whether every value was finite.
// Vector versions compare 32 values at a time and walk the set bits of a movemask, so the
// few candidates (about 1.5%) cost a branch each and the rest nothing.
template <bool kStrict>
inline bool keep(float m, float cut) { return kStrict ? m > cut : m >= cut; }

template <bool kResidual, bool kStrict>
bool scan_scalar(const float* grad, float* residual, int64_t lo, int64_t n, float cut,
                 Candidates* out) {
    bool finite = true;
    for (int64_t i = lo; i < n; ++i) {
        float v = kResidual ? residual[i] + grad[i] : grad[i];
        if (kResidual) residual[i] = v;
        float m = std::fabs(v);
        finite &= m <= kFloatMax;
        if (keep<kStrict>(m, cut)) out->add(i, v);
    }
    return finite;
}

#if defined(__x86_64__)
template <bool kResidual, bool kStrict>
__attribute__((target("avx2"))) bool scan_avx2(const float* grad, float* residual, int64_t n,
                                               float cut, Candidates* out) {
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256 vcut = _mm256_set1_ps(cut), vmax = _mm256_set1_ps(kFloatMax);
    __m256 ok = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        uint32_t bits = 0;
        for (int q = 0; q < 4; ++q) {
            __m256 v = _mm256_loadu_ps(grad + i + 8 * q);
            if (kResidual) {
                v = _mm256_add_ps(_mm256_loadu_ps(residual + i + 8 * q), v);
                _mm256_storeu_ps(residual + i + 8 * q, v);
            }
            __m256 m = _mm256_and_ps(v, abs_mask);
            __m256 hit = kStrict ? _mm256_cmp_ps(m, vcut, _CMP_GT_OQ) : _mm256_cmp_ps(m, vcut, _CMP_GE_OQ);
            bits |= static_cast<uint32_t>(_mm256_movemask_ps(hit)) << (8 * q);
            ok = _mm256_and_ps(ok, _mm256_cmp_ps(m, vmax, _CMP_LE_OQ));
        }
        const float* c = kResidual ? residual : grad;  // just written or read: in L1
        for (; bits; bits &= bits - 1) out->add(i + __builtin_ctz(bits), c[i + __builtin_ctz(bits)]);
    }
    bool finite = _mm256_movemask_ps(ok) == 0xFF;
    return scan_scalar<kResidual, kStrict>(grad, residual, i, n, cut, out) && finite;
}

template <bool kResidual, bool kStrict>
bool scan_sse2(const float* grad, float* residual, int64_t n, float cut,
               Candidates* out) {
    const __m128 abs_mask = _mm_castsi128_ps(_mm_set1_epi32(0x7fffffff));
    const __m128 vcut = _mm_set1_ps(cut), vmax = _mm_set1_ps(kFloatMax);
    int ok = 0xF;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        uint32_t bits = 0;
        for (int q = 0; q < 4; ++q) {
            __m128 v = _mm_loadu_ps(grad + i + 4 * q);
            if (kResidual) {
                v = _mm_add_ps(_mm_loadu_ps(residual + i + 4 * q), v);
                _mm_storeu_ps(residual + i + 4 * q, v);
            }
            __m128 m = _mm_and_ps(v, abs_mask);
            __m128 hit = kStrict ? _mm_cmpgt_ps(m, vcut) : _mm_cmpge_ps(m, vcut);
            bits |= static_cast<uint32_t>(_mm_movemask_ps(hit)) << (4 * q);
            ok &= _mm_movemask_ps(_mm_cmple_ps(m, vmax));
        }
        const float* c = kResidual ? residual : grad;  // just written or read: in L1
        for (; bits; bits &= bits - 1) out->add(i + __builtin_ctz(bits), c[i + __builtin_ctz(bits)]);
    }
    return scan_scalar<kResidual, kStrict>(grad, residual, i, n, cut, out) && ok == 0xF;
}
#endif

template <bool kStrict>
bool scan_dispatch(const float* grad, float* residual, int64_t n, float cut,
                   Candidates* out) {
#if defined(__x86_64__)
    static const bool avx2 = __builtin_cpu_supports("avx2");
    if (avx2) return residual ? scan_avx2<true, kStrict>(grad, residual, n, cut, out)
                              : scan_avx2<false, kStrict>(grad, residual, n, cut, out);
    return residual ? scan_sse2<true, kStrict>(grad, residual, n, cut, out)
                    : scan_sse2<false, kStrict>(grad, residual, n, cut, out);
#else
    return residual ? scan_scalar<true, kStrict>(grad, residual, 0, n, cut, out)
                    : scan_scalar<false, kStrict>(grad, residual, 0, n, cut, out);
#endif
}

bool scan_range(const float* grad, float* residual, int64_t n, float cut, bool strict,
                Candidates* out) {
    return strict ? scan_dispatch<true>(grad, residual, n, cut, out)
                  : scan_dispatch<false>(grad, residual, n, cut, out);
}

// The fused pass over large tensors on a few threads, each over its own contiguous range
// (its candidates, ascending, appended in range order): the pass is bound by memory
// bandwidth, which one core does not fill.
constexpr int64_t kPerThread = int64_t{1} << 20;  // elements a thread must have to pay
// `expected`: about how many candidates to make room for. Leaves `out` finished.
bool scan(const float* grad, float* residual, int64_t n, float cut, bool strict, size_t expected,
          Candidates* out) {
    static const int hardware = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    int nthreads = static_cast<int>(std::min<int64_t>({hardware, 4, n / kPerThread}));
    if (nthreads < 2) {
        out->room(expected);
        bool finite = scan_range(grad, residual, n, cut, strict, out);
        out->finish();
        return finite;
    }
    int64_t chunk = (n / nthreads + 31) / 32 * 32;  // whole vector blocks per range
    std::vector<Candidates> parts(nthreads);
    std::vector<char> finite(nthreads, 1);
    run_parallel(nthreads, [&](int t) {
        int64_t lo = std::min(n, t * chunk), hi = t + 1 == nthreads ? n : std::min(n, lo + chunk);
        parts[t].room(expected / nthreads);
        finite[t] = scan_range(grad + lo, residual ? residual + lo : nullptr, hi - lo, cut,
                               strict, &parts[t]);
        parts[t].finish();
        for (auto& i : parts[t].positions) i += lo;
    });
    bool all_finite = true;
    for (int t = 0; t < nthreads; ++t) {
        all_finite &= finite[t] != 0;
        out->positions.insert(out->positions.end(), parts[t].positions.begin(),
                              parts[t].positions.end());
        out->values.insert(out->values.end(), parts[t].values.begin(), parts[t].values.end());
    }
    out->count = out->positions.size();
    return all_finite;
}

// The k-th largest of `bits` (magnitudes as their float bit patterns, which order as unsigned
// integers), and in *above how many are larger: a two-level radix select, counting the top 16
// bits and then, among the elements of the bucket that holds the k-th, the low 16 (two linear
// passes; nth_element over a sizeable share of the tensor cost more: the whole selection of
// 10% of 4M elements took 15.8 ms with it, 8.6 with this). Each level's scan for the bucket
// starts at the largest bucket used, not at the top of the 2^16 (most are empty).
uint32_t kth_largest(const std::vector<uint32_t>& bits, int64_t k, int64_t* above_out) {
    std::vector<uint32_t> count(1 << 16, 0);
    uint32_t high = 0;
    for (uint32_t b : bits) {
        ++count[b >> 16];
        high = std::max(high, b >> 16);
    }
    int64_t above = 0;
    for (;; --high) {  // the bucket where the count from the top reaches k
        if (above + count[high] >= k) break;
        above += count[high];
    }
    std::fill(count.begin(), count.end(), 0);
    uint32_t low = 0;
    for (uint32_t b : bits) {
        if ((b >> 16) == high) {
            ++count[b & 0xFFFF];
            low = std::max(low, b & 0xFFFF);
        }
    }
    for (;; --low) {
        if (above + count[low] >= k) break;
        above += count[low];
    }
    *above_out = above;
    return (high << 16) | low;
}

// From candidates (ascending, holding every element of magnitude >= the k-th largest), the
// exact top k and their values: all above the k-th magnitude, then the lowest-positioned ties.
// Written without a branch per candidate (about a third of them are dropped, unpredictably).
void exact_topk(const Candidates& cand, int64_t k, std::vector<int64_t>* indices,
                std::vector<float>* values) {
    std::vector<uint32_t> mags(cand.values.size());
    for (size_t t = 0; t < mags.size(); ++t) {
        float m = std::fabs(cand.values[t]);
        std::memcpy(&mags[t], &m, sizeof m);
    }
    int64_t above = 0;
    uint32_t kth = kth_largest(mags, k, &above);
    int64_t ties = k - above;
    indices->resize(static_cast<size_t>(k) + 1);  // one slot past: written, never kept
    values->resize(static_cast<size_t>(k) + 1);
    int64_t* out_positions = indices->data();
    float* out_values = values->data();
    size_t taken = 0;
    for (size_t t = 0; t < mags.size(); ++t) {
        bool tie = mags[t] == kth;
        bool take = mags[t] > kth || (tie && ties > 0);
        ties -= tie & take;
        out_positions[taken] = cand.positions[t];
        out_values[taken] = cand.values[t];
        taken += take;
    }
    indices->resize(static_cast<size_t>(k));
    values->resize(static_cast<size_t>(k));
}

}  // namespace

bool select_topk(const float* grad, float* residual, int64_t n, int64_t k,
                 std::vector<int64_t>* indices, std::vector<float>* values) {
    if (k < 0 || k > n) throw Error("top-k: k out of range");
    float cut = estimate_cut(grad, residual, n, k);
    Candidates cand;
    if (!scan(grad, residual, n, cut, false, static_cast<size_t>(std::min<int64_t>(n, 2 * k)),
              &cand))
        return false;
    if (static_cast<int64_t>(cand.positions.size()) < k) {
        // the sampled cut was too high: every position is a candidate
        const float* c = residual ? residual : grad;
        cand.positions.resize(n);
        cand.values.assign(c, c + n);
        for (int64_t i = 0; i < n; ++i) cand.positions[i] = i;
    }
    if (k == 0) {
        indices->clear();
        values->clear();
    } else {
        exact_topk(cand, k, indices, values);
    }
    return true;
}

bool select_threshold(const float* grad, float* residual, int64_t n, float tau,
                      std::vector<int64_t>* indices, std::vector<float>* values) {
    Candidates picked;
    if (!scan(grad, residual, n, tau, true, 0, &picked)) return false;
    indices->swap(picked.positions);
    values->swap(picked.values);
    return true;
}

}  // namespace dr
