// NEON GEMM of the block-chain types (kernels.h's block_chain: Q4_0, Q5_0,
// Q8_0 and IQ4_NL weights with Q8_0 activations, Q4_1 and Q5_1 with Q8_1,
// the K-quants with Q8_K), for prompt batches on the dot-product extension
// (Jetson Orin's Cortex-A78AE and every ARMv8.2+ core).
//
// Four weight rows at a time are unpacked to signed bytes and transposed
// into a panel whose 128-bit words hold four consecutive weights of each of
// the four rows (lane = row). sdot by element (vdotq_laneq_s32) multiplies a
// word by four of a token's activations taken from one lane of a register,
// so one 16-byte load of activations serves four words and no horizontal
// sums are needed. sdot multiplies signed bytes, so weights enter as their
// signed values (Q4_0's q - 8, Q5_0's q - 16, Q3_K's q - 4, Q6_K's q - 32,
// Q8_0 and the IQ4_NL codebook as they are) and need no offset term; Q4_1,
// Q5_1, Q2_K, Q4_K and Q5_K keep q (at most 31) and their mins are terms of
// their own, as in the x86 GEMMs.
//
// The integer sums are exact and the float steps are the reference's (y =
// fma(d_w * d_a, isum, y) block after block, ref/quants*.cpp), so the result
// is the reference's bits for any number of tokens.
#include "ggml-like/cpu/chain_gemms.h"

#include <arm_neon.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "ggml-like/blocks_k.h"
#include "ggml-like/cpu/arm/k_scales.h"
#include "ggml-like/types.h"

