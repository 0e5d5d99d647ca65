// AVX-512 VNNI kernels of the block-chain types (Q4_0 and Q8_0 weights,
// Q8_0 activations; kernels.h's block_chain): one row, sixteen rows at a
// time for generation, and the GEMM for prompt batches.
//
// Each computes, for every output, the exact integer sum of each 32-element
// block and then y = fma(d_w * d_a, isum, y) block after block: the scalar
// reference's arithmetic. So the three agree bit for bit with the reference
// and with each other, and a token's result does not depend on which of them
// its batch size picked.
//
// vpdpbusd multiplies unsigned by signed bytes: weights enter as unsigned
// u = q + offset (Q4_0: the nibble itself, offset 8; Q8_0: q ^ 0x80, offset
// 128), activations as they are, and offset * sum(a) is subtracted (the
// accumulator starts from it).
//
// Generation (matvec) reads the weights where they lie: two rows' blocks per
// 512-bit register, one vpdpbusd per two row-blocks, then the eight lanes of
// each row-block summed across registers (unpack/add steps) so that one
// vector holds sixteen rows' block sums and one FMA advances sixteen chains.
//
// Prompts (gemm) repack sixteen rows at a time into a panel whose 512-bit
// words hold four consecutive weights of each of the sixteen rows (lane =
// row): one vpdpbusd with four of a token's activations broadcast advances
// all sixteen rows' block sums, eight of them finish a block, and no
// horizontal sum is needed. The panel is made once per batch and read for
// every group of four tokens; 2 panels x 4 tokens per inner step keep 8
// integer and 8 float accumulators in registers.
#include "ggml-like/cpu/x86/avx512_chain.h"

#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "ggml-like/types.h"

namespace gl::avx512_chain {

namespace {

__m256i load256(const void* p) {
    return _mm256_loadu_si256(static_cast<const __m256i*>(p));
}
__m128i load128(const void* p) {
    return _mm_loadu_si128(static_cast<const __m128i*>(p));
}
int32_t load_i32(const void* p) {
    int32_t v;
    std::memcpy(&v, p, sizeof v);
    return v;
}

int32_t hsum_epi32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 1));
    return _mm_cvtsi128_si32(s);
}

// Weight blocks as unsigned bytes u in element order; the value is u - kOffset.
struct Q4 {
    using Block = BlockQ4_0;
    static constexpr int kOffset = 8;
    // Low nibbles are elements 0..15, high nibbles 16..31.
    static __m256i block(const uint8_t* p) {
        const __m256i q = _mm256_broadcastsi128_si256(load128(p + offsetof(Block, qs)));
        return _mm256_and_si256(_mm256_srlv_epi64(q, _mm256_setr_epi64x(0, 0, 4, 4)),
                                _mm256_set1_epi8(0x0f));
    }
    // Two blocks in one register, the first in the low half.
    static __m512i pair(const uint8_t* p0, const uint8_t* p1) {
        const __m512i q = _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm256_broadcastsi128_si256(load128(p0 + offsetof(Block, qs)))),
            _mm256_broadcastsi128_si256(load128(p1 + offsetof(Block, qs))), 1);
        return _mm512_and_si512(_mm512_srlv_epi64(q, _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4)),
                                _mm512_set1_epi8(0x0f));
    }
};

struct Q8 {
    using Block = BlockQ8_0;
    static constexpr int kOffset = 128;
    static __m256i block(const uint8_t* p) {
        return _mm256_xor_si256(load256(p + offsetof(Block, qs)),
                                _mm256_set1_epi8(static_cast<char>(0x80)));
    }
    static __m512i pair(const uint8_t* p0, const uint8_t* p1) {
        const __m512i q =
            _mm512_inserti64x4(_mm512_castsi256_si512(load256(p0 + offsetof(Block, qs))),
                               load256(p1 + offsetof(Block, qs)), 1);
        return _mm512_xor_si512(q, _mm512_set1_epi8(static_cast<char>(0x80)));
    }
};

template <typename W> uint16_t scale_of(const uint8_t* block) {
    uint16_t d;
    std::memcpy(&d, block + offsetof(typename W::Block, d), sizeof d);
    return d;
}

// ---- one row ----------------------------------------------------------------------

template <typename W> float vec_dot(int64_t n, const void* w, const void* a) {
    using Block = typename W::Block;
    const auto* x = static_cast<const uint8_t*>(w);
    const auto* y = static_cast<const BlockQ8_0*>(a);
    const __m256i zero = _mm256_setzero_si256();
    const __m256i off = _mm256_set1_epi8(static_cast<char>(W::kOffset));
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK8_0; i++) {
        const uint8_t* b = x + i * sizeof(Block);
        const __m256i av = load256(y[i].qs);
        const __m256i s = _mm256_sub_epi32(_mm256_dpbusd_epi32(zero, W::block(b), av),
                                           _mm256_dpbusd_epi32(zero, off, av));
        sum = std::fma(kFp16ToFp32[scale_of<W>(b)] * kFp16ToFp32[y[i].d],
                       static_cast<float>(hsum_epi32(s)), sum);
    }
    return sum;
}

