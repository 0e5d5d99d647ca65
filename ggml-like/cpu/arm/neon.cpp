// AArch64 NEON kernels with the dot-product extension; compiled with
// -march=armv8.2-a+dotprod+fp16 and only reached after dispatch.cpp has seen
// asimddp and asimdhp in the CPU's hwcaps.
//
// sdot (vdotq_s32) multiplies signed bytes and sums each group of four into an
// int32 lane, so Q8_0 blocks need no sign tricks and Q4_0 nibbles only need
// the -8 offset applied before the dot product. Each block's integer sum is
// exact and is scaled by d_w * d_a (read through the fp16 table) in float;
// two blocks per iteration go to independent accumulators.
#include "ggml-like/kernels.h"
#include "ggml-like/cpu/q8_1.h"
#include "ggml-like/blocks_k.h"
#include "ggml-like/cpu/chain_gemms.h"
#include "ggml-like/cpu/static_count.h"

#include <arm_neon.h>

#include <cstring>

namespace gl::neon_delta {
void delta_rule(float* s, int64_t d_v, int64_t d_k, const float* k, const float* q,
                const float* v, float decay, float beta, float scale, float* o);
}

namespace gl {

namespace {

float scale(uint16_t dw, uint16_t da) {
    return kFp16ToFp32[dw] * kFp16ToFp32[da];
}

// ---- vec_dot --------------------------------------------------------------------

float32x4_t block_q8_0(const BlockQ8_0& x, const BlockQ8_0& y, float32x4_t acc) {
    int32x4_t s = vdotq_s32(vdupq_n_s32(0), vld1q_s8(x.qs), vld1q_s8(y.qs));
    s = vdotq_s32(s, vld1q_s8(x.qs + 16), vld1q_s8(y.qs + 16));
    return vfmaq_n_f32(acc, vcvtq_f32_s32(s), scale(x.d, y.d));
}

float vec_dot_q8_0(int64_t n, const void* w, const void* a) {
    const auto* x = static_cast<const BlockQ8_0*>(w);
    const auto* y = static_cast<const BlockQ8_0*>(a);
    const int64_t nb = n / QK8_0;
    float32x4_t acc0 = vdupq_n_f32(0.0f), acc1 = vdupq_n_f32(0.0f);
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2) {
        acc0 = block_q8_0(x[i], y[i], acc0);
        acc1 = block_q8_0(x[i + 1], y[i + 1], acc1);
    }
    if (i < nb) acc0 = block_q8_0(x[i], y[i], acc0);
    return vaddvq_f32(vaddq_f32(acc0, acc1));
}

float32x4_t block_q4_0(const BlockQ4_0& x, const BlockQ8_0& y, float32x4_t acc) {
    const uint8x16_t b = vld1q_u8(x.qs);
    const int8x16_t eight = vdupq_n_s8(8);
    const int8x16_t lo = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(b, vdupq_n_u8(0x0f))), eight);
    const int8x16_t hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(b, 4)), eight);
    int32x4_t s = vdotq_s32(vdupq_n_s32(0), lo, vld1q_s8(y.qs));
    s = vdotq_s32(s, hi, vld1q_s8(y.qs + 16));
    return vfmaq_n_f32(acc, vcvtq_f32_s32(s), scale(x.d, y.d));
}

float vec_dot_q4_0(int64_t n, const void* w, const void* a) {
    const auto* x = static_cast<const BlockQ4_0*>(w);
    const auto* y = static_cast<const BlockQ8_0*>(a);
    const int64_t nb = n / QK4_0;
    float32x4_t acc0 = vdupq_n_f32(0.0f), acc1 = vdupq_n_f32(0.0f);
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2) {
        acc0 = block_q4_0(x[i], y[i], acc0);
        acc1 = block_q4_0(x[i + 1], y[i + 1], acc1);
    }
    if (i < nb) acc0 = block_q4_0(x[i], y[i], acc0);
    return vaddvq_f32(vaddq_f32(acc0, acc1));
}

