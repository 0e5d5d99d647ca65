// The 256-bit GEMMs of the block-chain types (avx2_chain.cpp with
// vpmaddubsw, avxvnni_chain.cpp with AVX-VNNI's vpdpbusd) read the panels of
// chain_panel.h as two halves of eight rows; this is their common driver:
// a panel is packed once per sixteen rows and each half is multiplied by
// four tokens at a time (G::tile<NT>: the including file's arithmetic). In
// an anonymous namespace like k_scales.h: the including files are compiled
// with different -m flags.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "ggml-like/cpu/chain_gemms.h"
#include "ggml-like/cpu/x86/chain_panel.h"

namespace gl {
namespace {
namespace chain {

constexpr int kHalfRows = 8;
constexpr size_t kHalfBytes = 32;

// Half h (rows 8h..8h+7) of the panel word at p.
inline __m256i load_half(const uint8_t* p, int h) {
    return _mm256_load_si256(reinterpret_cast<const __m256i*>(p + h * kHalfBytes));
}

template <int NT, typename V> void zero(V (&v)[NT]) {
#pragma GCC unroll 8
    for (int t = 0; t < NT; t++) v[t] = V{};
}

// A 32-element block's float steps for half h and NT tokens (the
// reference's chain): f += (d * d_a) * isum, then with a min f += m * s_a.
// d: the panel's sixteen d (then the sixteen m).
template <bool kMin, int NT, typename Act>
__attribute__((always_inline)) inline void add_block(__m256 (&f)[NT], const __m256i (&isum)[NT],
                                                     const float* d, int h,
                                                     const Act* const (&tok)[NT], int64_t b) {
    const __m256 dw = _mm256_load_ps(d + h * kHalfRows);
#pragma GCC unroll 8
    for (int t = 0; t < NT; t++) {
        const __m256 da = _mm256_set1_ps(kFp16ToFp32[tok[t][b].d]);
        f[t] = _mm256_fmadd_ps(_mm256_mul_ps(dw, da), _mm256_cvtepi32_ps(isum[t]), f[t]);
        if constexpr (kMin)
            f[t] = _mm256_fmadd_ps(_mm256_load_ps(d + kPanelRows + h * kHalfRows),
                                   _mm256_set1_ps(kFp16ToFp32[tok[t][b].s]), f[t]);
    }
}

// A K-quant super-block's float steps for half h and NT tokens: with mins
// f += (d * d_a) * qsum, then f -= (dmin * d_a) * msum; else the offset
// comes off the integer sum first, f += (d * d_a) * (qsum - msum << shift).
// d: the panel's sixteen d (then the sixteen dmin).
template <typename K, int NT>
__attribute__((always_inline)) inline void add_super(__m256 (&f)[NT], const __m256i (&q)[NT],
                                                     const __m256i (&m)[NT], const float* d, int h,
                                                     const BlockQ8_K* const (&tok)[NT], int64_t b) {
    const __m256 dw = _mm256_load_ps(d + h * kHalfRows);
#pragma GCC unroll 8
    for (int t = 0; t < NT; t++) {
        const __m256 da = _mm256_set1_ps(tok[t][b].d);
        if constexpr (K::kMin) {
            f[t] = _mm256_fmadd_ps(_mm256_mul_ps(dw, da), _mm256_cvtepi32_ps(q[t]), f[t]);
            const __m256 dm = _mm256_mul_ps(_mm256_load_ps(d + kPanelRows + h * kHalfRows), da);
            f[t] = _mm256_fnmadd_ps(dm, _mm256_cvtepi32_ps(m[t]), f[t]);
        } else {
            const __m256i total = _mm256_sub_epi32(q[t], _mm256_slli_epi32(m[t], K::kOffsetShift));
            f[t] = _mm256_fmadd_ps(_mm256_mul_ps(dw, da), _mm256_cvtepi32_ps(total), f[t]);
        }
    }
}

// The first n of eight lanes as a store mask (none for n <= 0).
inline __m256i first_lanes(int64_t n) {
    const int k = static_cast<int>(std::clamp<int64_t>(n, 0, kHalfRows));
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(k), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// Half h of a panel by NT tokens from t0, over all super-blocks.
template <typename G, int NT>
void tile(const uint8_t* pan, int h, int64_t n_super, const Q8Tokens& a, int64_t t0, float* y,
          size_t y_stride, __m256i mask) {
    __m256 f[NT];
    zero(f);
    G::template tile<NT>(pan, h, n_super, a, t0, f);
#pragma GCC unroll 8
    for (int t = 0; t < NT; t++)
        _mm256_maskstore_ps(y + (t0 + t) * y_stride + h * kHalfRows, mask, f[t]);
}

// Four tokens a tile (more run out of registers), then the rest.
template <typename G>
void tokens(const uint8_t* pan, int h, int64_t n_super, const Q8Tokens& a, float* y,
            size_t y_stride, __m256i mask) {
    by_token_tiles(a.n_tok, [&]<int NT>(int64_t t0) {
        tile<G, NT>(pan, h, n_super, a, t0, y, y_stride, mask);
    });
}

template <typename G>
void gemm_panels(int64_t n, const void* w, size_t row_bytes, int64_t n_rows, const Q8Tokens& a,
                 float* y, size_t y_stride, void* scratch) {
    const int64_t n_super = n / (32 * G::kUnits);
    const auto* base = static_cast<const uint8_t*>(w);
    auto* s = static_cast<uint8_t*>(scratch);
    uint8_t* pan = s + (64 - reinterpret_cast<uintptr_t>(s) % 64) % 64;
    for (int64_t r0 = 0; r0 < n_rows; r0 += kPanelRows) {
        const int64_t rows = std::min<int64_t>(kPanelRows, n_rows - r0);
        const __m256i mask[2] = {first_lanes(rows), first_lanes(rows - kHalfRows)};
        pack_panel<G>(base + r0 * row_bytes, row_bytes, static_cast<int>(rows), n_super, pan);
        for (int h = 0; h * kHalfRows < rows; h++)
            tokens<G>(pan, h, n_super, a, y + r0, y_stride, mask[h]);
    }
}

} // namespace chain
} // namespace
} // namespace gl
