#include "ggml-like/cpu/ops.h"

#include <algorithm>
#include <cmath>

#include "ggml-like/cpu/gemm.h"
#include "ggml-like/kernels.h"

namespace gl::ops {

void rmsnorm(const float* x, const float* w, int64_t n, float eps, float* out) {
    double ss = 0; // double: a row of 4096 squares loses digits in float
    for (int64_t i = 0; i < n; i++) ss += static_cast<double>(x[i]) * x[i];
    const float scale = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(n) + eps));
    for (int64_t i = 0; i < n; i++) out[i] = x[i] * scale * w[i];
}

void softmax(float* x, int64_t n) {
    float mx = -INFINITY;
    for (int64_t i = 0; i < n; i++) mx = std::max(mx, x[i]);
    double sum = 0;
    for (int64_t i = 0; i < n; i++) {
        x[i] = std::exp(x[i] - mx);
        sum += x[i];
    }
    const float inv = static_cast<float>(1.0 / sum);
    for (int64_t i = 0; i < n; i++) x[i] *= inv;
}

void gelu_mul(float* gate, const float* up, int64_t n) {
    // 0.5 x (1 + tanh(u)) written as x / (1 + exp(-2u)): the same function,
    // without the cancellation of 1 + tanh(u) near -1 (7e-5 relative error in
    // float at x = -4, against 2e-7 this way).
    constexpr float k2Sqrt2OverPi = 1.5957691216057308f;
    for (int64_t i = 0; i < n; i++) {
        const float x = gate[i];
        gate[i] = x / (1.0f + std::exp(-k2Sqrt2OverPi * (x + 0.044715f * x * x * x))) * up[i];
    }
}

void silu_mul(float* gate, const float* up, int64_t n) {
    // exp(-g) a chunk at a time through the vectorised kernel (cpu::exp_sum
    // with max 0 computes exp in place; its sum is not needed).
    constexpr int64_t kChunk = 256;
    float e[kChunk];
    for (int64_t b = 0; b < n; b += kChunk) {
        const int64_t m = std::min(kChunk, n - b);
        for (int64_t i = 0; i < m; i++) e[i] = -gate[b + i];
        cpu::exp_sum(e, m, 0.0f);
        for (int64_t i = 0; i < m; i++) gate[b + i] = gate[b + i] / (1.0f + e[i]) * up[b + i];
    }
}

void add(float* y, const float* x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += x[i];
}

void rope_angles(double pos, int n_pairs, const double* inv_freq, float* cos_out, float* sin_out) {
    for (int i = 0; i < n_pairs; i++) {
        double a = pos * inv_freq[i];
        cos_out[i] = static_cast<float>(std::cos(a));
        sin_out[i] = static_cast<float>(std::sin(a));
    }
}

void rope(float* x, int n_heads, int head_dim, int rope_dims, const float* cos, const float* sin,
          bool neox) {
    const int half = rope_dims / 2;
    for (int h = 0; h < n_heads; h++) {
        float* v = x + static_cast<int64_t>(h) * head_dim;
        for (int i = 0; i < half; i++) {
            const int a = neox ? i : 2 * i;
            const int b = neox ? i + half : 2 * i + 1;
            const float x0 = v[a], x1 = v[b];
            v[a] = x0 * cos[i] - x1 * sin[i];
            v[b] = x0 * sin[i] + x1 * cos[i];
        }
    }
}

size_t matmul_scratch_bytes(Type weight, int64_t n_in, int64_t n_tok, int n_threads) {
    const Type at = vec_dot_type(weight);
    const size_t dot = at == Type::F32 ? 0 : row_size(at, n_in) * static_cast<size_t>(n_tok);
    // The tiled path is decided per call (it may be switched off), so room for both.
    const size_t tiles =
        n_tok >= gemm::kMinTokens ? gemm::scratch_bytes(n_in, n_tok, n_threads) : 0;
    return std::max(dot, tiles);
}

void matmul(ThreadPool& pool, const Tensor& w, const float* x, int64_t n_tok, float* y,
            void* scratch, bool tiles_ok) {
    if (tiles_ok && gemm::applies(w.type, w.ne0, n_tok))
        return gemm::matmul_tiles(pool, w, x, n_tok, y, scratch);
    const Type at = vec_dot_type(w.type);
    const int64_t n_in = w.ne0, n_out = w.ne1;
    const void* act = x;
    size_t act_row = static_cast<size_t>(n_in) * sizeof(float);
    if (at != Type::F32) {
        // Quantize each activation row once; every weight row then reuses it.
        act_row = row_size(at, n_in);
        uint8_t* dst = static_cast<uint8_t*>(scratch);
        pool.parallel_for(
            n_tok,
            [&](int64_t b, int64_t e, int) {
                for (int64_t t = b; t < e; t++)
                    cpu::quantize_row(at, x + t * n_in, dst + t * act_row, n_in);
            },
            n_tok * n_in);
        act = scratch;
    }
    const int64_t n_chunks = (n_out + kRowChunk - 1) / kRowChunk;
    pool.parallel_for(
        n_chunks,
        [&](int64_t cb, int64_t ce, int) {
            for (int64_t c = cb; c < ce; c++) {
                const int64_t r0 = c * kRowChunk, r1 = std::min(n_out, r0 + kRowChunk);
                // token-outer within the chunk: the chunk's weight rows stay in cache
                for (int64_t t = 0; t < n_tok; t++) {
                    const uint8_t* a = static_cast<const uint8_t*>(act) + t * act_row;
                    float* yt = y + t * n_out;
                    cpu::matvec(w.type, n_in, w.row(r0), w.row_bytes, r1 - r0, a, yt + r0);
                }
            }
        },
        n_out * n_in * n_tok);
}

} // namespace gl::ops
