// Row dequantizers for the types of blocks_k.h, shared by the AVX2 and
// AVX-512 k-quant files. The bits are unpacked to bytes with AVX2
// instructions (32 weights a register); a store policy S, one per file,
// widens 16 bytes at a time to floats with that file's vector width:
//
//   S::u8_fma(q, dl, ml, out): out[i] = fma(dl, q[i], -ml), q unsigned bytes
//   S::i8_mul(q, dl, out):     out[i] = dl * q[i],          q signed bytes
//
// which round exactly as the reference's fma(dl, q, -ml) does (ml is 0 for
// the types without a min, and a product plus -0 is the product), so every
// table gives the reference's bits (tests/runtime/test_kernels_k.cpp).
// In an anonymous namespace, like k_scales.h: the two including files are
// compiled with different -m flags, and each must get its own copy.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "ggml-like/blocks_k.h"
#include "ggml-like/cpu/x86/k_scales.h"

namespace gl {
namespace {

namespace dq {

inline __m256i load256(const void* p) {
    return _mm256_loadu_si256(static_cast<const __m256i*>(p));
}

inline __m256i bytes(int v) {
    return _mm256_set1_epi8(static_cast<char>(v));
}

inline __m128i lo128(__m256i v) {
    return _mm256_castsi256_si128(v);
}
inline __m128i hi128(__m256i v) {
    return _mm256_extracti128_si256(v, 1);
}

// A 32-block's nibbles as bytes in element order (low nibbles are elements
// 0..15, high ones 16..31).
inline __m256i nibbles(const uint8_t* qs) {
    const __m256i b =
        _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)));
    return _mm256_and_si256(_mm256_srlv_epi64(b, _mm256_setr_epi64x(0, 0, 4, 4)), bytes(0x0f));
}

// 0xff in byte j where bit j of the little-endian 32-bit word qh is set.
inline __m256i expand_bits(const uint8_t* qh) {
    uint32_t w;
    std::memcpy(&w, qh, sizeof w);
    const __m256i v = _mm256_set1_epi32(static_cast<int>(w));
    const __m256i spread = _mm256_shuffle_epi8(
        v, _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303));
    const __m256i bit = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ull));
    return _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
}

// q of Q5_0 / Q5_1 (0..31): the nibble plus 16 where the fifth bit is set.
inline __m256i five(const uint8_t* qs, const uint8_t* qh) {
    return _mm256_or_si256(nibbles(qs), _mm256_and_si256(expand_bits(qh), bytes(0x10)));
}

// Bit b of every byte of v, moved to bit `to` (0 or 1 per byte).
inline __m256i bit_to(__m256i v, int b, int to) {
    const __m256i one = _mm256_and_si256(_mm256_srli_epi16(v, b), bytes(1));
    return _mm256_slli_epi16(one, to); // a 0/1 byte shifted by < 8 stays in its byte
}

// 32 unsigned bytes of one scale.
template <typename S> void u8_fma32(__m256i q, float dl, float ml, float* out) {
    S::u8_fma(lo128(q), dl, ml, out);
    S::u8_fma(hi128(q), dl, ml, out + 16);
}

// ---- 32-element blocks ------------------------------------------------------

// w = d q + m: fma(d, q, m), the reference's fma(d * 1, q, -(-m * 1)).
template <typename S> void q4_1(const void* src, float* dst, int64_t n) {
    const auto* b = static_cast<const BlockQ4_1*>(src);
    for (int64_t i = 0; i < n / 32; i++)
        u8_fma32<S>(nibbles(b[i].qs), kFp16ToFp32[b[i].d], -kFp16ToFp32[b[i].m], dst + 32 * i);
}

template <typename S> void q5_1(const void* src, float* dst, int64_t n) {
    const auto* b = static_cast<const BlockQ5_1*>(src);
    for (int64_t i = 0; i < n / 32; i++)
        u8_fma32<S>(five(b[i].qs, b[i].qh), kFp16ToFp32[b[i].d], -kFp16ToFp32[b[i].m],
                    dst + 32 * i);
}

// q - 16 as a signed byte: the nibble with 0xf0 or'ed in where the fifth bit is clear.
template <typename S> void q5_0(const void* src, float* dst, int64_t n) {
    const auto* b = static_cast<const BlockQ5_0*>(src);
    for (int64_t i = 0; i < n / 32; i++) {
        const __m256i neg = _mm256_andnot_si256(expand_bits(b[i].qh), bytes(0xf0));
        const __m256i q = _mm256_or_si256(nibbles(b[i].qs), neg);
        const float d = kFp16ToFp32[b[i].d];
        S::i8_mul(lo128(q), d, dst + 32 * i);
        S::i8_mul(hi128(q), d, dst + 32 * i + 16);
    }
}