// Float weights: `Load::get` turns 4 weights into floats (a type, so it is
// always inlined). 16 per iteration into four accumulators, then 4 at a time,
// then the last 0..3 through a zero-padded copy.
struct F32 {
    using Elem = float;
    static float32x4_t get(const float* p) { return vld1q_f32(p); }
};
struct F16 {
    using Elem = uint16_t;
    static float32x4_t get(const uint16_t* p) {
        return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p)));
    }
};
struct BF16 {
    using Elem = uint16_t;
    static float32x4_t get(const uint16_t* p) {
        return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(p), 16));
    }
};

// Scores of NH (up to 4) query heads over a whole key tile (see
// gl::key_tile_index): per dimension, the tile's 16 keys as four vectors times
// each head's query element; sixteen accumulators, no horizontal sums.
template <typename Load, int NH>
void dot_tile_n(int64_t hd, const typename Load::Elem* k, int lo, int hi, const float* q,
                float scale, float* out, size_t os) {
    float32x4_t acc[NH][4];
    for (int j = 0; j < NH; j++)
        for (int c = 0; c < 4; c++) acc[j][c] = vdupq_n_f32(0.0f);
    for (int64_t d = 0; d < hd; d++) {
        const typename Load::Elem* kd = k + d * kKeyTile;
        const float32x4_t k0 = Load::get(kd), k1 = Load::get(kd + 4), k2 = Load::get(kd + 8),
                          k3 = Load::get(kd + 12);
        for (int j = 0; j < NH; j++) {
            const float qd = q[j * hd + d];
            acc[j][0] = vfmaq_n_f32(acc[j][0], k0, qd);
            acc[j][1] = vfmaq_n_f32(acc[j][1], k1, qd);
            acc[j][2] = vfmaq_n_f32(acc[j][2], k2, qd);
            acc[j][3] = vfmaq_n_f32(acc[j][3], k3, qd);
        }
    }
    for (int j = 0; j < NH; j++) {
        float all[kKeyTile];
        for (int c = 0; c < 4; c++) vst1q_f32(all + 4 * c, vmulq_n_f32(acc[j][c], scale));
        std::memcpy(out + j * os, all + lo, sizeof(float) * (hi - lo));
    }
}

// The ring's last tile, when shorter than kKeyTile, takes the reference.
template <typename Load, Type kType>
void dot_tile(int64_t hd, const void* tile, int width, int lo, int hi, const float* q, int nh,
              float scale, float* out, size_t os) {
    if (width != kKeyTile)
        return ref::dot_tile(kType, hd, tile, width, lo, hi, q, nh, scale, out, os);
    const auto* k = static_cast<const typename Load::Elem*>(tile);
    for_static_groups<4>(nh, [&](auto n, int j0) {
        dot_tile_n<Load, decltype(n)::value>(hd, k, lo, hi, q + j0 * hd, scale, out + j0 * os, os);
    });
}

template <typename Load, typename Elem = typename Load::Elem>
float dot_float(int64_t n, const Elem* w, const float* a) {
    float32x4_t acc[4] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f),
                          vdupq_n_f32(0.0f)};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int k = 0; k < 4; k++)
            acc[k] = vfmaq_f32(acc[k], Load::get(w + i + 4 * k), vld1q_f32(a + i + 4 * k));
    for (; i + 4 <= n; i += 4) acc[0] = vfmaq_f32(acc[0], Load::get(w + i), vld1q_f32(a + i));
    if (i < n) {
        Elem wt[4] = {};
        float at[4] = {};
        std::memcpy(wt, w + i, static_cast<size_t>(n - i) * sizeof(Elem));
        std::memcpy(at, a + i, static_cast<size_t>(n - i) * sizeof(float));
        acc[1] = vfmaq_f32(acc[1], Load::get(wt), vld1q_f32(at));
    }
    return vaddvq_f32(vaddq_f32(vaddq_f32(acc[0], acc[1]), vaddq_f32(acc[2], acc[3])));
}

template <typename Load> float vec_dot_float(int64_t n, const void* w, const void* a) {
    return dot_float<Load>(n, static_cast<const typename Load::Elem*>(w),
                           static_cast<const float*>(a));
}

// ---- axpy -----------------------------------------------------------------------