// ---- sixteen rows (generation) ------------------------------------------------------

// Measured on one core of an AMD EPYC (Zen 5): 256 bytes ahead, half the
// rows each step, beat 64-2048 bytes and every row each step.
constexpr size_t kPrefetchBytes = 256;

// p0..p7 each hold two row-blocks' eight lane sums (rows 2j and 2j+1 of the
// group in p_j's halves). Returns the sixteen row-block sums, lane l holding
// row kLaneRow[l] (see kRowsFromLanes).
__attribute__((always_inline)) inline __m512i sum_pairs(__m512i p0, __m512i p1, __m512i p2,
                                                        __m512i p3, __m512i p4, __m512i p5,
                                                        __m512i p6, __m512i p7) {
    // Within each 128-bit lane: [a0+a2, b0+b2, a1+a3, b1+b3].
    auto s1 = [](__m512i a, __m512i b) {
        return _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
    };
    // Then [sum a, sum b, sum c, sum d] of each 128-bit lane.
    auto s2 = [](__m512i ab, __m512i cd) {
        return _mm512_add_epi32(_mm512_unpacklo_epi64(ab, cd), _mm512_unpackhi_epi64(ab, cd));
    };
    const __m512i r0 = s2(s1(p0, p1), s1(p2, p3)); // lanes of rows 0,2,4,6 | ... | 1,3,5,7
    const __m512i r1 = s2(s1(p4, p5), s1(p6, p7)); // rows 8..15 likewise
    // Each row's two 128-bit lanes added: rows 0,2,4,6 | 1,3,5,7 | 8,10,12,14 | 9,11,13,15.
    return _mm512_add_epi32(_mm512_shuffle_i32x4(r0, r1, _MM_SHUFFLE(2, 0, 2, 0)),
                            _mm512_shuffle_i32x4(r0, r1, _MM_SHUFFLE(3, 1, 3, 1)));
}

template <typename W>
void matvec(int64_t n, const void* w, size_t row_bytes, int64_t n_rows, const void* a, float* y) {
    using Block = typename W::Block;
    const auto* act = static_cast<const BlockQ8_0*>(a);
    const int64_t nb = n / QK8_0;
    const auto* base = static_cast<const uint8_t*>(w);
    const size_t rb = row_bytes;
    const __m512i zero = _mm512_setzero_si512();
    const __m512i off = _mm512_set1_epi8(static_cast<char>(W::kOffset));
    const __m512i rows_from_lanes =
        _mm512_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15);
    int64_t r = 0;
    for (; r + 16 <= n_rows; r += 16) {
        const uint8_t* g = base + r * rb;
        __m512 acc = _mm512_setzero_ps();
        for (int64_t i = 0; i < nb; i++) {
            const uint8_t* p = g + i * sizeof(Block);
            // Sixteen streams, each 18 or 34 bytes a step: every other
            // step, half of them a fixed distance ahead (each row's next
            // lines requested before the hardware prefetcher sees them).
            const uint8_t* ahead = p + kPrefetchBytes + (i & 1) * rb;
            for (int k = 0; k < 16; k += 2)
                _mm_prefetch(reinterpret_cast<const char*>(ahead + k * rb), _MM_HINT_T0);
            const __m512i av = _mm512_broadcast_i64x4(load256(act[i].qs));
            const __m512i neg = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, off, av));
            const __m512i p0 = _mm512_dpbusd_epi32(neg, W::pair(p, p + rb), av);
            const __m512i p1 = _mm512_dpbusd_epi32(neg, W::pair(p + 2 * rb, p + 3 * rb), av);
            const __m512i p2 = _mm512_dpbusd_epi32(neg, W::pair(p + 4 * rb, p + 5 * rb), av);
            const __m512i p3 = _mm512_dpbusd_epi32(neg, W::pair(p + 6 * rb, p + 7 * rb), av);
            const __m512i p4 = _mm512_dpbusd_epi32(neg, W::pair(p + 8 * rb, p + 9 * rb), av);
            const __m512i p5 = _mm512_dpbusd_epi32(neg, W::pair(p + 10 * rb, p + 11 * rb), av);
            const __m512i p6 = _mm512_dpbusd_epi32(neg, W::pair(p + 12 * rb, p + 13 * rb), av);
            const __m512i p7 = _mm512_dpbusd_epi32(neg, W::pair(p + 14 * rb, p + 15 * rb), av);
            const __m512i s = sum_pairs(p0, p1, p2, p3, p4, p5, p6, p7);
            // The sixteen fp16 scales in the same lane order (16 loads and
            // inserts measured a little faster than a gather).
            auto d = [&](int k) { return static_cast<short>(scale_of<W>(p + k * rb)); };
            const __m512 dw = _mm512_cvtph_ps(_mm256_setr_epi16(d(0), d(2), d(4), d(6), d(1), d(3),
                                                                d(5), d(7), d(8), d(10), d(12),
                                                                d(14), d(9), d(11), d(13), d(15)));
            const __m512 sc = _mm512_mul_ps(dw, _mm512_set1_ps(kFp16ToFp32[act[i].d]));
            acc = _mm512_fmadd_ps(sc, _mm512_cvtepi32_ps(s), acc);
        }
        _mm512_storeu_ps(y + r, _mm512_permutexvar_ps(rows_from_lanes, acc));
    }
    for (; r < n_rows; r++) y[r] = vec_dot<W>(n, base + r * rb, a);
}