template <typename S> void iq4_nl(const void* src, float* dst, int64_t n) {
    const auto* b = static_cast<const BlockIQ4_NL*>(src);
    const __m256i book =
        _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kIQ4NL)));
    for (int64_t i = 0; i < n / 32; i++) {
        const __m256i q = _mm256_shuffle_epi8(book, nibbles(b[i].qs));
        const float d = kFp16ToFp32[b[i].d];
        S::i8_mul(lo128(q), d, dst + 32 * i);
        S::i8_mul(hi128(q), d, dst + 32 * i + 16);
    }
}

// ---- K-quants ---------------------------------------------------------------

// Q5_K: sub-block 2c is the low nibbles of qs[32c..], 2c + 1 the high ones;
// bit j of qh[l] is the fifth bit of sub-block j's element l.
template <typename S> void q5_K(const void* src, float* dst, int64_t n) {
    const auto* b = static_cast<const BlockQ5_K*>(src);
    for (int64_t i = 0; i < n / QK_K; i++) {
        alignas(16) uint8_t sm[16];
        _mm_store_si128(reinterpret_cast<__m128i*>(sm), unpack_scales_k4(b[i].scales));
        const float d = kFp16ToFp32[b[i].d], dmin = kFp16ToFp32[b[i].dmin];
        const __m256i qh = load256(b[i].qh);
        float* out = dst + i * QK_K;
        for (int c = 0; c < 4; c++) {
            const __m256i q = load256(b[i].qs + 32 * c);
            const int j = 2 * c;
            const __m256i lo = _mm256_or_si256(_mm256_and_si256(q, bytes(0x0f)), bit_to(qh, j, 4));
            const __m256i hi = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16(q, 4), bytes(0x0f)), bit_to(qh, j + 1, 4));
            u8_fma32<S>(lo, d * static_cast<float>(sm[j]), dmin * static_cast<float>(sm[8 + j]),
                        out + 32 * j);
            u8_fma32<S>(hi, d * static_cast<float>(sm[j + 1]), dmin * static_cast<float>(sm[9 + j]),
                        out + 32 * j + 32);
        }
    }
}

// Q2_K: in half h, group k (elements 128 h + 32 k + l) is bits 2k, 2k+1 of
// qs[32 h + l]; its two 16-element sub-blocks are 8 h + 2 k and + 1.
template <typename S> void q2_K(const void* src, float* dst, int64_t n) {
    const auto* b = static_cast<const BlockQ2_K*>(src);
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = kFp16ToFp32[b[i].d], dmin = kFp16ToFp32[b[i].dmin];
        float* out = dst + i * QK_K;
        for (int h = 0; h < 2; h++) {
            const __m256i qv = load256(b[i].qs + 32 * h);
            for (int k = 0; k < 4; k++) {
                const __m256i q = _mm256_and_si256(_mm256_srli_epi16(qv, 2 * k), bytes(3));
                const int j = 8 * h + 2 * k;
                const uint8_t s0 = b[i].scales[j], s1 = b[i].scales[j + 1];
                S::u8_fma(lo128(q), d * static_cast<float>(s0 & 0x0f),
                          dmin * static_cast<float>(s0 >> 4), out + 16 * j);
                S::u8_fma(hi128(q), d * static_cast<float>(s1 & 0x0f),
                          dmin * static_cast<float>(s1 >> 4), out + 16 * j + 16);
            }
        }
    }
}

// Q3_K: the crumbs as in Q2_K plus a third bit, bit 4 h + k of hmask[l],
// minus 4; the scale is the stored one minus 32 (k_scales.h).
template <typename S> void q3_K(const void* src, float* dst, int64_t n) {
    const auto* b = static_cast<const BlockQ3_K*>(src);
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = kFp16ToFp32[b[i].d];
        alignas(16) int8_t sc[16];
        _mm_store_si128(reinterpret_cast<__m128i*>(sc), unpack_scales_k3(b[i].scales));
        const __m256i hm = load256(b[i].hmask);
        float* out = dst + i * QK_K;
        for (int h = 0; h < 2; h++) {
            const __m256i qv = load256(b[i].qs + 32 * h);
            for (int k = 0; k < 4; k++) {
                const __m256i crumb = _mm256_and_si256(_mm256_srli_epi16(qv, 2 * k), bytes(3));
                const __m256i q =
                    _mm256_sub_epi8(_mm256_or_si256(crumb, bit_to(hm, 4 * h + k, 2)), bytes(4));
                const int j = 8 * h + 2 * k;
                S::i8_mul(lo128(q), d * static_cast<float>(sc[j]), out + 16 * j);
                S::i8_mul(hi128(q), d * static_cast<float>(sc[j + 1]), out + 16 * j + 16);
            }
        }
    }
}

} // namespace dq

} // namespace
} // namespace gl
