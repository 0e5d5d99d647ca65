// Element-wise and row operations on float activations, plus the matrix
// product of a (possibly quantized) weight matrix with a batch of activation
// rows. Plain C++; the heavy inner loops go through gl::cpu kernels.
#pragma once

#include <cstdint>

#include "ggml-like/tensor.h"
#include "ggml-like/cpu/thread_pool.h"

namespace gl::ops {

// out[i] = x[i] / sqrt(mean(x^2) + eps) * w[i]
void rmsnorm(const float* x, const float* w, int64_t n, float eps, float* out);
// In place, numerically stable (subtracts the max).
void softmax(float* x, int64_t n);
// gate[i] = silu(gate[i]) * up[i]
void silu_mul(float* gate, const float* up, int64_t n);
void gelu_mul(float* gate, const float* up, int64_t n); // tanh approximation (backend.h)
// y[i] += x[i]
void add(float* y, const float* x, int64_t n);

// RoPE angles for one position: theta_i = pos * inv_freq[i], computed in double
// so that large absolute positions keep their precision.
void rope_angles(double pos, int n_pairs, const double* inv_freq, float* cos_out, float* sin_out);
// Rotate the first rope_dims of each head. `neox`: pairs (i, i + rope_dims/2)
// (GPT-NeoX / Qwen2 layout) instead of adjacent pairs (2i, 2i+1) (llama).
void rope(float* x, int n_heads, int head_dim, int rope_dims, const float* cos, const float* sin,
          bool neox);

// Bytes of scratch matmul needs for n_tok activation rows of n_in elements on
// n_threads threads: the rows converted to the weight type's activation type,
// or the tiled path's packed tokens and per-thread panels (gemm.h).
size_t matmul_scratch_bytes(Type weight, int64_t n_in, int64_t n_tok, int n_threads);
// y[t][r] = dot(W.row(r), x[t]) for t < n_tok, r < W.ne1.
// x: n_tok rows of W.ne0 floats; y: n_tok rows of W.ne1 floats. Batches go to
// gemm::matmul_tiles where it applies, else one dot product per (row, token).
// With tiles_ok false, always the dot products: each token's outputs are then
// the same whatever the batch (--deterministic).
void matmul(ThreadPool& pool, const Tensor& w, const float* x, int64_t n_tok, float* y,
            void* scratch, bool tiles_ok = true);

// Weight rows per work unit of matmul's parallel loop (one dot product per
// row and token): enough to amortize the loop, small enough that both
// threads stay busy on the narrow matrices of small models.
inline constexpr int64_t kRowChunk = 16;

} // namespace gl::ops
