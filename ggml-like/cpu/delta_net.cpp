#include "delta_net.h"

#include <cmath>
#include <cstring>
#include <vector>

namespace gl::cpu {

void causal_conv1d_silu(float* state, const float* x, const float* w, int64_t n, int channels,
                        int kernel, float* out) {
    const int hist = kernel - 1;
    std::vector<float> win(static_cast<size_t>(hist + n));
    for (int c = 0; c < channels; c++) {
        float* s = state + static_cast<size_t>(c) * hist;
        const float* wc = w + static_cast<size_t>(c) * kernel;
        std::memcpy(win.data(), s, sizeof(float) * hist);
        for (int64_t t = 0; t < n; t++) win[hist + t] = x[t * channels + c];
        for (int64_t t = 0; t < n; t++) {
            float acc = 0.0f;
            for (int j = 0; j < kernel; j++) acc += win[t + j] * wc[j];
            out[t * channels + c] = acc / (1.0f + std::exp(-acc));
        }
        std::memcpy(s, win.data() + n, sizeof(float) * hist);
    }
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
                      float* out) {
    const float out_scale = 1.0f / std::sqrt(static_cast<float>(d_v));
    const int64_t k_at = static_cast<int64_t>(n_k_heads) * d_k, v_at = 2 * k_at;
    for (int64_t t = 0; t < n; t++) {
        const float* row = qkv + t * stride;
        for (int h = 0; h < n_v_heads; h++) {
            const int kh = h % n_k_heads;
            const float* q = row + static_cast<int64_t>(kh) * d_k;
            const float* k = row + k_at + static_cast<int64_t>(kh) * d_k;
            const float* v = row + v_at + static_cast<int64_t>(h) * d_v;
            const float decay = std::exp(g[t * n_v_heads + h]);
            const float b = beta[t * n_v_heads + h];
            float* S = state + static_cast<int64_t>(h) * d_v * d_k;
            float* o = out + t * static_cast<int64_t>(n_v_heads) * d_v + static_cast<int64_t>(h) * d_v;
            for (int j = 0; j < d_v; j++) {
                float* s = S + static_cast<int64_t>(j) * d_k;
                float sk = 0.0f;
                for (int i = 0; i < d_k; i++) {
                    s[i] *= decay;
                    sk += s[i] * k[i];
                }
                const float d = (v[j] - sk) * b;
                float sq = 0.0f;
                for (int i = 0; i < d_k; i++) {
                    s[i] += d * k[i];
                    sq += s[i] * q[i];
                }
                o[j] = sq * out_scale;
            }
        }
    }
}

} // namespace gl::cpu
