// Lane sums for the per-ISA x86 files. In an anonymous namespace: each file
// is compiled with its own ISA flags, and a shared inline function could be
// merged across them at link time (an AVX-512 body in an AVX2 file).
#pragma once

#include <immintrin.h>

namespace {

inline float hsum(__m256 x) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

#ifdef __AVX512F__
// (GCC 12's _mm512_reduce_add_ps, and a cast of the low half, warn of an
// uninitialized temporary: both halves are extracted.)
inline float hsum(__m512 x) {
    return hsum(_mm256_add_ps(_mm512_extractf32x8_ps(x, 0), _mm512_extractf32x8_ps(x, 1)));
}
#endif

} // namespace
