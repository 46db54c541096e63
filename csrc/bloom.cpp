// Bloom-filter insertion and whole-tensor query for DeepReduce's "bloom" index codec.
//
// The hash scheme is defined once, in deepreduce_hvd/bloom_filter.py, and mirrored here bit
// for bit: key = fmix64(position + seed_key); h1 = low 32 bits, h2 = high 32 bits | 1;
// probe j sets bit ((h1 + j*h2) mod 2^32) * m >> 32. Filters are little-endian bit arrays.
// The query scans every position on several threads; a worker's failure (an allocation, or
// more positives than the payload can justify) is carried back to the caller, never thrown
// out of the thread.
#include <algorithm>
#include <atomic>
#include <climits>
#include <string>

#include "engine.h"

namespace dr {
namespace {

inline uint64_t fmix64(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ULL;
    k ^= k >> 33;
    return k;
}

inline uint32_t probe(uint32_t h1, uint32_t h2, uint32_t j, uint64_t m) {
    uint32_t g = h1 + j * h2;  // wraps mod 2^32 by definition
    return static_cast<uint32_t>((static_cast<uint64_t>(g) * m) >> 32);
}

inline bool test_bit(const uint8_t* bits, uint32_t b) { return (bits[b >> 3] >> (b & 7)) & 1u; }

void check_params(uint64_t m, int h) {
    if (m == 0 || m > 0xFFFFFFFFULL || h < 1 || h > 64)
        throw Error("bloom: need 0 < m < 2**32 and 1 <= h <= 64");
}

// Scans [lo, hi) in blocks: the first three probes of every position are tested without a
// branch and the survivors (about an eighth) compacted, so the unpredictable branch is taken
// once per survivor instead of once per position.
void query_range(const uint8_t* bits, uint64_t m, int h, uint64_t seed_key, int64_t lo,
                 int64_t hi, int64_t max_positives, std::atomic<int64_t>* found,
                 std::vector<int64_t>* out) {
    constexpr int kBlock = 256;
    int64_t cand[kBlock];
    uint32_t c1[kBlock], c2[kBlock];
    const int first = std::min(h, 3);
    for (int64_t base = lo; base < hi; base += kBlock) {
        int n = static_cast<int>(std::min<int64_t>(kBlock, hi - base)), kept = 0;
        for (int t = 0; t < n; ++t) {
            int64_t i = base + t;
            uint64_t key = fmix64(static_cast<uint64_t>(i) + seed_key);
            uint32_t h1 = static_cast<uint32_t>(key), h2 = static_cast<uint32_t>(key >> 32) | 1u;
            bool hit = test_bit(bits, probe(h1, h2, 0, m));
            for (int j = 1; j < first; ++j) hit &= test_bit(bits, probe(h1, h2, j, m));
            cand[kept] = i;
            c1[kept] = h1;
            c2[kept] = h2;
            kept += hit;
        }
        size_t before = out->size();
        for (int t = 0; t < kept; ++t) {
            int j = first;
            while (j < h && test_bit(bits, probe(c1[t], c2[t], j, m))) ++j;
            if (j == h) out->push_back(cand[t]);
        }
        int64_t added = static_cast<int64_t>(out->size() - before);
        if (added && found->fetch_add(added) + added > max_positives) return;
    }
}

}  // namespace

std::vector<uint8_t> bloom_insert(const int64_t* positions, size_t n, uint64_t m, int h,
                                  uint64_t seed_key) {
    check_params(m, h);
    std::vector<uint8_t> bits((m + 7) / 8, 0);
    for (size_t i = 0; i < n; ++i) {
        uint64_t key = fmix64(static_cast<uint64_t>(positions[i]) + seed_key);
        uint32_t h1 = static_cast<uint32_t>(key), h2 = static_cast<uint32_t>(key >> 32) | 1u;
        for (int j = 0; j < h; ++j) {
            uint32_t b = probe(h1, h2, j, m);
            bits[b >> 3] |= static_cast<uint8_t>(1u << (b & 7));
        }
    }
    return bits;
}

std::vector<int64_t> bloom_conflicts(const int64_t* positives, size_t n, uint64_t m, int h,
                                     uint64_t seed_key) {
    check_params(m, h);
    std::vector<int64_t> members(m, 0), out(n);
    auto probes = [&](size_t i, auto&& visit) {
        uint64_t key = fmix64(static_cast<uint64_t>(positives[i]) + seed_key);
        uint32_t h1 = static_cast<uint32_t>(key), h2 = static_cast<uint32_t>(key >> 32) | 1u;
        for (int j = 0; j < h; ++j) visit(probe(h1, h2, j, m));
    };
    for (size_t i = 0; i < n; ++i) probes(i, [&](uint32_t b) { ++members[b]; });
    for (size_t i = 0; i < n; ++i) {
        int64_t smallest = INT64_MAX;
        probes(i, [&](uint32_t b) { smallest = std::min(smallest, members[b]); });
        out[i] = smallest;
    }
    return out;
}

std::vector<int64_t> bloom_query(const uint8_t* bits, uint64_t m, int h, uint64_t seed_key,
                                 int64_t size, int threads, int64_t max_positives) {
    check_params(m, h);
    if (size < 0) throw Error("bloom: negative size");
    int nthreads = std::max(1, std::min<int>(threads, static_cast<int>(size / 65536) + 1));
    std::vector<std::vector<int64_t>> parts(nthreads);
    std::atomic<int64_t> found{0};
    int64_t chunk = (size + nthreads - 1) / nthreads;
    run_parallel(nthreads, [&](int t) {
        int64_t lo = std::min<int64_t>(size, t * chunk), hi = std::min<int64_t>(size, lo + chunk);
        query_range(bits, m, h, seed_key, lo, hi, max_positives, &found, &parts[t]);
    });
    if (found.load() > max_positives)
        throw Error("bloom: the filter reports more positives than its parameters allow");
    size_t total = 0;
    for (auto& p : parts) total += p.size();
    std::vector<int64_t> out;
    out.reserve(total);
    for (auto& p : parts) out.insert(out.end(), p.begin(), p.end());
    return out;
}

}  // namespace dr
