// Matrix products with (possibly quantized) weights: y[t] = W x[t].
//
// Decode (n_tok <= 8): matrix-vector. One warp per weight row; lane i reads
// the 8-element chunks i, i + 32, ... of the row, so a warp's loads cover one
// contiguous stretch of the row per step (coalesced: 256 elements = eight
// 32-blocks or one K-quant super-block), dequantizes them in registers
// (dequant.h), and dots them with every token of the batch before moving on:
// each weight byte is read once per call. Lane sums meet in a warp shuffle
// reduction. Decode is bandwidth-bound, so float FMA on dequantized weights
// costs nothing against the memory traffic and is more exact than the CPU's
// int8 activation path.
//
// Prompts (n_tok > 8): tiled. A 256-thread block computes a 64 (weight rows)
// x 64 (tokens) tile of y; each step dequantizes a 64 x 32 tile of W and
// loads a 64 x 32 tile of x into shared memory, then every thread accumulates
// its 4 x 4 outputs. (First stage: FP32 SIMT. The later stage should move to
// tensor cores: mma.sync on sm_80+/sm_87, wgmma on sm_90, with weights
// dequantized to F16/BF16 tiles.)
#include <cstdint>
#include <cstdio>

#include "ggml-like/cuda/dequant.h"
#include "ggml-like/cuda/kernels.h"

namespace gl::cuda {

namespace {

constexpr int kWarp = 32;
constexpr int kRowsPerBlock = 4; // matvec: warps per block, one weight row each
constexpr int kMaxVecTok = 8;

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = kWarp / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

template <uint32_t T, int NT>
__global__ void __launch_bounds__(kRowsPerBlock* kWarp)
    matvec_kernel(const uint8_t* __restrict__ w, size_t row_bytes, int64_t n_in, int64_t n_out,
                  const float* __restrict__ x, int n_tok, bool x_vec4, float* __restrict__ y) {
    const int lane = threadIdx.x % kWarp;
    const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
    if (row >= n_out) return; // whole warps leave together
    const uint8_t* wr = w + row * row_bytes;
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.0f;
    const int64_t n8 = n_in / 8;
    for (int64_t c = lane; c < n8; c += kWarp) {
        float wv[8];
        dequant8<T>(wr, c * 8, wv);
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t < n_tok) {
                const float* xt = x + t * n_in + c * 8;
                float xv[8];
                if (x_vec4) { // two 16-byte loads, not eight 4-byte ones
                    const float4 a = reinterpret_cast<const float4*>(xt)[0];
                    const float4 b = reinterpret_cast<const float4*>(xt)[1];
                    xv[0] = a.x, xv[1] = a.y, xv[2] = a.z, xv[3] = a.w;
                    xv[4] = b.x, xv[5] = b.y, xv[6] = b.z, xv[7] = b.w;
                } else {
#pragma unroll
                    for (int i = 0; i < 8; i++) xv[i] = xt[i];
                }
                float s = acc[t];
#pragma unroll
                for (int i = 0; i < 8; i++) s = fmaf(wv[i], xv[i], s);
                acc[t] = s;
            }
        }
    }
    if constexpr (is_float_type<T>()) {
        for (int64_t k = n8 * 8 + lane; k < n_in; k += kWarp) {
            const float wv = load1<T>(wr, k);
#pragma unroll
            for (int t = 0; t < NT; t++)
                if (t < n_tok) acc[t] = fmaf(wv, x[t * n_in + k], acc[t]);
        }
    }
#pragma unroll
    for (int t = 0; t < NT; t++) {
        const float s = warp_sum(acc[t]);
        if (lane == 0 && t < n_tok) y[t * n_out + row] = s;
    }
}

constexpr int kBM = 64, kBN = 64, kBK = 32, kGemmThreads = 256;

