// Bit-stream kernels: field packing, fixed and variable-width reads, canonical Huffman and
// Rice decoding. Mirrors deepreduce_hvd/bits.py (same bytes); see engine.h for conventions.
#include <algorithm>
#include <cstring>
#include <functional>
#include <queue>
#include <utility>

#include "bitstream.h"
#include "engine.h"

namespace dr {

std::vector<uint8_t> pack_fields(const uint64_t* values, const int64_t* widths, size_t n) {
    uint64_t total = 0;
    for (size_t i = 0; i < n; ++i) {
        if (widths[i] < 0) throw Error("pack_fields: negative width");
        total += static_cast<uint64_t>(widths[i]);
    }
    BitWriter out(total);
    for (size_t i = 0; i < n; ++i) out.field(values[i], widths[i]);
    return out.finish();
}

std::vector<uint8_t> pack_fixed(const uint64_t* values, size_t n, int width) {
    if (width < 0 || width > 64) throw Error("pack_fixed: width must be 0..64");
    BitWriter out(static_cast<uint64_t>(n) * width);
    for (size_t i = 0; i < n; ++i) out.put(to_stream(values[i], width), width);
    return out.finish();
}

std::vector<uint64_t> stream_order_codes(const uint64_t* codes, const uint8_t* lengths,
                                         size_t alphabet, const char* what) {
    std::vector<uint64_t> streamed(alphabet);
    for (size_t s = 0; s < alphabet; ++s) {
        if (lengths[s] > 15) throw Error(std::string(what) + ": code longer than 15 bits");
        streamed[s] = to_stream(codes[s], lengths[s]);
    }
    return streamed;
}

std::vector<uint8_t> huffman_pack(const int64_t* symbols, size_t n, const uint64_t* codes,
                                  const uint8_t* lengths, size_t alphabet, const uint8_t* bits,
                                  size_t nbits) {
    std::vector<uint64_t> streamed = stream_order_codes(codes, lengths, alphabet, "huffman_pack");
    uint64_t total = nbits;
    for (size_t i = 0; i < n; ++i) {
        if (symbols[i] < 0 || static_cast<size_t>(symbols[i]) >= alphabet || !lengths[symbols[i]])
            throw Error("huffman_pack: symbol without a code");
        total += lengths[symbols[i]];
    }
    BitWriter out(total);
    for (size_t i = 0; i < n; ++i) out.put(streamed[symbols[i]], lengths[symbols[i]]);
    size_t i = 0;  // the bits 64 to a put (one a put was a third of an entropy value body's packing)
    for (; i + 64 <= nbits; i += 64) {
        uint64_t word = 0;
        for (int j = 0; j < 64; ++j) word |= static_cast<uint64_t>(bits[i + j] != 0) << j;
        out.put(word, 64);
    }
    for (; i < nbits; ++i) out.put(bits[i] ? 1 : 0, 1);
    return out.finish();
}

std::vector<uint64_t> read_fixed(const uint8_t* data, size_t nbytes, uint64_t start,
                                 uint64_t count, int width) {
    if (width < 0 || width > 64) throw Error("read_fixed: width must be 0..64");
    check_room(nbytes, start, count, width, "fixed-width fields");
    std::vector<uint64_t> out(count);
    BitReader in(data, nbytes, start);
    for (uint64_t i = 0; i < count; ++i) out[i] = in.field(width);
    return out;
}

std::vector<uint64_t> read_fields(const uint8_t* data, size_t nbytes, uint64_t start,
                                  const int64_t* widths, size_t n) {
    uint64_t total = 0;
    for (size_t i = 0; i < n; ++i) {
        if (widths[i] < 0 || widths[i] > 64) throw Error("read_fields: width must be 0..64");
        total += static_cast<uint64_t>(widths[i]);
    }
    check_room(nbytes, start, total, 1, "variable-width fields");
    std::vector<uint64_t> out(n);
    BitReader in(data, nbytes, start);
    for (size_t i = 0; i < n; ++i) out[i] = in.field(static_cast<int>(widths[i]));
    return out;
}

std::vector<uint32_t> huffman_decode(const uint8_t* data, size_t nbytes, uint64_t start,
                                     const uint8_t* lengths, size_t alphabet, uint64_t count,
                                     uint64_t* end) {
    check_room(nbytes, start, count, 1, "Huffman stream");  // every code has >= 1 bit
    if (alphabet > kMaxHuffmanAlphabet) throw Error("Huffman alphabet over 4096 symbols");
    // canonical codes: shorter first, then by symbol (as huffman.canonical_codes)
    std::vector<uint32_t> used;
    int width = 0;
    int per_length[16] = {0};
    for (size_t s = 0; s < alphabet; ++s) {
        if (lengths[s] > 15) throw Error("Huffman code longer than 15 bits");
        if (lengths[s]) {
            used.push_back(static_cast<uint32_t>(s));
            width = std::max<int>(width, lengths[s]);
            ++per_length[lengths[s]];
        }
    }
    if (count && used.empty()) throw Error("Huffman table is empty");
    std::stable_sort(used.begin(), used.end(),
                     [&](uint32_t a, uint32_t b) { return lengths[a] < lengths[b]; });
    // A direct table on the next `fast` bits (symbol << 4 | length; 0: longer code or invalid);
    // longer codes are decoded canonically: first code and first index of each length. A
    // long stream gets the widest window even when its codes are short (see `multi`).
    const int fast = std::min(11, std::max(width, count >= 2048 ? 11 : 0));
    std::vector<uint32_t> single(size_t(1) << fast, 0);
    uint32_t first_code[17] = {0}, first_index[17] = {0};
    uint64_t code = 0;
    int prev = 0;
    for (size_t idx = 0; idx < used.size(); ++idx) {
        uint32_t s = used[idx];
        int len = lengths[s];
        code <<= (len - prev);
        if (len != prev) {
            first_code[len] = static_cast<uint32_t>(code);
            first_index[len] = static_cast<uint32_t>(idx);
        }
        prev = len;
        if (code >> len) throw Error("Huffman table is not a prefix code");
        if (len <= fast) {
            uint64_t rev = to_stream(code, len);
            for (uint64_t fill = 0; fill < (1ULL << (fast - len)); ++fill)
                single[rev | (fill << len)] = (s << 4) | static_cast<uint32_t>(len);
        }
        ++code;
    }
    // The same window decoded up to four codes deep, as far as whole codes fit in it: four
    // 12-bit symbols, their total length (4 bits) and how many (3 bits), so one lookup and
    // one shift yield several symbols (a 1% selection's levels average 1.7 bits, its rank
    // steps 3.1: the chain of lookup and shift was the decoder's whole cost).
    std::vector<uint64_t> multi(single.size(), 0);
    for (size_t w = 0; w < multi.size(); ++w) {
        uint64_t entry = 0;
        int total = 0, n = 0;
        for (; n < 4; ++n) {
            uint32_t one = single[w >> total];  // valid only if it fits the bits left
            int len = static_cast<int>(one & 15);
            if (!one || total + len > fast) break;
            entry |= static_cast<uint64_t>(one >> 4) << (12 * n);
            total += len;
        }
        if (n) multi[w] = entry | static_cast<uint64_t>(total) << 48 | static_cast<uint64_t>(n) << 52;
    }
    std::vector<uint32_t> out(count + 4);  // a lookup writes four symbols, some past the end
    // A bit buffer (the stream from `pos` on in its low `held` bits; zeros past the end),
    // refilled 48 bits at a time: each lookup costs a table read and a shift of the buffer,
    // where re-reading the stream at the bit position made every code wait on a load.
    BitReader in(data, nbytes, start);
    uint64_t held_bits = 0;
    int held = 0;
    const uint64_t mask = (1ULL << fast) - 1;
    auto refill = [&] {
        if (held < 16) {  // at least 15 bits for the longest code
            BitReader ahead(data, nbytes, in.pos() + held);
            held_bits |= (ahead.peek() & ((1ULL << 48) - 1)) << held;
            held += 48;
        }
    };
    auto consume = [&](int len) {
        held_bits >>= len;
        held -= len;
        in.skip(len);
    };
    // a code longer than the window: read most significant bit first, length by length
    auto long_code = [&]() -> uint32_t {
        uint32_t c = 0;
        for (int len = 1; len <= width; ++len) {
            c = (c << 1) | static_cast<uint32_t>((held_bits >> (len - 1)) & 1);
            if (per_length[len] && c >= first_code[len] &&
                c - first_code[len] < static_cast<uint32_t>(per_length[len])) {
                consume(len);
                return used[first_index[len] + (c - first_code[len])];
            }
        }
        throw Error("Huffman stream holds an invalid code");
    };
    uint64_t i = 0;
    while (i + 4 <= count) {
        refill();
        uint64_t entry = multi[held_bits & mask];
        if (!entry) {
            out[i++] = long_code();
            continue;
        }
        for (int n = 0; n < 4; ++n) out[i + n] = static_cast<uint32_t>(entry >> (12 * n)) & 0xFFF;
        i += (entry >> 52) & 7;
        consume(static_cast<int>((entry >> 48) & 15));
    }
    for (; i < count;) {  // the last few, one at a time
        refill();
        uint32_t one = single[held_bits & mask];
        if (!one) {
            out[i++] = long_code();
            continue;
        }
        out[i++] = one >> 4;
        consume(static_cast<int>(one & 15));
    }
    out.resize(count);
    if (in.pos() > in.total_bits()) throw Error("Huffman stream truncated");
    *end = in.pos();
    return out;
}

std::vector<uint8_t> huffman_lengths(const int64_t* freqs, size_t n, int max_length) {
    std::vector<uint8_t> lengths(n, 0);
    std::vector<size_t> used;
    std::vector<int64_t> weights;
    for (size_t s = 0; s < n; ++s) {
        if (freqs[s] < 0) throw Error("Huffman frequencies must be non-negative");
        if (freqs[s]) {
            used.push_back(s);
            weights.push_back(freqs[s]);
        }
    }
    if (used.size() == 1) lengths[used[0]] = 1;
    if (used.size() <= 1) return lengths;
    const size_t m = used.size();
    for (;;) {
        using Node = std::pair<int64_t, size_t>;  // (weight, id): ties by id, as heapq
        std::priority_queue<Node, std::vector<Node>, std::greater<Node>> heap;
        for (size_t i = 0; i < m; ++i) heap.emplace(weights[i], i);
        std::vector<size_t> parent(2 * m - 1, 0);
        size_t node = m;
        while (heap.size() > 1) {
            Node a = heap.top();
            heap.pop();
            Node b = heap.top();
            heap.pop();
            parent[a.second] = parent[b.second] = node;
            heap.emplace(a.first + b.first, node++);
        }
        std::vector<int> depth(node, 0);
        int deepest = 0;
        for (size_t child = node - 1; child-- > 0;) {
            depth[child] = depth[parent[child]] + 1;
            if (child < m) deepest = std::max(deepest, depth[child]);
        }
        if (deepest <= max_length) {
            for (size_t i = 0; i < m; ++i) lengths[used[i]] = static_cast<uint8_t>(depth[i]);
            return lengths;
        }
        for (auto& w : weights) w = (w + 1) / 2;  // flatten until the code fits
    }
}

// Word at a time: the unary quotients' terminating ones are taken from each 56-bit window
// with ctz and a clear of the lowest set bit (about 25 a window at 1%: the bit position is a
// dependency of the window, not of every element), and the remainders, at a fixed stride,
// are bit-reversed once per window of 56 / r of them (fields are stored most significant
// bit first). 42k positions: 0.28 -> 0.12 ms.
std::vector<int64_t> rice_positions(const uint8_t* data, size_t nbytes, uint64_t start,
                                    uint64_t count, int r, int64_t size, uint64_t* end) {
    if (r < 0 || r > 63) throw Error("Rice parameter out of range");
    if (size < 0) throw Error("Rice stream: negative tensor size");
    check_room(nbytes, start, count, 1 + static_cast<uint64_t>(r), "Rice stream");
    const uint64_t max_quotient = size ? static_cast<uint64_t>(size - 1) >> r : 0;
    std::vector<int64_t> out(count);  // quotients << r, then the positions
    BitReader in(data, nbytes, start);
    const uint64_t total = in.total_bits();
    constexpr int kWindow = 56;
    uint64_t i = 0, q = 0;
    while (i < count) {
        if (in.pos() >= total) throw Error("Rice stream truncated");
        uint64_t word = in.peek() & ((1ULL << kWindow) - 1);  // zeros past the end
        int used = 0;  // bits of the window consumed by whole codes
        for (; word && i < count; word &= word - 1) {
            int one = __builtin_ctzll(word);
            q += static_cast<uint64_t>(one - used);
            if (q > max_quotient) throw Error("Rice quotient larger than the tensor");
            out[i++] = static_cast<int64_t>(q << r);
            q = 0;
            used = one + 1;
        }
        if (i < count) {  // the rest of the window is zeros of the next quotient
            q += static_cast<uint64_t>(kWindow - used);
            if (q > max_quotient) throw Error("Rice quotient larger than the tensor");
            used = kWindow;
        }
        in.skip(static_cast<uint64_t>(used));
    }
    if (in.pos() > total) throw Error("Rice stream truncated");
    check_room(nbytes, in.pos(), count, r, "Rice remainders");
    const int per_window = r ? kWindow / r : 0;
    const uint64_t mask = r ? (~0ULL >> (64 - r)) : 0;
    int64_t position = -1;  // each gap counts the unselected positions before the next
    for (uint64_t done = 0; done < count;) {
        uint64_t take = per_window >= 2 ? std::min<uint64_t>(per_window, count - done) : 1;
        uint64_t reversed = per_window >= 2 ? reverse64(in.peek()) : 0;
        for (uint64_t m = 0; m < take; ++m, ++done) {
            uint64_t remainder = per_window >= 2 ? (reversed >> (64 - (m + 1) * r)) & mask
                                                 : in.field(r);
            uint64_t gap = static_cast<uint64_t>(out[done]) | remainder;
            if (gap >= static_cast<uint64_t>(size) - static_cast<uint64_t>(position + 1))
                throw Error("Rice stream: decoded position outside the tensor");
            position += static_cast<int64_t>(gap) + 1;
            out[done] = position;
        }
        if (per_window >= 2) in.skip(take * r);
    }
    *end = in.pos();
    return out;
}

}  // namespace dr
