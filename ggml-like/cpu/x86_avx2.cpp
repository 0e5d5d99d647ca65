// AVX2 + FMA + F16C kernels (this file is compiled with -mavx2 -mfma -mf16c and
// only reached after dispatch.cpp has checked the CPU for those).
//
// Quantized dot products multiply int8 pairs with maddubs (u8 x s8 -> s16
// pairs), widen with madd to int32, and only then scale by d_w * d_a in float,
// so each block's integer sum is exact. The loops keep everything in
// registers, unroll two blocks per iteration into independent accumulators and
// reduce horizontally once at the end.
//
// These loops are bound by the vector ALU ports, not by memory, so the per
// block work avoids shuffle-port (p5) uops: block scales come from the fp16
// lookup table as broadcast loads, and nibbles are split with a broadcast load
// plus a per-lane shift instead of an insert.
#include "ggml-like/quants.h"
#include "ggml-like/quants_k.h"

#include <immintrin.h>

#include <cstring>

namespace gl {

namespace {

// How far ahead of the current weight block to prefetch (see vec_dot_q8_0).
constexpr size_t kPrefetchBytes = 8192;

float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

float load_half(const void* p) {
    uint16_t h;
    std::memcpy(&h, p, sizeof h);
    return _cvtsh_ss(h);
}

// d_w * d_a in all lanes: two broadcast loads from the table and a multiply.
__m256 scale(uint16_t dw, uint16_t da) {
    return _mm256_mul_ps(_mm256_broadcast_ss(&kFp16ToFp32[dw]),
                         _mm256_broadcast_ss(&kFp16ToFp32[da]));
}

__m256i load256(const void* p) {
    return _mm256_loadu_si256(static_cast<const __m256i*>(p));
}
__m128i load128(const void* p) {
    return _mm_loadu_si128(static_cast<const __m128i*>(p));
}

// Eight partial int32 sums of w[i] * a[i] over 32 int8 pairs. maddubs wants an
// unsigned operand, so feed it |w| and a with w's sign moved onto it. Exact as
// long as a != -128 (Q8_0 activations are quantized to [-127, 127]); the pair
// sums stay below 2 * 128 * 127, inside int16.
__m256i dot_i8(__m256i w, __m256i a) {
    const __m256i p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w));
    return _mm256_madd_epi16(p16, _mm256_set1_epi16(1));
}

// Eight partial int32 sums of (q[i] - 8) * a[i] for unsigned nibbles q: the
// offset is taken out as 8 * sum(a) instead of re-signing q.
__m256i dot_u4(__m256i q, __m256i a) {
    const __m256i qa = _mm256_maddubs_epi16(q, a);
    const __m256i ea = _mm256_maddubs_epi16(_mm256_set1_epi8(8), a);
    return _mm256_madd_epi16(_mm256_sub_epi16(qa, ea), _mm256_set1_epi16(1));
}

// A Q4_0 block's 32 nibbles as bytes in element order: the low nibbles are
// elements 0..15, the high ones 16..31. The 16 bytes are loaded into both
// halves and only the upper half is shifted.
__m256i unpack_q4(const uint8_t* qs) {
    const __m256i b = _mm256_broadcastsi128_si256(load128(qs));
    const __m256i both = _mm256_srlv_epi64(b, _mm256_setr_epi64x(0, 0, 4, 4));
    return _mm256_and_si256(both, _mm256_set1_epi8(0x0f));
}

// ---- vec_dot --------------------------------------------------------------------

__m256 block_q8_0(const BlockQ8_0& x, const BlockQ8_0& y, __m256 acc) {
    const __m256 d = scale(x.d, y.d);
    const __m256i s = dot_i8(load256(x.qs), load256(y.qs));
    return _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(s), acc);
}

float vec_dot_q8_0(int64_t n, const void* w, const void* a) {
    const auto* x = static_cast<const BlockQ8_0*>(w);
    const auto* y = static_cast<const BlockQ8_0*>(a);
    const int64_t nb = n / QK8_0;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2) {
        // Two blocks are 68 bytes: fetch both lines they will need 8 KiB ahead
        // (the hardware prefetcher alone leaves generation waiting on DRAM).
        _mm_prefetch(reinterpret_cast<const char*>(x + i) + kPrefetchBytes, _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(x + i) + kPrefetchBytes + 64, _MM_HINT_T0);
        acc0 = block_q8_0(x[i], y[i], acc0);
        acc1 = block_q8_0(x[i + 1], y[i + 1], acc1);
    }
    if (i < nb) acc0 = block_q8_0(x[i], y[i], acc0);
    return hsum(_mm256_add_ps(acc0, acc1));
}

__m256 block_q4_0(const BlockQ4_0& x, const BlockQ8_0& y, __m256 acc) {
    const __m256 d = scale(x.d, y.d);
    const __m256i s = dot_u4(unpack_q4(x.qs), load256(y.qs));
    return _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(s), acc);
}

