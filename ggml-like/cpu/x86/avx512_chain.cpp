// AVX-512 VNNI GEMM of the block-chain types (kernels.h's block_chain: Q4_0,
// Q5_0, Q8_0 and IQ4_NL weights with Q8_0 activations, Q4_1 and Q5_1 with
// Q8_1, the K-quants with Q8_K), for prompt batches (and for any batch in ops::matmul's invariant
// mode, which tests use; --deterministic does not, see ops.h).
//
// For every output they compute exact integer sums per block (Q4_0, Q8_0)
// or super-block (K-quants) and then FMAs in block order: the scalar
// reference's arithmetic (ref/quants.cpp, ref/quants_k.cpp), so they agree
// with it bit for bit whatever the number of tokens.
//
// vpdpbusd multiplies unsigned by signed bytes: weights enter as unsigned
// u = q + offset (Q4_0: the nibble itself, offset 8; Q8_0: q ^ 0x80, offset
// 128; Q5_0: q, offset 16; Q6_K: q, offset 32; Q4_1 and Q4_K: q, and their
// mins), activations as they are,
// and the offset or min times the activations' sums is taken off.
//
// Batches of many tokens repack sixteen rows at a time into a panel whose
// 512-bit words hold four consecutive weights of each of the sixteen rows
// (lane = row): one vpdpbusd with four of a token's activations broadcast
// advances all sixteen rows' sums, and no horizontal sum is needed. The
// panel is made once per batch and read for every group of four tokens;
// 2 panels x 4 tokens per inner step keep the accumulators in registers.
#include "ggml-like/cpu/chain_gemms.h"

#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "ggml-like/cpu/x86/chain_panel.h"

namespace gl::avx512_chain {

namespace {

using namespace chain;

__m512i load_word(const uint8_t* p) {
    return _mm512_load_si512(p);
}

// acc[p][t] += the products of N consecutive words of panel p (starting at
// words[p]) with token t's activations from qs[t] on (four per word).
template <int NP, int NT, int N>
__attribute__((always_inline)) inline void dot_words(const uint8_t* const (&words)[NP],
                                                     const int8_t* const (&qs)[NT],
                                                     __m512i (&acc)[NP][NT]) {
#pragma GCC unroll 8
    for (int k = 0; k < N; k++) {
        __m512i wv[NP];
#pragma GCC unroll 8
        for (int p = 0; p < NP; p++) wv[p] = load_word(words[p] + k * kWordBytes);
#pragma GCC unroll 8
        for (int t = 0; t < NT; t++) {
            const __m512i av = _mm512_set1_epi32(load_i32(qs[t] + 4 * k));
#pragma GCC unroll 8
            for (int p = 0; p < NP; p++) acc[p][t] = _mm512_dpbusd_epi32(acc[p][t], wv[p], av);
        }
    }
}

// Q4_0 and Q8_0 (one unit, Q8_0 activations): the block's sum starts from
// -offset * sum(a), and the scale area is the sixteen d as float. Q4_1 (Q8_1
// activations): the sum starts from 0, the scale area also holds the
// sixteen m, and each block adds m * s_a after d * d_a * isum.
template <typename W> struct Block32 : Panel32<W> {
    using Act = typename Panel32<W>::Act;
    using Panel32<W>::kMin;
    using Panel32<W>::kPanelBytes;

    template <int NP, int NT>
    static void tile(const uint8_t* const* pan, int64_t nb, const Q8Tokens& a, int64_t t0,
                     __m512 (&f)[NP][NT]) {
        const Act* tok[NT];
        const int32_t* sums[NT];
        for (int t = 0; t < NT; t++) {
            tok[t] = reinterpret_cast<const Act*>(token_row(a, t0 + t));
            sums[t] = W::kOffset ? a.sums + (t0 + t) * nb : nullptr;
        }
        for (int64_t b = 0; b < nb; b++) {
            __m512i acc[NP][NT];
#pragma GCC unroll 8
            for (int t = 0; t < NT; t++) {
                const __m512i init = W::kOffset ? _mm512_set1_epi32(-W::kOffset * sums[t][b])
                                                : _mm512_setzero_si512();
#pragma GCC unroll 8
                for (int p = 0; p < NP; p++) acc[p][t] = init;
            }
            const uint8_t* words[NP];
            const int8_t* qs[NT];
            for (int p = 0; p < NP; p++) words[p] = pan[p] + b * kPanelBytes;
            for (int t = 0; t < NT; t++) qs[t] = tok[t][b].qs;
            dot_words<NP, NT, 8>(words, qs, acc);
#pragma GCC unroll 8
            for (int t = 0; t < NT; t++) {
                const __m512 da = _mm512_set1_ps(kFp16ToFp32[tok[t][b].d]);
#pragma GCC unroll 8
                for (int p = 0; p < NP; p++) {
                    const auto* d =
                        reinterpret_cast<const float*>(pan[p] + b * kPanelBytes + kUnitBytes);
                    f[p][t] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_load_ps(d), da),
                                              _mm512_cvtepi32_ps(acc[p][t]), f[p][t]);
                    if constexpr (kMin)
                        f[p][t] =
                            _mm512_fmadd_ps(_mm512_load_ps(d + kPanelRows),
                                            _mm512_set1_ps(kFp16ToFp32[tok[t][b].s]), f[p][t]);
                }
            }
        }
    }
};

