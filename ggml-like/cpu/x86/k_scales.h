// Q4_K/Q5_K scale unpacking shared by the AVX2 and AVX-512 k-quant files
// (SSE/AVX2 instructions only). In an anonymous namespace: the two files are
// compiled with different -m flags, and one shared inline copy could carry
// AVX-512 instructions into the AVX2 path.
#pragma once

#include <immintrin.h>

#include <cstdint>

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

} // namespace
} // namespace gl
