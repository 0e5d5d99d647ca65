// The weight types beyond Q4_0/Q8_0: the K-quants (256-element super-blocks),
// the 32-element Q4_1/Q5_0/Q5_1, IQ4_NL, and the activation types their dot
// products use (Q8_K, Q8_1).
//
// Layouts are those of GGUF files (facts about the format); everything that
// computes with them is kvrun's own. Which activation each weight type wants:
//
//   Q2_K Q3_K Q4_K Q5_K Q6_K  x Q8_K  (float d, 256 int8, 16 int16 sums of 16)
//   Q4_1 Q5_1                 x Q8_1  (fp16 d, fp16 s = d * sum(q), 32 int8)
//   Q5_0 IQ4_NL               x Q8_0
//
// Q8_K carries per-16 sums so the "- min" (or "- offset") part of a weight
// costs one small dot product with 16 numbers per super-block instead of a
// second pass over the weights. Q8_1's s plays the same role for the 32-blocks
// with a min: it is computed once per activation row rather than once per
// weight row. (Q8_0 plus an in-kernel sum would be exact where s is rounded to
// fp16, but that rounding, 2^-11 of one block's sum, is far below the int8
// quantization error of the activations themselves.)
//
// The reference code lives in ref/quants_k.cpp and is reached through
// gl::ref::* (kernels.h); the SIMD kernels live in cpu/*_k.cpp and are added to
// each ISA's KernelTable through the entry lists at the end of this file.
#pragma once

#include "ggml-like/kernels.h"
#include "ggml-like/types.h"

#include <array>
#include <cstddef>
#include <cstdint>

