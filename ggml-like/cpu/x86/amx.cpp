// BF16 matrix products on AMX tiles: each weight is read (and dequantized)
// once per batch and multiplied against every token of it, 16x16x32 at a
// time, instead of once per token as the dot-product path does.
//
// Weights and tokens are each split into two bf16 parts, x = hi + lo, and
// every product is taken as hi*hi + hi*lo + lo*hi: exact to about 2^-16
// relative, where plain bf16 (8-bit mantissas) lost whole units of logit on
// models with large activations (Gemma 3: 1.2 from the reference engine's
// F32 logits on a long prompt, 0.03 with the split). The micro-kernel holds a
// 32-row weight panel (two hi and two lo A tiles) against one token tile (a
// hi and a lo B tile) in two accumulator tiles; six tile products per k
// block. Products accumulate in fp32 inside the tiles.
#include "ggml-like/cpu/x86/amx.h"

#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic ignored "-Wuninitialized" // GCC PR 105593, see x86/avx512.cpp
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <algorithm>
#include <cstring>

namespace gl::amx {

namespace {

// The 64-byte LDTILECFG operand (palette 1).
struct TileConfig {
    uint8_t palette = 1;
    uint8_t start_row = 0;
    uint8_t reserved[14] = {};
    uint16_t colsb[16] = {};
    uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64);

// All eight tiles are 16 rows x 64 bytes: A = 16 weight rows x 32 bf16,
// B = 16 k-pairs x 16 tokens x 2 bf16, C = 16 weight rows x 16 fp32.
constexpr TileConfig all_tiles_16x64() {
    TileConfig c;
    for (int i = 0; i < 8; i++) {
        c.rows[i] = 16;
        c.colsb[i] = 64;
    }
    return c;
}

__m512i bf16_pairs(__m512 lo16, __m512 hi16) { // 32 floats -> 32 bf16
    return reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi16, lo16));
}

// bf16 back to float: the bits in the upper half.
__m512 bf16_to_f32(__m256i h) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// 32 floats at p -> their bf16 hi parts and the bf16 of what those miss.
void split_bf16(const float* p, __m512i* hi, __m512i* lo) {
    const __m512 a = _mm512_loadu_ps(p), b = _mm512_loadu_ps(p + 16);
    *hi = bf16_pairs(a, b);
    const __m512 ra = _mm512_sub_ps(a, bf16_to_f32(_mm512_castsi512_si256(*hi)));
    const __m512 rb = _mm512_sub_ps(b, bf16_to_f32(_mm512_extracti64x4_epi64(*hi, 1)));
    *lo = bf16_pairs(ra, rb);
}

// C tile (16 rows x 16 tokens) -> y rows of tokens, transposed.
void scatter(const float* c, float* y, int64_t y_stride, int rows, int tokens) {
    for (int t = 0; t < tokens; t++)
        for (int r = 0; r < rows; r++) y[t * y_stride + r] = c[r * 16 + t];
}

// out[k][i] = in[i][k] for a 16x16 block of 32-bit elements (here: bf16
// pairs of 16 tokens -> 16 k-pair rows of a B tile), in three shuffle stages.
void transpose16(const __m512i in[16], __m512i out[16]) {
    __m512i t[16], u[16];
    for (int j = 0; j < 16; j += 2) {
        t[j] = _mm512_unpacklo_epi32(in[j], in[j + 1]);     // per lane: a0 b0 a1 b1
        t[j + 1] = _mm512_unpackhi_epi32(in[j], in[j + 1]); //           a2 b2 a3 b3
    }
    for (int j = 0; j < 16; j += 4) {
        u[j] = _mm512_unpacklo_epi64(t[j], t[j + 2]); // per lane: element 0 of rows j..j+3
        u[j + 1] = _mm512_unpackhi_epi64(t[j], t[j + 2]);
        u[j + 2] = _mm512_unpacklo_epi64(t[j + 1], t[j + 3]);
        u[j + 3] = _mm512_unpackhi_epi64(t[j + 1], t[j + 3]);
    }
    // u[4j + m], lane L = element 4L + m of rows 4j..4j+3: gather the lanes.
    for (int m = 0; m < 4; m++) {
        const __m512i v0 = _mm512_shuffle_i32x4(u[m], u[4 + m], 0x88),
                      v1 = _mm512_shuffle_i32x4(u[m], u[4 + m], 0xDD);
        const __m512i w0 = _mm512_shuffle_i32x4(u[8 + m], u[12 + m], 0x88),
                      w1 = _mm512_shuffle_i32x4(u[8 + m], u[12 + m], 0xDD);
        out[m] = _mm512_shuffle_i32x4(v0, w0, 0x88);
        out[8 + m] = _mm512_shuffle_i32x4(v0, w0, 0xDD);
        out[4 + m] = _mm512_shuffle_i32x4(v1, w1, 0x88);
        out[12 + m] = _mm512_shuffle_i32x4(v1, w1, 0xDD);
    }
}

} // namespace

