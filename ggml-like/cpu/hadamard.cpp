#include <bit>
#include <cmath>

#include "ggml-like/hadamard.h"

namespace gl {

int hadamard_block(int head_dim) {
    if (head_dim <= 0) return 1;
    const int low = head_dim & -head_dim; // the largest power of two dividing it
    return low < kHadamardKeyBlock ? low : kHadamardKeyBlock;
}

namespace {
// One block: log2(b) passes of butterflies (a, b) -> (a + b, a - b) at
// distance h; the inner loop is contiguous, so the compiler vectorizes it
// once h reaches the vector width.
void butterflies(float* v, int b) {
    for (int h = 1; h < b; h *= 2)
        for (int i = 0; i < b; i += 2 * h)
            for (int j = i; j < i + h; j++) {
                const float a = v[j], c = v[j + h];
                v[j] = a + c;
                v[j + h] = a - c;
            }
}

// D / sqrt(b) as one factor per element (the sign and the scale together).
struct Factors {
    float f[kHadamardMaxBlock];
    explicit Factors(int b) {
        const float s = static_cast<float>(1.0 / std::sqrt(static_cast<double>(b)));
        for (int i = 0; i < b; i++) f[i] = hadamard_sign(i) ? -s : s;
    }
};
} // namespace

void hadamard_rows(float* x, int64_t rows, int64_t n, int block) {
    if (block <= 1) return;
    const Factors d(block);
    for (int64_t at = 0; at < rows * n; at += block) {
        float* v = x + at;
        for (int i = 0; i < block; i++) v[i] *= d.f[i];
        butterflies(v, block);
    }
}

void hadamard_rows_inverse(float* x, int64_t rows, int64_t n, int block) {
    if (block <= 1) return;
    const Factors d(block);
    for (int64_t at = 0; at < rows * n; at += block) {
        float* v = x + at;
        butterflies(v, block);
        for (int i = 0; i < block; i++) v[i] *= d.f[i];
    }
}

} // namespace gl
