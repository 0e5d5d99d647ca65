// Q8_1 activation rows (the activations of Q4_1 and Q5_1) from an ISA's Q8_0
// block quantizer: d and q exactly as Q8_0's, plus s = fp16(d * sum(q)) as
// the reference computes it. Instantiated in each ISA's file, with its flags.
#pragma once

#include <cstdint>
#include <cstring>

#include "ggml-like/blocks_k.h"
#include "ggml-like/types.h"

namespace gl {

template <void (*QuantizeBlockQ8_0)(const float*, BlockQ8_0*)>
void quantize_row_q8_1(const float* src, void* dst, int64_t n) {
    auto* b = static_cast<BlockQ8_1*>(dst);
    for (int64_t i = 0; i < n / QK8_0; i++) {
        BlockQ8_0 q;
        QuantizeBlockQ8_0(src + i * QK8_0, &q);
        int sum = 0;
        for (int8_t v : q.qs) sum += v;
        b[i].d = q.d;
        b[i].s = fp32_to_fp16(kFp16ToFp32[q.d] * static_cast<float>(sum));
        std::memcpy(b[i].qs, q.qs, sizeof q.qs);
    }
}

} // namespace gl
