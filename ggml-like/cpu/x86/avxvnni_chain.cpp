// AVX-VNNI GEMM of the block-chain types, for the CPUs with AVX2 and the VEX
// form of vpdpbusd but no AVX-512 (Intel's laptop and desktop cores from
// Alder Lake on): the AVX2 GEMM's panels and driver (chain_halves.h), with
// each word multiplied by four broadcast activations straight into 32-bit
// sums as the AVX-512 GEMM does, so no 16-bit runs and no sign trick. Q8_0
// and IQ4_NL enter as u = q + 128 with the offset taken off through the
// activations' block sums; the K-quants' sub-block sums are multiplied by
// their scales (vpmulld). Exact integer sums, then the reference's float
// chain: the same bits as every other table's GEMM.
#include "ggml-like/cpu/chain_gemms.h"

#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <type_traits>

#include "ggml-like/cpu/x86/chain_halves.h"

namespace gl::avxvnni_chain {

namespace {

using namespace chain;

// acc[t] += half h of N consecutive words (from words on) times token t's
// activations from qs[t] on (four a word).
template <int NT, int N>
__attribute__((always_inline)) inline void
dot_words(const uint8_t* words, int h, const int8_t* const (&qs)[NT], __m256i (&acc)[NT]) {
#pragma GCC unroll 2
    for (int k = 0; k < N; k++) {
        const __m256i wv = load_half(words + k * kWordBytes, h);
#pragma GCC unroll 8
        for (int t = 0; t < NT; t++)
            acc[t] =
                _mm256_dpbusd_avx_epi32(acc[t], wv, _mm256_set1_epi32(load_i32(qs[t] + 4 * k)));
    }
}

template <typename W> struct Block32 : Panel32<W> {
    using Act = typename Panel32<W>::Act;
    using Panel32<W>::kMin;
    using Panel32<W>::kPanelBytes;

    template <int NT>
    static void tile(const uint8_t* pan, int h, int64_t nb, const Q8Tokens& a, int64_t t0,
                     __m256 (&f)[NT]) {
        const Act* tok[NT];
        const int32_t* sums[NT];
        for (int t = 0; t < NT; t++) {
            tok[t] = reinterpret_cast<const Act*>(token_row(a, t0 + t));
            sums[t] = W::kOffset ? a.sums + (t0 + t) * nb : nullptr;
        }
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t* words = pan + b * kPanelBytes;
            __m256i acc[NT];
            const int8_t* qs[NT];
#pragma GCC unroll 8
            for (int t = 0; t < NT; t++) {
                acc[t] = W::kOffset ? _mm256_set1_epi32(-W::kOffset * sums[t][b])
                                    : _mm256_setzero_si256();
                qs[t] = tok[t][b].qs;
            }
            dot_words<NT, 8>(words, h, qs, acc);
            const auto* d = reinterpret_cast<const float*>(words + kUnitBytes) + h * kHalfRows;
#pragma GCC unroll 8
            for (int t = 0; t < NT; t++) {
                const __m256 da = _mm256_set1_ps(kFp16ToFp32[tok[t][b].d]);
                f[t] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_load_ps(d), da),
                                       _mm256_cvtepi32_ps(acc[t]), f[t]);
                if constexpr (kMin)
                    f[t] = _mm256_fmadd_ps(_mm256_load_ps(d + kPanelRows),
                                           _mm256_set1_ps(kFp16ToFp32[tok[t][b].s]), f[t]);
            }
        }
    }
};

