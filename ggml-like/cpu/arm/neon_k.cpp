// AArch64 NEON kernels (with the dot-product extension) for the types of
// blocks_k.h; compiled with -march=armv8.2-a+dotprod+fp16 and reached only
// after dispatch.cpp has seen asimddp and asimdhp in the hwcaps.
//
// sdot (vdotq_s32) multiplies signed bytes and sums each group of four into
// an int32 lane, so unpacked weights (0..63) go in as they are. A 16-weight
// sub-block is one sdot; its four lanes are scaled by the sub-block scale with
// an integer multiply-accumulate, so each super-block's sum is exact in int32
// and is scaled by d_w * d_a in float once. Offsets and mins are dots of the
// scales with Q8_K's 16 block sums, as in the x86 files.
#include "ggml-like/blocks_k.h"
#include "ggml-like/cpu/arm/k_scales.h"

#include <arm_neon.h>

#include <cmath>
#include <cstring>

namespace gl::neon_k {

namespace {

uint32_t load_u32(const void* p) {
    uint32_t v;
    std::memcpy(&v, p, sizeof v);
    return v;
}

// See x86/avx2_k.cpp: software prefetch well ahead of the streamed weights.
constexpr size_t kPrefetchBytes = 8192;

template <typename Block> void prefetch_ahead(const Block* block) {
    const char* p = reinterpret_cast<const char*>(block) + kPrefetchBytes;
    for (size_t off = 0; off < sizeof(Block); off += 64) __builtin_prefetch(p + off);
}

int8x16_t s8(uint8x16_t v) {
    return vreinterpretq_s8_u8(v);
}

// sum of w * a over 16 bytes, as four int32 lanes.
int32x4_t dot16(uint8x16_t w, const int8_t* a) {
    return vdotq_s32(vdupq_n_s32(0), s8(w), vld1q_s8(a));
}

// sum_j scale[j] * bsums[j] for 16 int16 scales.
int32_t scaled_bsums(int16x8_t lo, int16x8_t hi, const BlockQ8_K& y) {
    const int16x8_t b0 = vld1q_s16(y.bsums), b1 = vld1q_s16(y.bsums + 8);
    int32x4_t s = vmull_s16(vget_low_s16(lo), vget_low_s16(b0));
    s = vmlal_s16(s, vget_high_s16(lo), vget_high_s16(b0));
    s = vmlal_s16(s, vget_low_s16(hi), vget_low_s16(b1));
    s = vmlal_s16(s, vget_high_s16(hi), vget_high_s16(b1));
    return vaddvq_s32(s);
}

// ---- Q4_K / Q5_K ---------------------------------------------------------------------

// One super-block: d * da * sum(sc q a) - dmin * da * sum(m a).
template <bool kFive>
float block_k4(uint16_t d, uint16_t dmin, const uint8_t* scales, const uint8_t* qh,
               const uint8_t* qs, const BlockQ8_K& y) {
    uint8_t sc[8], m[8];
    unpack_scales_k4(scales, sc, m);
    // m_j pairs with bsums 2j and 2j + 1.
    const int16x8_t bs = vpaddq_s16(vld1q_s16(y.bsums), vld1q_s16(y.bsums + 8));
    const int16x8_t m16 = vreinterpretq_s16_u16(vmovl_u8(vld1_u8(m)));
    int32x4_t ms = vmull_s16(vget_low_s16(m16), vget_low_s16(bs));
    ms = vmlal_s16(ms, vget_high_s16(m16), vget_high_s16(bs));

    const uint8x16_t m4 = vdupq_n_u8(0x0f);
    uint8x16_t hb[2] = {vdupq_n_u8(0), vdupq_n_u8(0)};
    if (kFive) hb[0] = vld1q_u8(qh), hb[1] = vld1q_u8(qh + 16);
    int32x4_t sum = vdupq_n_s32(0);
    for (int c = 0; c < 4; c++) {
        const int8_t* a = y.qs + 64 * c;
        int32x4_t s_lo = vdupq_n_s32(0), s_hi = vdupq_n_s32(0);
        for (int g = 0; g < 2; g++) {
            const uint8x16_t q = vld1q_u8(qs + 32 * c + 16 * g);
            uint8x16_t lo = vandq_u8(q, m4), hi = vshrq_n_u8(q, 4);
            if (kFive) {
                // Bits 2c, 2c + 1 of qh (shifted down as c advances) become bit 4.
                lo = vorrq_u8(lo, vshlq_n_u8(vandq_u8(hb[g], vdupq_n_u8(1)), 4));
                hi = vorrq_u8(hi, vshlq_n_u8(vandq_u8(hb[g], vdupq_n_u8(2)), 3));
                hb[g] = vshrq_n_u8(hb[g], 2);
            }
            s_lo = vdotq_s32(s_lo, s8(lo), vld1q_s8(a + 16 * g));
            s_hi = vdotq_s32(s_hi, s8(hi), vld1q_s8(a + 32 + 16 * g));
        }
        sum = vmlaq_n_s32(sum, s_lo, sc[2 * c]);
        sum = vmlaq_n_s32(sum, s_hi, sc[2 * c + 1]);
    }
    return kFp16ToFp32[d] * y.d * static_cast<float>(vaddvq_s32(sum)) -
           kFp16ToFp32[dmin] * y.d * static_cast<float>(vaddvq_s32(ms));
}

} // namespace

float vec_dot_q4_K(int64_t n, const void* w, const void* a) {
    const auto* x = static_cast<const BlockQ4_K*>(w);
    const auto* y = static_cast<const BlockQ8_K*>(a);
    float acc = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        prefetch_ahead(x + i);
        acc += block_k4<false>(x[i].d, x[i].dmin, x[i].scales, nullptr, x[i].qs, y[i]);
    }
    return acc;
}

