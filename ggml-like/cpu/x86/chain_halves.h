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

// ---- packed weights (kernels.h) ---------------------------------------------------------
//
// The including file's A::block<P, NH, NT>(words, h0, qs, init, acc) puts the
// exact integer sums of halves h0..h0+NH-1 of a packed block by NT tokens in
// acc (each started from init[t], A::offset<P>() times the activations'
// block sum); the driver adds the reference's float chain. One token takes
// both halves in one pass, so generation streams each panel once; more take
// a half at a time, up to four tokens a tile, as the plain GEMM does (the
// panel is then in cache).

// Word j (< 8) of half h of a packed block: Q4_0's words k and k + 4 are
// the low and high nibbles of stored word k.
template <typename P, int kHigh>
__attribute__((always_inline)) inline __m256i packed_half_word(const uint8_t* words, int k, int h) {
    const auto* p = reinterpret_cast<const __m256i*>(
        words + (k + 4 * kHigh * (P::kStored == 8)) * kWordBytes + h * kHalfBytes);
    if constexpr (P::kStored == 4) {
        const __m256i v = _mm256_loadu_si256(p);
        return _mm256_and_si256(kHigh ? _mm256_srli_epi16(v, 4) : v, _mm256_set1_epi8(0x0f));
    } else {
        return _mm256_loadu_si256(p);
    }
}

// f.template operator()<kHigh>() for the low words (0-3), then the high (4-7).
template <typename F> __attribute__((always_inline)) inline void word_pairs(F&& f) {
    f.template operator()<0>();
    f.template operator()<1>();
}

template <typename A, typename P, int NH, int NT>
void packed_tile(const uint8_t* pan, int h0, int64_t nb, const Q8Tokens& a, int64_t t0, float* y,
                 size_t y_stride, const __m256i* mask) {
    const BlockQ8_0* tok[NT];
    const int32_t* sums[NT];
    for (int t = 0; t < NT; t++) {
        tok[t] = reinterpret_cast<const BlockQ8_0*>(token_row(a, t0 + t));
        sums[t] = a.sums + (t0 + t) * nb;
    }
    __m256 f[NH][NT];
#pragma GCC unroll 2
    for (int h = 0; h < NH; h++) zero(f[h]);
    for (int64_t b = 0; b < nb; b++) {
        const PackedBlock at(P::kStored, b, nb);
        // The first token tile streams the panel from memory; the others
        // find it in cache.
        if (b % 2 == 0 && t0 == 0 && h0 == 0) prefetch_pair<P>(pan + at.pair);
        const int8_t* qs[NT];
        int32_t init[NT];
        for (int t = 0; t < NT; t++) {
            qs[t] = tok[t][b].qs;
            init[t] = A::template offset<P>() * sums[t][b];
        }
        __m256i acc[NH][NT];
        A::template block<P, NH, NT>(pan + at.words, h0, qs, init, acc);
#pragma GCC unroll 2
        for (int h = 0; h < NH; h++) {
            const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(
                reinterpret_cast<const __m128i*>(pan + at.scales + (h0 + h) * kHalfRows * 2)));
#pragma GCC unroll 4
            for (int t = 0; t < NT; t++)
                f[h][t] =
                    _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_set1_ps(kFp16ToFp32[tok[t][b].d])),
                                    _mm256_cvtepi32_ps(acc[h][t]), f[h][t]);
        }
    }
#pragma GCC unroll 2
    for (int h = 0; h < NH; h++)
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++)
            _mm256_maskstore_ps(y + (t0 + t) * y_stride + (h0 + h) * kHalfRows, mask[h0 + h],
                                f[h][t]);
}

template <typename A, typename P>
void gemm_packed(int64_t n, const void* panels, int64_t n_rows, const Q8Tokens& a, float* y,
                 size_t y_stride) {
    const int64_t nb = n / 32;
    const size_t panel_bytes = kPanelRows * nb * sizeof(typename P::Block);
    const auto* base = static_cast<const uint8_t*>(panels);
    for (int64_t r0 = 0; r0 < n_rows; r0 += kPanelRows) {
        const int64_t rows = std::min<int64_t>(kPanelRows, n_rows - r0);
        const __m256i mask[2] = {first_lanes(rows), first_lanes(rows - kHalfRows)};
        const uint8_t* pan = base + (r0 / kPanelRows) * panel_bytes;
        float* yr = y + r0;
        if (a.n_tok == 1 && rows > kHalfRows) {
            packed_tile<A, P, 2, 1>(pan, 0, nb, a, 0, yr, y_stride, mask);
            continue;
        }
        for (int h = 0; h * kHalfRows < rows; h++)
            by_token_tiles(a.n_tok, [&]<int NT>(int64_t t0) {
                packed_tile<A, P, 1, NT>(pan, h, nb, a, t0, yr, y_stride, mask);
            });
    }
}

} // namespace chain
} // namespace
} // namespace gl

// In a 256-bit ISA file's namespace: its packed GEMMs, the driver above over
// the file's arithmetic `Arith` (chain_gemms.h declares them).
#define KVRUN_DEFINE_PACKED_GEMMS(Arith)                                                           \
    void gemm_packed_q4_0(int64_t n, const void* panels, int64_t n_rows, const Q8Tokens& a,        \
                          float* y, size_t y_stride) {                                             \
        gemm_packed<Arith, PackedQ4>(n, panels, n_rows, a, y, y_stride);                           \
    }                                                                                              \
    void gemm_packed_q8_0(int64_t n, const void* panels, int64_t n_rows, const Q8Tokens& a,        \
                          float* y, size_t y_stride) {                                             \
        gemm_packed<Arith, PackedQ8>(n, panels, n_rows, a, y, y_stride);                           \
    }
