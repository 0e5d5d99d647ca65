// The orthonormal Walsh–Hadamard transform, run over blocks of a row: the
// rotation that spreads a key's outlier channels over its block before a
// 4-bit cache quantizes it (KvCacheConfig::k_rotate, docs/kv-cache.md).
//
// The rotation of a block of b elements (b a power of two) is R = H_b D / sqrt(b):
// D flips the signs of a fixed pseudo-random half of the elements
// (hadamard_sign), H_b is the Hadamard matrix in Sylvester order
// (H[i][j] = (-1)^popcount(i & j)). R is orthonormal, so rotating both a
// query and a key leaves their dot product as it was; its inverse is
// D H_b / sqrt(b). Without D, a component every element of a key shares (keys
// have per-channel offsets) would all land on element 0 of the block: a new
// outlier, the thing the rotation exists to remove (Gemma 3 270M, q4_0 keys
// in blocks of 256: +6.5% perplexity without D).
#pragma once

#include <bit>
#include <cstdint>

namespace gl {

// The block keys are rotated in on heads of head_dim elements: 32 (the
// q8_0 / q4_0 block: each quantized block is rotated on its own), or the
// largest power of two dividing head_dim when that is smaller (16 for heads
// of 80; 1 for an odd head size: no rotation). Whole heads of 64 or 256 were
// measured and are no better (docs/kv-cache.md, "Rotated keys").
constexpr int kHadamardKeyBlock = 32;
int hadamard_block(int head_dim);
// The largest block the transform takes.
constexpr int kHadamardMaxBlock = 256;

// D's sign for element i of a block: -1 where this is true. A quadratic
// (bent) function of i's bits, i0 i1 + i2 i3 + ... mod 2: its Walsh spectrum
// is flat, so a constant offset comes out of R spread evenly, every element
// of magnitude 1 (blocks of 16, 64, 256) or half of them of sqrt(2) (2, 8,
// 32). A Walsh function would only permute H's rows; a hashed pattern spread
// a constant over 32 elements with one of 3.5. The same pattern for every
// block size (the CUDA kernel repeats it).
constexpr bool hadamard_sign(int i) {
    return std::popcount(static_cast<unsigned>(i & (i >> 1) & 0x55)) & 1;
}

// `rows` rows of n floats, n a multiple of `block` (a power of two, at most
// kHadamardMaxBlock): each run of `block` elements x becomes R x, in place.
// Sign flips, then butterflies (O(b log b) a block).
void hadamard_rows(float* x, int64_t rows, int64_t n, int block);
// x becomes R^-1 x = D H_b x / sqrt(b) (rotated keys moved or reseated on the host).
void hadamard_rows_inverse(float* x, int64_t rows, int64_t n, int block);
// R x by the definition: each output a sum over the explicit matrix, in
// double (O(b^2) a block). The reference for the butterflies and the kernels.
void hadamard_rows_reference(float* x, int64_t rows, int64_t n, int block);

} // namespace gl
