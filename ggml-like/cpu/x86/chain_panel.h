// The panel layout of the block-chain GEMMs (avx512_chain.cpp, avx2_chain.cpp):
// how sixteen weight rows of a block-chain type (kernels.h's block_chain)
// are unpacked and transposed into a panel, and what the panel's scale area
// holds. Both GEMMs read the same panels, 512 bits (sixteen rows) or 256 bits
// (eight rows, one half) at a time. SSE/AVX2 instructions only; in an
// anonymous namespace like k_scales.h, since the two including files are
// compiled with different -m flags.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "ggml-like/blocks_k.h"
#include "ggml-like/cpu/x86/k_scales.h"
#include "ggml-like/kernels.h"
#include "ggml-like/types.h"

namespace gl {
namespace {
namespace chain {

inline __m256i load256(const void* p) {
    return _mm256_loadu_si256(static_cast<const __m256i*>(p));
}
inline __m128i load128(const void* p) {
    return _mm_loadu_si128(static_cast<const __m128i*>(p));
}
inline int32_t load_i32(const void* p) {
    int32_t v;
    std::memcpy(&v, p, sizeof v);
    return v;
}

// The 32 nibbles of a Q4_0/Q4_1/Q5_0 block's 16 bytes as bytes in element
// order: low nibbles are elements 0..15, high nibbles 16..31.
inline __m256i nibbles32(const uint8_t* qs) {
    const __m256i q = _mm256_broadcastsi128_si256(load128(qs));
    return _mm256_and_si256(_mm256_srlv_epi64(q, _mm256_setr_epi64x(0, 0, 4, 4)),
                            _mm256_set1_epi8(0x0f));
}

// Weight blocks as unsigned bytes u in element order; the value is u - kOffset
// (kMaxU: the largest u; kMin: a min term of its own, Q8_1 activations).
struct Q4 {
    using Block = BlockQ4_0;
    static constexpr int kOffset = 8, kMaxU = 15;
    static constexpr bool kMin = false;
    static __m256i block(const uint8_t* p) { return nibbles32(p + offsetof(Block, qs)); }
};

struct Q8 {
    using Block = BlockQ8_0;
    static constexpr int kOffset = 128, kMaxU = 255;
    static constexpr bool kMin = false;
    static __m256i block(const uint8_t* p) {
        return _mm256_xor_si256(load256(p + offsetof(Block, qs)),
                                _mm256_set1_epi8(static_cast<char>(0x80)));
    }
};

// Q4_1: nibbles as Q4_0's, w = d * q + m (no offset; the min is a term of
// its own against the Q8_1 activations' s = fp16(d_a * sum(a))).
struct Q41 {
    using Block = BlockQ4_1;
    static constexpr int kOffset = 0, kMaxU = 15;
    static constexpr bool kMin = true;
    static __m256i block(const uint8_t* p) { return nibbles32(p + offsetof(Block, qs)); }
};

// Q4_0's nibbles plus a fifth bit (bit j of qh for element j).
inline __m256i nibbles32_fifth(const uint8_t* qs, const uint8_t* qh) {
    // Byte j of the result takes bit j % 8 of qh byte j / 8.
    const __m256i h = _mm256_shuffle_epi8(
        _mm256_set1_epi32(load_i32(qh)),
        _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303));
    const __m256i bit = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ull));
    const __m256i top =
        _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(h, bit), bit), _mm256_set1_epi8(0x10));
    return _mm256_or_si256(nibbles32(qs), top);
}

// Q5_0: u = q (0..31), offset 16.
struct Q5 {
    using Block = BlockQ5_0;
    static constexpr int kOffset = 16, kMaxU = 31;
    static constexpr bool kMin = false;
    static __m256i block(const uint8_t* p) {
        return nibbles32_fifth(p + offsetof(Block, qs), p + offsetof(Block, qh));
    }
};

// Q5_1: Q5_0's bits, w = d * q + m as Q4_1's.
struct Q51 {
    using Block = BlockQ5_1;
    static constexpr int kOffset = 0, kMaxU = 31;
    static constexpr bool kMin = true;
    static __m256i block(const uint8_t* p) {
        return nibbles32_fifth(p + offsetof(Block, qs), p + offsetof(Block, qh));
    }
};

