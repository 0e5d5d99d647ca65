// The gated-delta-rule step (ref::delta_rule) on AVX2 (FMA): 8 lanes, a
// scalar tail.
#include <immintrin.h>

#include "ggml-like/cpu/x86/hsum.h"
#include "ggml-like/kernels.h"

namespace gl::avx2_delta {

void delta_rule(float* s, int64_t d_v, int64_t d_k, const float* k, const float* q,
                const float* v, float decay, float beta, float scale, float* o) {
    const __m256 vdecay = _mm256_set1_ps(decay);
    const int64_t body = d_k / 8 * 8;
    for (int64_t j = 0; j < d_v; j++) {
        float* row = s + j * d_k;
        __m256 acc = _mm256_setzero_ps();
        for (int64_t i = 0; i < body; i += 8) {
            const __m256 x = _mm256_mul_ps(_mm256_loadu_ps(row + i), vdecay);
            _mm256_storeu_ps(row + i, x);
            acc = _mm256_fmadd_ps(x, _mm256_loadu_ps(k + i), acc);
        }
        float sk = hsum(acc);
        for (int64_t i = body; i < d_k; i++) {
            row[i] *= decay;
            sk += row[i] * k[i];
        }
        const float dj = (v[j] - sk) * beta;
        const __m256 d = _mm256_set1_ps(dj);
        acc = _mm256_setzero_ps();
        for (int64_t i = 0; i < body; i += 8) {
            const __m256 x = _mm256_fmadd_ps(d, _mm256_loadu_ps(k + i), _mm256_loadu_ps(row + i));
            _mm256_storeu_ps(row + i, x);
            acc = _mm256_fmadd_ps(x, _mm256_loadu_ps(q + i), acc);
        }
        float sq = hsum(acc);
        for (int64_t i = body; i < d_k; i++) {
            row[i] += dj * k[i];
            sq += row[i] * q[i];
        }
        o[j] = sq * scale;
    }
}

} // namespace gl::avx2_delta
