// Matrix-matrix products for prompt batches.
//
// The dot-product path (ops::matmul) reads every weight once per token; a
// batch of T tokens reads and decodes each weight T times. Here each weight
// row block is dequantized once per batch into a panel and multiplied against
// all T tokens. Used by ops::matmul for batches of at least kMinTokens, on one
// of two paths:
//  - Amx: bf16 panels on Intel AMX tiles (fp32 accumulation). Weights and
//    activations each split into two bf16 parts (hi + lo), three tile
//    products per pair: about 16 bits of mantissa, close to the F32 path.
//  - Blas: an F32 panel and OpenBLAS SGEMM (builds with OpenBLAS, CPUs without
//    AMX: on AVX2 machines without VNNI, FMA on F32 beats 8-bit dot products
//    per instruction). Exact weights, F32 activations.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "ggml-like/tensor.h"
#include "ggml-like/cpu/thread_pool.h"

namespace gl::gemm {

constexpr int64_t kMinTokens = 16;

// AMX BF16 present, granted by the OS, and the active kernel table is the
// AVX-512 one (KVRUN_ISA=avx2/scalar and KVRUN_AMX=0 turn it off).
bool amx_enabled();
// Force both paths off (tests compare them with the dot-product path) or back on.
void force_off(bool off);

// OpenBLAS linked in, not switched off, and the kernels are not forced scalar.
bool blas_enabled();
// Load OpenBLAS now, unless KVRUN_BLAS=0: its load sets an environment
// variable (openblas.h), so call it while no other thread runs.
void load_blas();
// What the OpenBLAS path runs, for --version, info and bench
// (openblas::describe), or that KVRUN_BLAS=0 switched it off (not loaded then).
std::string blas_description();

enum class Path { None, Amx, Blas };
// Which path matmul takes for this weight type and batch.
Path path_for(Type weight, int64_t n_in, int64_t n_tok);
const char* path_name(Path p);
// path_for(...) != Path::None.
bool applies(Type weight, int64_t n_in, int64_t n_tok);
// Scratch for matmul_tiles: packed tokens plus one panel per thread.
size_t scratch_bytes(int64_t n_in, int64_t n_tok, int n_threads);
// y[t][r] = dot(W.row(r), x[t]); requires applies(W.type, W.ne0, max(n_tok,
// batch_tok)): rows of a larger batch (ops::MatmulPaths::batch_tokens) take
// the path the whole batch would, however few they are.
void matmul_tiles(ThreadPool& pool, const Tensor& w, const float* x, int64_t n_tok, float* y,
                  void* scratch, int64_t batch_tok = 0);

} // namespace gl::gemm