// The K-quants' tile: K is one of chain_panel.h's Q2K ... Q6K.
template <typename K> struct SuperTile : K {
    static constexpr int kUnits = K::kUnits;
    static constexpr size_t kPanelBytes = K::kPanelBytes;

    template <int NP, int NT>
    static void tile(const uint8_t* const* pan, int64_t nb, const Q8Tokens& a, int64_t t0,
                     __m512 (&f)[NP][NT]) {
        constexpr int kWordsPerSub = 64 / K::kSub; // 8 (Q4_K, Q5_K) or 4 (Q2_K, Q3_K, Q6_K)
        const BlockQ8_K* tok[NT];
        for (int t = 0; t < NT; t++)
            tok[t] = reinterpret_cast<const BlockQ8_K*>(token_row(a, t0 + t));
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t* words[NP];
            const uint8_t* area[NP];
            for (int p = 0; p < NP; p++) {
                words[p] = pan[p] + b * kPanelBytes;
                area[p] = words[p] + kUnits * kUnitBytes;
            }
            __m512i q[NP][NT];
#pragma GCC unroll 8
            for (int p = 0; p < NP; p++)
#pragma GCC unroll 8
                for (int t = 0; t < NT; t++) q[p][t] = _mm512_setzero_si512();
            for (int j = 0; j < K::kSub; j++) {
                __m512i s[NP][NT];
#pragma GCC unroll 8
                for (int p = 0; p < NP; p++)
#pragma GCC unroll 8
                    for (int t = 0; t < NT; t++) s[p][t] = _mm512_setzero_si512();
                const uint8_t* sub_words[NP];
                const int8_t* qs[NT];
                for (int p = 0; p < NP; p++)
                    sub_words[p] = words[p] + j * kWordsPerSub * kWordBytes;
                for (int t = 0; t < NT; t++) qs[t] = tok[t][b].qs + 4 * j * kWordsPerSub;
                dot_words<NP, NT, kWordsPerSub>(sub_words, qs, s);
#pragma GCC unroll 8
                for (int p = 0; p < NP; p++) {
                    const __m512i sc = load_word(area[p] + j * kWordBytes);
#pragma GCC unroll 8
                    for (int t = 0; t < NT; t++)
                        q[p][t] = _mm512_add_epi32(q[p][t], _mm512_mullo_epi32(s[p][t], sc));
                }
            }
            // The 16-bit pairs against the activations' 16-element sums.
            __m512i m[NP][NT];
#pragma GCC unroll 8
            for (int p = 0; p < NP; p++)
#pragma GCC unroll 8
                for (int t = 0; t < NT; t++) m[p][t] = _mm512_setzero_si512();
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++) {
#pragma GCC unroll 8
                for (int t = 0; t < NT; t++) {
                    const __m512i bs = _mm512_set1_epi32(load_i32(tok[t][b].bsums + 2 * i));
#pragma GCC unroll 8
                    for (int p = 0; p < NP; p++)
                        m[p][t] = _mm512_dpwssd_epi32(
                            m[p][t], load_word(area[p] + (K::kSub + i) * kWordBytes), bs);
                }
            }
#pragma GCC unroll 8
            for (int t = 0; t < NT; t++) {
                const __m512 da = _mm512_set1_ps(tok[t][b].d);
#pragma GCC unroll 8
                for (int p = 0; p < NP; p++) {
                    const auto* d =
                        reinterpret_cast<const float*>(area[p] + (K::kSub + 8) * kWordBytes);
                    const __m512 dd = _mm512_mul_ps(_mm512_load_ps(d), da);
                    if constexpr (K::kMin) {
                        f[p][t] = _mm512_fmadd_ps(dd, _mm512_cvtepi32_ps(q[p][t]), f[p][t]);
                        const __m512 dm = _mm512_mul_ps(_mm512_load_ps(d + kPanelRows), da);
                        f[p][t] = _mm512_fnmadd_ps(dm, _mm512_cvtepi32_ps(m[p][t]), f[p][t]);
                    } else {
                        const __m512i total =
                            _mm512_sub_epi32(q[p][t], _mm512_slli_epi32(m[p][t], K::kOffsetShift));
                        f[p][t] = _mm512_fmadd_ps(dd, _mm512_cvtepi32_ps(total), f[p][t]);
                    }
                }
            }
        }
    }
};

