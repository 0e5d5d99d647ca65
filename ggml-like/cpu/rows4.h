// Row loops shared by the per-ISA k-quant files. A Row type holds one row's
// running sums over its super-blocks: add(block, activation block), total(),
// and a static prefetch(block) that asks for the weights some way ahead.
// From it come a dot product and a matrix-vector product four rows at a
// time: the rows share each activation block (read once from L1 for four
// rows' products) and their weights stream side by side, which keeps more
// lines in flight from DRAM than one row at a time (Q4_K_M generation on an
// AMX Xeon +30%). On AMD cores it is the other way round (half the DRAM rate
// on Zen 4), so gl::cpu::matvec calls vec_dot_row row by row there
// (dispatch.cpp); both give a row the same bits.
//
// Included by files compiled with different -m flags: each defines its Row
// types in its own namespace, so each instantiates its own copies.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ggml-like/blocks_k.h"

namespace gl::rows4 {

template <typename Row> float vec_dot_row(int64_t n, const void* w, const void* a) {
    const auto* x = static_cast<const typename Row::Block*>(w);
    const auto* y = static_cast<const BlockQ8_K*>(a);
    Row s;
    for (int64_t i = 0; i < n / QK_K; i++) {
        Row::prefetch(x + i);
        s.add(x[i], y[i]);
    }
    return s.total();
}

// Four named row sums, not an array: GCC 12 keeps arrays of vectors on the
// stack, which puts a store-load round trip on every accumulation.
template <typename Row>
void matvec_rows4(int64_t n, const void* w, size_t row_bytes, int64_t n_rows, const void* a,
                  float* y) {
    using Block = typename Row::Block;
    const auto* yq = static_cast<const BlockQ8_K*>(a);
    const auto* base = static_cast<const uint8_t*>(w);
    const int64_t nb = n / QK_K;
    auto row = [&](int64_t r) { return reinterpret_cast<const Block*>(base + r * row_bytes); };
    int64_t r = 0;
    for (; r + 4 <= n_rows; r += 4) {
        const Block *x0 = row(r), *x1 = row(r + 1), *x2 = row(r + 2), *x3 = row(r + 3);
        Row s0, s1, s2, s3;
        for (int64_t i = 0; i < nb; i++) {
            // The four prefetches before the four rows' products: issued
            // each just before its row's, Q4_K_M generation measured 22%
            // slower.
            Row::prefetch(x0 + i);
            Row::prefetch(x1 + i);
            Row::prefetch(x2 + i);
            Row::prefetch(x3 + i);
            s0.add(x0[i], yq[i]);
            s1.add(x1[i], yq[i]);
            s2.add(x2[i], yq[i]);
            s3.add(x3[i], yq[i]);
        }
        y[r] = s0.total();
        y[r + 1] = s1.total();
        y[r + 2] = s2.total();
        y[r + 3] = s3.total();
    }
    for (; r < n_rows; r++) y[r] = vec_dot_row<Row>(n, row(r), a);
}

} // namespace gl::rows4