template <uint32_t T>
__global__ void __launch_bounds__(kGemmThreads)
    gemm_kernel(const uint8_t* __restrict__ w, size_t row_bytes, int64_t n_in, int64_t n_out,
                const float* __restrict__ x, int64_t n_tok, float* __restrict__ y) {
    __shared__ float ws[kBK][kBM + 4]; // ws[k][row]
    __shared__ float xs[kBK][kBN + 4]; // xs[k][token]
    const int tid = threadIdx.x;
    const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kBM;
    const int64_t tok0 = static_cast<int64_t>(blockIdx.y) * kBN;
    const int tx = tid % 16, ty = tid / 16; // this thread's 4 tokens / 4 rows
    // Loader roles: 64 rows (or tokens) x 4 chunks of 8 k.
    const int lr = tid / 4, lk = (tid % 4) * 8;
    const int64_t wrow = row0 + lr, xtok = tok0 + lr;
    float acc[4][4] = {};

    for (int64_t k0 = 0; k0 < n_in; k0 += kBK) {
        float v[8];
        const int64_t kk = k0 + lk;
        if (wrow < n_out && kk + 8 <= n_in) {
            dequant8<T>(w + wrow * row_bytes, kk, v);
        } else {
#pragma unroll
            for (int i = 0; i < 8; i++) v[i] = 0.0f;
            if constexpr (is_float_type<T>())
                if (wrow < n_out)
                    for (int i = 0; i < 8; i++)
                        if (kk + i < n_in) v[i] = load1<T>(w + wrow * row_bytes, kk + i);
        }
#pragma unroll
        for (int i = 0; i < 8; i++) ws[lk + i][lr] = v[i];
#pragma unroll
        for (int i = 0; i < 8; i++)
            xs[lk + i][lr] = (xtok < n_tok && kk + i < n_in) ? x[xtok * n_in + kk + i] : 0.0f;
        __syncthreads();
#pragma unroll 8
        for (int k = 0; k < kBK; k++) {
            float a[4], b[4];
#pragma unroll
            for (int i = 0; i < 4; i++) a[i] = ws[k][ty * 4 + i];
#pragma unroll
            for (int j = 0; j < 4; j++) b[j] = xs[k][tx * 4 + j];
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const int64_t t = tok0 + tx * 4 + j;
        if (t >= n_tok) continue;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int64_t r = row0 + ty * 4 + i;
            if (r < n_out) y[t * n_out + r] = acc[i][j];
        }
    }
}

template <uint32_t T>
void launch(const void* w, size_t row_bytes, int64_t n_in, int64_t n_out, const float* x,
            int64_t n_tok, float* y, cudaStream_t s) {
    const auto* wb = static_cast<const uint8_t*>(w);
    if (n_tok <= kMaxVecTok) {
        const dim3 grid(static_cast<unsigned>((n_out + kRowsPerBlock - 1) / kRowsPerBlock));
        const dim3 block(kRowsPerBlock * kWarp);
        // Every token's 8-element chunks are 16-byte aligned when x is and
        // rows are a multiple of 4 floats long.
        const bool x_vec4 = reinterpret_cast<uintptr_t>(x) % 16 == 0 && n_in % 4 == 0;
        if (n_tok == 1)
            matvec_kernel<T, 1><<<grid, block, 0, s>>>(wb, row_bytes, n_in, n_out, x, 1, x_vec4, y);
        else
            matvec_kernel<T, kMaxVecTok><<<grid, block, 0, s>>>(wb, row_bytes, n_in, n_out, x,
                                                                static_cast<int>(n_tok), x_vec4, y);
        return;
    }
    // grid.y is limited to 65535 tiles of 64 tokens: more than any batch.
    const dim3 grid(static_cast<unsigned>((n_out + kBM - 1) / kBM),
                    static_cast<unsigned>((n_tok + kBN - 1) / kBN));
    gemm_kernel<T><<<grid, kGemmThreads, 0, s>>>(wb, row_bytes, n_in, n_out, x, n_tok, y);
}

} // namespace

// Every compute type: the switch below instantiates a kernel for each, so a
// type added to GL_COMPUTE_TYPES without a dequant8 path fails to compile.
bool matmul_supported(Type t) {
    return type_info(t).supported;
}

void matmul(Type t, const void* w, size_t row_bytes, int64_t n_in, int64_t n_out, const float* x,
            int64_t n_tok, float* y, cudaStream_t s) {
    if (n_out <= 0 || n_tok <= 0) return;
    switch (t) {
#define GL_CASE(T)                                                                                 \
    case Type::T:                                                                                  \
        return launch<tid(Type::T)>(w, row_bytes, n_in, n_out, x, n_tok, y, s);
        GL_COMPUTE_TYPES(GL_CASE)
#undef GL_CASE
    default:
        // The backend checks matmul_supported first and throws with the name.
        std::fprintf(stderr, "kvrun: internal error: cuda matmul for %s\n", type_name(t));
        std::abort();
    }
}

} // namespace gl::cuda
