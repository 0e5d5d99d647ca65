// Kernels on Intel AMX tiles (x86/amx.cpp, compiled with -mamx-*). Reached
// only from ggml-like/gemm.cpp after it has checked the CPU and obtained the
// kernel's permission to use tile data.
//
// Layouts (bf16 stored as uint16_t; every value as two parts, hi + lo, the
// lo half of each buffer right after the hi half, see amx.cpp):
//  - weight panel (the A operand): kPanelRows rows of n_in bf16, tile-major:
//    for k-block kb, the tile of rows 0-15 at panel + kb * 1024 and rows 16-31
//    at + 512, each 16 rows x 32 k. Contiguous tiles stream well; row-major
//    rows 4 KiB apart did not (a third of the speed);
//  - packed tokens: for token tile tt (16 tokens) and k-block kb (32 k), one
//    1 KiB B tile at xv + (tt * n_kb + kb) * 512: 16 rows of k pairs, each row
//    16 tokens x (k, k+1). Tokens past n_tok are zero.
#pragma once

#include <cstddef>
#include <cstdint>

namespace gl::amx {

constexpr int kPanelRows = 32; // two A tiles

// Loads the tile configuration every kernel here uses: all eight tiles
// 16 rows x 64 bytes (palette 1).
void configure_tiles();
constexpr int kTileTokens = 16;
constexpr int kTileK = 32;

// Store weight row r (n_in floats as hi + lo bf16) into a 64-byte aligned
// panel of 2 x kPanelRows x n_in bf16.
void panel_row(const float* src, int64_t n_in, int r, uint16_t* panel);
// Pack token tiles [tt0, tt1) of x (n_tok rows of n_in floats, n_in % 32 == 0)
// into xv: 2 x n_tt x kTileTokens x n_in bf16 (n_tt token tiles cover n_tok).
void pack_tokens(const float* x, int64_t n_in, int64_t n_tok, int64_t tt0, int64_t tt1,
                 uint16_t* xv);
// y[t * y_stride + r] = dot(panel row r, x[t]) for r < rows (<= kPanelRows), t < n_tok.
void panel_matmul(const uint16_t* panel, int64_t n_in, const uint16_t* xv, int64_t n_tok, float* y,
                  int64_t y_stride, int rows);

// ---- prompt attention ------------------------------------------------------
// Up to kAttnRows query rows (one KV head's query heads for a run of
// tokens) against all the keys they see, F16 keys and values, head_dim a
// multiple of 32 up to 256. Every F16 value and the scaled queries are split
// into two bf16 parts (hi + lo) and each product is taken as hi*hi + hi*lo +
// lo*hi, so scores and sums are exact to about 2^-16 relative: as close to
// the F32 path as its own rounding. Each converted block of 32 keys and
// values serves all rows, which is what makes tiles pay; a decode step's
// eight rows do not amortise the conversion (measured earlier: no faster).
constexpr int kAttnRows = 128;
constexpr int kAttnBlockKeys = 32;

// Candidate keys [begin, end) of one KV head: key i's element d at
// k[key_tile_index(i, d, head_dim, n_keys)] (key tiles), its value at
// v + i * v_stride bytes; visible to a query at position p when
// 0 <= pos[i] <= p.
struct AttnKeys {
    const uint16_t* k = nullptr;
    int n_keys = 0;
    int begin = 0, end = 0;
    const uint8_t* v = nullptr;
    size_t v_stride = 0;
    const int64_t* pos = nullptr;
};
struct AttnRows {
    int n = 0; // <= kAttnRows
    const float* q[kAttnRows];
    float* out[kAttnRows];
    int64_t pos[kAttnRows];
};
// out[r] = softmax over the visible keys of (scale * q[r] . k) times v; rows
// that see no key get zeros. `scratch`: gl::attention_prompt_floats(head_dim)
// floats, 64-byte aligned.
void attend_rows(const AttnRows& rows, int head_dim, float scale, const AttnKeys* segs, int n_segs,
                 float* scratch);

} // namespace gl::amx