float vec_dot_q5_K(int64_t n, const void* w, const void* a) {
    const auto* x = static_cast<const BlockQ5_K*>(w);
    const auto* y = static_cast<const BlockQ8_K*>(a);
    float acc = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        prefetch_ahead(x + i);
        acc += block_k4<true>(x[i].d, x[i].dmin, x[i].scales, x[i].qh, x[i].qs, y[i]);
    }
    return acc;
}

// ---- Q6_K ------------------------------------------------------------------------------

namespace {

// 16 weights (q + 32, 0..63) of group k, part g, of a 128-weight half: low 4
// bits from ql[32 (k & 1) + 16 g ..] (high nibble for k >= 2), top 2 from
// bits 2k, 2k + 1 of qh[16 g ..].
uint8x16_t q6_16(const uint8_t* ql, const uint8_t* qh, int k, int g) {
    const uint8x16_t l = vld1q_u8(ql + 32 * (k & 1) + 16 * g);
    const uint8x16_t low = k < 2 ? vandq_u8(l, vdupq_n_u8(0x0f)) : vshrq_n_u8(l, 4);
    const uint8x16_t h = vld1q_u8(qh + 16 * g);
    uint8x16_t top;
    switch (k) {
    case 0:
        top = vshlq_n_u8(vandq_u8(h, vdupq_n_u8(0x03)), 4);
        break;
    case 1:
        top = vshlq_n_u8(vandq_u8(h, vdupq_n_u8(0x0c)), 2);
        break;
    case 2:
        top = vandq_u8(h, vdupq_n_u8(0x30));
        break;
    default:
        top = vshrq_n_u8(vandq_u8(h, vdupq_n_u8(0xc0)), 2);
        break;
    }
    return vorrq_u8(low, top);
}

} // namespace

float vec_dot_q6_K(int64_t n, const void* w, const void* a) {
    const auto* x = static_cast<const BlockQ6_K*>(w);
    const auto* y = static_cast<const BlockQ8_K*>(a);
    float acc = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        prefetch_ahead(x + i);
        const int8x16_t sc8 = vld1q_s8(x[i].scales);
        const int32_t off =
            scaled_bsums(vmovl_s8(vget_low_s8(sc8)), vmovl_s8(vget_high_s8(sc8)), y[i]);
        int32x4_t sum = vdupq_n_s32(0);
        for (int h = 0; h < 2; h++)
            for (int k = 0; k < 4; k++)
                for (int g = 0; g < 2; g++) {
                    const int sub = 8 * h + 2 * k + g;
                    const int32x4_t s =
                        dot16(q6_16(x[i].ql + 64 * h, x[i].qh + 32 * h, k, g), y[i].qs + 16 * sub);
                    sum = vmlaq_n_s32(sum, s, x[i].scales[sub]);
                }
        const int32_t total = vaddvq_s32(sum) - 32 * off;
        acc += kFp16ToFp32[x[i].d] * y[i].d * static_cast<float>(total);
    }
    return acc;
}

