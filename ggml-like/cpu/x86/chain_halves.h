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
    uint8_t* pan = panel_scratch(scratch);
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