// ---- the prompt GEMM -----------------------------------------------------------------

constexpr int kPanelRows = 16;
// One block of a panel: 8 words of 16 rows x 4 bytes, then the 16 scales as float.
constexpr size_t kPanelBlockBytes = 8 * 64 + kPanelRows * sizeof(float);

// In place: v[k] lane r (a dword) becomes the old v[r] lane k.
__attribute__((always_inline)) inline void transpose8x8(__m256i v[8]) {
    __m256i t[8], s[8];
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_epi32(v[2 * i], v[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_epi32(v[2 * i], v[2 * i + 1]);
    }
    for (int i = 0; i < 2; i++) {
        s[4 * i] = _mm256_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        s[4 * i + 1] = _mm256_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        s[4 * i + 2] = _mm256_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        s[4 * i + 3] = _mm256_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    for (int k = 0; k < 4; k++) {
        v[k] = _mm256_permute2x128_si256(s[k], s[k + 4], 0x20);
        v[k + 4] = _mm256_permute2x128_si256(s[k], s[k + 4], 0x31);
    }
}

// Sixteen rows (fewer at a matrix's end: the rest zero) into a panel.
template <typename W>
void pack_panel(const uint8_t* w, size_t rb, int rows, int64_t nb, uint8_t* panel) {
    using Block = typename W::Block;
    for (int64_t b = 0; b < nb; b++) {
        uint8_t* dst = panel + b * kPanelBlockBytes;
        auto* d = reinterpret_cast<float*>(dst + 8 * 64);
        for (int half = 0; half < 2; half++) {
            __m256i v[8];
            for (int j = 0; j < 8; j++) {
                const int r = half * 8 + j;
                const uint8_t* p = w + r * rb + b * sizeof(Block);
                v[j] = r < rows ? W::block(p) : _mm256_setzero_si256();
                d[r] = r < rows ? kFp16ToFp32[scale_of<W>(p)] : 0.0f;
            }
            transpose8x8(v);
            for (int k = 0; k < 8; k++)
                _mm256_store_si256(reinterpret_cast<__m256i*>(dst + k * 64 + half * 32), v[k]);
        }
    }
}

// NP panels (16 rows each) by NT tokens, over all nb blocks.
template <int NP, int NT>
void tile(const uint8_t* const* pan, int64_t nb, const Q8Tokens& a, int64_t t0, int offset,
          float* y, size_t y_stride, const __mmask16* row_mask) {
    const BlockQ8_0* tok[NT];
    const int32_t* sums[NT];
    for (int t = 0; t < NT; t++) {
        tok[t] = reinterpret_cast<const BlockQ8_0*>(static_cast<const uint8_t*>(a.rows) +
                                                    (t0 + t) * a.row_bytes);
        sums[t] = a.sums + (t0 + t) * nb;
    }
    __m512 f[NP][NT];
#pragma GCC unroll 8
    for (int p = 0; p < NP; p++)
#pragma GCC unroll 8
        for (int t = 0; t < NT; t++) f[p][t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        __m512i acc[NP][NT];
#pragma GCC unroll 8
        for (int t = 0; t < NT; t++) {
            const __m512i init = _mm512_set1_epi32(-offset * sums[t][b]);
#pragma GCC unroll 8
            for (int p = 0; p < NP; p++) acc[p][t] = init;
        }
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            __m512i wv[NP];
#pragma GCC unroll 8
            for (int p = 0; p < NP; p++)
                wv[p] = _mm512_load_si512(pan[p] + b * kPanelBlockBytes + k * 64);
#pragma GCC unroll 8
            for (int t = 0; t < NT; t++) {
                const __m512i av = _mm512_set1_epi32(load_i32(tok[t][b].qs + 4 * k));
#pragma GCC unroll 8
                for (int p = 0; p < NP; p++) acc[p][t] = _mm512_dpbusd_epi32(acc[p][t], wv[p], av);
            }
        }
#pragma GCC unroll 8
        for (int t = 0; t < NT; t++) {
            const __m512 da = _mm512_set1_ps(kFp16ToFp32[tok[t][b].d]);
#pragma GCC unroll 8
            for (int p = 0; p < NP; p++) {
                const __m512 dw = _mm512_load_ps(
                    reinterpret_cast<const float*>(pan[p] + b * kPanelBlockBytes + 8 * 64));
                f[p][t] =
                    _mm512_fmadd_ps(_mm512_mul_ps(dw, da), _mm512_cvtepi32_ps(acc[p][t]), f[p][t]);
            }
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < NT; t++)
#pragma GCC unroll 8
        for (int p = 0; p < NP; p++)
            _mm512_mask_storeu_ps(y + (t0 + t) * y_stride + p * kPanelRows, row_mask[p], f[p][t]);
}

template <int NP>
void tokens(const uint8_t* const* pan, int64_t nb, const Q8Tokens& a, int offset, float* y,
            size_t y_stride, const __mmask16* row_mask) {
    int64_t t0 = 0;
    for (; t0 + 4 <= a.n_tok; t0 += 4) tile<NP, 4>(pan, nb, a, t0, offset, y, y_stride, row_mask);
    switch (a.n_tok - t0) {
    case 3:
        return tile<NP, 3>(pan, nb, a, t0, offset, y, y_stride, row_mask);
    case 2:
        return tile<NP, 2>(pan, nb, a, t0, offset, y, y_stride, row_mask);
    case 1:
        return tile<NP, 1>(pan, nb, a, t0, offset, y, y_stride, row_mask);
    default:
        return;
    }
}

__mmask16 first_lanes(int64_t n) {
    return n >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << n) - 1);
}

