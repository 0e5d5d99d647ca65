// Matrix-matrix products for prompt batches on tile hardware (Intel AMX).
//
// The dot-product path (ops::matmul) reads every weight once per token; a
// batch of T tokens reads and decodes each weight T times. Here each weight
// row block is dequantized once per batch into a bf16 panel and multiplied
// against all T tokens on AMX tiles (fp32 accumulation). Used by ops::matmul
// for batches of at least kMinTokens on CPUs with AMX-BF16; otherwise absent.
//
// Precision: weights and activations are rounded to bf16 (8-bit mantissa),
// comparable to the 8-bit activation blocks of the dot-product path.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ggml-like/tensor.h"
#include "ggml-like/thread_pool.h"

namespace gl::gemm {

constexpr int64_t kMinTokens = 16;

// AMX BF16 present, granted by the OS, and the active kernel table is the
// AVX-512 one (KVRUN_ISA=avx2/scalar and KVRUN_AMX=0 turn it off).
bool amx_enabled();
// Force the tiles off (tests compare both paths) or back to the default.
void force_off(bool off);

// Whether matmul takes the tiled path for this weight type and batch.
bool applies(Type weight, int64_t n_in, int64_t n_tok);
// Scratch for matmul_tiles: packed tokens plus one panel per thread.
size_t scratch_bytes(int64_t n_in, int64_t n_tok, int n_threads);
// y[t][r] = dot(W.row(r), x[t]); requires applies(W.type, W.ne0, n_tok).
void matmul_tiles(ThreadPool& pool, const Tensor& w, const float* x, int64_t n_tok, float* y,
                  void* scratch);

} // namespace gl::gemm
