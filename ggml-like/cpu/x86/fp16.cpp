// AVX512-FP16 kernels of a decode step's attention; see x86/fp16.h.
// Compiled with -mavx512fp16 (CMake's x86_fp16 flags); nothing here runs
// unless cpu_supported().
#include "ggml-like/cpu/x86/fp16.h"

#include <cpuid.h>

#include <cstring>

#include "ggml-like/cpu/static_count.h"

#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic ignored "-Wuninitialized" // GCC PR 105593, see x86/avx512.cpp
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

namespace gl::fp16 {

// AVX512-FP16 asked through cpuid: older clang's __builtin_cpu_supports does
// not know it. (The builtins for the AVX-512 subsets check that the OS saves
// the registers, which FP16 shares.)
bool cpu_supported() {
    unsigned a = 0, b = 0, c = 0, d = 0;
    constexpr unsigned kAvx512Fp16Bit = 1u << 23; // CPUID.(7,0):EDX
    return __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d & kAvx512Fp16Bit) &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512dq");
}

void to_half(const float* x, float scale, int64_t n, uint16_t* out) {
    const __m512 s = _mm512_set1_ps(scale);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i),
                            _mm512_cvtps_ph(_mm512_mul_ps(_mm512_loadu_ps(x + i), s),
                                            _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    if (i < n) {
        const auto m = static_cast<__mmask16>((1u << (n - i)) - 1);
        _mm256_mask_storeu_epi16(out + i, m,
                                 _mm512_cvtps_ph(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), s),
                                                 _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
}

namespace {

// Lanes 0-15 and 16-31 of a half vector, widened to F32.
inline __m512 low_f32(__m512h v) {
    return _mm512_cvtxph_ps(_mm512_castph512_ph256(v));
}
inline __m512 high_f32(__m512h v) {
    return _mm512_cvtph_ps(_mm512_extracti64x4_epi64(_mm512_castph_si512(v), 1));
}
// Any lane inf or NaN (fpclass: QNaN 0x01, +inf 0x08, -inf 0x10, SNaN 0x80).
inline __mmask16 not_finite(__m512 v) {
    return _mm512_fpclass_ps_mask(v, 0x99);
}

// Read as _Float16 so that the compiler folds the broadcast into the FMA's
// memory operand ({1to32}) rather than spending a shuffle on each.
inline __m512h broadcast(const uint16_t* h) {
    _Float16 x;
    std::memcpy(&x, h, sizeof x);
    return _mm512_set1_ph(x);
}

// Per dimension d, the two tiles' 16 keys side by side are one 32-half
// vector (tile a's row d in lanes 0-15, b's in 16-31), times each head's
// query element broadcast: NH accumulators of 32 keys, no horizontal sums.
template <int NH>
bool score_tiles_n(int hd, const uint16_t* ka, const uint16_t* kb, const uint16_t* q, float* out,
                   size_t os, const uint8_t* pf, int pf_lines) {
    __m512 lo[NH], hi[NH];
#pragma GCC unroll 8
    for (int j = 0; j < NH; j++) lo[j] = hi[j] = _mm512_setzero_ps();
    for (int d0 = 0; d0 < hd; d0 += kSpanDims) {
        __m512h acc[NH];
#pragma GCC unroll 8
        for (int j = 0; j < NH; j++) acc[j] = _mm512_setzero_ph();
#pragma GCC unroll 16
        for (int d = d0; d < d0 + kSpanDims; d++) {
            if (d < pf_lines) _mm_prefetch(reinterpret_cast<const char*>(pf + 64 * d), _MM_HINT_T1);
            const __m512i kv = _mm512_inserti64x4(
                _mm512_castsi256_si512(
                    _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ka + d * 16))),
                _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kb + d * 16)), 1);
            const __m512h k = _mm512_castsi512_ph(kv);
#pragma GCC unroll 8
            for (int j = 0; j < NH; j++)
                acc[j] = _mm512_fmadd_ph(broadcast(q + j * hd + d), k, acc[j]);
        }
#pragma GCC unroll 8
        for (int j = 0; j < NH; j++) {
            lo[j] = _mm512_add_ps(lo[j], low_f32(acc[j]));
            hi[j] = _mm512_add_ps(hi[j], high_f32(acc[j]));
        }
    }
    __mmask16 bad = 0;
#pragma GCC unroll 8
    for (int j = 0; j < NH; j++) bad |= not_finite(lo[j]) | not_finite(hi[j]);
    if (bad) return false;
#pragma GCC unroll 8
    for (int j = 0; j < NH; j++) {
        _mm512_storeu_ps(out + j * os, lo[j]);
        _mm512_storeu_ps(out + j * os + 16, hi[j]);
    }
    return true;
}