// IQ4_NL: the codebook value of each nibble, u = value + 128 as Q8_0's.
struct IQ4 {
    using Block = BlockIQ4_NL;
    static constexpr int kOffset = 128, kMaxU = 255;
    static constexpr bool kMin = false;
    static __m256i block(const uint8_t* p) {
        const __m128i book = _mm_xor_si128(load128(kIQ4NL), _mm_set1_epi8(static_cast<char>(0x80)));
        return _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(book),
                                   nibbles32(p + offsetof(Block, qs)));
    }
};

template <typename W> uint16_t scale_of(const uint8_t* block) {
    uint16_t d;
    std::memcpy(&d, block + offsetof(typename W::Block, d), sizeof d);
    return d;
}

// ---- the prompt GEMM -----------------------------------------------------------------
//
// A panel holds sixteen rows, one super-block after another (32 elements for
// Q4_0/Q8_0, 256 for the K-quants): first its 32-element units' eight words
// each (word k, lane r: elements 4k..4k+3 of the unit in row r, as unsigned
// bytes), then the type's scale area. Each weight type says how to get a
// unit of one row (unit), how to fill the scale area (scales) and how to
// multiply a panel by tokens (Tile).

constexpr int kPanelRows = 16;
constexpr size_t kWordBytes = 64;
constexpr size_t kUnitBytes = 8 * kWordBytes;

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
template <typename G>
void pack_panel(const uint8_t* w, size_t rb, int rows, int64_t n_super, uint8_t* panel) {
    using Block = typename G::Block;
    for (int64_t b = 0; b < n_super; b++) {
        uint8_t* dst = panel + b * G::kPanelBytes;
        const uint8_t* blocks[kPanelRows];
        for (int r = 0; r < kPanelRows; r++)
            blocks[r] = r < rows ? w + r * rb + b * sizeof(Block) : nullptr;
        for (int u = 0; u < G::kUnits; u++) {
            for (int half = 0; half < 2; half++) {
                __m256i v[8];
                for (int j = 0; j < 8; j++) {
                    const uint8_t* p = blocks[half * 8 + j];
                    v[j] = p ? G::unit(p, u) : _mm256_setzero_si256();
                }
                transpose8x8(v);
                for (int k = 0; k < 8; k++)
                    _mm256_store_si256(reinterpret_cast<__m256i*>(dst + u * kUnitBytes +
                                                                  k * kWordBytes + half * 32),
                                       v[k]);
            }
        }
        G::scales(blocks, dst + G::kUnits * kUnitBytes);
    }
}

inline const uint8_t* token_row(const Q8Tokens& a, int64_t t) {
    return static_cast<const uint8_t*>(a.rows) + t * a.row_bytes;
}

// Q4_0 and Q8_0 (one unit, Q8_0 activations): the block's sum starts from
// -offset * sum(a), and the scale area is the sixteen d as float. Q4_1 (Q8_1
// activations): the sum starts from 0, the scale area also holds the
// sixteen m, and each block adds m * s_a after d * d_a * isum.
template <typename W> struct Panel32 {
    using Block = typename W::Block;
    static constexpr bool kMin = W::kMin;
    using Act = std::conditional_t<kMin, BlockQ8_1, BlockQ8_0>;
    static constexpr int kUnits = 1;
    static constexpr size_t kPanelBytes = kUnitBytes + (kMin ? 2 : 1) * kPanelRows * sizeof(float);
    static __m256i unit(const uint8_t* p, int) { return W::block(p); }
    static void scales(const uint8_t* const* blocks, uint8_t* area) {
        auto* d = reinterpret_cast<float*>(area);
        for (int r = 0; r < kPanelRows; r++) {
            d[r] = blocks[r] ? kFp16ToFp32[scale_of<W>(blocks[r])] : 0.0f;
            if constexpr (kMin)
                d[kPanelRows + r] =
                    blocks[r] ? kFp16ToFp32[reinterpret_cast<const Block*>(blocks[r])->m] : 0.0f;
        }
    }
};

