#include <bit>
#include <cmath>
#include <vector>

#include "ggml-like/hadamard.h"

namespace gl {

void hadamard_rows_reference(float* x, int64_t rows, int64_t n, int block) {
    const double scale = 1.0 / std::sqrt(static_cast<double>(block));
    std::vector<float> in(block);
    for (int64_t at = 0; at < rows * n; at += block) {
        float* v = x + at;
        in.assign(v, v + block);
        for (int i = 0; i < block; i++) {
            double s = 0;
            for (int j = 0; j < block; j++)
                s += ((std::popcount(static_cast<unsigned>(i & j)) & 1) != hadamard_sign(j) ? -1.0
                                                                                            : 1.0) *
                     in[j];
            v[i] = static_cast<float>(s * scale);
        }
    }
}

} // namespace gl