// NP panels (16 rows each) by NT tokens, over all super-blocks.
template <typename G, int NP, int NT>
void tile(const uint8_t* const* pan, int64_t n_super, const Q8Tokens& a, int64_t t0, float* y,
          size_t y_stride, const __mmask16* row_mask) {
    __m512 f[NP][NT];
#pragma GCC unroll 8
    for (int p = 0; p < NP; p++)
#pragma GCC unroll 8
        for (int t = 0; t < NT; t++) f[p][t] = _mm512_setzero_ps();
    G::template tile<NP, NT>(pan, n_super, a, t0, f);
#pragma GCC unroll 8
    for (int t = 0; t < NT; t++)
#pragma GCC unroll 8
        for (int p = 0; p < NP; p++)
            _mm512_mask_storeu_ps(y + (t0 + t) * y_stride + p * kPanelRows, row_mask[p], f[p][t]);
}

template <typename G, int NP>
void tokens(const uint8_t* const* pan, int64_t n_super, const Q8Tokens& a, float* y,
            size_t y_stride, const __mmask16* row_mask) {
    by_token_tiles(a.n_tok, [&]<int NT>(int64_t t0) {
        tile<G, NP, NT>(pan, n_super, a, t0, y, y_stride, row_mask);
    });
}

// The first n lanes (none for n <= 0).
__mmask16 first_lanes(int64_t n) {
    if (n <= 0) return 0;
    return n >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << n) - 1);
}

template <typename G>
void gemm_panels(int64_t n, const void* w, size_t row_bytes, int64_t n_rows, const Q8Tokens& a,
                 float* y, size_t y_stride, void* scratch) {
    const int64_t n_super = n / (32 * G::kUnits);
    const auto* base = static_cast<const uint8_t*>(w);
    uint8_t* pan0 = panel_scratch(scratch);
    uint8_t* pan1 = pan0 + n_super * G::kPanelBytes;
    const uint8_t* pan[2] = {pan0, pan1};
    for (int64_t r0 = 0; r0 < n_rows; r0 += 2 * kPanelRows) {
        const int64_t rows = std::min<int64_t>(2 * kPanelRows, n_rows - r0);
        const __mmask16 mask[2] = {first_lanes(rows), first_lanes(rows - kPanelRows)};
        pack_panel<G>(base + r0 * row_bytes, row_bytes,
                      static_cast<int>(std::min<int64_t>(rows, kPanelRows)), n_super, pan0);
        if (rows > kPanelRows) {
            pack_panel<G>(base + (r0 + kPanelRows) * row_bytes, row_bytes,
                          static_cast<int>(rows - kPanelRows), n_super, pan1);
            tokens<G, 2>(pan, n_super, a, y + r0, y_stride, mask);
        } else {
            tokens<G, 1>(pan, n_super, a, y + r0, y_stride, mask);
        }
    }
}

// Every type's panel fits the scratch gemm_scratch_bytes (kernels.h) gives.
static_assert(Block32<Q4>::kPanelBytes <= kGemmPanelBlockBytes);
static_assert(Block32<Q8>::kPanelBytes <= kGemmPanelBlockBytes);
static_assert(Block32<Q41>::kPanelBytes <= kGemmPanelBlockBytes);
static_assert(Q4K::kPanelBytes <= 8 * kGemmPanelBlockBytes);
static_assert(Q5K::kPanelBytes <= 8 * kGemmPanelBlockBytes);
static_assert(Q6K::kPanelBytes <= 8 * kGemmPanelBlockBytes);
static_assert(Q2K::kPanelBytes <= 8 * kGemmPanelBlockBytes);

