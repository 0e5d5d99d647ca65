// AVX2 GEMM of the block-chain types (kernels.h's block_chain: Q4_0, Q5_0,
// Q8_0 and IQ4_NL weights with Q8_0 activations, Q4_1 and Q5_1 with Q8_1,
// the K-quants with Q8_K), for prompt batches on CPUs without AVX-512.
//
// The same panels as the AVX-512 GEMM (chain_panel.h: sixteen rows, lane =
// row, four unsigned weight bytes a lane), read as two 256-bit halves of
// eight rows. Without vpdpbusd a word is multiplied by four broadcast
// activations with vpmaddubsw, whose 16-bit pair sums saturate: products of
// u <= 15 (Q4_0, Q4_1, Q4_K) can be added up for eight words (sixteen products
// of at most 15 * 128 = 1920 stay below 32767), of u <= 31 (Q5_0) for four,
// of u <= 63 (Q6_K) for two, before vpmaddwd widens them to 32 bits (with
// the sub-block scale as its multiplier for the K-quants). Q8_0's and
// IQ4_NL's weights, unsigned as u = q + 128, would saturate a single pair, so
// their words are turned back to q and multiplied as |q| by a * sign(q) (Q8_0
// activations are within +-127, so the sign never wraps), and widened at once.
// A tile is one half (eight rows) by four tokens.
//
// The integer sums are exact, so the result is the scalar reference's
// arithmetic (ref/quants.cpp, ref/quants_k.cpp) and the same bits, as the
// AVX-512 GEMM's are.
#include "ggml-like/cpu/chain_gemms.h"

#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "ggml-like/cpu/x86/chain_halves.h"

