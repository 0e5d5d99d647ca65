// Element-wise and row operations on float activations, plus the matrix
// product of a (possibly quantized) weight matrix with a batch of activation
// rows. Plain C++; the heavy inner loops go through gl::cpu kernels.
#pragma once

#include <cstdint>
#include <cstddef>
#include <string>
#include <vector>

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
// Which batch paths matmul may take.
struct MatmulPaths {
    // gemm::matmul_tiles (AMX or OpenBLAS on F32 activations): its results
    // depend on the batch. Off under --deterministic.
    bool tiles = true;
    // The kernel table's integer GEMM (block-chain types, 8-bit activations):
    // the reference's block-chain arithmetic whatever the batch. Off under
    // --precise, which keeps F32 activations for prompts.
    bool int8 = true;
    // Every batch of a block-chain type through the integer GEMM, one token
    // too, so that each token's outputs are the same bits whatever its batch
    // (and Q4_1 too, which otherwise keeps F32 prompts). Otherwise batches of
    // fewer than kInt8MinTokens take the table's own dot products, which sum
    // in their own order. Not what --deterministic uses on plain rows: single
    // tokens decode 2.2-3.9x slower this way than on the dot products, since
    // each batch packs its panels anew. Packed weights (below) do not.
    bool invariant = false;
    // Every row the bits of a one-token batch, whatever the batch's size
    // (speculative verification, kvrun batch's decode passes:
    // Backend::set_rows_exact): no tiles, and the integer GEMM only where
    // one token takes it too (packed weights, the invariant mode).
    bool rows_exact = false;
    // Weights with a packed copy (Tensor::packed) take the table's packed
    // GEMM for every batch, one token too: fast for one token and for many,
    // and batch-invariant, so every other flag here is met. Off under
    // --precise (F32 activations).
    bool packed = true;
    // The rows are part of a batch of this many tokens (the tokens a mixture
    // of experts routes to one expert): they take that batch's arithmetic, so
    // that an expert's precision does not depend on how many of the batch's
    // tokens it got: 8-bit activations where the batch would take the integer
    // GEMM (the GEMM, or the dot products for fewer than kInt8MinTokens
    // rows), F32 tiles where it would take those (--precise). 0: the rows
    // are the batch.
    int64_t batch_tokens = 0;
};
// y[t][r] = dot(W.row(r), x[t]) for t < n_tok, r < W.ne1.
// x: n_tok rows of W.ne0 floats; y: n_tok rows of W.ne1 floats. Batches go
// to AMX tiles where they exist, else to the integer GEMM where the type has
// one, else to the OpenBLAS tiles, else one dot product per (row, token);
// each path only where `paths` allows it. The dot products, and the integer
// GEMM, each give a token the same outputs whatever its batch; with
// paths.invariant every batch of a block-chain type takes the GEMM.
void matmul(ThreadPool& pool, const Tensor& w, const float* x, int64_t n_tok, float* y,
            void* scratch, MatmulPaths paths = {});
// One token's products with several matrices in one parallel loop (a
// mixture of experts' generated token: its experts' gate and up rows, then
// their down rows): job j sets y = W_j x_j, the same bits as matmul(pool,
// *W_j, x_j, 1, y_j, ...) with these paths. The rows of every job whose one
// token takes the dot products are cut into one loop's chunks, so that each
// thread streams one contiguous run of them instead of joining a loop per
// matrix; each distinct (x, activation type) is converted once. A job whose
// token takes another path (packed weights, the invariant mode's GEMM) runs
// alone through matmul, with `scratch` as its scratch.
// What matvec_group keeps between calls (it grows to the largest group).
struct MatvecGroupScratch {
    std::vector<uint8_t> acts;  // the converted activations
    std::vector<size_t> offset; // job j's activations in acts; kNone: x itself
    struct Chunk {
        int32_t job;
        int64_t r0, r1;
    };
    std::vector<Chunk> chunks;
    static constexpr size_t kNone = SIZE_MAX;
};
void matvec_group(ThreadPool& pool, const MatvecJob* jobs, int n_jobs, MatvecGroupScratch& group,
                  void* scratch, MatmulPaths paths = {});
// What matmul runs for this weight type and batch: "amx-bf16", "openblas",
// "int8 gemm (<isa>)" or "dot products" (for --version, info and bench).
std::string batch_path_name(Type weight, int64_t n_in, int64_t n_tok, MatmulPaths paths = {});
// The same for a matrix, which may be packed: "packed int8 gemm (<isa>)".
std::string batch_path_name(const Tensor& w, int64_t n_tok, MatmulPaths paths = {});
// The default paths of a 512-token batch: one name, or the integer GEMM's
// types and the others' ("int8 gemm (avx512) for Q4_0, Q5_0, ..., Q6_K;
// openblas for the rest").
std::string batch_paths_summary();
// Batches of at least this many tokens take the integer GEMM (outside the
// invariant mode): below it the dot products are faster (AMD EPYC, 1.1B Q4_0
// shape, AVX-512: 2 tokens 50 against 102 tok/s, 4: 89 against 120, 8: 161
// against 127; AVX2 alike). Not under MatmulPaths::rows_exact.
inline constexpr int64_t kInt8MinTokens = 8;

// Weight rows per work unit of matmul's parallel loop (one dot product per
// row and token): enough to amortize the loop, small enough that both
// threads stay busy on the narrow matrices of small models.
inline constexpr int64_t kRowChunk = 16;
// Weight rows per work unit of the integer GEMM: two of its 16-row panels.
inline constexpr int64_t kGemmRows = 32;

} // namespace gl::ops