// ---- Q2_K / Q3_K ----------------------------------------------------------------------

namespace {

// sum over 256 weights of scale * q * a, for 2-bit fields (plus, for Q3_K, a
// third bit from hmask) and 16 signed scales.
template <bool kThree>
int32_t dot_crumbs(const uint8_t* qs, const uint8_t* hmask, const int8_t* scales, const int8_t* a) {
    int32x4_t sum = vdupq_n_s32(0);
    uint8x16_t hm[2] = {vdupq_n_u8(0), vdupq_n_u8(0)};
    if (kThree) hm[0] = vld1q_u8(hmask), hm[1] = vld1q_u8(hmask + 16);
    for (int h = 0; h < 2; h++) {
        uint8x16_t qv[2] = {vld1q_u8(qs + 32 * h), vld1q_u8(qs + 32 * h + 16)};
        for (int k = 0; k < 4; k++)
            for (int g = 0; g < 2; g++) {
                uint8x16_t q = vandq_u8(qv[g], vdupq_n_u8(3));
                qv[g] = vshrq_n_u8(qv[g], 2);
                if (kThree) {
                    // Bit 4h + k of hmask, taken from the bottom as it shifts down.
                    q = vorrq_u8(q, vshlq_n_u8(vandq_u8(hm[g], vdupq_n_u8(1)), 2));
                    hm[g] = vshrq_n_u8(hm[g], 1);
                }
                const int sub = 8 * h + 2 * k + g;
                sum = vmlaq_n_s32(sum, dot16(q, a + 16 * sub), scales[sub]);
            }
    }
    return vaddvq_s32(sum);
}

} // namespace

float vec_dot_q2_K(int64_t n, const void* w, const void* a) {
    const auto* x = static_cast<const BlockQ2_K*>(w);
    const auto* y = static_cast<const BlockQ8_K*>(a);
    float acc = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        prefetch_ahead(x + i);
        const uint8x16_t s = vld1q_u8(x[i].scales);
        int8_t sc[16];
        vst1q_s8(sc, s8(vandq_u8(s, vdupq_n_u8(0x0f))));
        const uint8x16_t m = vshrq_n_u8(s, 4);
        const int32_t mins = scaled_bsums(vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(m))),
                                          vreinterpretq_s16_u16(vmovl_u8(vget_high_u8(m))), y[i]);
        const int32_t sum = dot_crumbs<false>(x[i].qs, nullptr, sc, y[i].qs);
        acc += kFp16ToFp32[x[i].d] * y[i].d * static_cast<float>(sum) -
               kFp16ToFp32[x[i].dmin] * y[i].d * static_cast<float>(mins);
    }
    return acc;
}

float vec_dot_q3_K(int64_t n, const void* w, const void* a) {
    const auto* x = static_cast<const BlockQ3_K*>(w);
    const auto* y = static_cast<const BlockQ8_K*>(a);
    float acc = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        prefetch_ahead(x + i);
        const int8x16_t sc8 = unpack_scales_k3(x[i].scales);
        int8_t sc[16];
        vst1q_s8(sc, sc8);
        // Weights are stored as q + 4 (0..7): take 4 * sum_j sc_j * bsums_j off.
        const int32_t off =
            scaled_bsums(vmovl_s8(vget_low_s8(sc8)), vmovl_s8(vget_high_s8(sc8)), y[i]);
        const int32_t sum = dot_crumbs<true>(x[i].qs, x[i].hmask, sc, y[i].qs) - 4 * off;
        acc += kFp16ToFp32[x[i].d] * y[i].d * static_cast<float>(sum);
    }
    return acc;
}

// ---- 32-element blocks ---------------------------------------------------------------------

