// A decode step's attention over F16 keys and values with AVX512-FP16
// products (x86/fp16.cpp, compiled with -mavx512fp16; Sapphire Rapids and
// later). Reached only from ggml-like/attention.cpp after available().
//
// Why: at depth the F32 path is bound by its FMAs (one 512-bit FMA per 16
// products, plus widening every F16 element), not by reading the ring. Here
// one 512-bit FMA takes 32 products straight from the F16 cache, with no
// widening. Half precision would lose too much if it summed a whole head or
// a whole ring, so it sums only short spans (kSpanDims dimensions of a score,
// kSpanKeys keys of a value sum) in F16 and adds the spans in F32; each span
// adds a few F16 roundings (relative 2^-11 each) to the F16 cache's own.
// A span that overflows half precision (|sum| > 65504) gives inf or NaN: the
// kernels check their F32 results and return false, having written nothing,
// and the caller takes the F32 path for those keys.
#pragma once

#include <cstddef>
#include <cstdint>

namespace gl::fp16 {

constexpr int kSpanDims = 16; // dimensions of a score summed in F16
constexpr int kSpanKeys = 16; // keys of a value sum summed in F16
constexpr int kMaxHeads = 8;  // query heads one scores call takes
constexpr int kMaxValueHeads = 4;
constexpr int kMaxHeadDim = 256;

// The CPU has AVX512-FP16 (and the OS saves its registers).
bool cpu_supported();

// x[i] * scale rounded to F16, n elements.
void to_half(const float* x, float scale, int64_t n, uint16_t* out);

// Scores of nh query heads (1..kMaxHeads) over two full key tiles of 16 keys
// each (gl::key_tile_index, F16, head_dim hd: a multiple of kSpanDims, at most
// kMaxHeadDim): q holds the heads' scaled queries in F16, hd apart; key i of
// tile a goes to out[j * os + i], of tile b to out[j * os + 16 + i].
// False, nothing written, if a score is not finite. Prefetches pf_lines
// (at most hd) lines from pf into L2 as it goes, one per dimension: the
// caller's next chunk, fetched between the FMAs instead of in a burst.
bool score_tiles(int hd, const uint16_t* tile_a, const uint16_t* tile_b, const uint16_t* q, int nh,
                 float* out, size_t os, const void* pf = nullptr, int pf_lines = 0);

// y[j][0..hd) += sum_i w[j * ws + i] * v_i for nh heads (1..kMaxValueHeads)
// over n F16 value rows (v_i at rows + i * stride bytes); hd a multiple of
// 32, at most kMaxHeadDim; n at most 64. False, y untouched, if a sum is
// not finite. Prefetches pf_lines (at most n per 64 dimensions) lines from
// pf into L2, one per row.
bool add_values(int hd, const uint8_t* rows, size_t stride, int n, const float* w, size_t ws,
                int nh, float* const* y, const void* pf = nullptr, int pf_lines = 0);

} // namespace gl::fp16
