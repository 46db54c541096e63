// float32 <-> float16 with the F16C instructions (8 values at a time). To half, optionally
// keeping the rounding error in the source buffer: the dense fp16 allreduce's cast and its
// error feedback in one pass. From half, scaled by a power of two: the fp16 value codec's
// decoding. numpy (astype, ldexp) gives the same bits for every non-NaN value.
#include <cmath>
#include <cstring>

#include "engine.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace dr {

#if defined(__x86_64__)
bool have_f16c() {
    static const bool yes = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");
    return yes;
}

__attribute__((target("avx,f16c"))) bool to_half(float* src, uint16_t* dst, size_t n,
                                                   bool keep_error) {
    const __m128i exponent = _mm_set1_epi16(0x7C00);
    __m128i bad = _mm_setzero_si128();
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(src + i);
        __m128i h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
        bad = _mm_or_si128(bad, _mm_cmpeq_epi16(_mm_and_si128(h, exponent), exponent));
        if (keep_error) _mm256_storeu_ps(src + i, _mm256_sub_ps(v, _mm256_cvtph_ps(h)));
    }
    bool finite = _mm_movemask_epi8(bad) == 0;
    if (i < n) {
        float tail[8] = {0};
        uint16_t out[8];
        for (size_t j = i; j < n; ++j) tail[j - i] = src[j];
        __m256 v = _mm256_loadu_ps(tail);
        __m128i h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out), h);
        float back[8];
        _mm256_storeu_ps(back, _mm256_cvtph_ps(h));
        for (size_t j = i; j < n; ++j) {
            dst[j] = out[j - i];
            finite &= (out[j - i] & 0x7C00) != 0x7C00;
            if (keep_error) src[j] -= back[j - i];
        }
    }
    return finite;
}

// dst = float(src) * 2**-exponent, rounded once as ldexp rounds: a single multiply where
// 2**-exponent is a float (every half times it is exact until it rounds into the subnormals),
// else two (the first, by 2**64, exact).
__attribute__((target("avx,f16c"))) void from_half(const uint16_t* src, float* dst, size_t n,
                                                   int exponent) {
    const bool once = exponent >= -127;
    const __m256 scale = _mm256_set1_ps(std::ldexp(1.0f, once ? -exponent : -exponent - 64));
    const __m256 extra = _mm256_set1_ps(once ? 1.0f : std::ldexp(1.0f, 64));
    size_t i = 0;
    for (; i < n; i += 8) {
        uint16_t tail[8] = {0};
        const uint16_t* from = src + i;
        if (i + 8 > n) {
            std::memcpy(tail, src + i, (n - i) * sizeof(uint16_t));  // src may be unaligned
            from = tail;
        }
        __m256 v = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(from)));
        v = _mm256_mul_ps(v, scale);
        if (!once) v = _mm256_mul_ps(v, extra);
        if (i + 8 <= n) {
            _mm256_storeu_ps(dst + i, v);
        } else {
            float out[8];
            _mm256_storeu_ps(out, v);
            for (size_t j = i; j < n; ++j) dst[j] = out[j - i];
        }
    }
}

#else
bool have_f16c() { return false; }

void from_half(const uint16_t*, float*, size_t, int) { throw Error("no hardware float16 conversion"); }

bool to_half(float*, uint16_t*, size_t, bool) { throw Error("no hardware float16 conversion"); }
#endif

}  // namespace dr
