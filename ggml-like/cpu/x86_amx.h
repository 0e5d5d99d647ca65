// Kernels on Intel AMX tiles (x86_amx.cpp, compiled with -mamx-*). Reached
// only from ggml-like/gemm.cpp after it has checked the CPU and obtained the
// kernel's permission to use tile data.
//
// Layouts (bf16 stored as uint16_t):
//  - weight panel (the A operand): kPanelRows rows of n_in bf16, tile-major:
//    for k-block kb, the tile of rows 0-15 at panel + kb * 1024 and rows 16-31
//    at + 512, each 16 rows x 32 k. Contiguous tiles stream well; row-major
//    rows 4 KiB apart did not (a third of the speed);
//  - packed tokens: for token tile tt (16 tokens) and k-block kb (32 k), one
//    1 KiB B tile at xv + (tt * n_kb + kb) * 512: 16 rows of k pairs, each row
//    16 tokens x (k, k+1). Tokens past n_tok are zero.
#pragma once

#include <cstdint>

namespace gl::amx {

constexpr int kPanelRows = 32; // two A tiles
constexpr int kTileTokens = 16;
constexpr int kTileK = 32;

// Store weight row r (n_in floats, rounded to bf16) into a 64-byte aligned panel.
void panel_row(const float* src, int64_t n_in, int r, uint16_t* panel);
// Pack token tiles [tt0, tt1) of x (n_tok rows of n_in floats, n_in % 32 == 0).
void pack_tokens(const float* x, int64_t n_in, int64_t n_tok, int64_t tt0, int64_t tt1,
                 uint16_t* xv);
// y[t * y_stride + r] = dot(panel row r, x[t]) for r < rows (<= kPanelRows), t < n_tok.
void panel_matmul(const uint16_t* panel, int64_t n_in, const uint16_t* xv, int64_t n_tok, float* y,
                  int64_t y_stride, int rows);

} // namespace gl::amx