// ---- packed weights (kernels.h) ---------------------------------------------------
//
// The panels are made once at load, so a single token pays for no repacking
// and generation reads the weights' own bytes. Per block and token the sums
// are those of Block32's tile, in two integer chains (low and high words: the
// latency of eight dependent vpdpbusd halved for one token), added exactly
// before the block's FMA: the same bits as the plain GEMM.

// Words k and k + 4 of a block (k < 4).
template <typename P>
__attribute__((always_inline)) inline void packed_words(const uint8_t* p, int k, __m512i& wl,
                                                        __m512i& wh) {
    if constexpr (P::kStored == 4) {
        const __m512i v = _mm512_loadu_si512(p + k * kWordBytes);
        const __m512i low = _mm512_set1_epi8(0x0f);
        wl = _mm512_and_si512(v, low);
        wh = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
    } else {
        wl = _mm512_loadu_si512(p + k * kWordBytes);
        wh = _mm512_loadu_si512(p + (4 + k) * kWordBytes);
    }
}

// NP panels by NT tokens. With few tokens each sum runs in two chains (words
// 0-3 and 4-7) so that one token's eight dependent vpdpbusd do not set the
// pace; with more, the tokens' sums are chains enough, and the registers
// are needed.
template <typename P, int NP, int NT>
void packed_tile(const uint8_t* const (&pan)[NP], int64_t nb, const Q8Tokens& a, int64_t t0,
                 float* y, size_t y_stride, const __mmask16* row_mask) {
    constexpr bool kSplit = NT <= 2;
    constexpr int NC = kSplit ? 2 : 1;
    const BlockQ8_0* tok[NT];
    const int32_t* sums[NT];
    for (int t = 0; t < NT; t++) {
        tok[t] = reinterpret_cast<const BlockQ8_0*>(token_row(a, t0 + t));
        sums[t] = a.sums + (t0 + t) * nb;
    }
    __m512 f[NP][NT];
#pragma GCC unroll 8
    for (int p = 0; p < NP; p++)
#pragma GCC unroll 8
        for (int t = 0; t < NT; t++) f[p][t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const PackedBlock at(P::kStored, b, nb);
        __m512i acc[NC][NP][NT];
#pragma GCC unroll 8
        for (int t = 0; t < NT; t++) {
            const __m512i init = _mm512_set1_epi32(-P::kOffset * sums[t][b]);
#pragma GCC unroll 8
            for (int p = 0; p < NP; p++) {
                acc[0][p][t] = init;
                if constexpr (kSplit) acc[NC - 1][p][t] = _mm512_setzero_si512();
            }
        }
        // The first token tile streams the panels from memory; the others
        // find them in cache.
        if (b % 2 == 0 && t0 == 0)
#pragma GCC unroll 8
            for (int p = 0; p < NP; p++) prefetch_pair<P>(pan[p] + at.pair);
        if constexpr (P::kStored == 4) {
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) {
                __m512i wl[NP], wh[NP];
#pragma GCC unroll 8
                for (int p = 0; p < NP; p++) packed_words<P>(pan[p] + at.words, k, wl[p], wh[p]);
#pragma GCC unroll 8
                for (int t = 0; t < NT; t++) {
                    const __m512i al = _mm512_set1_epi32(load_i32(tok[t][b].qs + 4 * k));
                    const __m512i ah = _mm512_set1_epi32(load_i32(tok[t][b].qs + 16 + 4 * k));
#pragma GCC unroll 8
                    for (int p = 0; p < NP; p++) {
                        acc[0][p][t] = _mm512_dpbusd_epi32(acc[0][p][t], wl[p], al);
                        acc[NC - 1][p][t] = _mm512_dpbusd_epi32(acc[NC - 1][p][t], wh[p], ah);
                    }
                }
            }
        } else {
            // Q8_0: the eight words in their order, so the lines are read in
            // theirs (words 0-3 one chain, 4-7 the other).
#pragma GCC unroll 8
            for (int k = 0; k < 8; k++) {
                __m512i w[NP];
#pragma GCC unroll 8
                for (int p = 0; p < NP; p++)
                    w[p] = _mm512_loadu_si512(pan[p] + at.words + k * kWordBytes);
#pragma GCC unroll 8
                for (int t = 0; t < NT; t++) {
                    const __m512i av = _mm512_set1_epi32(load_i32(tok[t][b].qs + 4 * k));
#pragma GCC unroll 8
                    for (int p = 0; p < NP; p++) {
                        __m512i& c = acc[k < 4 ? 0 : NC - 1][p][t];
                        c = _mm512_dpbusd_epi32(c, w[p], av);
                    }
                }
            }
        }
#pragma GCC unroll 8
        for (int p = 0; p < NP; p++) {
            const __m512 d = _mm512_cvtph_ps(
                _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pan[p] + at.scales)));