float vec_dot_q4_0(int64_t n, const void* w, const void* a) {
    const auto* x = static_cast<const BlockQ4_0*>(w);
    const auto* y = static_cast<const BlockQ8_0*>(a);
    const int64_t nb = n / QK4_0;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2) {
        _mm_prefetch(reinterpret_cast<const char*>(x + i) + kPrefetchBytes,
                     _MM_HINT_T0); // 36 bytes per step
        acc0 = block_q4_0(x[i], y[i], acc0);
        acc1 = block_q4_0(x[i + 1], y[i + 1], acc1);
    }
    if (i < nb) acc0 = block_q4_0(x[i], y[i], acc0);
    return hsum(_mm256_add_ps(acc0, acc1));
}

// Float weights: `Load::get` turns 8 weights into floats (a type, not a
// function pointer, so it is always inlined). The row is walked 32 at a time
// into four accumulators (FMA latency is 4 cycles), then 8 at a time, then
// the last 0..7 through a zero-padded copy so the tail is summed the same way.
template <typename Load, typename Elem = typename Load::Elem>
float dot_float(int64_t n, const Elem* w, const float* a) {
    constexpr auto load = Load::get;
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                     _mm256_setzero_ps()};
    int64_t i = 0;
    for (; i + 32 <= n; i += 32)
        for (int k = 0; k < 4; k++)
            acc[k] = _mm256_fmadd_ps(load(w + i + 8 * k), _mm256_loadu_ps(a + i + 8 * k), acc[k]);
    for (; i + 8 <= n; i += 8)
        acc[0] = _mm256_fmadd_ps(load(w + i), _mm256_loadu_ps(a + i), acc[0]);
    if (i < n) {
        Elem wt[8] = {};
        float at[8] = {};
        std::memcpy(wt, w + i, static_cast<size_t>(n - i) * sizeof(Elem));
        std::memcpy(at, a + i, static_cast<size_t>(n - i) * sizeof(float));
        acc[1] = _mm256_fmadd_ps(load(wt), _mm256_loadu_ps(at), acc[1]);
    }
    return hsum(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
}

struct F32 {
    using Elem = float;
    static __m256 get(const float* p) { return _mm256_loadu_ps(p); }
};
struct F16 {
    using Elem = uint16_t;
    static __m256 get(const uint16_t* p) { return _mm256_cvtph_ps(load128(p)); }
};
struct BF16 {
    using Elem = uint16_t;
    static __m256 get(const uint16_t* p) {
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(load128(p)), 16));
    }
};

template <typename Load> float vec_dot_float(int64_t n, const void* w, const void* a) {
    return dot_float<Load>(n, static_cast<const typename Load::Elem*>(w),
                           static_cast<const float*>(a));
}

// ---- axpy -----------------------------------------------------------------------

template <typename Load, typename Elem = typename Load::Elem>
void axpy_float(int64_t n, float alpha, const Elem* x, float* y) {
    constexpr auto load = Load::get;
    const __m256 va = _mm256_set1_ps(alpha);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, load(x + i), _mm256_loadu_ps(y + i)));
    if (i < n) {
        Elem xt[8] = {};
        float yt[8] = {};
        const size_t m = static_cast<size_t>(n - i);
        std::memcpy(xt, x + i, m * sizeof(Elem));
        std::memcpy(yt, y + i, m * sizeof(float));
        _mm256_storeu_ps(yt, _mm256_fmadd_ps(va, load(xt), _mm256_loadu_ps(yt)));
        std::memcpy(y + i, yt, m * sizeof(float));
    }
}

template <typename Load> void axpy(int64_t n, float alpha, const void* x, float* y) {
    axpy_float<Load>(n, alpha, static_cast<const typename Load::Elem*>(x), y);
}

// ---- quantize -------------------------------------------------------------------

// roundf (halves away from zero) for |v| < 2^23: _mm256_round_ps has no such
// mode, so truncate and step one away from zero when the dropped part is
// >= 0.5 (v - trunc(v) is exact). Matches the reference bit for bit.
__m256 round_half_away(__m256 v) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __m256 frac = _mm256_andnot_ps(sign, _mm256_sub_ps(v, t));
    const __m256 up = _mm256_cmp_ps(frac, _mm256_set1_ps(0.5f), _CMP_GE_OQ);
    const __m256 step = _mm256_or_ps(_mm256_set1_ps(1.0f), _mm256_and_ps(v, sign));
    return _mm256_add_ps(t, _mm256_and_ps(up, step));
}

