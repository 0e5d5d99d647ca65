// Q3_K/Q4_K/Q5_K scale unpacking shared by the AVX2 and AVX-512 k-quant files
// (SSE/AVX2 instructions only). In an anonymous namespace: the two files are
// compiled with different -m flags, and one shared inline copy could carry
// AVX-512 instructions into the AVX2 path.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace gl {
namespace {

// The eight 6-bit scales (bytes 0-7) and mins (bytes 8-15) of a Q4_K/Q5_K
// block, from the 12 packed bytes at `s` (the four bytes read past them are
// the block's own quants, unused). Words w0..w2 of the packing in
// blocks_k.h give, per int32 lane:
//   sc0-3 = w0 & 0x3f, sc4-7 = (w2 & 0x0f) | (w0 >> 6) << 4,
//   m0-3  = w1 & 0x3f, m4-7  = (w2 >> 4 & 0x0f) | (w1 >> 6) << 4,
// in the vector unit: done with scalar shifts and inserts it cost as many
// uops as the block's 256 products.
inline __m128i unpack_scales_k4(const uint8_t* s) {
    const __m128i w = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
    const __m128i a = _mm_shuffle_epi32(w, _MM_SHUFFLE(2, 1, 2, 0)); // w0 w2 w1 w2
    const __m128i b = _mm_shuffle_epi32(w, _MM_SHUFFLE(1, 1, 0, 0)); // w0 w0 w1 w1
    const __m128i low =
        _mm_and_si128(_mm_srlv_epi32(a, _mm_setr_epi32(0, 0, 0, 4)),
                      _mm_setr_epi32(0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f));
    // (w >> 6 & 3) << 4 per byte is (w >> 2) & 0x30
    return _mm_or_si128(
        low, _mm_and_si128(_mm_srli_epi32(b, 2), _mm_setr_epi32(0, 0x30303030, 0, 0x30303030)));
}

// Q3_K's sixteen 6-bit scales minus 32, as signed bytes, from the 12 packed
// bytes at `s` (blocks_k.h: low 4 bits of scale j are the low nibble of s[j]
// for j < 8, the high nibble of s[j - 8] after; the top 2 are bits
// 2 (j / 4), +1 of s[8 + j % 4]). Reads exactly the 12 bytes: the block's d
// follows them, and after the last block of a row there may be nothing.
inline __m128i unpack_scales_k3(const uint8_t* s) {
    const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(s));
    const __m128i m4 = _mm_set1_epi8(0x0f);
    const __m128i lo =
        _mm_unpacklo_epi64(_mm_and_si128(q, m4), _mm_and_si128(_mm_srli_epi16(q, 4), m4));
    // Dword k holds s[8..11] shifted down by 2k: its byte j % 4 is scale j's top bits.
    uint32_t top;
    std::memcpy(&top, s + 8, sizeof top);
    const __m128i w2 = _mm_set1_epi32(static_cast<int>(top));
    const __m128i hi =
        _mm_and_si128(_mm_srlv_epi32(w2, _mm_setr_epi32(0, 2, 4, 6)), _mm_set1_epi8(3));
    return _mm_sub_epi8(_mm_or_si128(lo, _mm_slli_epi16(hi, 4)), _mm_set1_epi8(32));
}

} // namespace
} // namespace gl