template <typename Load, typename Elem = typename Load::Elem>
void axpy_float(int64_t n, float alpha, const Elem* x, float* y) {
    int64_t i = 0;
    for (; i + 4 <= n; i += 4)
        vst1q_f32(y + i, vfmaq_n_f32(vld1q_f32(y + i), Load::get(x + i), alpha));
    if (i < n) {
        Elem xt[4] = {};
        float yt[4] = {};
        const size_t m = static_cast<size_t>(n - i);
        std::memcpy(xt, x + i, m * sizeof(Elem));
        std::memcpy(yt, y + i, m * sizeof(float));
        vst1q_f32(yt, vfmaq_n_f32(vld1q_f32(yt), Load::get(xt), alpha));
        std::memcpy(y + i, yt, m * sizeof(float));
    }
}

template <typename Load> void axpy(int64_t n, float alpha, const void* x, float* y) {
    axpy_float<Load>(n, alpha, static_cast<const typename Load::Elem*>(x), y);
}

// ---- quantize -------------------------------------------------------------------

// Same algorithm as gl::ref: amax / 127 rounded to fp16, q = roundf(x / d)
// against the stored d, clamped to +-127. frinta rounds halves away from zero,
// exactly like roundf, and the division is kept, so the bytes are identical.
void quantize_block_q8_0(const float* x, BlockQ8_0* out) {
    float32x4_t v[8];
    for (int k = 0; k < 8; k++) v[k] = vld1q_f32(x + 4 * k);
    float32x4_t m = vabsq_f32(v[0]);
    for (int k = 1; k < 8; k++) m = vmaxq_f32(m, vabsq_f32(v[k]));
    const float amax = vmaxvq_f32(m);
    out->d = fp32_to_fp16(amax / 127.0f);
    const float d = kFp16ToFp32[out->d];
    if (d == 0.0f) {
        std::memset(out->qs, 0, sizeof out->qs);
        return;
    }
    const float32x4_t vd = vdupq_n_f32(d);
    const float32x4_t lo = vdupq_n_f32(-127.0f), hi = vdupq_n_f32(127.0f);
    int32x4_t q[8];
    for (int k = 0; k < 8; k++) {
        const float32x4_t r = vrndaq_f32(vdivq_f32(v[k], vd));
        q[k] = vcvtq_s32_f32(vminq_f32(hi, vmaxq_f32(lo, r)));
    }
    for (int k = 0; k < 2; k++) {
        const int16x8_t a = vcombine_s16(vmovn_s32(q[4 * k]), vmovn_s32(q[4 * k + 1]));
        const int16x8_t b = vcombine_s16(vmovn_s32(q[4 * k + 2]), vmovn_s32(q[4 * k + 3]));
        vst1q_s8(out->qs + 16 * k, vcombine_s8(vmovn_s16(a), vmovn_s16(b)));
    }
}

void quantize_row_q8_0(const float* src, void* dst, int64_t n) {
    auto* b = static_cast<BlockQ8_0*>(dst);
    for (int64_t i = 0; i < n / QK8_0; i++) quantize_block_q8_0(src + i * QK8_0, b + i);
}

// fcvtn rounds to nearest even under the default FPCR and quiets NaNs keeping
// their top payload bits, like gl::fp32_to_fp16.
void quantize_row_f16(const float* src, void* dst, int64_t n) {
    auto* d = static_cast<uint16_t*>(dst);
    int64_t i = 0;
    for (; i + 4 <= n; i += 4)
        vst1_u16(d + i, vreinterpret_u16_f16(vcvt_f16_f32(vld1q_f32(src + i))));
    for (; i < n; i++) d[i] = fp32_to_fp16(src[i]);
}

// ---- dequantize -----------------------------------------------------------------

template <typename Load> void dequantize_float(const void* src, float* dst, int64_t n) {
    const auto* s = static_cast<const typename Load::Elem*>(src);
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(dst + i, Load::get(s + i));
    if (i < n) {
        typename Load::Elem t[4] = {};
        float out[4];
        std::memcpy(t, s + i, static_cast<size_t>(n - i) * sizeof t[0]);
        vst1q_f32(out, Load::get(t));
        std::memcpy(dst + i, out, static_cast<size_t>(n - i) * sizeof(float));
    }
}