namespace gl {

inline constexpr int QK_K = 256;   // elements per K-quant super-block
inline constexpr int kScaleK = 12; // bytes of packed 6-bit scales (Q3_K, Q4_K, Q5_K)

// ---- K-quants -----------------------------------------------------------------

// Eight sub-blocks of 32: w = d * sc[j] * q - dmin * m[j], q in 0..15.
// scales[] packs eight 6-bit sc and eight 6-bit m: for j < 4, sc[j] and m[j]
// are the low 6 bits of bytes j and j + 4; for j >= 4 their low 4 bits are
// the low and high nibble of byte j + 4 and their top 2 bits are the top two
// bits of bytes j - 4 (sc) and j (m). Elements 64 c .. 64 c + 31 are the low
// nibbles of qs[32 c .. 32 c + 31] (sub-block 2c), the next 32 the high ones.
struct BlockQ4_K {
    uint16_t d;    // fp16 scale of the sub-block scales
    uint16_t dmin; // fp16 scale of the sub-block mins
    uint8_t scales[kScaleK];
    uint8_t qs[QK_K / 2];
};
static_assert(sizeof(BlockQ4_K) == type_info(Type::Q4_K).type_size);

// Q4_K plus a fifth bit: bit c of qh[l] is the high bit of element 32 c + l.
struct BlockQ5_K {
    uint16_t d;
    uint16_t dmin;
    uint8_t scales[kScaleK];
    uint8_t qh[QK_K / 8];
    uint8_t qs[QK_K / 2];
};
static_assert(sizeof(BlockQ5_K) == type_info(Type::Q5_K).type_size);

// Sixteen sub-blocks of 16: w = d * scales[j] * (q - 32), q in 0..63. The
// block is two halves of 128; in half h, element 128 h + 32 k + l (k = 0..3,
// l = 0..31) takes its low 4 bits from ql[64 h + l + 32 (k & 1)] (low nibble
// for k < 2, high for k >= 2) and its top 2 bits from bits 2k, 2k+1 of
// qh[32 h + l]. Its scale is scales[8 h + 2 k + l / 16].
struct BlockQ6_K {
    uint8_t ql[QK_K / 2];
    uint8_t qh[QK_K / 4];
    int8_t scales[QK_K / 16];
    uint16_t d;
};
static_assert(sizeof(BlockQ6_K) == type_info(Type::Q6_K).type_size);

// Sixteen sub-blocks of 16: w = d * (sc & 15) * q - dmin * (sc >> 4), q in
// 0..3. In half h, element 128 h + 32 k + l sits in bits 2k, 2k+1 of
// qs[32 h + l]; its sub-block is 8 h + 2 k + l / 16.
struct BlockQ2_K {
    uint8_t scales[QK_K / 16]; // low nibble: scale, high nibble: min
    uint8_t qs[QK_K / 4];
    uint16_t d;
    uint16_t dmin;
};
static_assert(sizeof(BlockQ2_K) == type_info(Type::Q2_K).type_size);

// Sixteen sub-blocks of 16: w = d * (s - 32) * (q - 4), q in 0..7, with the
// low 2 bits placed as in Q2_K and the third bit at bit (element / 32) of
// hmask[element % 32]. s is 6 bits: the low 4 are the low nibble of
// scales[j] (j < 8) or the high nibble of scales[j - 8]; the top 2 are bits
// 2 (j / 4), +1 of scales[8 + j % 4].
struct BlockQ3_K {
    uint8_t hmask[QK_K / 8];
    uint8_t qs[QK_K / 4];
    uint8_t scales[kScaleK];
    uint16_t d;
};
static_assert(sizeof(BlockQ3_K) == type_info(Type::Q3_K).type_size);

// Activations for the K-quants: a = d * qs, qs in [-127, 127];
// bsums[j] = sum of qs[16 j .. 16 j + 15].
struct BlockQ8_K {
    float d;
    int8_t qs[QK_K];
    int16_t bsums[QK_K / 16];
};
static_assert(sizeof(BlockQ8_K) == type_info(Type::Q8_K).type_size);

// ---- 32-element blocks ----------------------------------------------------------

// w = d * q + m, q in 0..15, nibbles placed as in Q4_0.
struct BlockQ4_1 {
    uint16_t d;
    uint16_t m;
    uint8_t qs[16];
};
static_assert(sizeof(BlockQ4_1) == type_info(Type::Q4_1).type_size);

// w = d * (q - 16), q in 0..31: nibbles as in Q4_0, bit j of qh (read as a
// little-endian uint32) is the fifth bit of element j.
struct BlockQ5_0 {
    uint16_t d;
    uint8_t qh[4];
    uint8_t qs[16];
};
static_assert(sizeof(BlockQ5_0) == type_info(Type::Q5_0).type_size);

// w = d * q + m, q in 0..31, bits as in Q5_0.
struct BlockQ5_1 {
    uint16_t d;
    uint16_t m;
    uint8_t qh[4];
    uint8_t qs[16];
};
static_assert(sizeof(BlockQ5_1) == type_info(Type::Q5_1).type_size);

// Activations for Q4_1/Q5_1: a = d * qs, s = fp16(d * sum(qs)).
struct BlockQ8_1 {
    uint16_t d;
    uint16_t s;
    int8_t qs[32];
};
static_assert(sizeof(BlockQ8_1) == type_info(Type::Q8_1).type_size);

// w = d * kIQ4NL[q], nibbles placed as in Q4_0.
struct BlockIQ4_NL {
    uint16_t d;
    uint8_t qs[16];
};
static_assert(sizeof(BlockIQ4_NL) == type_info(Type::IQ4_NL).type_size);

// The IQ4_NL codebook: 16 levels, denser near zero where weights cluster.
inline constexpr int8_t kIQ4NL[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                      1,    13,   25,  38,  53,  69,  89,  113};

// ---- kernel signatures -------------------------------------------------------------

using VecDotFn = float (*)(int64_t n, const void* w, const void* a);
using QuantizeFn = void (*)(const float* src, void* dst, int64_t n);
using DequantizeFn = void (*)(const void* src, float* dst, int64_t n);

// ---- reference entry points -----------------------------------------------------

namespace ref {
// One type's reference kernels; null where the type has none (activation
// types have no dot product of their own).
struct RowKernels {
    DequantizeFn dequantize_row;
    QuantizeFn quantize_row;
    VecDotFn vec_dot;
};
// The reference kernels of the types above, indexed by type id (all null for
// other ids). The generic gl::ref functions (ref/quants.cpp) look a type up in
// their own table first and then here.
extern const std::array<RowKernels, kTypeIdLimit> kRowKernelsK;
} // namespace ref

// ---- SIMD kernels, by ISA ---------------------------------------------------------

// One type's kernels in one ISA; a null member keeps the reference.
struct KernelEntryK {
    Type type;
    VecDotFn vec_dot;
    QuantizeFn quantize_row;
    DequantizeFn dequantize_row;
};

// Used by each ISA's make_table, at compile time only. The slots are
// assigned even when null: these types are this header's, so nothing else
// fills them, and testing a function's address against null is not a
// constant expression under -fsanitize=undefined.
template <size_t N> constexpr void add_kernels_k(KernelTable& t, const KernelEntryK (&e)[N]) {
    for (const KernelEntryK& k : e) {
        const auto i = static_cast<uint32_t>(k.type);
        t.vec_dot[i] = k.vec_dot;
        t.quantize_row[i] = k.quantize_row;
        t.dequantize_row[i] = k.dequantize_row;
    }
}

// The per-ISA kernels (cpu/x86/avx2_k.cpp, cpu/x86/avx512_k.cpp,
// cpu/arm/neon_k.cpp). Each ISA namespace declares the same set, and its
// table gets the same entries; the two macros keep the three lists in step.
// clang-format off
#define GL_DECLARE_K_KERNELS                                              \
    float vec_dot_q2_K(int64_t n, const void* w, const void* a);          \
    float vec_dot_q3_K(int64_t n, const void* w, const void* a);          \
    float vec_dot_q4_K(int64_t n, const void* w, const void* a);          \
    float vec_dot_q5_K(int64_t n, const void* w, const void* a);          \
    float vec_dot_q6_K(int64_t n, const void* w, const void* a);          \
    float vec_dot_q4_1(int64_t n, const void* w, const void* a);          \
    float vec_dot_q5_0(int64_t n, const void* w, const void* a);          \
    float vec_dot_q5_1(int64_t n, const void* w, const void* a);          \
    float vec_dot_iq4_nl(int64_t n, const void* w, const void* a);        \
    void quantize_row_q8_K(const float* src, void* dst, int64_t n);       \
    void dequantize_row_q2_K(const void* src, float* dst, int64_t n);     \
    void dequantize_row_q3_K(const void* src, float* dst, int64_t n);     \
    void dequantize_row_q4_K(const void* src, float* dst, int64_t n);     \
    void dequantize_row_q5_K(const void* src, float* dst, int64_t n);     \
    void dequantize_row_q6_K(const void* src, float* dst, int64_t n);     \
    void dequantize_row_q4_1(const void* src, float* dst, int64_t n);     \
    void dequantize_row_q5_0(const void* src, float* dst, int64_t n);     \
    void dequantize_row_q5_1(const void* src, float* dst, int64_t n);     \
    void dequantize_row_iq4_nl(const void* src, float* dst, int64_t n);

#define GL_K_KERNEL_ENTRIES(ns)                                             \
    {                                                                       \
        {Type::Q2_K, ns::vec_dot_q2_K, nullptr, ns::dequantize_row_q2_K},   \
        {Type::Q3_K, ns::vec_dot_q3_K, nullptr, ns::dequantize_row_q3_K},   \
        {Type::Q4_K, ns::vec_dot_q4_K, nullptr, ns::dequantize_row_q4_K},   \
        {Type::Q5_K, ns::vec_dot_q5_K, nullptr, ns::dequantize_row_q5_K},   \
        {Type::Q6_K, ns::vec_dot_q6_K, nullptr, ns::dequantize_row_q6_K},   \
        {Type::Q4_1, ns::vec_dot_q4_1, nullptr, ns::dequantize_row_q4_1},   \
        {Type::Q5_0, ns::vec_dot_q5_0, nullptr, ns::dequantize_row_q5_0},   \
        {Type::Q5_1, ns::vec_dot_q5_1, nullptr, ns::dequantize_row_q5_1},   \
        {Type::IQ4_NL, ns::vec_dot_iq4_nl, nullptr, ns::dequantize_row_iq4_nl}, \
        {Type::Q8_K, nullptr, ns::quantize_row_q8_K, nullptr},              \
    }

#if defined(__x86_64__)
namespace avx2_k { GL_DECLARE_K_KERNELS }
namespace avx512_k { GL_DECLARE_K_KERNELS }
inline constexpr KernelEntryK kAvx2KernelsK[] = GL_K_KERNEL_ENTRIES(avx2_k);
inline constexpr KernelEntryK kAvx512KernelsK[] = GL_K_KERNEL_ENTRIES(avx512_k);
// Multi-row kernels (KernelTable::matvec), x86 only so far: each x86
// namespace has one for every type of this header.
#define GL_DECLARE_MATVEC_K(T) \
    void matvec_##T(int64_t n, const void* w, size_t row_bytes, int64_t n_rows, const void* a, float* y);
#define GL_MATVEC_K_TYPES(X) X(q2_K) X(q3_K) X(q4_K) X(q5_K) X(q6_K) X(q4_1) X(q5_0) X(q5_1) X(iq4_nl)
namespace avx2_k { GL_MATVEC_K_TYPES(GL_DECLARE_MATVEC_K) }
namespace avx512_k { GL_MATVEC_K_TYPES(GL_DECLARE_MATVEC_K) }
#undef GL_DECLARE_MATVEC_K
#undef GL_MATVEC_K_TYPES
// The matvec entries of a table, from one of the namespaces above.
#define GL_ADD_MATVEC_K(t, ns)                            \
    do {                                                  \
        (t).matvec[id(Type::Q2_K)] = ns::matvec_q2_K;     \
        (t).matvec[id(Type::Q3_K)] = ns::matvec_q3_K;     \
        (t).matvec[id(Type::Q4_K)] = ns::matvec_q4_K;     \
        (t).matvec[id(Type::Q5_K)] = ns::matvec_q5_K;     \
        (t).matvec[id(Type::Q6_K)] = ns::matvec_q6_K;     \
        (t).matvec[id(Type::Q4_1)] = ns::matvec_q4_1;     \
        (t).matvec[id(Type::Q5_0)] = ns::matvec_q5_0;     \
        (t).matvec[id(Type::Q5_1)] = ns::matvec_q5_1;     \
        (t).matvec[id(Type::IQ4_NL)] = ns::matvec_iq4_nl; \
    } while (false)
#endif
#if defined(__aarch64__)
namespace neon_k { GL_DECLARE_K_KERNELS }
inline constexpr KernelEntryK kNeonKernelsK[] = GL_K_KERNEL_ENTRIES(neon_k);
#endif

#undef GL_DECLARE_K_KERNELS
#undef GL_K_KERNEL_ENTRIES
// clang-format on

} // namespace gl
