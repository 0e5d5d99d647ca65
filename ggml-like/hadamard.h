// The orthonormal Walsh–Hadamard transform, run over blocks of a row: the
// rotation that spreads a key's outlier channels over its block before a
// 4-bit cache quantizes it (KvCacheConfig::k_rotate, docs/kv-cache.md).
//
// H_b (b a power of two, Sylvester order: H[i][j] = (-1)^popcount(i & j))
// scaled by 1/sqrt(b) is symmetric and orthonormal, so it is its own inverse
// and rotating both a query and a key leaves their dot product as it was.
#pragma once

#include <cstdint>

namespace gl {

// The largest block the transform may use on heads of head_dim elements:
// the largest power of two dividing head_dim, at most kHadamardMaxBlock
// (1 for an odd head size: no rotation).
constexpr int kHadamardMaxBlock = 256;
int hadamard_block(int head_dim);

// `rows` rows of n floats, n a multiple of `block` (a power of two, at most
// kHadamardMaxBlock): each run of `block` elements x becomes H_b x / sqrt(b),
// in place. The butterflies (O(b log b) a block).
void hadamard_rows(float* x, int64_t rows, int64_t n, int block);
// The same by the definition: each output a sum over the explicit matrix, in
// double (O(b^2) a block). The reference for the butterflies and the kernels.
void hadamard_rows_reference(float* x, int64_t rows, int64_t n, int block);

} // namespace gl