// 16 signed bytes -> 16 floats times d.
void store_scaled_i8(int8x16_t q, float d, float* out) {
    const int16x8_t lo = vmovl_s8(vget_low_s8(q)), hi = vmovl_s8(vget_high_s8(q));
    vst1q_f32(out, vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo))), d));
    vst1q_f32(out + 4, vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_high_s16(lo))), d));
    vst1q_f32(out + 8, vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi))), d));
    vst1q_f32(out + 12, vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_high_s16(hi))), d));
}

void dequantize_row_q8_0(const void* src, float* dst, int64_t n) {
    const auto* b = static_cast<const BlockQ8_0*>(src);
    for (int64_t i = 0; i < n / QK8_0; i++) {
        const float d = kFp16ToFp32[b[i].d];
        store_scaled_i8(vld1q_s8(b[i].qs), d, dst + i * QK8_0);
        store_scaled_i8(vld1q_s8(b[i].qs + 16), d, dst + i * QK8_0 + 16);
    }
}

void dequantize_row_q4_0(const void* src, float* dst, int64_t n) {
    const auto* b = static_cast<const BlockQ4_0*>(src);
    const int8x16_t eight = vdupq_n_s8(8);
    for (int64_t i = 0; i < n / QK4_0; i++) {
        const float d = kFp16ToFp32[b[i].d];
        const uint8x16_t q = vld1q_u8(b[i].qs);
        const int8x16_t lo = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(q, vdupq_n_u8(0x0f))), eight);
        const int8x16_t hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(q, 4)), eight);
        store_scaled_i8(lo, d, dst + i * QK4_0);
        store_scaled_i8(hi, d, dst + i * QK4_0 + 16);
    }
}

constexpr uint32_t id(Type t) {
    return static_cast<uint32_t>(t);
}

constexpr KernelTable make_table() {
    KernelTable t = {"neon", {}, {}, {}, {}, {}, {}, {}, {}, {}, nullptr, nullptr, nullptr, {}, {}, {}};
    t.vec_dot[id(Type::F32)] = vec_dot_float<F32>;
    t.vec_dot[id(Type::F16)] = vec_dot_float<F16>;
    t.vec_dot[id(Type::BF16)] = vec_dot_float<BF16>;
    t.vec_dot[id(Type::Q8_0)] = vec_dot_q8_0;
    t.vec_dot[id(Type::Q4_0)] = vec_dot_q4_0;
    // The block-chain GEMM (arm/neon_chain.cpp): prompt batches.
    KVRUN_SET_CHAIN_GEMMS(t, neon_chain);
    t.quantize_row[id(Type::Q8_0)] = quantize_row_q8_0;
    t.quantize_row[id(Type::Q8_1)] = quantize_row_q8_1<quantize_block_q8_0>;
    t.quantize_row[id(Type::F16)] = quantize_row_f16;
    t.dequantize_row[id(Type::F16)] = dequantize_float<F16>;
    t.dequantize_row[id(Type::BF16)] = dequantize_float<BF16>;
    t.dequantize_row[id(Type::Q8_0)] = dequantize_row_q8_0;
    t.dequantize_row[id(Type::Q4_0)] = dequantize_row_q4_0;
    t.axpy[id(Type::F32)] = axpy<F32>;
    t.axpy[id(Type::F16)] = axpy<F16>;
    t.axpy[id(Type::BF16)] = axpy<BF16>;
    t.dot_tile[id(Type::F32)] = dot_tile<F32, Type::F32>;
    t.dot_tile[id(Type::F16)] = dot_tile<F16, Type::F16>;
    t.dot_tile[id(Type::BF16)] = dot_tile<BF16, Type::BF16>;
    add_kernels_k(t, kNeonKernelsK); // arm/neon_k.cpp
    t.delta_rule = neon_delta::delta_rule; // arm/neon_delta.cpp
    return t;
}

} // namespace

// constinit: dispatch may read the table from another file's static initializer.
extern const KernelTable kNeonTable;
constinit const KernelTable kNeonTable = make_table();

} // namespace gl