// Below this many tokens the sixteen-row kernel per token beats making panels.
constexpr int64_t kPanelMinTokens = 3;

template <typename W>
void gemm(int64_t n, const void* w, size_t row_bytes, int64_t n_rows, const Q8Tokens& a, float* y,
          size_t y_stride, void* scratch) {
    if (a.n_tok < kPanelMinTokens) {
        for (int64_t t = 0; t < a.n_tok; t++)
            matvec<W>(n, w, row_bytes, n_rows,
                      static_cast<const uint8_t*>(a.rows) + t * a.row_bytes, y + t * y_stride);
        return;
    }
    const int64_t nb = n / QK8_0;
    const auto* base = static_cast<const uint8_t*>(w);
    auto* s = static_cast<uint8_t*>(scratch);
    uint8_t* pan0 = s + (64 - reinterpret_cast<uintptr_t>(s) % 64) % 64;
    uint8_t* pan1 = pan0 + nb * kPanelBlockBytes;
    const uint8_t* pan[2] = {pan0, pan1};
    for (int64_t r0 = 0; r0 < n_rows; r0 += 2 * kPanelRows) {
        const int64_t rows = std::min<int64_t>(2 * kPanelRows, n_rows - r0);
        const __mmask16 mask[2] = {first_lanes(rows), first_lanes(rows - kPanelRows)};
        pack_panel<W>(base + r0 * row_bytes, row_bytes,
                      static_cast<int>(std::min<int64_t>(rows, kPanelRows)), nb, pan0);
        if (rows > kPanelRows) {
            pack_panel<W>(base + (r0 + kPanelRows) * row_bytes, row_bytes,
                          static_cast<int>(rows - kPanelRows), nb, pan1);
            tokens<2>(pan, nb, a, W::kOffset, y + r0, y_stride, mask);
        } else {
            tokens<1>(pan, nb, a, W::kOffset, y + r0, y_stride, mask);
        }
    }
}

} // namespace

// gemm_scratch_bytes (dispatch.cpp) gives two panels and alignment slack.
static_assert(kPanelBlockBytes == kGemmPanelBlockBytes);

void gemm_q4_0(int64_t n, const void* w, size_t row_bytes, int64_t n_rows, const Q8Tokens& a,
               float* y, size_t y_stride, void* scratch) {
    gemm<Q4>(n, w, row_bytes, n_rows, a, y, y_stride, scratch);
}
void gemm_q8_0(int64_t n, const void* w, size_t row_bytes, int64_t n_rows, const Q8Tokens& a,
               float* y, size_t y_stride, void* scratch) {
    gemm<Q8>(n, w, row_bytes, n_rows, a, y, y_stride, scratch);
}

} // namespace gl::avx512_chain