namespace {

// 0xff in byte j (of 16) where bit j of the 16-bit value is set.
uint8x16_t expand16(uint32_t bits) {
    const uint8x16_t v = vcombine_u8(vdup_n_u8(static_cast<uint8_t>(bits)),
                                     vdup_n_u8(static_cast<uint8_t>(bits >> 8)));
    const uint8x16_t bit = vreinterpretq_u8_u64(vdupq_n_u64(0x8040201008040201ull));
    return vtstq_u8(v, bit);
}

struct Halves {
    uint8x16_t lo, hi; // elements 0..15, 16..31
};

Halves nibbles(const uint8_t* qs) {
    const uint8x16_t b = vld1q_u8(qs);
    return {vandq_u8(b, vdupq_n_u8(0x0f)), vshrq_n_u8(b, 4)};
}

// Q5_0/Q5_1: q = nibble + 16 where the fifth bit is set.
Halves five(const uint8_t* qs, const uint8_t* qh) {
    const Halves n = nibbles(qs);
    const uint32_t bits = load_u32(qh);
    const uint8x16_t sixteen = vdupq_n_u8(16);
    return {vorrq_u8(n.lo, vandq_u8(expand16(bits), sixteen)),
            vorrq_u8(n.hi, vandq_u8(expand16(bits >> 16), sixteen))};
}

int32_t dot32(Halves w, const int8_t* a) {
    return vaddvq_s32(vdotq_s32(dot16(w.lo, a), s8(w.hi), vld1q_s8(a + 16)));
}

template <typename Block, typename Unpack>
float dot_with_min(int64_t n, const Block* x, const BlockQ8_1* y, Unpack unpack) {
    float acc = 0.0f;
    for (int64_t i = 0; i < n / 32; i++) {
        prefetch_ahead(x + i);
        const float s = static_cast<float>(dot32(unpack(x[i]), y[i].qs));
        acc += kFp16ToFp32[x[i].d] * kFp16ToFp32[y[i].d] * s +
               kFp16ToFp32[x[i].m] * kFp16ToFp32[y[i].s];
    }
    return acc;
}

// Q8_0 activations; `unpack` gives signed weights (as bytes).
template <typename Block, typename Unpack>
float dot_signed(int64_t n, const Block* x, const BlockQ8_0* y, Unpack unpack) {
    float acc = 0.0f;
    for (int64_t i = 0; i < n / 32; i++) {
        prefetch_ahead(x + i);
        const float s = static_cast<float>(dot32(unpack(x[i]), y[i].qs));
        acc += kFp16ToFp32[x[i].d] * kFp16ToFp32[y[i].d] * s;
    }
    return acc;
}

} // namespace

float vec_dot_q4_1(int64_t n, const void* w, const void* a) {
    return dot_with_min(n, static_cast<const BlockQ4_1*>(w), static_cast<const BlockQ8_1*>(a),
                        [](const BlockQ4_1& b) { return nibbles(b.qs); });
}

float vec_dot_q5_1(int64_t n, const void* w, const void* a) {
    return dot_with_min(n, static_cast<const BlockQ5_1*>(w), static_cast<const BlockQ8_1*>(a),
                        [](const BlockQ5_1& b) { return five(b.qs, b.qh); });
}

float vec_dot_q5_0(int64_t n, const void* w, const void* a) {
    return dot_signed(n, static_cast<const BlockQ5_0*>(w), static_cast<const BlockQ8_0*>(a),
                      [](const BlockQ5_0& b) {
                          const Halves q = five(b.qs, b.qh);
                          const uint8x16_t sixteen = vdupq_n_u8(16);
                          return Halves{vsubq_u8(q.lo, sixteen), vsubq_u8(q.hi, sixteen)};
                      });
}

float vec_dot_iq4_nl(int64_t n, const void* w, const void* a) {
    const uint8x16_t book = vreinterpretq_u8_s8(vld1q_s8(kIQ4NL));
    return dot_signed(n, static_cast<const BlockIQ4_NL*>(w), static_cast<const BlockQ8_0*>(a),
                      [book](const BlockIQ4_NL& b) {
                          const Halves q = nibbles(b.qs);
                          return Halves{vqtbl1q_u8(book, q.lo), vqtbl1q_u8(book, q.hi)};
                      });
}

// ---- Q8_K activations ------------------------------------------------------------------------