// The K-quants (eight units a super-block, Q8_K activations). Sub-block
// sums times their integer scales are added up exactly (vpmulld); the
// mins' and offsets' terms come from the activations' 16-element sums (Q8_K
// bsums) and pairs of 16-bit scales (vpdpwssd). Scale area: the sub-block
// scales as int32 (kSub words), the eight pair words, then d (and dmin) as float.

// Q4_K and Q5_K: eight sub-blocks of 32: u = q (Q4_K 0..15, Q5_K 0..31 with
// a fifth bit, bit u of qh[l] for element 32 u + l), w = d * sc * q - dmin * m.
// Per row: y = fma(d * da, qsum, y), then fma(-(dmin * da), msum, y), with
// qsum = sum sc_j * dot_j and msum = sum m_j * asum_j (kernels.h).
template <typename B> struct Q45K {
    using Block = B;
    static constexpr bool kFifth = std::is_same_v<B, BlockQ5_K>;
    static constexpr bool kMin = true;
    static constexpr int kMaxU = kFifth ? 31 : 15;
    static constexpr int kUnits = 8, kSub = 8;
    static constexpr size_t kScaleBytes = (kSub + 8) * kWordBytes + 2 * kPanelRows * sizeof(float);
    static constexpr size_t kPanelBytes = kUnits * kUnitBytes + kScaleBytes;
    static __m256i unit(const uint8_t* p, int u) {
        const __m256i q = load256(p + offsetof(Block, qs) + 32 * (u / 2));
        const __m256i low =
            _mm256_and_si256(u % 2 ? _mm256_srli_epi16(q, 4) : q, _mm256_set1_epi8(0x0f));
        if constexpr (kFifth) {
            const __m256i qh = load256(p + offsetof(Block, qh));
            const __m256i top =
                _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(u)), _mm256_set1_epi8(1));
            return _mm256_or_si256(low, _mm256_slli_epi16(top, 4));
        }
        return low;
    }
    static void scales(const uint8_t* const* blocks, uint8_t* area) {
        auto* sc = reinterpret_cast<int32_t*>(area);
        auto* pairs = reinterpret_cast<uint32_t*>(area + kSub * kWordBytes);
        auto* d = reinterpret_cast<float*>(area + (kSub + 8) * kWordBytes);
        for (int r = 0; r < kPanelRows; r++) {
            uint8_t sm[16] = {};
            if (blocks[r])
                _mm_storeu_si128(reinterpret_cast<__m128i*>(sm),
                                 unpack_scales_k4(blocks[r] + offsetof(Block, scales)));
            for (int j = 0; j < 8; j++) {
                sc[j * kPanelRows + r] = sm[j];
                // bsums i = 2j, 2j + 1 both take min j.
                pairs[j * kPanelRows + r] = sm[8 + j] | static_cast<uint32_t>(sm[8 + j]) << 16;
            }
            const auto* blk = reinterpret_cast<const Block*>(blocks[r]);
            d[r] = blocks[r] ? kFp16ToFp32[blk->d] : 0.0f;
            d[kPanelRows + r] = blocks[r] ? kFp16ToFp32[blk->dmin] : 0.0f;
        }
    }
};

using Q4K = Q45K<BlockQ4_K>;
using Q5K = Q45K<BlockQ5_K>;