// The configuration is a constant in memory: built on the stack in a
// function that did nothing else, GCC 12 dropped the stores of the rows and
// columns (it does not see LDTILECFG read them) and the instruction faulted
// on the garbage left there.
void configure_tiles() {
    alignas(64) static constexpr TileConfig kConfig = all_tiles_16x64();
    _tile_loadconfig(&kConfig);
}

void panel_row(const float* src, int64_t n_in, int r, uint16_t* panel) {
    uint16_t* dst = panel + (r / 16) * 512 + (r % 16) * 32;
    uint16_t* dst_lo = dst + kPanelRows * n_in;
    for (int64_t kb = 0; kb < n_in / kTileK; kb++) {
        __m512i hi, lo;
        split_bf16(src + kb * kTileK, &hi, &lo);
        _mm512_store_si512(dst + kb * 1024, hi);
        _mm512_store_si512(dst_lo + kb * 1024, lo);
    }
}

void pack_tokens(const float* x, int64_t n_in, int64_t n_tok, int64_t tt0, int64_t tt1,
                 uint16_t* xv) {
    const int64_t n_kb = n_in / kTileK, n_tt = (n_tok + kTileTokens - 1) / kTileTokens;
    uint16_t* xv_lo = xv + n_tt * kTileTokens * n_in;
    for (int64_t tt = tt0; tt < tt1; tt++) {
        const int64_t t0 = tt * kTileTokens;
        const int live = static_cast<int>(std::min<int64_t>(kTileTokens, n_tok - t0));
        for (int64_t kb = 0; kb < n_kb; kb++) {
            __m512i hi[16], lo[16], cols[16];
            for (int t = 0; t < 16; t++) {
                if (t < live) {
                    split_bf16(x + (t0 + t) * n_in + kb * kTileK, &hi[t], &lo[t]);
                } else {
                    hi[t] = lo[t] = _mm512_setzero_si512();
                }
            }
            const int64_t at = (tt * n_kb + kb) * 512;
            transpose16(hi, cols);
            for (int kk = 0; kk < 16; kk++) _mm512_storeu_si512(xv + at + kk * 32, cols[kk]);
            transpose16(lo, cols);
            for (int kk = 0; kk < 16; kk++) _mm512_storeu_si512(xv_lo + at + kk * 32, cols[kk]);
        }
    }
}

void panel_matmul(const uint16_t* panel, int64_t n_in, const uint16_t* xv, int64_t n_tok, float* y,
                  int64_t y_stride, int rows) {
    configure_tiles();
    const int64_t n_kb = n_in / kTileK, n_tt = (n_tok + kTileTokens - 1) / kTileTokens;
    const uint16_t* panel_lo = panel + kPanelRows * n_in;
    const uint16_t* xv_lo = xv + n_tt * kTileTokens * n_in;
    alignas(64) float c[2][256];
    const int rows0 = rows < 16 ? rows : 16, rows1 = rows - rows0;
    for (int64_t tt = 0; tt < n_tt; tt++) {
        const uint16_t* bh = xv + tt * n_kb * 512;
        const uint16_t* bl = xv_lo + tt * n_kb * 512;
        _tile_zero(4);
        _tile_zero(5);
        for (int64_t kb = 0; kb < n_kb; kb++) {
            _tile_loadd(0, panel + kb * 1024, 64);          // rows 0-15, hi
            _tile_loadd(1, panel + kb * 1024 + 512, 64);    // rows 16-31, hi
            _tile_loadd(2, panel_lo + kb * 1024, 64);       // rows 0-15, lo
            _tile_loadd(3, panel_lo + kb * 1024 + 512, 64); // rows 16-31, lo
            _tile_loadd(6, bh + kb * 512, 64);
            _tile_loadd(7, bl + kb * 512, 64);
            _tile_dpbf16ps(4, 0, 6);
            _tile_dpbf16ps(4, 0, 7);
            _tile_dpbf16ps(4, 2, 6);
            _tile_dpbf16ps(5, 1, 6);
            _tile_dpbf16ps(5, 1, 7);
            _tile_dpbf16ps(5, 3, 6);
        }
        _tile_stored(4, c[0], 64);
        _tile_stored(5, c[1], 64);
        const int t0 = static_cast<int>(tt * kTileTokens);
        const int tok = static_cast<int>(std::min<int64_t>(16, n_tok - t0));
        scatter(c[0], y + t0 * y_stride, y_stride, rows0, tok);
        if (rows1 > 0) scatter(c[1], y + t0 * y_stride + 16, y_stride, rows1, tok);
    }
    _tile_release();
}

} // namespace gl::amx
