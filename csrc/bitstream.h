// Bit-stream reader and writer shared by the kernels (conventions in engine.h): stream bit t
// in byte t >> 3 at bit (t & 7), fields most significant bit first.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "engine.h"

namespace dr {

// Raise unless nbytes hold count fields of bits_each bits after bit `start` (bits.check_room).
inline void check_room(size_t nbytes, uint64_t start, uint64_t count, uint64_t bits_each,
                       const char* what) {
    uint64_t total = 8 * static_cast<uint64_t>(nbytes);
    if (start > total || (bits_each && count > (total - start) / bits_each))
        throw Error(std::string(what) + ": stream holds fewer bits than declared");
}

// Raise unless a stream that ends at bit `end` ends in the last of nbytes (bits.expect_stream_end).
inline void expect_stream_end(size_t nbytes, uint64_t end, const char* what) {
    if ((end + 7) / 8 != nbytes) throw Error(std::string(what) + ": bytes after the stream");
}

// Bits needed for v (0 -> 0).
inline int bit_length(uint64_t v) { return v ? 64 - __builtin_clzll(v) : 0; }

inline uint64_t reverse64(uint64_t x) {
    x = ((x >> 1) & 0x5555555555555555ULL) | ((x & 0x5555555555555555ULL) << 1);
    x = ((x >> 2) & 0x3333333333333333ULL) | ((x & 0x3333333333333333ULL) << 2);
    x = ((x >> 4) & 0x0F0F0F0F0F0F0F0FULL) | ((x & 0x0F0F0F0F0F0F0F0FULL) << 4);
    return __builtin_bswap64(x);
}

// The w low bits of v, most significant first, as w bits in stream order.
inline uint64_t to_stream(uint64_t v, int w) { return w ? reverse64(v) >> (64 - w) : 0; }

class BitWriter {
  public:
    // total_bits: what will be written (more still works, by growing the buffer).
    explicit BitWriter(uint64_t total_bits) : out_((total_bits + 7) / 8 + 8) {}

    // w (0..64) bits already in stream order.
    void put(uint64_t s, int w) {
        if (w == 0) return;
        if (w < 64) s &= (1ULL << w) - 1;
        acc_ |= s << fill_;
        int total = fill_ + w;
        if (total >= 64) {
            flush_word();
            int written = 64 - fill_;
            acc_ = written >= 64 ? 0 : s >> written;
            fill_ = total - 64;
        } else {
            fill_ = total;
        }
    }

    // A field of any width, most significant bit first (bits above 64 are zeros).
    void field(uint64_t v, int64_t w) {
        for (; w > 64; w -= std::min<int64_t>(w - 64, 64)) put(0, static_cast<int>(std::min<int64_t>(w - 64, 64)));
        put(to_stream(v, static_cast<int>(w)), static_cast<int>(w));
    }

    std::vector<uint8_t> finish() {
        if (written_ + 8 > out_.size()) out_.resize(written_ + 8);
        for (int b = 0; b < fill_; b += 8) out_[written_++] = static_cast<uint8_t>(acc_ >> b);
        out_.resize(written_);
        return std::move(out_);
    }

  private:
    void flush_word() {  // one 8-byte store into room sized up front (the byte order of acc_)
        if (written_ + 8 > out_.size()) out_.resize(2 * out_.size() + 8);
        uint8_t bytes[8];
        for (int b = 0; b < 8; ++b) bytes[b] = static_cast<uint8_t>(acc_ >> (8 * b));
        std::memcpy(out_.data() + written_, bytes, 8);
        written_ += 8;
    }

    std::vector<uint8_t> out_;
    size_t written_ = 0;
    uint64_t acc_ = 0;
    int fill_ = 0;
};

class BitReader {
  public:
    BitReader(const uint8_t* data, size_t nbytes, uint64_t start)
        : data_(data), nbytes_(nbytes), pos_(start) {}

    // The next 57 or more bits in stream order (zeros past the end), without consuming them.
    uint64_t peek() const {
        size_t byte = pos_ >> 3;
        uint64_t word = 0;
        if (byte + 8 <= nbytes_) {
            std::memcpy(&word, data_ + byte, 8);
        } else if (byte < nbytes_) {
            std::memcpy(&word, data_ + byte, nbytes_ - byte);
        }
        return word >> (pos_ & 7);
    }

    void skip(uint64_t w) { pos_ += w; }

    // A field of w (0..64) bits, most significant bit first.
    uint64_t field(int w) {
        if (w > 56) return long_field(w);
        uint64_t s = w ? peek() & ((1ULL << w) - 1) : 0;
        pos_ += w;
        return to_stream(s, w);
    }

    uint64_t pos() const { return pos_; }

    // A field wider than 56 bits: two reads (kept out of line so field() inlines).
    __attribute__((noinline)) uint64_t long_field(int w) {
        uint64_t high = field(w - 32);
        return (high << 32) | field(32);
    }
    uint64_t total_bits() const { return 8 * static_cast<uint64_t>(nbytes_); }

  private:
    const uint8_t* data_;
    size_t nbytes_;
    uint64_t pos_;
};

}  // namespace dr
