// Sorted runs for the sparse allreduce: an owner sums its range's pieces (one ascending run of
// positions per rank) in rank order, and a sender finds which of its positions survived.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "engine.h"

namespace dr {

namespace {

// Scratch an owner reuses from step to step (it merges the same sizes every step): fresh
// multi-megabyte buffers come back from the allocator unmapped, and their first touches
// cost more than the merge. Up to kKeptBytes a buffer stays; a larger one is freed after.
constexpr size_t kKeptBytes = size_t(8) << 20;

template <class T>
T* scratch(std::vector<T>& kept, std::vector<T>& once, size_t n) {
    std::vector<T>& buffer = n * sizeof(T) <= kKeptBytes ? kept : once;
    if (buffer.size() < n) buffer.resize(n);
    return buffer.data();
}

// Dense enough (positions spanning at most this many times their count): the sums are
// accumulated in a buffer over the span and the positions marked in a bitmap, whose set bits
// are read out in order; that costs a clearing of the span where merging P runs costs log2(P)
// passes over the elements, each waiting on its comparisons. Measured: 4 runs of 262,144
// positions in a span of 1M (a warm-up's 25%) 2.1 ms (4.7 with a byte a position and a pass
// writing every one); at a span 12x the elements 0.58 ms against 0.71 merged, at 25x both
// about 0.35 ms.
constexpr int64_t kDenseSpan = 16;

int64_t sum_in_span(const int64_t* pos, const float* val, size_t n, int64_t span,
                    int64_t* out_positions, float* out_sums) {
    thread_local std::vector<float> kept_sums;
    thread_local std::vector<uint64_t> kept_seen;
    std::vector<float> once_sums;
    std::vector<uint64_t> once_seen;
    const size_t words = static_cast<size_t>(span + 63) / 64;
    float* sums = scratch(kept_sums, once_sums, static_cast<size_t>(span));
    uint64_t* seen = scratch(kept_seen, once_seen, words);
    std::memset(sums, 0, static_cast<size_t>(span) * sizeof(float));  // each sum 0 + its values
    std::memset(seen, 0, words * sizeof(uint64_t));
    for (size_t i = 0; i < n; ++i) {  // runs in rank order
        const int64_t p = pos[i];
        sums[p] += val[i];
        seen[p >> 6] |= uint64_t{1} << (p & 63);
    }
    int64_t u = 0;
    for (size_t w = 0; w < words; ++w) {
        for (uint64_t bits = seen[w]; bits; bits &= bits - 1) {
            const int64_t p = static_cast<int64_t>(w) * 64 + __builtin_ctzll(bits);
            out_positions[u] = p;
            out_sums[u++] = sums[p];
        }
    }
    return u;
}

}  // namespace

int64_t merge_sum(const int64_t* positions, const float* values, const int64_t* starts, size_t runs,
                  int64_t* out_positions, float* out_sums) {
    int64_t span = 0;  // the largest position + 1; -1 if a position is negative
    for (size_t r = 0; r < runs; ++r) {
        if (starts[r] > starts[r + 1]) throw Error("merge_sum: run bounds decrease");
        for (int64_t i = starts[r] + 1; i < starts[r + 1]; ++i)
            if (positions[i] <= positions[i - 1]) return -1;
        if (starts[r] < starts[r + 1] && span >= 0)
            span = positions[starts[r]] < 0 ? -1 : std::max(span, positions[starts[r + 1] - 1] + 1);
    }
    const int64_t* pos = positions + starts[0];
    const float* val = values + starts[0];
    size_t n = static_cast<size_t>(starts[runs] - starts[0]);
    if (runs > 2 && span >= 0 && span <= kDenseSpan * static_cast<int64_t>(n))
        return sum_in_span(pos, val, n, span, out_positions, out_sums);
    // Adjacent runs merged pairwise (the left one first among equal positions) until one is
    // left, ping-ponging between two scratch buffers (the first pass reads the input); then
    // one pass writes the unique positions and their sums into the output.
    std::vector<size_t> bounds, next;
    for (size_t r = 0; r <= runs; ++r) bounds.push_back(static_cast<size_t>(starts[r] - starts[0]));
    thread_local std::vector<int64_t> kept_pos_a, kept_pos_b;
    thread_local std::vector<float> kept_val_a, kept_val_b;
    std::vector<int64_t> once_pos_a, once_pos_b;
    std::vector<float> once_val_a, once_val_b;
    int64_t* pos_a = bounds.size() > 2 ? scratch(kept_pos_a, once_pos_a, n) : nullptr;
    float* val_a = bounds.size() > 2 ? scratch(kept_val_a, once_val_a, n) : nullptr;
    int64_t* pos_b = bounds.size() > 3 ? scratch(kept_pos_b, once_pos_b, n) : nullptr;
    float* val_b = bounds.size() > 3 ? scratch(kept_val_b, once_val_b, n) : nullptr;
    bool to_a = true;
    while (bounds.size() > 2) {
        int64_t* pos2 = to_a ? pos_a : pos_b;
        float* val2 = to_a ? val_a : val_b;
        next.assign(1, 0);
        for (size_t r = 0; r + 1 < bounds.size(); r += 2) {
            size_t i = bounds[r], mid = bounds[r + 1];
            size_t end = r + 2 < bounds.size() ? bounds[r + 2] : mid;
            size_t j = mid, o = i;
            while (i < mid && j < end) {  // branch-free: the order is data-dependent
                int64_t x = pos[i], y = pos[j];
                bool left = x <= y;
                pos2[o] = left ? x : y;
                val2[o++] = left ? val[i] : val[j];
                i += left;
                j += !left;
            }
            for (; i < mid; ++i, ++o) pos2[o] = pos[i], val2[o] = val[i];
            for (; j < end; ++j, ++o) pos2[o] = pos[j], val2[o] = val[j];
            next.push_back(end);
        }
        pos = pos2, val = val2;
        bounds.swap(next);
        to_a = !to_a;
    }
    int64_t u = -1;  // the last unique position's slot; sums start from 0
    for (size_t i = 0; i < n; ++i) {
        if (u >= 0 && out_positions[u] == pos[i]) {
            out_sums[u] += val[i];
        } else {
            out_positions[++u] = pos[i];
            out_sums[u] = 0.0f + val[i];
        }
    }
    return u + 1;
}

bool member_sorted(const int64_t* a, size_t na, const int64_t* b, size_t nb, uint8_t* in) {
    for (size_t i = 1; i < na; ++i)
        if (a[i] <= a[i - 1]) return false;
    for (size_t j = 1; j < nb; ++j)
        if (b[j] <= b[j - 1]) return false;
    // Where b's span is small beside the elements (a bitmap of at most 4x their bytes), its
    // positions are marked and a's looked up: independent accesses to a cache-resident map,
    // where the merge below waits on each comparison (1M in 1M of a 4M tensor: 5.7 ms).
    const int64_t span = nb ? b[nb - 1] + 1 : 0;
    if (nb && b[0] >= 0 && span / 256 <= static_cast<int64_t>(na + nb)) {
        std::vector<uint64_t> map(static_cast<size_t>(span + 63) / 64);
        for (size_t j = 0; j < nb; ++j) map[b[j] >> 6] |= uint64_t{1} << (b[j] & 63);
        for (size_t i = 0; i < na; ++i)
            in[i] = a[i] >= 0 && a[i] < span && (map[a[i] >> 6] >> (a[i] & 63) & 1);
        return true;
    }
    size_t i = 0, j = 0;
    while (i < na && j < nb) {  // branch-free; in[i]'s last write is when i moves on
        int64_t x = a[i], y = b[j];
        in[i] = x == y;
        i += x <= y;
        j += y <= x;
    }
    for (; i < na; ++i) in[i] = 0;
    return true;
}

}  // namespace dr