namespace {

// fmaxnm / fminnm return the number when one operand is a quiet NaN, like
// std::max / std::min in the reference's argument order; frintn rounds to
// nearest even like nearbyint. So the bytes match the reference's.
void quantize_block_q8_K(const float* x, BlockQ8_K* out) {
    float32x4_t m = vdupq_n_f32(0.0f);
    for (int k = 0; k < QK_K; k += 4) m = vmaxnmq_f32(m, vabsq_f32(vld1q_f32(x + k)));
    const float amax = vmaxnmvq_f32(m);
    const float iscale = amax != 0.0f ? 127.0f / amax : 0.0f;
    if (!std::isfinite(iscale) || iscale == 0.0f) {
        std::memset(out, 0, sizeof *out);
        return;
    }
    out->d = amax / 127.0f;
    const float32x4_t lo = vdupq_n_f32(-127.0f), hi = vdupq_n_f32(127.0f);
    for (int g = 0; g < QK_K / 16; g++) {
        int32x4_t q[4];
        for (int k = 0; k < 4; k++) {
            float32x4_t r = vrndnq_f32(vmulq_n_f32(vld1q_f32(x + 16 * g + 4 * k), iscale));
            r = vminnmq_f32(vmaxnmq_f32(r, lo), hi);
            q[k] = vcvtq_s32_f32(r);
        }
        const int16x8_t a = vcombine_s16(vmovn_s32(q[0]), vmovn_s32(q[1]));
        const int16x8_t b = vcombine_s16(vmovn_s32(q[2]), vmovn_s32(q[3]));
        vst1q_s8(out->qs + 16 * g, vcombine_s8(vmovn_s16(a), vmovn_s16(b)));
        out->bsums[g] = static_cast<int16_t>(
            vaddvq_s32(vaddq_s32(vaddq_s32(q[0], q[1]), vaddq_s32(q[2], q[3]))));
    }
}

} // namespace

void quantize_row_q8_K(const float* src, void* dst, int64_t n) {
    auto* b = static_cast<BlockQ8_K*>(dst);
    for (int64_t i = 0; i < n / QK_K; i++) quantize_block_q8_K(src + i * QK_K, b + i);
}

// ---- dequantize -------------------------------------------------------------------------------

namespace {

// 16 unsigned bytes -> fma(dl, q, -ml), rounded like the reference.
void store_fma_u8(uint8x16_t q, float dl, float ml, float* out) {
    const uint16x8_t lo = vmovl_u8(vget_low_u8(q)), hi = vmovl_u8(vget_high_u8(q));
    const uint32x4_t part[4] = {vmovl_u16(vget_low_u16(lo)), vmovl_u16(vget_high_u16(lo)),
                                vmovl_u16(vget_low_u16(hi)), vmovl_u16(vget_high_u16(hi))};
    const float32x4_t vd = vdupq_n_f32(dl), vm = vdupq_n_f32(-ml);
    for (int k = 0; k < 4; k++) vst1q_f32(out + 4 * k, vfmaq_f32(vm, vd, vcvtq_f32_u32(part[k])));
}

// 16 signed bytes -> dl * q (the reference's fma(dl, q, -0)).
void store_mul_s8(int8x16_t q, float dl, float* out) {
    const int16x8_t lo = vmovl_s8(vget_low_s8(q)), hi = vmovl_s8(vget_high_s8(q));
    const int32x4_t part[4] = {vmovl_s16(vget_low_s16(lo)), vmovl_s16(vget_high_s16(lo)),
                               vmovl_s16(vget_low_s16(hi)), vmovl_s16(vget_high_s16(hi))};
    for (int p = 0; p < 4; p++) vst1q_f32(out + 4 * p, vmulq_n_f32(vcvtq_f32_s32(part[p]), dl));
}

// Bit b of every byte, moved to bit `to`.
uint8x16_t bit_to(uint8x16_t v, int b, int to) {
    return vshlq_u8(vandq_u8(vshlq_u8(v, vdupq_n_s8(static_cast<int8_t>(-b))), vdupq_n_u8(1)),
                    vdupq_n_s8(static_cast<int8_t>(to)));
}

} // namespace

