// The gated-delta-rule step (ref::delta_rule) on NEON: 4 lanes, two
// accumulators, a scalar tail.
#include <arm_neon.h>

#include "ggml-like/kernels.h"

namespace gl::neon_delta {

void delta_rule(float* s, int64_t d_v, int64_t d_k, const float* k, const float* q,
                const float* v, float decay, float beta, float scale, float* o) {
    const int64_t body = d_k / 8 * 8;
    for (int64_t j = 0; j < d_v; j++) {
        float* row = s + j * d_k;
        float32x4_t a0 = vdupq_n_f32(0.0f), a1 = vdupq_n_f32(0.0f);
        for (int64_t i = 0; i < body; i += 8) {
            const float32x4_t x0 = vmulq_n_f32(vld1q_f32(row + i), decay);
            const float32x4_t x1 = vmulq_n_f32(vld1q_f32(row + i + 4), decay);
            vst1q_f32(row + i, x0);
            vst1q_f32(row + i + 4, x1);
            a0 = vfmaq_f32(a0, x0, vld1q_f32(k + i));
            a1 = vfmaq_f32(a1, x1, vld1q_f32(k + i + 4));
        }
        float sk = vaddvq_f32(vaddq_f32(a0, a1));
        for (int64_t i = body; i < d_k; i++) {
            row[i] *= decay;
            sk += row[i] * k[i];
        }
        const float dj = (v[j] - sk) * beta;
        a0 = vdupq_n_f32(0.0f);
        a1 = vdupq_n_f32(0.0f);
        for (int64_t i = 0; i < body; i += 8) {
            const float32x4_t x0 = vfmaq_n_f32(vld1q_f32(row + i), vld1q_f32(k + i), dj);
            const float32x4_t x1 = vfmaq_n_f32(vld1q_f32(row + i + 4), vld1q_f32(k + i + 4), dj);
            vst1q_f32(row + i, x0);
            vst1q_f32(row + i + 4, x1);
            a0 = vfmaq_f32(a0, x0, vld1q_f32(q + i));
            a1 = vfmaq_f32(a1, x1, vld1q_f32(q + i + 4));
        }
        float sq = vaddvq_f32(vaddq_f32(a0, a1));
        for (int64_t i = body; i < d_k; i++) {
            row[i] += dj * k[i];
            sq += row[i] * q[i];
        }
        o[j] = sq * scale;
    }
}

} // namespace gl::neon_delta
