// The gated-delta-rule step (ref::delta_rule) on AVX-512: each state row's
// decay, key product, update and query product 16 lanes at a time, the tail
// masked.
#include <immintrin.h>

#include "ggml-like/cpu/x86/hsum.h"
#include "ggml-like/kernels.h"

namespace gl::avx512_delta {

void delta_rule(float* s, int64_t d_v, int64_t d_k, const float* k, const float* q,
                const float* v, float decay, float beta, float scale, float* o) {
    const __m512 vdecay = _mm512_set1_ps(decay);
    for (int64_t j = 0; j < d_v; j++) {
        float* row = s + j * d_k;
        __m512 acc = _mm512_setzero_ps();
        int64_t i = 0;
        for (; i + 16 <= d_k; i += 16) {
            const __m512 x = _mm512_mul_ps(_mm512_loadu_ps(row + i), vdecay);
            _mm512_storeu_ps(row + i, x);
            acc = _mm512_fmadd_ps(x, _mm512_loadu_ps(k + i), acc);
        }
        const __mmask16 tail = static_cast<__mmask16>((1u << (d_k - i)) - 1);
        if (tail) {
            const __m512 x = _mm512_mul_ps(_mm512_maskz_loadu_ps(tail, row + i), vdecay);
            _mm512_mask_storeu_ps(row + i, tail, x);
            acc = _mm512_fmadd_ps(x, _mm512_maskz_loadu_ps(tail, k + i), acc);
        }
        const __m512 d = _mm512_set1_ps((v[j] - hsum(acc)) * beta);
        acc = _mm512_setzero_ps();
        for (i = 0; i + 16 <= d_k; i += 16) {
            const __m512 x = _mm512_fmadd_ps(d, _mm512_loadu_ps(k + i), _mm512_loadu_ps(row + i));
            _mm512_storeu_ps(row + i, x);
            acc = _mm512_fmadd_ps(x, _mm512_loadu_ps(q + i), acc);
        }
        if (tail) {
            const __m512 x = _mm512_fmadd_ps(d, _mm512_maskz_loadu_ps(tail, k + i),
                                             _mm512_maskz_loadu_ps(tail, row + i));
            _mm512_mask_storeu_ps(row + i, tail, x);
            acc = _mm512_fmadd_ps(x, _mm512_maskz_loadu_ps(tail, q + i), acc);
        }
        o[j] = hsum(acc) * scale;
    }
}

} // namespace gl::avx512_delta