void dequantize_row_q4_K(const void* src, float* dst, int64_t n) {
    const auto* b = static_cast<const BlockQ4_K*>(src);
    for (int64_t i = 0; i < n / QK_K; i++) {
        uint8_t sc[8], m[8];
        unpack_scales_k4(b[i].scales, sc, m);
        const float d = kFp16ToFp32[b[i].d], dmin = kFp16ToFp32[b[i].dmin];
        for (int c = 0; c < 4; c++)
            for (int g = 0; g < 2; g++) {
                const uint8x16_t q = vld1q_u8(b[i].qs + 32 * c + 16 * g);
                float* out = dst + i * QK_K + 64 * c + 16 * g;
                const int j = 2 * c;
                store_fma_u8(vandq_u8(q, vdupq_n_u8(0x0f)), d * static_cast<float>(sc[j]),
                             dmin * static_cast<float>(m[j]), out);
                store_fma_u8(vshrq_n_u8(q, 4), d * static_cast<float>(sc[j + 1]),
                             dmin * static_cast<float>(m[j + 1]), out + 32);
            }
    }
}

// Q6_K: the offset comes off in the integers, then one multiply per weight,
// which rounds like the reference's fma(dl, q, -0).
void dequantize_row_q6_K(const void* src, float* dst, int64_t n) {
    const auto* b = static_cast<const BlockQ6_K*>(src);
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = kFp16ToFp32[b[i].d];
        for (int h = 0; h < 2; h++)
            for (int k = 0; k < 4; k++)
                for (int g = 0; g < 2; g++) {
                    const int sub = 8 * h + 2 * k + g;
                    const int8x16_t q = vsubq_s8(
                        s8(q6_16(b[i].ql + 64 * h, b[i].qh + 32 * h, k, g)), vdupq_n_s8(32));
                    const float dl = d * static_cast<float>(b[i].scales[sub]);
                    const int16x8_t lo = vmovl_s8(vget_low_s8(q)), hi = vmovl_s8(vget_high_s8(q));
                    const int32x4_t part[4] = {
                        vmovl_s16(vget_low_s16(lo)), vmovl_s16(vget_high_s16(lo)),
                        vmovl_s16(vget_low_s16(hi)), vmovl_s16(vget_high_s16(hi))};
                    float* out = dst + i * QK_K + 16 * sub;
                    for (int p = 0; p < 4; p++)
                        vst1q_f32(out + 4 * p, vmulq_n_f32(vcvtq_f32_s32(part[p]), dl));
                }
    }
}

// Q5_K: sub-block 2c is the low nibbles of qs[32c..], 2c + 1 the high
// ones; bit j of qh[l] is the fifth bit of sub-block j's element l.
void dequantize_row_q5_K(const void* src, float* dst, int64_t n) {
    const auto* b = static_cast<const BlockQ5_K*>(src);
    for (int64_t i = 0; i < n / QK_K; i++) {
        uint8_t sc[8], m[8];
        unpack_scales_k4(b[i].scales, sc, m);
        const float d = kFp16ToFp32[b[i].d], dmin = kFp16ToFp32[b[i].dmin];
        for (int c = 0; c < 4; c++)
            for (int g = 0; g < 2; g++) {
                const uint8x16_t q = vld1q_u8(b[i].qs + 32 * c + 16 * g);
                const uint8x16_t qh = vld1q_u8(b[i].qh + 16 * g);
                float* out = dst + i * QK_K + 64 * c + 16 * g;
                const int j = 2 * c;
                store_fma_u8(vorrq_u8(vandq_u8(q, vdupq_n_u8(0x0f)), bit_to(qh, j, 4)),
                             d * static_cast<float>(sc[j]), dmin * static_cast<float>(m[j]), out);
                store_fma_u8(vorrq_u8(vshrq_n_u8(q, 4), bit_to(qh, j + 1, 4)),
                             d * static_cast<float>(sc[j + 1]), dmin * static_cast<float>(m[j + 1]),
                             out + 32);
            }
    }
}

