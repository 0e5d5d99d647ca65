// A non-owning view of a 2-D weight or activation: rows of ne0 elements of one
// type, `row_bytes` apart. Weights point into the mmapped GGUF file.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ggml-like/types.h"

namespace gl {

struct Tensor {
    Type type = Type::F32;
    int64_t ne0 = 0;      // elements per row (contiguous)
    int64_t ne1 = 0;      // rows
    size_t row_bytes = 0; // stride between rows
    const void* data = nullptr;
    // The same rows packed for the CPU GEMM (kernels.h: panels of
    // kPackedPanelRows rows, whose bytes start where row 16 p's would), or
    // null. Kept beside `data`, which every other path reads.
    const void* packed = nullptr;

    const uint8_t* row(int64_t r) const {
        return static_cast<const uint8_t*>(data) + r * row_bytes;
    }
    // The bytes a pass over every row reads (rows row_bytes apart).
    size_t bytes() const { return row_bytes * static_cast<size_t>(ne1); }
    // Rows [first, first + n) of this one: the parts of a fused matrix
    // (packed too where they start on a panel).
    Tensor rows(int64_t first, int64_t n) const {
        Tensor t = *this;
        t.ne1 = n;
        t.data = row(first);
        t.packed = packed && first % kPanelRows == 0
                       ? static_cast<const uint8_t*>(packed) + first * row_bytes
                       : nullptr;
        return t;
    }
    // kernels.h's kPackedPanelRows (a panel's bytes are its rows').
    static constexpr int64_t kPanelRows = 16;
    explicit operator bool() const { return data != nullptr; }
};

// One token's product with a matrix, y = W x, as one job of a group
// (Backend::matmul_group).
struct MatvecJob {
    const Tensor* w;
    const float* x; // w->ne0 floats
    float* y;       // w->ne1 floats
};

} // namespace gl
