// Launchers for the CUDA kernels (matmul.cu, ops.cu, attention.cu). Every
// pointer here is a DEVICE pointer; every launcher enqueues on `s` and returns
// without waiting. Errors of the launch itself are checked by the caller
// (cudaGetLastError) -- see backend.cu.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include <cuda_runtime.h>

#include "ggml-like/types.h"

namespace gl::cuda {

// ---- matmul ------------------------------------------------------------------------
// Weight types with a CUDA path: every type of GL_COMPUTE_TYPES (types.h).
bool matmul_supported(Type t);
// y[t][r] = dot(W row r, x[t]) for t < n_tok, r < n_out. W rows are
// row_bytes apart. n_tok <= 8 uses the matrix-vector kernel (one warp per
// weight row, all tokens per weight read); larger batches the tiled kernel.
void matmul(Type t, const void* w, size_t row_bytes, int64_t n_in, int64_t n_out, const float* x,
            int64_t n_tok, float* y, cudaStream_t s);

// ---- element-wise and row operations ----------------------------------------------------
void rmsnorm(const float* x, const float* w, int64_t n, int64_t rows, float eps, float* out,
             cudaStream_t s);
// x += y, then rmsnorm(x) into out (which may be y), in one kernel: the bits
// of add then rmsnorm.
void add_rmsnorm(float* x, const float* y, const float* w, int64_t n, int64_t rows, float eps,
                 float* out, cudaStream_t s);
void rope(float* x, int64_t rows, int n_heads, int head_dim, int rope_dims, const float* cos,
          const float* sin, bool neox, cudaStream_t s);
// n_blocks runs of `block` floats (a power of two, at most
// kHadamardMaxBlock), each rotated by the orthonormal Hadamard transform in
// place (gl::hadamard_rows).
// `inverse`: R^-1 (gl::hadamard_rows_inverse), butterflies first, then D / sqrt(b).
void hadamard_rows(float* x, int64_t n_blocks, int block, bool inverse, cudaStream_t s);
void silu_mul(float* gate, const float* up, int64_t n, cudaStream_t s);
void gelu_mul(float* gate, const float* up, int64_t n, cudaStream_t s);
void add(float* y, const float* x, int64_t n, cudaStream_t s);
// Every type of GL_KV_TYPES (types.h); n a multiple of the block size.
bool convert_supported(Type t);
void convert_rows(Type t, const float* x, int64_t n, int64_t rows, void* dst, cudaStream_t s);

// ---- attention ------------------------------------------------------------------------
// AttentionArgs with device pointers (see attention.h for the rules). The
// device holds n_slots cached rows: the whole ring (n_slots = n_ctx), or with
// a hot/cold split only the hot slots, each tagged in slot_pos with the
// position it holds; the visibility rules still use the ring's n_ctx, n_sink
// and window.
struct DevAttention {
    int n_tok = 0, n_head = 0, n_head_kv = 0, head_dim = 0;
    float scale = 1.0f;
    const float* q = nullptr;
    const float* q_unrot = nullptr; // may be null when no query is past n_ctx
    const int64_t* pos = nullptr;
    Type k_type = Type::F16, v_type = Type::F16;
    size_t k_row_bytes = 0, v_row_bytes = 0;
    int n_ctx = 0;   // the ring's slots (rules)
    int n_slots = 0; // rows at k_slots / v_slots, entries of slot_pos
    const void* k_slots = nullptr;
    const void* v_slots = nullptr;
    const int64_t* slot_pos = nullptr; // [n_slots], never null here
    const void* k_new = nullptr;
    const void* v_new = nullptr;
    int n_sink = 0;
    int64_t window = 0;
    const float* sink_k = nullptr; // may be null when no query is past n_ctx
    float* out = nullptr;
    float* lse = nullptr; // optional [n_tok][n_head]: log-sum-exp of each query's scores
};
// Keys per split: each (token, head) scans n_slots + n_tok keys in chunks of
// this many, one thread block per chunk (flash-decoding), and a second kernel
// merges the chunks' partial softmax sums by log-sum-exp.
inline constexpr int kAttnChunk = 256;
inline int attention_splits(int n_slots, int n_tok) {
    return (n_slots + n_tok + kAttnChunk - 1) / kAttnChunk;
}
// Floats of device scratch for the partial results.
inline size_t attention_partial_floats(int n_tok, int n_head, int head_dim, int n_slots) {
    return static_cast<size_t>(n_tok) * n_head * attention_splits(n_slots, n_tok) * (head_dim + 2);
}
void attention(const DevAttention& a, float* partial, cudaStream_t s);

// False (with the reason) when this binary has no kernel image for the
// current device (built for other architectures).
bool kernels_loadable(std::string* why);

} // namespace gl::cuda