namespace gl::neon_chain {

namespace {

constexpr int kRows = 4; // rows of a panel: lanes of a 128-bit word
constexpr size_t kWordBytes = 16;
constexpr size_t kUnitBytes = 8 * kWordBytes; // 32 elements of four rows

// A row's 32 elements (a unit) as signed bytes: elements 0-15 and 16-31.
struct Unit {
    int8x16_t lo, hi;
};

int8x16_t low_nibbles(uint8x16_t b) {
    return vreinterpretq_s8_u8(vandq_u8(b, vdupq_n_u8(0x0f)));
}
int8x16_t high_nibbles(uint8x16_t b) {
    return vreinterpretq_s8_u8(vshrq_n_u8(b, 4));
}

// Q4_0's nibble layout: elements 0-15 low nibbles, 16-31 high.
Unit nibbles32(const uint8_t* qs) {
    const uint8x16_t b = vld1q_u8(qs);
    return {low_nibbles(b), high_nibbles(b)};
}

// Q5's fifth bits (bit j of the 32-bit qh for element j) added as 16.
Unit fifth_bits(Unit u, const uint8_t* qh) {
    static constexpr uint8_t kBit[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    const uint8x16_t bit = vld1q_u8(kBit), sixteen = vdupq_n_u8(0x10);
    const uint8x16_t lo = vcombine_u8(vdup_n_u8(qh[0]), vdup_n_u8(qh[1]));
    const uint8x16_t hi = vcombine_u8(vdup_n_u8(qh[2]), vdup_n_u8(qh[3]));
    return {vaddq_s8(u.lo, vreinterpretq_s8_u8(vandq_u8(vtstq_u8(lo, bit), sixteen))),
            vaddq_s8(u.hi, vreinterpretq_s8_u8(vandq_u8(vtstq_u8(hi, bit), sixteen)))};
}

// Bits 2k, 2k+1 of the 32 bytes at q + 32 h (unit u = 4 h + k), as 0..3.
Unit crumbs(const uint8_t* q, int u) {
    const uint8_t* p = q + 32 * (u / 4);
    const int8x16_t shift = vdupq_n_s8(static_cast<int8_t>(-2 * (u % 4)));
    const uint8x16_t three = vdupq_n_u8(3);
    return {vreinterpretq_s8_u8(vandq_u8(vshlq_u8(vld1q_u8(p), shift), three)),
            vreinterpretq_s8_u8(vandq_u8(vshlq_u8(vld1q_u8(p + 16), shift), three))};
}

// Bit u of the 32 bytes at q, as 0 or 1.
Unit bits(const uint8_t* q, int u) {
    const int8x16_t shift = vdupq_n_s8(static_cast<int8_t>(-u));
    const uint8x16_t one = vdupq_n_u8(1);
    return {vreinterpretq_s8_u8(vandq_u8(vshlq_u8(vld1q_u8(q), shift), one)),
            vreinterpretq_s8_u8(vandq_u8(vshlq_u8(vld1q_u8(q + 16), shift), one))};
}

Unit minus(Unit u, int8_t v) {
    return {vsubq_s8(u.lo, vdupq_n_s8(v)), vsubq_s8(u.hi, vdupq_n_s8(v))};
}

// ---- the 32-element types: unit(block) as signed bytes, kMin: w = d q + m -----

struct Q4 {
    using Block = BlockQ4_0;
    static constexpr bool kMin = false;
    static Unit unit(const uint8_t* p, int) { return minus(nibbles32(p + offsetof(Block, qs)), 8); }
};

struct Q41 {
    using Block = BlockQ4_1;
    static constexpr bool kMin = true;
    static Unit unit(const uint8_t* p, int) { return nibbles32(p + offsetof(Block, qs)); }
};

struct Q5 {
    using Block = BlockQ5_0;
    static constexpr bool kMin = false;
    static Unit unit(const uint8_t* p, int) {
        return minus(fifth_bits(nibbles32(p + offsetof(Block, qs)), p + offsetof(Block, qh)), 16);
    }
};

struct Q51 {
    using Block = BlockQ5_1;
    static constexpr bool kMin = true;
    static Unit unit(const uint8_t* p, int) {
        return fifth_bits(nibbles32(p + offsetof(Block, qs)), p + offsetof(Block, qh));
    }
};

struct Q8 {
    using Block = BlockQ8_0;
    static constexpr bool kMin = false;
    static Unit unit(const uint8_t* p, int) {
        const auto* qs = reinterpret_cast<const int8_t*>(p + offsetof(Block, qs));
        return {vld1q_s8(qs), vld1q_s8(qs + 16)};
    }
};

struct IQ4 {
    using Block = BlockIQ4_NL;
    static constexpr bool kMin = false;
    static Unit unit(const uint8_t* p, int) {
        const int8x16_t book = vld1q_s8(kIQ4NL);
        const Unit n = nibbles32(p + offsetof(Block, qs));
        return {vqtbl1q_s8(book, vreinterpretq_u8_s8(n.lo)),
                vqtbl1q_s8(book, vreinterpretq_u8_s8(n.hi))};
    }
};

// Scale area: the four rows' d as float (and m for kMin).
template <typename W> struct Panel32 {
    using Block = typename W::Block;
    static constexpr int kUnits = 1;
    static constexpr size_t kPanelBytes = kUnitBytes + (W::kMin ? 2 : 1) * kRows * sizeof(float);
    static Unit unit(const uint8_t* p, int u) { return W::unit(p, u); }
    static void scales(const uint8_t* const* blocks, uint8_t* area) {
        auto* d = reinterpret_cast<float*>(area);
        for (int r = 0; r < kRows; r++) {
            const auto* b = reinterpret_cast<const Block*>(blocks[r]);
            d[r] = b ? kFp16ToFp32[b->d] : 0.0f;
            if constexpr (W::kMin) d[kRows + r] = b ? kFp16ToFp32[b->m] : 0.0f;
        }
    }
};

// ---- the K-quants (eight units a super-block) -----------------------------------

// The K-quants' scale area: kSub scales as int32 per row (a word each),
// with mins kSub mins likewise, then d (and dmin) as float.
template <int kSubBlocks, bool kMins> struct SubScales {
    static constexpr int kSub = kSubBlocks;
    static constexpr bool kMin = kMins;
    static constexpr size_t kScaleBytes = ((kMin ? 2 : 1) * kSub + (kMin ? 2 : 1)) * kWordBytes;
    static void store(uint8_t* area, int r, const int* sc, const int* m, float d, float dmin) {
        auto* s = reinterpret_cast<int32_t*>(area);
        for (int j = 0; j < kSub; j++) s[j * kRows + r] = sc[j];
        if constexpr (kMin)
            for (int j = 0; j < kSub; j++) s[(kSub + j) * kRows + r] = m[j];
        auto* df = reinterpret_cast<float*>(s + (kMin ? 2 : 1) * kSub * kRows);
        df[r] = d;
        if constexpr (kMin) df[kRows + r] = dmin;
    }
};

// Q4_K and Q5_K: unit j is sub-block j; u = q (Q5_K: plus bit j of qh[l]).
template <typename B> struct Q45K : SubScales<8, true> {
    using Block = B;
    static constexpr int kUnits = 8;
    static constexpr size_t kPanelBytes = kUnits * kUnitBytes + kScaleBytes;
    static Unit unit(const uint8_t* p, int u) {
        const uint8_t* q = p + offsetof(Block, qs) + 32 * (u / 2);
        const uint8x16_t b0 = vld1q_u8(q), b1 = vld1q_u8(q + 16);
        Unit v = u % 2 ? Unit{high_nibbles(b0), high_nibbles(b1)}
                       : Unit{low_nibbles(b0), low_nibbles(b1)};
        if constexpr (std::is_same_v<B, BlockQ5_K>) {
            const Unit h = bits(p + offsetof(Block, qh), u);
            v = {vaddq_s8(v.lo, vshlq_n_s8(h.lo, 4)), vaddq_s8(v.hi, vshlq_n_s8(h.hi, 4))};
        }
        return v;
    }
    static void scales(const uint8_t* const* blocks, uint8_t* area) {
        for (int r = 0; r < kRows; r++) {
            const auto* b = reinterpret_cast<const Block*>(blocks[r]);
            uint8_t s8[8] = {}, m8[8] = {};
            if (b) unpack_scales_k4(b->scales, s8, m8);
            int sc[8], m[8];
            for (int j = 0; j < kSub; j++) sc[j] = s8[j], m[j] = m8[j];
            store(area, r, sc, m, b ? kFp16ToFp32[b->d] : 0.0f, b ? kFp16ToFp32[b->dmin] : 0.0f);
        }
    }
};
using Q4K = Q45K<BlockQ4_K>;
using Q5K = Q45K<BlockQ5_K>;

// The types of sixteen sub-blocks of 16: unit u = 4 h + k holds elements
// 128 h + 32 k + l, sub-blocks 2u (its lo) and 2u + 1 (its hi).

// Q6_K: s = q - 32; the sixteen int8 scales.
struct Q6K : SubScales<16, false> {
    using Block = BlockQ6_K;
    static constexpr int kUnits = 8;
    static constexpr size_t kPanelBytes = kUnits * kUnitBytes + kScaleBytes;
    static Unit unit(const uint8_t* p, int u) {
        const int h = u / 4, k = u % 4;
        const uint8_t* ql = p + offsetof(Block, ql) + 64 * h + 32 * (k & 1);
        const Unit top = crumbs(p + offsetof(Block, qh), u);
        auto part = [&](int off, int8x16_t t) {
            const uint8x16_t l = vld1q_u8(ql + off);
            const int8x16_t low = k >= 2 ? high_nibbles(l) : low_nibbles(l);
            return vsubq_s8(vorrq_s8(low, vshlq_n_s8(t, 4)), vdupq_n_s8(32));
        };
        return {part(0, top.lo), part(16, top.hi)};
    }
    static void scales(const uint8_t* const* blocks, uint8_t* area) {
        for (int r = 0; r < kRows; r++) {
            const auto* b = reinterpret_cast<const Block*>(blocks[r]);
            int sc[16] = {};
            for (int j = 0; j < kSub && b; j++) sc[j] = b->scales[j];
            store(area, r, sc, nullptr, b ? kFp16ToFp32[b->d] : 0.0f, 0.0f);
        }
    }
};

// Q2_K: s = q (0..3); sc the low, m the high nibble of scales[j].
struct Q2K : SubScales<16, true> {
    using Block = BlockQ2_K;
    static constexpr int kUnits = 8;
    static constexpr size_t kPanelBytes = kUnits * kUnitBytes + kScaleBytes;
    static Unit unit(const uint8_t* p, int u) { return crumbs(p + offsetof(Block, qs), u); }
    static void scales(const uint8_t* const* blocks, uint8_t* area) {
        for (int r = 0; r < kRows; r++) {
            const auto* b = reinterpret_cast<const Block*>(blocks[r]);
            int sc[16] = {}, m[16] = {};
            for (int j = 0; j < kSub && b; j++) sc[j] = b->scales[j] & 0x0f, m[j] = b->scales[j] >> 4;
            store(area, r, sc, m, b ? kFp16ToFp32[b->d] : 0.0f, b ? kFp16ToFp32[b->dmin] : 0.0f);
        }
    }
};

// Q3_K: s = q - 4 (the qs crumb, plus 4 where bit u of hmask[l] is set);
// the 6-bit scales less 32.
struct Q3K : SubScales<16, false> {
    using Block = BlockQ3_K;
    static constexpr int kUnits = 8;
    static constexpr size_t kPanelBytes = kUnits * kUnitBytes + kScaleBytes;
    static Unit unit(const uint8_t* p, int u) {
        const Unit c = crumbs(p + offsetof(Block, qs), u), h = bits(p + offsetof(Block, hmask), u);
        const int8x16_t four = vdupq_n_s8(4);
        return {vsubq_s8(vorrq_s8(c.lo, vshlq_n_s8(h.lo, 2)), four),
                vsubq_s8(vorrq_s8(c.hi, vshlq_n_s8(h.hi, 2)), four)};
    }
    static void scales(const uint8_t* const* blocks, uint8_t* area) {
        for (int r = 0; r < kRows; r++) {
            const auto* b = reinterpret_cast<const Block*>(blocks[r]);
            int sc[16] = {};
            if (b) {
                int8_t s8[16];
                vst1q_s8(s8, unpack_scales_k3(b->scales));
                for (int j = 0; j < kSub; j++) sc[j] = s8[j];
            }
            store(area, r, sc, nullptr, b ? kFp16ToFp32[b->d] : 0.0f, 0.0f);
        }
    }
};

// ---- panels -----------------------------------------------------------------------

// Words 0-3 of a unit from the rows' lo halves, 4-7 from their hi halves:
// word k lane r = dword k of row r.
void transpose4x4(const int8x16_t (&rows)[kRows], int8_t* dst) {
    const int32x4_t r0 = vreinterpretq_s32_s8(rows[0]), r1 = vreinterpretq_s32_s8(rows[1]);
    const int32x4_t r2 = vreinterpretq_s32_s8(rows[2]), r3 = vreinterpretq_s32_s8(rows[3]);
    const int32x4_t t0 = vtrn1q_s32(r0, r1), t1 = vtrn2q_s32(r0, r1);
    const int32x4_t t2 = vtrn1q_s32(r2, r3), t3 = vtrn2q_s32(r2, r3);
    auto lo64 = [](int32x4_t a, int32x4_t b) {
        return vreinterpretq_s8_s64(vtrn1q_s64(vreinterpretq_s64_s32(a), vreinterpretq_s64_s32(b)));
    };
    auto hi64 = [](int32x4_t a, int32x4_t b) {
        return vreinterpretq_s8_s64(vtrn2q_s64(vreinterpretq_s64_s32(a), vreinterpretq_s64_s32(b)));
    };
    vst1q_s8(dst, lo64(t0, t2));
    vst1q_s8(dst + kWordBytes, lo64(t1, t3));
    vst1q_s8(dst + 2 * kWordBytes, hi64(t0, t2));
    vst1q_s8(dst + 3 * kWordBytes, hi64(t1, t3));
}

// Four rows (fewer at a matrix's end: the rest zero) into a panel.
template <typename G>
void pack_panel(const uint8_t* w, size_t rb, int rows, int64_t n_super, uint8_t* panel) {
    using Block = typename G::Block;
    for (int64_t b = 0; b < n_super; b++) {
        uint8_t* dst = panel + b * G::kPanelBytes;
        const uint8_t* blocks[kRows];
        for (int r = 0; r < kRows; r++)
            blocks[r] = r < rows ? w + r * rb + b * sizeof(Block) : nullptr;
        for (int u = 0; u < G::kUnits; u++) {
            int8x16_t lo[kRows], hi[kRows];
            for (int r = 0; r < kRows; r++) {
                const Unit v = blocks[r] ? G::unit(blocks[r], u) : Unit{vdupq_n_s8(0), vdupq_n_s8(0)};
                lo[r] = v.lo;
                hi[r] = v.hi;
            }
            auto* unit = reinterpret_cast<int8_t*>(dst + u * kUnitBytes);
            transpose4x4(lo, unit);
            transpose4x4(hi, unit + 4 * kWordBytes);
        }
        G::scales(blocks, dst + G::kUnits * kUnitBytes);
    }
}

const uint8_t* token_row(const Q8Tokens& a, int64_t t) {
    return static_cast<const uint8_t*>(a.rows) + t * a.row_bytes;
}

// acc[t] += four words (from words on) times token t's 16 activations act[t]
// (four a word, lane k for word k).
template <int NT>
__attribute__((always_inline)) inline void dot4(const uint8_t* words, const int8x16_t (&act)[NT],
                                                int32x4_t (&acc)[NT]) {
    const auto* p = reinterpret_cast<const int8_t*>(words);
    const int8x16_t w0 = vld1q_s8(p), w1 = vld1q_s8(p + kWordBytes);
    const int8x16_t w2 = vld1q_s8(p + 2 * kWordBytes), w3 = vld1q_s8(p + 3 * kWordBytes);
    for (int t = 0; t < NT; t++) {
        acc[t] = vdotq_laneq_s32(acc[t], w0, act[t], 0);
        acc[t] = vdotq_laneq_s32(acc[t], w1, act[t], 1);
        acc[t] = vdotq_laneq_s32(acc[t], w2, act[t], 2);
        acc[t] = vdotq_laneq_s32(acc[t], w3, act[t], 3);
    }
}

template <int NT, typename V> void fill(V (&v)[NT], V x) {
    for (int t = 0; t < NT; t++) v[t] = x;
}

template <typename W> struct Block32 : Panel32<W> {
    using Act = std::conditional_t<W::kMin, BlockQ8_1, BlockQ8_0>;
    using Panel32<W>::kPanelBytes;

    template <int NT>
    static void tile(const uint8_t* pan, int64_t nb, const Q8Tokens& a, int64_t t0,
                     float32x4_t (&f)[NT]) {
        const Act* tok[NT];
        for (int t = 0; t < NT; t++) tok[t] = reinterpret_cast<const Act*>(token_row(a, t0 + t));
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t* words = pan + b * kPanelBytes;
            int32x4_t acc[NT];
            fill(acc, vdupq_n_s32(0));
            int8x16_t act[NT];
            for (int t = 0; t < NT; t++) act[t] = vld1q_s8(tok[t][b].qs);
            dot4(words, act, acc);
            for (int t = 0; t < NT; t++) act[t] = vld1q_s8(tok[t][b].qs + 16);
            dot4(words + 4 * kWordBytes, act, acc);
            const auto* d = reinterpret_cast<const float*>(words + kUnitBytes);
            const float32x4_t dw = vld1q_f32(d);
            for (int t = 0; t < NT; t++) {
                f[t] = vfmaq_f32(f[t], vmulq_n_f32(dw, kFp16ToFp32[tok[t][b].d]),
                                 vcvtq_f32_s32(acc[t]));
                if constexpr (W::kMin)
                    f[t] = vfmaq_n_f32(f[t], vld1q_f32(d + kRows), kFp16ToFp32[tok[t][b].s]);
            }
        }
    }
};

template <typename K> struct SuperTile : K {
    using K::kPanelBytes;
    using K::kSub;
    using K::kUnits;

    template <int NT>
    static void tile(const uint8_t* pan, int64_t nb, const Q8Tokens& a, int64_t t0,
                     float32x4_t (&f)[NT]) {
        const BlockQ8_K* tok[NT];
        for (int t = 0; t < NT; t++)
            tok[t] = reinterpret_cast<const BlockQ8_K*>(token_row(a, t0 + t));
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t* words = pan + b * kPanelBytes;
            const auto* sc = reinterpret_cast<const int32_t*>(words + kUnits * kUnitBytes);
            int32x4_t q[NT];
            fill(q, vdupq_n_s32(0));
            for (int u = 0; u < kUnits; u++) {
                const uint8_t* unit = words + u * kUnitBytes;
                // Sub-block sums: one per unit (Q4_K, Q5_K) or one per half (Q6_K).
                int32x4_t s[NT];
                int8x16_t act[NT];
                fill(s, vdupq_n_s32(0));
                for (int t = 0; t < NT; t++) act[t] = vld1q_s8(tok[t][b].qs + 32 * u);
                dot4(unit, act, s);
                if constexpr (kSub == 16) {
                    for (int t = 0; t < NT; t++) {
                        q[t] = vmlaq_s32(q[t], s[t], vld1q_s32(sc + 2 * u * kRows));
                        s[t] = vdupq_n_s32(0);
                    }
                }
                for (int t = 0; t < NT; t++) act[t] = vld1q_s8(tok[t][b].qs + 32 * u + 16);
                dot4(unit + 4 * kWordBytes, act, s);
                const int j = kSub == 16 ? 2 * u + 1 : u;
                for (int t = 0; t < NT; t++) q[t] = vmlaq_s32(q[t], s[t], vld1q_s32(sc + j * kRows));
            }
            const auto* d = reinterpret_cast<const float*>(sc + (K::kMin ? 2 : 1) * kSub * kRows);
            static_assert(kSub == 8 || kSub == 16);
            const float32x4_t dw = vld1q_f32(d);
            for (int t = 0; t < NT; t++) {
                const float da = tok[t][b].d;
                f[t] = vfmaq_f32(f[t], vmulq_n_f32(dw, da), vcvtq_f32_s32(q[t]));
                if constexpr (K::kMin) {
                    // The mins against the sub-blocks' activation sums.
                    const int32_t* mn = sc + kSub * kRows;
                    int32x4_t m = vdupq_n_s32(0);
                    const int16_t* bsums = tok[t][b].bsums;
                    for (int j = 0; j < kSub; j++)
                        m = vmlaq_n_s32(m, vld1q_s32(mn + j * kRows),
                                        kSub == 16 ? bsums[j] : bsums[2 * j] + bsums[2 * j + 1]);
                    f[t] = vfmsq_f32(f[t], vmulq_n_f32(vld1q_f32(d + kRows), da), vcvtq_f32_s32(m));
                }
            }
        }
    }
};

// Four rows by NT tokens from t0, over all super-blocks; `rows` of the four
// are stored.
template <typename G, int NT>
void tile(const uint8_t* pan, int64_t n_super, const Q8Tokens& a, int64_t t0, float* y,
          size_t y_stride, int rows) {
    float32x4_t f[NT];
    fill(f, vdupq_n_f32(0.0f));
    G::template tile<NT>(pan, n_super, a, t0, f);
    for (int t = 0; t < NT; t++) {
        float* out = y + (t0 + t) * y_stride;
        if (rows == kRows) {
            vst1q_f32(out, f[t]);
        } else {
            float v[kRows];
            vst1q_f32(v, f[t]);
            std::memcpy(out, v, static_cast<size_t>(rows) * sizeof(float));
        }
    }
}

template <typename G>
void tokens(const uint8_t* pan, int64_t n_super, const Q8Tokens& a, float* y, size_t y_stride,
            int rows) {
    by_token_tiles(a.n_tok, [&]<int NT>(int64_t t0) {
        tile<G, NT>(pan, n_super, a, t0, y, y_stride, rows);
    });
}

template <typename G>
void gemm_panels(int64_t n, const void* w, size_t row_bytes, int64_t n_rows, const Q8Tokens& a,
                 float* y, size_t y_stride, void* scratch) {
    const int64_t n_super = n / (32 * G::kUnits);
    const auto* base = static_cast<const uint8_t*>(w);
    uint8_t* pan = panel_scratch(scratch);
    for (int64_t r0 = 0; r0 < n_rows; r0 += kRows) {
        const int rows = static_cast<int>(std::min<int64_t>(kRows, n_rows - r0));
        pack_panel<G>(base + r0 * row_bytes, row_bytes, rows, n_super, pan);
        tokens<G>(pan, n_super, a, y + r0, y_stride, rows);
    }
}

// Every type's panel fits the scratch gemm_scratch_bytes (kernels.h) gives.
static_assert(Panel32<Q41>::kPanelBytes <= kGemmPanelBlockBytes);
static_assert(Q4K::kPanelBytes <= 8 * kGemmPanelBlockBytes);
static_assert(Q6K::kPanelBytes <= 8 * kGemmPanelBlockBytes);
static_assert(Q2K::kPanelBytes <= 8 * kGemmPanelBlockBytes);

} // namespace

KVRUN_CHAIN_GEMMS(KVRUN_DEFINE_CHAIN_GEMM)

} // namespace gl::neon_chain