// Same algorithm as gl::ref (amax / 127 rounded to fp16, q = roundf(x / d)
// against the stored d, clamped to +-127); the division is kept (not a
// reciprocal multiply) because the result must be bit-identical.
void quantize_block_q8_0(const float* x, BlockQ8_0* out) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 v[4];
    for (int k = 0; k < 4; k++) v[k] = _mm256_loadu_ps(x + 8 * k);
    __m256 m =
        _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
                      _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float amax = _mm_cvtss_f32(m4);

    const uint16_t dh = _cvtss_sh(amax / 127.0f, _MM_FROUND_TO_NEAREST_INT);
    std::memcpy(&out->d, &dh, sizeof dh);
    const float d = _cvtsh_ss(dh);
    if (d == 0.0f) {
        std::memset(out->qs, 0, sizeof out->qs);
        return;
    }
    const __m256 vd = _mm256_set1_ps(d);
    const __m256 lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
    __m256i q[4];
    for (int k = 0; k < 4; k++) {
        const __m256 r = round_half_away(_mm256_div_ps(v[k], vd));
        q[k] = _mm256_cvttps_epi32(_mm256_min_ps(hi, _mm256_max_ps(lo, r)));
    }
    // The packs interleave 128-bit lanes; the permute puts the 32 bytes back in order.
    const __m256i p =
        _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    const __m256i ordered =
        _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out->qs), ordered);
}

void quantize_row_q8_0(const float* src, void* dst, int64_t n) {
    auto* b = static_cast<BlockQ8_0*>(dst);
    for (int64_t i = 0; i < n / QK8_0; i++) quantize_block_q8_0(src + i * QK8_0, b + i);
}

// F16C's conversion rounds to nearest even and keeps NaN payloads like
// gl::fp32_to_fp16, so this is bit-identical to the reference.
void quantize_row_f16(const float* src, void* dst, int64_t n) {
    auto* d = static_cast<uint16_t*>(dst);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) d[i] = _cvtss_sh(src[i], _MM_FROUND_TO_NEAREST_INT);
}

// ---- dequantize -----------------------------------------------------------------

void dequantize_row_f16(const void* src, float* dst, int64_t n) {
    const auto* s = static_cast<const uint16_t*>(src);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, F16::get(s + i));
    for (; i < n; i++) dst[i] = load_half(s + i);
}

void dequantize_row_bf16(const void* src, float* dst, int64_t n) {
    const auto* s = static_cast<const uint16_t*>(src);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, BF16::get(s + i));
    for (; i < n; i++) dst[i] = bf16_to_fp32(s[i]);
}

// 32 signed bytes -> 32 floats times d.
void store_scaled_i8(__m256i q, float d, float* out) {
    const __m256 vd = _mm256_set1_ps(d);
    const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
    const __m128i part[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
    for (int k = 0; k < 4; k++)
        _mm256_storeu_ps(out + 8 * k,
                         _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(part[k])), vd));
}

void dequantize_row_q8_0(const void* src, float* dst, int64_t n) {
    const auto* b = static_cast<const BlockQ8_0*>(src);
    for (int64_t i = 0; i < n / QK8_0; i++)
        store_scaled_i8(load256(b[i].qs), load_half(&b[i].d), dst + i * QK8_0);
}

void dequantize_row_q4_0(const void* src, float* dst, int64_t n) {
    const auto* b = static_cast<const BlockQ4_0*>(src);
    for (int64_t i = 0; i < n / QK4_0; i++) {
        const __m256i q = _mm256_sub_epi8(unpack_q4(b[i].qs), _mm256_set1_epi8(8));
        store_scaled_i8(q, load_half(&b[i].d), dst + i * QK4_0);
    }
}

constexpr uint32_t id(Type t) {
    return static_cast<uint32_t>(t);
}

constexpr KernelTable make_table() {
    KernelTable t = {"avx2", {}, {}, {}, {}, {}, {}, {}, nullptr, nullptr, {}};
    t.vec_dot[id(Type::F32)] = vec_dot_float<F32>;
    t.vec_dot[id(Type::F16)] = vec_dot_float<F16>;
    t.vec_dot[id(Type::BF16)] = vec_dot_float<BF16>;
    t.vec_dot[id(Type::Q8_0)] = vec_dot_q8_0;
    t.vec_dot[id(Type::Q4_0)] = vec_dot_q4_0;
    t.quantize_row[id(Type::Q8_0)] = quantize_row_q8_0;
    t.quantize_row[id(Type::F16)] = quantize_row_f16;
    t.dequantize_row[id(Type::F16)] = dequantize_row_f16;
    t.dequantize_row[id(Type::BF16)] = dequantize_row_bf16;
    t.dequantize_row[id(Type::Q8_0)] = dequantize_row_q8_0;
    t.dequantize_row[id(Type::Q4_0)] = dequantize_row_q4_0;
    t.axpy[id(Type::F32)] = axpy<F32>;
    t.axpy[id(Type::F16)] = axpy<F16>;
    t.axpy[id(Type::BF16)] = axpy<BF16>;
    add_kernels_k(t, kAvx2KernelsK); // x86_avx2_k.cpp
    return t;
}

} // namespace

// constinit: dispatch may read the table from another file's static initializer.
extern const KernelTable kAvx2Table;
constinit const KernelTable kAvx2Table = make_table();

} // namespace gl