namespace gl::avx2_chain {

namespace {

using namespace chain;

// acc[t] += the 16-bit pair products of half h of N consecutive words (from
// words on) with token t's activations from qs[t] on (four per word). Two
// words an iteration: unrolled further, the compiler's schedule runs out of
// the sixteen registers and spills.
template <int NT, int N>
__attribute__((always_inline)) inline void
dot16(const uint8_t* words, int h, const int8_t* const (&qs)[NT], __m256i (&acc)[NT]) {
#pragma GCC unroll 2
    for (int k = 0; k < N; k++) {
        const __m256i wv = load_half(words + k * kWordBytes, h);
#pragma GCC unroll 8
        for (int t = 0; t < NT; t++) {
            const __m256i av = _mm256_set1_epi32(load_i32(qs[t] + 4 * k));
            acc[t] = _mm256_add_epi16(acc[t], _mm256_maddubs_epi16(wv, av));
        }
    }
}

// Words (of four products a lane, two a 16-bit pair) whose vpmaddubsw sums of
// weights u <= max_u and activations |a| <= 128 may be added in 16 bits.
constexpr int unsaturated_words(int max_u) {
    int k = 8;
    while (k > 1 && k * 2 * max_u * 128 > 32767) k /= 2;
    return k;
}
static_assert(unsaturated_words(15) == 8 && unsaturated_words(31) == 4 &&
              unsaturated_words(63) == 2);

// The 32-element types (Panel32): exact block sums, then d * d_a times the
// sum (and Q4_1's m * s_a) into the float accumulators, block by block.
template <typename W> struct Block32 : Panel32<W> {
    using Act = typename Panel32<W>::Act;
    using Panel32<W>::kMin;
    using Panel32<W>::kPanelBytes;
    // Q8_0, IQ4_NL: signed bytes, as |q| by a * sign(q).
    static constexpr bool kSigned = W::kMaxU > 127;
    static constexpr int kRun = unsaturated_words(W::kMaxU);

    template <int NT>
    static void tile(const uint8_t* pan, int h, int64_t nb, const Q8Tokens& a, int64_t t0,
                     __m256 (&f)[NT]) {
        const __m256i ones = _mm256_set1_epi16(1);
        const Act* tok[NT];
        const int32_t* sums[NT];
        for (int t = 0; t < NT; t++) {
            tok[t] = reinterpret_cast<const Act*>(token_row(a, t0 + t));
            sums[t] = !kSigned && W::kOffset ? a.sums + (t0 + t) * nb : nullptr;
        }
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t* words = pan + b * kPanelBytes;
            const int8_t* qs[NT];
            for (int t = 0; t < NT; t++) qs[t] = tok[t][b].qs;
            __m256i acc[NT];
            if constexpr (kSigned) {
                zero(acc);
#pragma GCC unroll 2
                for (int k = 0; k < 8; k++) {
                    const __m256i q = _mm256_xor_si256(load_half(words + k * kWordBytes, h),
                                                       _mm256_set1_epi8(static_cast<char>(0x80)));
                    const __m256i mag = _mm256_abs_epi8(q);
#pragma GCC unroll 8
                    for (int t = 0; t < NT; t++) {
                        const __m256i av = _mm256_set1_epi32(load_i32(qs[t] + 4 * k));
                        acc[t] = _mm256_add_epi32(
                            acc[t], _mm256_madd_epi16(
                                        _mm256_maddubs_epi16(mag, _mm256_sign_epi8(av, q)), ones));
                    }
                }
            } else {
#pragma GCC unroll 8
                for (int t = 0; t < NT; t++)
                    acc[t] = W::kOffset ? _mm256_set1_epi32(-W::kOffset * sums[t][b])
                                        : _mm256_setzero_si256();
                static_assert(kRun * 2 * W::kMaxU * 128 <= 32767);
#pragma GCC unroll 2
                for (int r = 0; r < 8; r += kRun) {
                    __m256i s[NT];
                    zero(s);
                    const int8_t* part[NT];
                    for (int t = 0; t < NT; t++) part[t] = qs[t] + 4 * r;
                    dot16<NT, kRun>(words + r * kWordBytes, h, part, s);
#pragma GCC unroll 8
                    for (int t = 0; t < NT; t++)
                        acc[t] = _mm256_add_epi32(acc[t], _mm256_madd_epi16(s[t], ones));
                }
            }
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

// The K-quants: each sub-block's 16-bit sums are widened by vpmaddwd with
// the sub-block's scale as a 16-bit pair, which multiplies and adds at once;
// the mins' and offsets' terms are the pair words against the Q8_K bsums.
template <typename K> struct SuperTile : K {
    static constexpr int kUnits = K::kUnits;
    static constexpr size_t kPanelBytes = K::kPanelBytes;
    static constexpr int kWordsPerSub = 64 / K::kSub; // 8 (Q4_K, Q5_K) or 4 (Q2_K, Q3_K, Q6_K)
    static constexpr int kRun = std::min(unsaturated_words(K::kMaxU), kWordsPerSub);
    static_assert(kWordsPerSub % kRun == 0);

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
                // The int32 scale word as (sc, sc) in 16-bit halves.
                const __m256i s32 = load_half(area + j * kWordBytes, h);
                const __m256i sc = _mm256_blend_epi16(s32, _mm256_slli_epi32(s32, 16), 0xaa);
#pragma GCC unroll 2
                for (int r = 0; r < kWordsPerSub; r += kRun) {
                    __m256i s[NT];
                    zero(s);
                    const int8_t* qs[NT];
                    const int w0 = j * kWordsPerSub + r;
                    for (int t = 0; t < NT; t++) qs[t] = tok[t][b].qs + 4 * w0;
                    dot16<NT, kRun>(words + w0 * kWordBytes, h, qs, s);
#pragma GCC unroll 8
                    for (int t = 0; t < NT; t++)
                        q[t] = _mm256_add_epi32(q[t], _mm256_madd_epi16(s[t], sc));
                }
            }
            __m256i m[NT];
            zero(m);
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++) {
                const __m256i pairs = load_half(area + (K::kSub + i) * kWordBytes, h);
#pragma GCC unroll 8
                for (int t = 0; t < NT; t++) {
                    const __m256i bs = _mm256_set1_epi32(load_i32(tok[t][b].bsums + 2 * i));
                    m[t] = _mm256_add_epi32(m[t], _mm256_madd_epi16(pairs, bs));
                }
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

// Packed weights (chain_halves.h's driver). Q4_0's nibbles (u <= 15) as
// Block32's: the eight words' pair sums in 16 bits, widened once, the offset
// taken off through the activations' block sums. Q8_0's u = q + 128 turned
// back to q and multiplied as |q| by a * sign(q), widened a word at a time.
struct PackedArith {
    template <typename P> static constexpr int offset() {
        return P::kStored == 4 ? -P::kOffset : 0;
    }
    template <typename P, int NH, int NT>
    __attribute__((always_inline)) static void
    block(const uint8_t* words, int h0, const int8_t* const (&qs)[NT], const int32_t (&init)[NT],
          __m256i (&acc)[NH][NT]) {
        const __m256i ones = _mm256_set1_epi16(1);
        constexpr bool kNibbles = P::kStored == 4;
        static_assert(!kNibbles || unsaturated_words(Q4::kMaxU) == 8);
        __m256i s[NH][NT];
#pragma GCC unroll 2
        for (int h = 0; h < NH; h++)
#pragma GCC unroll 4
            for (int t = 0; t < NT; t++) {
                s[h][t] = _mm256_setzero_si256();
                if constexpr (!kNibbles) acc[h][t] = _mm256_set1_epi32(init[t]);
            }
        // A word at a time: four tokens' sums, their tiles' float sums and
        // one word fill the sixteen registers.
        word_pairs([&]<int kHigh>() __attribute__((always_inline)) {
#pragma GCC unroll 2
            for (int k = 0; k < 4; k++) {
                const int j = k + 4 * kHigh;
                __m256i w[NH];
#pragma GCC unroll 2
                for (int h = 0; h < NH; h++) {
                    w[h] = packed_half_word<P, kHigh>(words, k, h0 + h);
                    if constexpr (!kNibbles)
                        w[h] = _mm256_xor_si256(w[h], _mm256_set1_epi8(static_cast<char>(0x80)));
                }
#pragma GCC unroll 4
                for (int t = 0; t < NT; t++) {
                    const __m256i av = _mm256_set1_epi32(load_i32(qs[t] + 4 * j));
#pragma GCC unroll 2
                    for (int h = 0; h < NH; h++) {
                        if constexpr (kNibbles) {
                            s[h][t] = _mm256_add_epi16(s[h][t], _mm256_maddubs_epi16(w[h], av));
                        } else {
                            const __m256i p = _mm256_maddubs_epi16(_mm256_abs_epi8(w[h]),
                                                                   _mm256_sign_epi8(av, w[h]));
                            acc[h][t] = _mm256_add_epi32(acc[h][t], _mm256_madd_epi16(p, ones));
                        }
                    }
                }
            }
        });
        if constexpr (kNibbles)
#pragma GCC unroll 2
            for (int h = 0; h < NH; h++)
#pragma GCC unroll 4
                for (int t = 0; t < NT; t++)
                    acc[h][t] = _mm256_add_epi32(_mm256_set1_epi32(init[t]),
                                                 _mm256_madd_epi16(s[h][t], ones));
    }
};

} // namespace

KVRUN_CHAIN_GEMMS(KVRUN_DEFINE_CHAIN_GEMM)

KVRUN_DEFINE_PACKED_GEMMS(PackedArith)

} // namespace gl::avx2_chain
