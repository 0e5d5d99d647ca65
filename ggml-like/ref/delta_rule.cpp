// The reference gated-delta-rule step (kernels.h, ref::delta_rule): the
// arithmetic the SIMD versions are tested against.
#include "ggml-like/kernels.h"

namespace gl::ref {

void delta_rule(float* s, int64_t d_v, int64_t d_k, const float* k, const float* q,
                const float* v, float decay, float beta, float scale, float* o) {
    for (int64_t j = 0; j < d_v; j++) {
        float* row = s + j * d_k;
        float sk = 0.0f;
        for (int64_t i = 0; i < d_k; i++) {
            row[i] *= decay;
            sk += row[i] * k[i];
        }
        const float d = (v[j] - sk) * beta;
        float sq = 0.0f;
        for (int64_t i = 0; i < d_k; i++) {
            row[i] += d * k[i];
            sq += row[i] * q[i];
        }
        o[j] = sq * scale;
    }
}

} // namespace gl::ref
