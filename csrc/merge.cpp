// Sorted runs for the sparse allreduce: an owner sums its range's pieces (one ascending run of
// positions per rank) in rank order, and a sender finds which of its positions survived.
#include <vector>

#include "engine.h"

namespace dr {

bool merge_sum(const int64_t* positions, const float* values, const int64_t* starts, size_t runs,
               std::vector<int64_t>* out_positions, std::vector<float>* out_sums) {
    for (size_t r = 0; r < runs; ++r) {
        if (starts[r] > starts[r + 1]) throw Error("merge_sum: run bounds decrease");
        for (int64_t i = starts[r] + 1; i < starts[r + 1]; ++i)
            if (positions[i] <= positions[i - 1]) return false;
    }
    // Adjacent runs merged pairwise (the left one first among equal positions) until one is
    // left: sorted by (position, run) in log2(P) linear passes.
    size_t n = static_cast<size_t>(starts[runs] - starts[0]);
    std::vector<int64_t> pos(positions + starts[0], positions + starts[runs]), pos2(n);
    std::vector<float> val(values + starts[0], values + starts[runs]), val2(n);
    std::vector<size_t> bounds, next;
    for (size_t r = 0; r <= runs; ++r) bounds.push_back(static_cast<size_t>(starts[r] - starts[0]));
    while (bounds.size() > 2) {
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
        pos.swap(pos2);
        val.swap(val2);
        bounds.swap(next);
    }
    out_positions->resize(n);
    out_sums->resize(n);
    size_t u = 0;  // the last unique position's slot
    for (size_t i = 0; i < n; ++i) {
        bool fresh = i == 0 || pos[i] != (*out_positions)[u];
        u += fresh && i;
        (*out_positions)[u] = pos[i];
        (*out_sums)[u] = (fresh ? 0.0f : (*out_sums)[u]) + val[i];
    }
    out_positions->resize(n ? u + 1 : 0);
    out_sums->resize(n ? u + 1 : 0);
    return true;
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
