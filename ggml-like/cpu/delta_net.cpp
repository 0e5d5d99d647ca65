#include "delta_net.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "ggml-like/backend.h"
#include "ggml-like/kernels.h"

namespace gl::cpu {

void causal_conv1d_silu(float* state, const float* x, const float* w, int64_t n, int channels,
                        int kernel, float* out) {
    const int hist = kernel - 1;
    const size_t C = static_cast<size_t>(channels);
    // Taps as rows ([kernel][channels]) so that each row of the batch is one
    // contiguous multiply-add per tap; per channel the taps still add in order.
    std::vector<float> taps(static_cast<size_t>(kernel) * C);
    for (size_t c = 0; c < C; c++)
        for (int j = 0; j < kernel; j++) taps[j * C + c] = w[c * kernel + j];
    // The input row at position idx of the window: history (state) for idx < 0.
    auto input = [&](int64_t idx) { return idx < 0 ? state + (idx + hist) * C : x + idx * C; };
    for (int64_t t = 0; t < n; t++) {
        float* o = out + t * C;
        std::fill(o, o + C, 0.0f);
        for (int j = 0; j < kernel; j++) {
            const float* src = input(t - hist + j);
            const float* tj = taps.data() + j * C;
            for (size_t c = 0; c < C; c++) o[c] += src[c] * tj[c];
        }
        for (size_t c = 0; c < C; c++) o[c] = o[c] / (1.0f + std::exp(-o[c]));
    }
    // The last kernel-1 inputs become the history (through a copy: with a
    // batch shorter than that, part of the new history is the old one).
    std::vector<float> next(static_cast<size_t>(hist) * C);
    for (int r = 0; r < hist; r++) std::memcpy(next.data() + r * C, input(n - hist + r), C * 4);
    std::memcpy(state, next.data(), next.size() * sizeof(float));
}

void l2_normalize(float* x, int64_t rows, int n, float eps) {
    for (int64_t r = 0; r < rows; r++) {
        float* v = x + r * n;
        double ss = 0;
        for (int i = 0; i < n; i++) ss += static_cast<double>(v[i]) * v[i];
        const float scale = static_cast<float>(1.0 / std::sqrt(ss + eps));
        for (int i = 0; i < n; i++) v[i] *= scale;
    }
}

void gated_delta_rule(float* state, const float* qkv, int64_t stride, const float* g,
                      const float* beta, int64_t n, int n_v_heads, int n_k_heads, int d_k, int d_v,
                      float* out, int h0, int h1) {
    const float out_scale = 1.0f / std::sqrt(static_cast<float>(d_v));
    const int64_t k_at = static_cast<int64_t>(n_k_heads) * d_k, v_at = 2 * k_at;
    // Heads outer: a head's state (d_v x d_k floats) stays in cache over the
    // batch's tokens.
    for (int h = h0; h < h1; h++) {
        const int kh = h % n_k_heads;
        for (int64_t t = 0; t < n; t++) {
            const float* row = qkv + t * stride;
            delta_rule(state + static_cast<int64_t>(h) * d_v * d_k, d_v, d_k,
                       row + k_at + static_cast<int64_t>(kh) * d_k,
                       row + static_cast<int64_t>(kh) * d_k, row + v_at + static_cast<int64_t>(h) * d_v,
                       std::exp(g[t * n_v_heads + h]), beta[t * n_v_heads + h], out_scale,
                       out + (t * n_v_heads + h) * static_cast<int64_t>(d_v));
        }
    }
}

} // namespace gl::cpu

namespace gl {

void Backend::gated_delta_rule(float* state, const float* qkv, int64_t stride, const float* g,
                               const float* beta, int64_t n, int n_v_heads, int n_k_heads, int d_k,
                               int d_v, float* out) {
    cpu::gated_delta_rule(state, qkv, stride, g, beta, n, n_v_heads, n_k_heads, d_k, d_v, out, 0,
                          n_v_heads);
}

} // namespace gl