// The types of sixteen sub-blocks of 16 (Q2_K, Q3_K, Q6_K): their scale area
// from each row's sixteen scales, the sixteen 16-bit values paired against
// the activations' bsums (Q2_K's mins, or the scales again for the offset
// of Q3_K and Q6_K), d and, with mins, dmin. Null rows get zeros.
template <bool kMin> struct Sub16Scales {
    static constexpr int kSub = 16;
    static constexpr size_t kScaleBytes =
        (kSub + 8) * kWordBytes + (kMin ? 2 : 1) * kPanelRows * sizeof(float);
    static void store(uint8_t* area, int r, const int (&sc)[16], const int (&paired)[16], float d,
                      float dmin) {
        auto* s = reinterpret_cast<int32_t*>(area);
        auto* pairs = reinterpret_cast<uint32_t*>(area + kSub * kWordBytes);
        auto* df = reinterpret_cast<float*>(area + (kSub + 8) * kWordBytes);
        for (int j = 0; j < kSub; j++) s[j * kPanelRows + r] = sc[j];
        for (int j = 0; j < 8; j++)
            pairs[j * kPanelRows + r] =
                static_cast<uint16_t>(paired[2 * j]) |
                static_cast<uint32_t>(static_cast<uint16_t>(paired[2 * j + 1])) << 16;
        df[r] = d;
        if constexpr (kMin) df[kPanelRows + r] = dmin;
    }
};

// Two bits of element 128 h + 32 k + l at bits 2k of byte 32 h + l (Q2_K's
// and Q3_K's qs, Q6_K's qh): unit u = 4 h + k.
inline __m256i crumbs(const uint8_t* q, int u) {
    return _mm256_and_si256(
        _mm256_srl_epi16(load256(q + 32 * (u / 4)), _mm_cvtsi32_si128(2 * (u % 4))),
        _mm256_set1_epi8(3));
}

// Q6_K: sixteen sub-blocks of 16: u = q (0..63), w = d * sc * (q - 32).
// y = fma(d * da, qsum, y), qsum = sum sc_j * (dot_j - 32 * asum_j).
struct Q6K : Sub16Scales<false> {
    using Block = BlockQ6_K;
    static constexpr bool kMin = false;
    static constexpr int kMaxU = 63, kOffsetShift = 5;
    static constexpr int kUnits = 8;
    static constexpr size_t kPanelBytes = kUnits * kUnitBytes + kScaleBytes;
    // Unit u = 4 h + k: elements 128 h + 32 k + l, low four bits from
    // ql[64 h + 32 (k & 1) + l] (high nibble when k >= 2), top two bits
    // 2k, 2k+1 of qh[32 h + l].
    static __m256i unit(const uint8_t* p, int u) {
        const int h = u / 4, k = u % 4;
        const __m256i ql = load256(p + offsetof(Block, ql) + 64 * h + 32 * (k & 1));
        const __m256i low =
            _mm256_and_si256(k >= 2 ? _mm256_srli_epi16(ql, 4) : ql, _mm256_set1_epi8(0x0f));
        return _mm256_or_si256(low, _mm256_slli_epi16(crumbs(p + offsetof(Block, qh), u), 4));
    }
    static void scales(const uint8_t* const* blocks, uint8_t* area) {
        for (int r = 0; r < kPanelRows; r++) {
            const auto* blk = reinterpret_cast<const Block*>(blocks[r]);
            int sc[16] = {};
            for (int j = 0; j < kSub && blk; j++) sc[j] = blk->scales[j];
            store(area, r, sc, sc, blk ? kFp16ToFp32[blk->d] : 0.0f, 0.0f);
        }
    }
};

// Q2_K: sixteen sub-blocks of 16: u = q (0..3), w = d * sc * q - dmin * m
// (sc the low, m the high nibble of scales[j]). As Q4_K: y = fma(d * da,
// qsum, y), then fma(-(dmin * da), msum, y).
struct Q2K : Sub16Scales<true> {
    using Block = BlockQ2_K;
    static constexpr bool kMin = true;
    static constexpr int kMaxU = 3;
    static constexpr int kUnits = 8;
    static constexpr size_t kPanelBytes = kUnits * kUnitBytes + kScaleBytes;
    static __m256i unit(const uint8_t* p, int u) { return crumbs(p + offsetof(Block, qs), u); }
    static void scales(const uint8_t* const* blocks, uint8_t* area) {
        for (int r = 0; r < kPanelRows; r++) {
            const auto* blk = reinterpret_cast<const Block*>(blocks[r]);
            int sc[16] = {}, m[16] = {};
            for (int j = 0; j < kSub && blk; j++) {
                sc[j] = blk->scales[j] & 0x0f;
                m[j] = blk->scales[j] >> 4;
            }
            store(area, r, sc, m, blk ? kFp16ToFp32[blk->d] : 0.0f,
                  blk ? kFp16ToFp32[blk->dmin] : 0.0f);
        }
    }
};