#pragma GCC unroll 8
            for (int t = 0; t < NT; t++) {
                const __m512 da = _mm512_set1_ps(kFp16ToFp32[tok[t][b].d]);
                __m512i sum = acc[0][p][t];
                if constexpr (kSplit) sum = _mm512_add_epi32(sum, acc[NC - 1][p][t]);
                f[p][t] = _mm512_fmadd_ps(_mm512_mul_ps(d, da), _mm512_cvtepi32_ps(sum), f[p][t]);
            }
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < NT; t++)
#pragma GCC unroll 8
        for (int p = 0; p < NP; p++)
            _mm512_mask_storeu_ps(y + (t0 + t) * y_stride + p * kPanelRows, row_mask[p], f[p][t]);
}

template <typename P>
void gemm_packed(int64_t n, const void* panels, int64_t n_rows, const Q8Tokens& a, float* y,
                 size_t y_stride) {
    const int64_t nb = n / 32;
    const size_t panel_bytes = kPanelRows * nb * sizeof(typename P::Block);
    const auto* base = static_cast<const uint8_t*>(panels);
    for (int64_t r0 = 0; r0 < n_rows; r0 += 2 * kPanelRows) {
        const int64_t rows = std::min<int64_t>(2 * kPanelRows, n_rows - r0);
        const __mmask16 mask[2] = {first_lanes(rows), first_lanes(rows - kPanelRows)};
        const uint8_t* p0 = base + (r0 / kPanelRows) * panel_bytes;
        if (a.n_tok == 1 || (a.n_tok >= 8 && a.n_tok < 16)) {
            // A panel at a time: one token streams it once; 8-15 tokens take
            // it by eight tokens a tile, so that a panel read from memory
            // feeds eight tokens' products, which hide the read (two by four
            // leave the memory idle while the second tile runs from cache:
            // 1.1B Q4_0, 8 tokens 375 -> 480 tok/s). Longer batches read each
            // panel once for many tiles, and two panels by four tokens reuse
            // more of each load (256 tokens: 625 against 515 tok/s).
            for (int p = 0; p * kPanelRows < rows; p++) {
                const uint8_t* pan[1] = {p0 + p * panel_bytes};
                float* yp = y + r0 + p * kPanelRows;
                int64_t t0 = 0;
                for (; t0 + 8 <= a.n_tok; t0 += 8)
                    packed_tile<P, 1, 8>(pan, nb, a, t0, yp, y_stride, mask + p);
                const int64_t done = t0;
                by_token_tiles(a.n_tok - done, [&]<int NT>(int64_t t) {
                    packed_tile<P, 1, NT>(pan, nb, a, done + t, yp, y_stride, mask + p);
                });
            }
        } else if (rows > kPanelRows) {
            const uint8_t* pan[2] = {p0, p0 + panel_bytes};
            by_token_tiles(a.n_tok, [&]<int NT>(int64_t t0) {
                packed_tile<P, 2, NT>(pan, nb, a, t0, y + r0, y_stride, mask);
            });
        } else {
            const uint8_t* pan[1] = {p0};
            by_token_tiles(a.n_tok, [&]<int NT>(int64_t t0) {
                packed_tile<P, 1, NT>(pan, nb, a, t0, y + r0, y_stride, mask);
            });
        }
    }
}

} // namespace

KVRUN_CHAIN_GEMMS(KVRUN_DEFINE_CHAIN_GEMM)

void gemm_packed_q4_0(int64_t n, const void* panels, int64_t n_rows, const Q8Tokens& a, float* y,
                      size_t y_stride) {
    gemm_packed<PackedQ4>(n, panels, n_rows, a, y, y_stride);
}
void gemm_packed_q8_0(int64_t n, const void* panels, int64_t n_rows, const Q8Tokens& a, float* y,
                      size_t y_stride) {
    gemm_packed<PackedQ8>(n, panels, n_rows, a, y, y_stride);
}

} // namespace gl::avx512_chain