template <typename K> struct SuperTile : K {
    static constexpr int kUnits = K::kUnits;
    static constexpr size_t kPanelBytes = K::kPanelBytes;
    static constexpr int kWordsPerSub = 64 / K::kSub;

    template <int NT>
    static void tile(const uint8_t* pan, int h, int64_t nb, const Q8Tokens& a, int64_t t0,
                     __m256 (&f)[NT]) {
        const BlockQ8_K* tok[NT];
        for (int t = 0; t < NT; t++)
            tok[t] = reinterpret_cast<const BlockQ8_K*>(token_row(a, t0 + t));
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t* words = pan + b * kPanelBytes;
            const uint8_t* area = words + kUnits * kUnitBytes;
            __m256i q[NT];
            zero(q);
            for (int j = 0; j < K::kSub; j++) {
                __m256i s[NT];
                zero(s);
                const int8_t* qs[NT];
                for (int t = 0; t < NT; t++) qs[t] = tok[t][b].qs + 4 * j * kWordsPerSub;
                dot_words<NT, kWordsPerSub>(words + j * kWordsPerSub * kWordBytes, h, qs, s);
                const __m256i sc = load_half(area + j * kWordBytes, h);
#pragma GCC unroll 8
                for (int t = 0; t < NT; t++)
                    q[t] = _mm256_add_epi32(q[t], _mm256_mullo_epi32(s[t], sc));
            }
            __m256i m[NT];
            zero(m);
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++) {
                const __m256i pairs = load_half(area + (K::kSub + i) * kWordBytes, h);
#pragma GCC unroll 8
                for (int t = 0; t < NT; t++)
                    m[t] = _mm256_dpwssd_avx_epi32(
                        m[t], pairs, _mm256_set1_epi32(load_i32(tok[t][b].bsums + 2 * i)));
            }
            const auto* d =
                reinterpret_cast<const float*>(area + (K::kSub + 8) * kWordBytes) + h * kHalfRows;
#pragma GCC unroll 8
            for (int t = 0; t < NT; t++) {
                const __m256 da = _mm256_set1_ps(tok[t][b].d);
                const __m256 dd = _mm256_mul_ps(_mm256_load_ps(d), da);
                if constexpr (K::kMin) {
                    f[t] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(q[t]), f[t]);
                    const __m256 dm = _mm256_mul_ps(_mm256_load_ps(d + kPanelRows), da);
                    f[t] = _mm256_fnmadd_ps(dm, _mm256_cvtepi32_ps(m[t]), f[t]);
                } else {
                    const __m256i total =
                        _mm256_sub_epi32(q[t], _mm256_slli_epi32(m[t], K::kOffsetShift));
                    f[t] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(total), f[t]);
                }
            }
        }
    }
};

// Packed weights (chain_halves.h's driver): u = q + offset against the
// activations, the offset taken off through their block sums.
struct PackedArith {
    template <typename P> static constexpr int offset() { return -P::kOffset; }
    template <typename P, int NH, int NT>
    __attribute__((always_inline)) static void
    block(const uint8_t* words, int h0, const int8_t* const (&qs)[NT], const int32_t (&init)[NT],
          __m256i (&acc)[NH][NT]) {
#pragma GCC unroll 2
        for (int h = 0; h < NH; h++)
#pragma GCC unroll 4
            for (int t = 0; t < NT; t++) acc[h][t] = _mm256_set1_epi32(init[t]);
        word_pairs([&]<int kHigh>() __attribute__((always_inline)) {
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) {
                const int j = k + 4 * kHigh;
                __m256i w[NH];
#pragma GCC unroll 2
                for (int h = 0; h < NH; h++) w[h] = packed_half_word<P, kHigh>(words, k, h0 + h);
#pragma GCC unroll 4
                for (int t = 0; t < NT; t++) {
                    const __m256i av = _mm256_set1_epi32(load_i32(qs[t] + 4 * j));
#pragma GCC unroll 2
                    for (int h = 0; h < NH; h++)
                        acc[h][t] = _mm256_dpbusd_avx_epi32(acc[h][t], w[h], av);
                }
            }
        });
    }
};

} // namespace

KVRUN_CHAIN_GEMMS(KVRUN_DEFINE_CHAIN_GEMM)

KVRUN_DEFINE_PACKED_GEMMS(PackedArith)

} // namespace gl::avxvnni_chain