// Q3_K: sixteen sub-blocks of 16: u = q + 4 (0..7: the qs crumb, and bit u
// of hmask[l] as 4 for element 32 u + l), w = d * sc * (u - 4) with the
// 6-bit scales less 32. As Q6_K: qsum = sum sc_j * (dot_j - 4 * asum_j).
struct Q3K : Sub16Scales<false> {
    using Block = BlockQ3_K;
    static constexpr bool kMin = false;
    static constexpr int kMaxU = 7, kOffsetShift = 2;
    static constexpr int kUnits = 8;
    static constexpr size_t kPanelBytes = kUnits * kUnitBytes + kScaleBytes;
    static __m256i unit(const uint8_t* p, int u) {
        const __m256i high = _mm256_and_si256(
            _mm256_srl_epi16(load256(p + offsetof(Block, hmask)), _mm_cvtsi32_si128(u)),
            _mm256_set1_epi8(1));
        return _mm256_or_si256(crumbs(p + offsetof(Block, qs), u), _mm256_slli_epi16(high, 2));
    }
    static void scales(const uint8_t* const* blocks, uint8_t* area) {
        for (int r = 0; r < kPanelRows; r++) {
            const auto* blk = reinterpret_cast<const Block*>(blocks[r]);
            int sc[16] = {};
            if (blk) {
                int8_t s8[16];
                _mm_storeu_si128(reinterpret_cast<__m128i*>(s8), unpack_scales_k3(blk->scales));
                for (int j = 0; j < kSub; j++) sc[j] = s8[j];
            }
            store(area, r, sc, sc, blk ? kFp16ToFp32[blk->d] : 0.0f, 0.0f);
        }
    }
};

// ---- packed weights (kernels.h) -------------------------------------------------------
//
// Made once at load (gl::pack_rows), so a single token pays for no repacking
// and generation reads the weights' own bytes, one stream a panel. The
// words are those of the panels above; Q4_0 keeps two in one (low and high
// nibbles), Q8_0 stores its eight.

struct PackedQ4 {
    using Block = BlockQ4_0;
    static constexpr int kOffset = Q4::kOffset;
    static constexpr int kStored = 4;
};
struct PackedQ8 {
    using Block = BlockQ8_0;
    static constexpr int kOffset = Q8::kOffset;
    static constexpr int kStored = 8;
};

constexpr size_t kPackedScaleBytes = kPanelRows * sizeof(uint16_t);

// Where block b of a panel's nb keeps its words and its sixteen fp16
// scales, and where its pair of blocks starts (kernels.h: pairs of blocks,
// the last alone when nb is odd).
struct PackedBlock {
    size_t pair, words, scales;
    PackedBlock(int stored, int64_t b, int64_t nb) {
        const size_t block_words = static_cast<size_t>(stored) * kWordBytes;
        const bool lone = b % 2 == 0 && b + 1 == nb;
        pair = static_cast<size_t>(b / 2) * 2 * (block_words + kPackedScaleBytes);
        words = pair + static_cast<size_t>(b % 2) * block_words;
        scales =
            pair + (lone ? 1 : 2) * block_words + static_cast<size_t>(b % 2) * kPackedScaleBytes;
    }
};

// Generation streams the panels from memory: each pair's lines are asked for
// this far ahead (the hardware prefetcher alone leaves the loop waiting on
// DRAM, as for the dot products).
constexpr size_t kPackedPrefetchAhead = 8192;
template <typename P>
__attribute__((always_inline)) inline void prefetch_pair(const uint8_t* pair) {
#pragma GCC unroll 20
    for (size_t l = 0; l < 2 * (P::kStored * kWordBytes + kPackedScaleBytes); l += kWordBytes)
        _mm_prefetch(reinterpret_cast<const char*>(pair) + kPackedPrefetchAhead + l, _MM_HINT_T0);
}

} // namespace chain
} // namespace
} // namespace gl