// Q2_K / Q3_K: in half h, group k (elements 128 h + 32 k + l) is bits 2k,
// 2k+1 of qs[32 h + l] (Q3_K: plus bit 4 h + k of hmask[l] as the third bit,
// minus 4); its 16-element sub-blocks are 8 h + 2 k and + 1.
void dequantize_row_q2_K(const void* src, float* dst, int64_t n) {
    const auto* b = static_cast<const BlockQ2_K*>(src);
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = kFp16ToFp32[b[i].d], dmin = kFp16ToFp32[b[i].dmin];
        for (int h = 0; h < 2; h++)
            for (int g = 0; g < 2; g++) {
                const uint8x16_t qv = vld1q_u8(b[i].qs + 32 * h + 16 * g);
                for (int k = 0; k < 4; k++) {
                    const uint8x16_t q = vandq_u8(
                        vshlq_u8(qv, vdupq_n_s8(static_cast<int8_t>(-2 * k))), vdupq_n_u8(3));
                    const int j = 8 * h + 2 * k + g;
                    const uint8_t s = b[i].scales[j];
                    store_fma_u8(q, d * static_cast<float>(s & 0x0f),
                                 dmin * static_cast<float>(s >> 4), dst + i * QK_K + 16 * j);
                }
            }
    }
}

void dequantize_row_q3_K(const void* src, float* dst, int64_t n) {
    const auto* b = static_cast<const BlockQ3_K*>(src);
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = kFp16ToFp32[b[i].d];
        int8_t sc[16];
        vst1q_s8(sc, unpack_scales_k3(b[i].scales));
        for (int h = 0; h < 2; h++)
            for (int g = 0; g < 2; g++) {
                const uint8x16_t qv = vld1q_u8(b[i].qs + 32 * h + 16 * g);
                const uint8x16_t hm = vld1q_u8(b[i].hmask + 16 * g);
                for (int k = 0; k < 4; k++) {
                    const uint8x16_t crumb = vandq_u8(
                        vshlq_u8(qv, vdupq_n_s8(static_cast<int8_t>(-2 * k))), vdupq_n_u8(3));
                    const int8x16_t q =
                        vsubq_s8(s8(vorrq_u8(crumb, bit_to(hm, 4 * h + k, 2))), vdupq_n_s8(4));
                    const int j = 8 * h + 2 * k + g;
                    store_mul_s8(q, d * static_cast<float>(sc[j]), dst + i * QK_K + 16 * j);
                }
            }
    }
}

// 32-element blocks: w = d q + m is fma(d, q, m); Q5_0 and IQ4_NL are d * q.
void dequantize_row_q4_1(const void* src, float* dst, int64_t n) {
    const auto* b = static_cast<const BlockQ4_1*>(src);
    for (int64_t i = 0; i < n / 32; i++) {
        const Halves q = nibbles(b[i].qs);
        const float d = kFp16ToFp32[b[i].d], ml = -kFp16ToFp32[b[i].m];
        store_fma_u8(q.lo, d, ml, dst + 32 * i);
        store_fma_u8(q.hi, d, ml, dst + 32 * i + 16);
    }
}

void dequantize_row_q5_1(const void* src, float* dst, int64_t n) {
    const auto* b = static_cast<const BlockQ5_1*>(src);
    for (int64_t i = 0; i < n / 32; i++) {
        const Halves q = five(b[i].qs, b[i].qh);
        const float d = kFp16ToFp32[b[i].d], ml = -kFp16ToFp32[b[i].m];
        store_fma_u8(q.lo, d, ml, dst + 32 * i);
        store_fma_u8(q.hi, d, ml, dst + 32 * i + 16);
    }
}

void dequantize_row_q5_0(const void* src, float* dst, int64_t n) {
    const auto* b = static_cast<const BlockQ5_0*>(src);
    for (int64_t i = 0; i < n / 32; i++) {
        const Halves q = five(b[i].qs, b[i].qh);
        const float d = kFp16ToFp32[b[i].d];
        store_mul_s8(vsubq_s8(s8(q.lo), vdupq_n_s8(16)), d, dst + 32 * i);
        store_mul_s8(vsubq_s8(s8(q.hi), vdupq_n_s8(16)), d, dst + 32 * i + 16);
    }
}

void dequantize_row_iq4_nl(const void* src, float* dst, int64_t n) {
    const auto* b = static_cast<const BlockIQ4_NL*>(src);
    const int8x16_t book = vld1q_s8(kIQ4NL);
    for (int64_t i = 0; i < n / 32; i++) {
        const Halves q = nibbles(b[i].qs);
        const float d = kFp16ToFp32[b[i].d];
        store_mul_s8(vqtbl1q_s8(book, q.lo), d, dst + 32 * i);
        store_mul_s8(vqtbl1q_s8(book, q.hi), d, dst + 32 * i + 16);
    }
}

} // namespace gl::neon_k
