// Sorted runs for the sparse allreduce: an owner sums its range's pieces (one ascending run of
// positions per rank) in rank order, and a sender finds which of its positions survived.
#include <cstdint>
#include <vector>

#include "engine.h"

namespace dr {

int64_t merge_sum(const int64_t* positions, const float* values, const int64_t* starts, size_t runs,
                  int64_t* out_positions, float* out_sums) {
    for (size_t r = 0; r < runs; ++r) {
        if (starts[r] > starts[r + 1]) throw Error("merge_sum: run bounds decrease");
        for (int64_t i = starts[r] + 1; i < starts[r + 1]; ++i)
            if (positions[i] <= positions[i - 1]) return -1;
    }
    // Adjacent runs merged pairwise (the left one first among equal positions) until one is
    // left, ping-ponging between two scratch buffers (the first pass reads the input); then
    // one pass writes the unique positions and their sums into the output.
    const int64_t* pos = positions + starts[0];
    const float* val = values + starts[0];
    std::vector<size_t> bounds, next;
    for (size_t r = 0; r <= runs; ++r) bounds.push_back(static_cast<size_t>(starts[r] - starts[0]));
    size_t n = bounds.back();
    std::vector<int64_t> pos_a, pos_b;
    std::vector<float> val_a, val_b;
    if (bounds.size() > 2) pos_a.resize(n), val_a.resize(n);
    if (bounds.size() > 3) pos_b.resize(n), val_b.resize(n);
    bool to_a = true;
    while (bounds.size() > 2) {
        int64_t* pos2 = to_a ? pos_a.data() : pos_b.data();
        float* val2 = to_a ? val_a.data() : val_b.data();
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