// One slice of NV x 32 dimensions from k0 for NH heads: per key, the slice's
// values are loaded once and added to every head's half accumulators; every
// kSpanKeys keys those are widened into F32 sums, which end in `res`.
template <int NH, int NV>
bool add_slice(const uint8_t* rows, size_t stride, int n, const uint16_t (*wh)[64], int k0,
               float* const* y, float (*res)[kMaxHeadDim], const uint8_t* pf, int pf_lines) {
    __m512 f[NH][2 * NV];
#pragma GCC unroll 4
    for (int j = 0; j < NH; j++)
#pragma GCC unroll 4
        for (int c = 0; c < 2 * NV; c++) f[j][c] = _mm512_loadu_ps(y[j] + k0 + 16 * c);
    for (int i0 = 0; i0 < n; i0 += kSpanKeys) {
        const int i1 = i0 + kSpanKeys < n ? i0 + kSpanKeys : n;
        __m512h acc[NH][NV];
#pragma GCC unroll 4
        for (int j = 0; j < NH; j++)
#pragma GCC unroll 2
            for (int c = 0; c < NV; c++) acc[j][c] = _mm512_setzero_ph();
        for (int i = i0; i < i1; i++) {
            if (i < pf_lines) _mm_prefetch(reinterpret_cast<const char*>(pf + 64 * i), _MM_HINT_T1);
            const auto* r = reinterpret_cast<const uint16_t*>(rows + i * stride) + k0;
            __m512h v[NV];
#pragma GCC unroll 2
            for (int c = 0; c < NV; c++) v[c] = _mm512_castsi512_ph(_mm512_loadu_si512(r + 32 * c));
#pragma GCC unroll 4
            for (int j = 0; j < NH; j++) {
                const __m512h w = broadcast(&wh[j][i]);
#pragma GCC unroll 2
                for (int c = 0; c < NV; c++) acc[j][c] = _mm512_fmadd_ph(w, v[c], acc[j][c]);
            }
        }
#pragma GCC unroll 4
        for (int j = 0; j < NH; j++)
#pragma GCC unroll 2
            for (int c = 0; c < NV; c++) {
                f[j][2 * c] = _mm512_add_ps(f[j][2 * c], low_f32(acc[j][c]));
                f[j][2 * c + 1] = _mm512_add_ps(f[j][2 * c + 1], high_f32(acc[j][c]));
            }
    }
    __mmask16 bad = 0;
#pragma GCC unroll 4
    for (int j = 0; j < NH; j++)
#pragma GCC unroll 4
        for (int c = 0; c < 2 * NV; c++) {
            bad |= not_finite(f[j][c]);
            _mm512_storeu_ps(res[j] + k0 + 16 * c, f[j][c]);
        }
    return bad == 0;
}

template <int NH>
bool add_values_n(int hd, const uint8_t* rows, size_t stride, int n, const float* w, size_t ws,
                  float* const* y, const uint8_t* pf, int pf_lines) {
    alignas(64) uint16_t wh[NH][64];
    for (int j = 0; j < NH; j++) to_half(w + j * ws, 1.0f, n, wh[j]);
    alignas(64) float res[NH][kMaxHeadDim];
    int k0 = 0;
    for (; k0 + 64 <= hd; k0 += 64, pf += 64 * n, pf_lines -= n)
        if (!add_slice<NH, 2>(rows, stride, n, wh, k0, y, res, pf, pf_lines)) return false;
    if (k0 < hd && !add_slice<NH, 1>(rows, stride, n, wh, k0, y, res, pf, pf_lines)) return false;
    for (int j = 0; j < NH; j++) std::memcpy(y[j], res[j], sizeof(float) * hd);
    return true;
}

} // namespace

bool score_tiles(int hd, const uint16_t* tile_a, const uint16_t* tile_b, const uint16_t* q, int nh,
                 float* out, size_t os, const void* pf, int pf_lines) {
    if (hd % kSpanDims != 0 || hd > kMaxHeadDim || nh < 1 || nh > kMaxHeads) return false;
    bool ok = false;
    with_static_count<kMaxHeads>(nh, [&](auto c) {
        ok = score_tiles_n<decltype(c)::value>(hd, tile_a, tile_b, q, out, os,
                                               static_cast<const uint8_t*>(pf), pf_lines);
    });
    return ok;
}

bool add_values(int hd, const uint8_t* rows, size_t stride, int n, const float* w, size_t ws,
                int nh, float* const* y, const void* pf, int pf_lines) {
    if (hd % 32 != 0 || hd > kMaxHeadDim || n < 1 || n > 64 || nh < 1 || nh > kMaxValueHeads)
        return false;
    bool ok = false;
    with_static_count<kMaxValueHeads>(nh, [&](auto c) {
        ok = add_values_n<decltype(c)::value>(hd, rows, stride, n, w, ws, y,
                                              static_cast<const uint8_t*>(pf), pf_lines);
    });
    return ok;
}

} // namespace gl::fp16
