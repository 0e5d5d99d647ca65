// AVX-512 (F, BW, VL, DQ) + VNNI kernels; compiled with those flags and only
// reached after dispatch.cpp has checked the CPU for them.
//
// Quantized dot products use VNNI's vpdpbusd (u8 x s8, four products summed
// into each int32 lane) on one 32-element block per 256-bit register. Two
// blocks per 512-bit register were tried and were slower: building the pair
// (inserts, per-half scales) costs shuffle-port uops, and these loops are
// bound by the vector ALU ports, not by memory. vpdpbusd wants an unsigned
// operand: Q8_0 feeds it |w| and moves w's sign onto a; Q4_0 nibbles are
// already unsigned and 8 * sum(a) is subtracted afterwards. Sums go straight
// to int32 (no saturating int16 step as with maddubs), so each block's sum is
// exact. Block scales are broadcast loads from the fp16 table.
//
// Float rows use 512-bit registers with masked loads for the tail.
#include "ggml-like/kernels.h"
#include "ggml-like/cpu/q8_1.h"
#include "ggml-like/blocks_k.h"
#include "ggml-like/cpu/chain_gemms.h"
#include "ggml-like/cpu/static_count.h"

// GCC 12's AVX-512 headers start many intrinsics from _mm512_undefined_*(),
// which trips false -Wuninitialized warnings once inlined (GCC PR 105593,
// fixed in GCC 13). The pragma must precede the header to cover it.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

namespace gl::avx512_delta {
void delta_rule(float* s, int64_t d_v, int64_t d_k, const float* k, const float* q,
                const float* v, float decay, float beta, float scale, float* o);
}

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

float hsum(__m512 v) {
    return hsum(_mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1)));
}

float load_half(const void* p) {
    uint16_t h;
    std::memcpy(&h, p, sizeof h);
    return _cvtsh_ss(h);
}

__m256i load256(const void* p) {
    return _mm256_loadu_si256(static_cast<const __m256i*>(p));
}
__m128i load128(const void* p) {
    return _mm_loadu_si128(static_cast<const __m128i*>(p));
}

// d_w * d_a in all lanes: two broadcast loads from the table and a multiply.
__m256 scale(uint16_t dw, uint16_t da) {
    return _mm256_mul_ps(_mm256_broadcast_ss(&kFp16ToFp32[dw]),
                         _mm256_broadcast_ss(&kFp16ToFp32[da]));
}

// Per-lane sums of u * a - off * a.
__m256i dot_offset(__m256i u, __m256i a, __m256i off) {
    const __m256i zero = _mm256_setzero_si256();
    return _mm256_sub_epi32(_mm256_dpbusd_epi32(zero, u, a), _mm256_dpbusd_epi32(zero, off, a));
}

// Q4_0 trick: the block's 16 bytes go to both halves; the low half keeps the
// low nibbles (elements 0..15) and the high half keeps the high nibbles in
// place, i.e. 16 * q (elements 16..31), saving a shift. The matching offset
// is 8 below and 16 * 8 above, so lanes 4..7 of every block sum come out
// exactly 16x too large; that is one power-of-two factor for the whole
// accumulator, removed once at the end (exact in float).
__m256i q4_masked(const uint8_t* qs) {
    const __m256i b = _mm256_broadcastsi128_si256(load128(qs));
    return _mm256_and_si256(
        b, _mm256_set_m128i(_mm_set1_epi8(static_cast<char>(0xf0)), _mm_set1_epi8(0x0f)));
}
__m256i q4_offset() {
    return _mm256_set_m128i(_mm_set1_epi8(static_cast<char>(128)), _mm_set1_epi8(8));
}

// For dequantize: nibbles as bytes in element order.
__m256i unpack_q4(const uint8_t* qs) {
    const __m256i b = _mm256_broadcastsi128_si256(load128(qs));
    const __m256i both = _mm256_srlv_epi64(b, _mm256_setr_epi64x(0, 0, 4, 4));
    return _mm256_and_si256(both, _mm256_set1_epi8(0x0f));
}

// ---- vec_dot --------------------------------------------------------------------

// Q8_0 x Q8_0: vpdpbusd on |w| and a carrying w's sign. One uop fewer than
// the +128 offset form; exact unless a holds -128, which the Q8_0 activation
// quantizer never produces (it clamps to +-127).
__m256 block_q8_0(const BlockQ8_0& x, const BlockQ8_0& y, __m256 acc) {
    const __m256i w = load256(x.qs);
    const __m256i s = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_sign_epi8(w, w),
                                          _mm256_sign_epi8(load256(y.qs), w));
    return _mm256_fmadd_ps(scale(x.d, y.d), _mm256_cvtepi32_ps(s), acc);
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
    const __m256i s = dot_offset(q4_masked(x.qs), load256(y.qs), q4_offset());
    return _mm256_fmadd_ps(scale(x.d, y.d), _mm256_cvtepi32_ps(s), acc);
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
    // Undo the 16x of the high-nibble lanes (see q4_masked).
    const __m256 unscale = _mm256_setr_ps(1, 1, 1, 1, 1.0f / 16, 1.0f / 16, 1.0f / 16, 1.0f / 16);
    return hsum(_mm256_mul_ps(_mm256_add_ps(acc0, acc1), unscale));
}

// Q4_0 matrix-vector product, four rows at a time. One row's block costs 7
// vector uops in vec_dot_q4_0 and the loop is bound by them (about 15 GB/s
// from L2 on one core, below what two cores can stream from DRAM). Four rows
// share the activation block, its scale and its offset term, and the offset
// is folded into vpdpbusd's accumulator input (it starts from -offset), so a
// row's block costs 5 uops: and, vpdpbusd, convert, scale multiply, FMA.
// Named accumulators, not an array: GCC 12 keeps arrays of vectors on the
// stack, which puts a store-load round trip on every FMA chain.
//
// The same loop serves Q8_0 (Q8Rows below): with the offset term shared by
// the rows, its +128 form (w ^ 0x80 as unsigned, minus 128 * sum(a)) costs
// one xor and one vpdpbusd a row-block instead of two vpsignb and a vpdpbusd.
struct Q4Rows {
    using Block = BlockQ4_0;
    static __m256i weights(const BlockQ4_0& x) { return q4_masked(x.qs); }
    static __m256i offset() { return q4_offset(); }
    // Undo the 16x of the high-nibble lanes (see q4_masked).
    static __m256 unscale() {
        return _mm256_setr_ps(1, 1, 1, 1, 1.0f / 16, 1.0f / 16, 1.0f / 16, 1.0f / 16);
    }
    static float one_row(int64_t n, const void* w, const void* a) { return vec_dot_q4_0(n, w, a); }
};
struct Q8Rows {
    using Block = BlockQ8_0;
    static __m256i weights(const BlockQ8_0& x) {
        return _mm256_xor_si256(load256(x.qs), _mm256_set1_epi8(static_cast<char>(0x80)));
    }
    static __m256i offset() { return _mm256_set1_epi8(static_cast<char>(0x80)); }
    static __m256 unscale() { return _mm256_set1_ps(1.0f); }
    static float one_row(int64_t n, const void* w, const void* a) { return vec_dot_q8_0(n, w, a); }
};

template <typename R>
__attribute__((always_inline)) inline void row_block(const typename R::Block& x, __m256i neg_offset,
                                                     __m256i a, __m256 da, __m256& acc) {
    const __m256i s = _mm256_dpbusd_epi32(neg_offset, R::weights(x), a);
    acc = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_broadcast_ss(&kFp16ToFp32[x.d]), da),
                          _mm256_cvtepi32_ps(s), acc);
}

template <typename R>
void matvec_rows4(int64_t n, const void* w, size_t row_bytes, int64_t n_rows, const void* a,
                  float* y) {
    using Block = typename R::Block;
    const auto* y8 = static_cast<const BlockQ8_0*>(a);
    const int64_t nb = n / QK8_0;
    const __m256 unscale = R::unscale();
    const auto* base = static_cast<const uint8_t*>(w);
    // The four rows are one contiguous span, read at the rate of 4 blocks a
    // step: prefetch it linearly, the lines of 4 blocks a step.
    constexpr int kLines = (4 * sizeof(Block) + 63) / 64;
    int64_t r = 0;
    for (; r + 4 <= n_rows; r += 4) {
        const uint8_t* g = base + r * row_bytes;
        const auto* x0 = reinterpret_cast<const Block*>(g);
        const auto* x1 = reinterpret_cast<const Block*>(g + row_bytes);
        const auto* x2 = reinterpret_cast<const Block*>(g + 2 * row_bytes);
        const auto* x3 = reinterpret_cast<const Block*>(g + 3 * row_bytes);
        __m256 c0 = _mm256_setzero_ps(), c1 = c0, c2 = c0, c3 = c0;
        for (int64_t i = 0; i < nb; i++) {
            const char* p =
                reinterpret_cast<const char*>(g) + kPrefetchBytes + i * 4 * sizeof(Block);
            for (int l = 0; l < kLines; l++) _mm_prefetch(p + 64 * l, _MM_HINT_T0);
            const __m256i av = load256(y8[i].qs);
            const __m256i neg_offset =
                _mm256_sub_epi32(_mm256_setzero_si256(),
                                 _mm256_dpbusd_epi32(_mm256_setzero_si256(), R::offset(), av));
            const __m256 da = _mm256_broadcast_ss(&kFp16ToFp32[y8[i].d]);
            row_block<R>(x0[i], neg_offset, av, da, c0);
            row_block<R>(x1[i], neg_offset, av, da, c1);
            row_block<R>(x2[i], neg_offset, av, da, c2);
            row_block<R>(x3[i], neg_offset, av, da, c3);
        }
        y[r] = hsum(_mm256_mul_ps(c0, unscale));
        y[r + 1] = hsum(_mm256_mul_ps(c1, unscale));
        y[r + 2] = hsum(_mm256_mul_ps(c2, unscale));
        y[r + 3] = hsum(_mm256_mul_ps(c3, unscale));
    }
    for (; r < n_rows; r++) y[r] = R::one_row(n, base + r * row_bytes, a);
}

// Float weights: `Load::get` gives 16 weights as floats, `Load::masked` the
// first m of them (rest zero); types, not function pointers, so they inline.
// Four accumulators cover the FMA latency; the last 0..15 elements go through
// masked loads, which never touch memory past the end of the row.
template <typename Load, typename Elem = typename Load::Elem>
float dot_float(int64_t n, const Elem* w, const float* a) {
    constexpr auto load = Load::get;
    constexpr auto load_masked = Load::masked;
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                     _mm512_setzero_ps()};
    int64_t i = 0;
    for (; i + 64 <= n; i += 64)
        for (int k = 0; k < 4; k++)
            acc[k] = _mm512_fmadd_ps(load(w + i + 16 * k), _mm512_loadu_ps(a + i + 16 * k), acc[k]);
    for (; i + 16 <= n; i += 16)
        acc[0] = _mm512_fmadd_ps(load(w + i), _mm512_loadu_ps(a + i), acc[0]);
    if (i < n) {
        const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
        acc[1] = _mm512_fmadd_ps(load_masked(m, w + i), _mm512_maskz_loadu_ps(m, a + i), acc[1]);
    }
    return hsum(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
}

struct F32 {
    using Elem = float;
    static __m512 get(const float* p) { return _mm512_loadu_ps(p); }
    static __m512 masked(__mmask16 m, const float* p) { return _mm512_maskz_loadu_ps(m, p); }
};
struct F16 {
    using Elem = uint16_t;
    static __m512 get(const uint16_t* p) { return _mm512_cvtph_ps(load256(p)); }
    static __m512 masked(__mmask16 m, const uint16_t* p) {
        return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
    }
};
struct BF16 {
    using Elem = uint16_t;
    static __m512 widen(__m256i h) {
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    static __m512 get(const uint16_t* p) { return widen(load256(p)); }
    static __m512 masked(__mmask16 m, const uint16_t* p) {
        return widen(_mm256_maskz_loadu_epi16(m, p));
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
    constexpr auto load_masked = Load::masked;
    const __m512 va = _mm512_set1_ps(alpha);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_fmadd_ps(va, load(x + i), _mm512_loadu_ps(y + i)));
    if (i < n) {
        const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
        const __m512 r =
            _mm512_fmadd_ps(va, load_masked(m, x + i), _mm512_maskz_loadu_ps(m, y + i));
        _mm512_mask_storeu_ps(y + i, m, r);
    }
}

template <typename Load> void axpy(int64_t n, float alpha, const void* x, float* y) {
    axpy_float<Load>(n, alpha, static_cast<const typename Load::Elem*>(x), y);
}

// ---- attention over cached rows --------------------------------------------------

// A head of up to 8 * 16 elements is held in registers (q for the scores,
// the output for the values) while the rows stream past; longer heads take
// the row-at-a-time kernels.

__mmask16 tail_mask(int64_t hd, int c) {
    const int64_t left = hd - 16 * c;
    return left >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << left) - 1);
}

// Sixteen row sums at once: lane j of the result is the sum of a[j]'s lanes
// (a transpose-and-add tree, ~3 instructions a row instead of ~9 for a
// horizontal sum each).
inline __attribute__((always_inline)) __m512 sum16(const __m512 a[16]) {
    __m512 x[8], y[4];
    for (int i = 0; i < 8; i++) // per 128-bit lane: a0+a2, b0+b2, a1+a3, b1+b3
        x[i] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]),
                             _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
    for (int j = 0; j < 4; j++) { // per lane: the lane's sums of rows 4j .. 4j+3
        const __m512d lo =
            _mm512_unpacklo_pd(_mm512_castps_pd(x[2 * j]), _mm512_castps_pd(x[2 * j + 1]));
        const __m512d hi =
            _mm512_unpackhi_pd(_mm512_castps_pd(x[2 * j]), _mm512_castps_pd(x[2 * j + 1]));
        y[j] = _mm512_add_ps(_mm512_castpd_ps(lo), _mm512_castpd_ps(hi));
    }
    // Add the four lanes: pairs of lanes, then pairs of pairs.
    const __m512 z0 = _mm512_add_ps(_mm512_shuffle_f32x4(y[0], y[1], 0x88),
                                    _mm512_shuffle_f32x4(y[0], y[1], 0xDD));
    const __m512 z1 = _mm512_add_ps(_mm512_shuffle_f32x4(y[2], y[3], 0x88),
                                    _mm512_shuffle_f32x4(y[2], y[3], 0xDD));
    return _mm512_add_ps(_mm512_shuffle_f32x4(z0, z1, 0x88), _mm512_shuffle_f32x4(z0, z1, 0xDD));
}

// NC, the number of 16-element chunks, is a template parameter so that the
// per-chunk arrays below live in registers (with a run-time count the
// compiler keeps them on the stack: ~3x slower, measured).
template <typename Load, int NC>
void dot_rows_n(int64_t hd, const uint8_t* base, size_t stride, int64_t n, const float* q,
                float scale, float* out) {
    using Elem = typename Load::Elem;
    __m512 qv[NC];
    __mmask16 mk[NC];
    for (int c = 0; c < NC; c++) {
        mk[c] = tail_mask(hd, c);
        qv[c] = _mm512_maskz_loadu_ps(mk[c], q + 16 * c);
    }
    auto row_dot = [&](int64_t i) {
        const auto* r = reinterpret_cast<const Elem*>(base + i * stride);
        __m512 acc = _mm512_mul_ps(Load::masked(mk[0], r), qv[0]);
        for (int c = 1; c < NC; c++)
            acc = _mm512_fmadd_ps(Load::masked(mk[c], r + 16 * c), qv[c], acc);
        return acc;
    };
    const __m512 vscale = _mm512_set1_ps(scale);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 acc[16];
        for (int j = 0; j < 16; j++) acc[j] = row_dot(i + j);
        _mm512_storeu_ps(out + i, _mm512_mul_ps(sum16(acc), vscale));
    }
    for (; i < n; i++) out[i] = _mm512_reduce_add_ps(row_dot(i)) * scale;
}

// Chunk-outer: one 16-float slice of y at a time, in named registers (GCC
// keeps arrays of vectors indexed in a loop on the stack, storing them every
// row), with eight accumulators for rows i mod 8: an FMA takes 4 cycles and
// two issue per cycle, so fewer leave the FMA ports idle (four measured at
// half the throughput).
template <typename Load, int NC>
void axpy_rows_n(int64_t hd, const uint8_t* base, size_t stride, int64_t n, const float* w,
                 float* y) {
    using Elem = typename Load::Elem;
    for (int c = 0; c < NC; c++) {
        const __mmask16 mk = tail_mask(hd, c);
        const uint8_t* p = base + 16 * c * sizeof(Elem);
        auto row = [&](int64_t i) {
            return Load::masked(mk, reinterpret_cast<const Elem*>(p + i * stride));
        };
        __m512 a0 = _mm512_maskz_loadu_ps(mk, y + 16 * c), a1 = _mm512_setzero_ps(), a2 = a1,
               a3 = a1, a4 = a1, a5 = a1, a6 = a1, a7 = a1;
        int64_t i = 0;
        for (; i + 8 <= n; i += 8) {
            a0 = _mm512_fmadd_ps(_mm512_set1_ps(w[i]), row(i), a0);
            a1 = _mm512_fmadd_ps(_mm512_set1_ps(w[i + 1]), row(i + 1), a1);
            a2 = _mm512_fmadd_ps(_mm512_set1_ps(w[i + 2]), row(i + 2), a2);
            a3 = _mm512_fmadd_ps(_mm512_set1_ps(w[i + 3]), row(i + 3), a3);
            a4 = _mm512_fmadd_ps(_mm512_set1_ps(w[i + 4]), row(i + 4), a4);
            a5 = _mm512_fmadd_ps(_mm512_set1_ps(w[i + 5]), row(i + 5), a5);
            a6 = _mm512_fmadd_ps(_mm512_set1_ps(w[i + 6]), row(i + 6), a6);
            a7 = _mm512_fmadd_ps(_mm512_set1_ps(w[i + 7]), row(i + 7), a7);
        }
        for (; i < n; i++) a0 = _mm512_fmadd_ps(_mm512_set1_ps(w[i]), row(i), a0);
        const __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                                       _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7)));
        _mm512_mask_storeu_ps(y + 16 * c, mk, s);
    }
}

// NC chunks of 16 per row, unrolled (a run-time chunk loop measured ~2x
// slower: short inner loops of four).
template <typename Load, int NC>
void rows_to_f32_n(int64_t hd, const uint8_t* base, size_t stride, int64_t n, float* dst) {
    using Elem = typename Load::Elem;
    if (hd == 16 * NC) { // whole chunks: the load folds into vcvtph2ps (one ALU uop, not two)
        for (int64_t i = 0; i < n; i++, dst += hd) {
            const auto* r = reinterpret_cast<const Elem*>(base + i * stride);
            for (int c = 0; c < NC; c++) _mm512_storeu_ps(dst + 16 * c, Load::get(r + 16 * c));
        }
        return;
    }
    __mmask16 mk[NC];
    for (int c = 0; c < NC; c++) mk[c] = tail_mask(hd, c);
    for (int64_t i = 0; i < n; i++, dst += hd) {
        const auto* r = reinterpret_cast<const Elem*>(base + i * stride);
        for (int c = 0; c < NC; c++)
            _mm512_mask_storeu_ps(dst + 16 * c, mk[c], Load::masked(mk[c], r + 16 * c));
    }
}

template <typename Load>
void rows_to_f32(int64_t hd, const void* rows, size_t stride, int64_t n, float* dst) {
    const auto* base = static_cast<const uint8_t*>(rows);
    if (with_static_count<8>(static_cast<int>((hd + 15) / 16), [&](auto nc) {
            rows_to_f32_n<Load, decltype(nc)::value>(hd, base, stride, n, dst);
        }))
        return;
    for (int64_t i = 0; i < n; i++, dst += hd) {
        const auto* r = reinterpret_cast<const typename Load::Elem*>(base + i * stride);
        for (int64_t k = 0; k < hd; k += 16) {
            const __mmask16 m = tail_mask(hd - k, 0);
            _mm512_mask_storeu_ps(dst + k, m, Load::masked(m, r + k));
        }
    }
}

// Several heads' weighted sums over the same rows (attention's values for
// the heads of a GQA group). One head at a time needs two loads per FMA (row
// and weight), more than the load ports give while two FMAs issue per cycle;
// here four heads x 64 elements of accumulators stay in registers and each
// row's 64 elements are loaded (and, for F16 or BF16 rows, widened: no F32
// tile to store first) once for the four heads. Sixteen named accumulators:
// GCC 12 stores an array of vectors back to the stack on every iteration
// (measured: slower than one head at a time).
template <typename Load>
void axpy_heads4_64(const uint8_t* rows, size_t stride, int64_t n, const float* w, size_t ws,
                    float* const* y, int64_t k0) {
    using Elem = typename Load::Elem;
    float* y0 = y[0] + k0;
    float* y1 = y[1] + k0;
    float* y2 = y[2] + k0;
    float* y3 = y[3] + k0;
#define KV_LOAD4(h)                                                                                \
    __m512 a##h##_0 = _mm512_loadu_ps(y##h), a##h##_1 = _mm512_loadu_ps(y##h + 16),                \
           a##h##_2 = _mm512_loadu_ps(y##h + 32), a##h##_3 = _mm512_loadu_ps(y##h + 48)
    KV_LOAD4(0);
    KV_LOAD4(1);
    KV_LOAD4(2);
    KV_LOAD4(3);
#undef KV_LOAD4
    for (int64_t i = 0; i < n; i++) {
        const Elem* r = reinterpret_cast<const Elem*>(rows + i * stride) + k0;
        const __m512 v0 = Load::get(r), v1 = Load::get(r + 16), v2 = Load::get(r + 32),
                     v3 = Load::get(r + 48);
#define KV_FMA4(h)                                                                                 \
    {                                                                                              \
        const __m512 p = _mm512_set1_ps(w[h * ws + i]);                                            \
        a##h##_0 = _mm512_fmadd_ps(p, v0, a##h##_0);                                               \
        a##h##_1 = _mm512_fmadd_ps(p, v1, a##h##_1);                                               \
        a##h##_2 = _mm512_fmadd_ps(p, v2, a##h##_2);                                               \
        a##h##_3 = _mm512_fmadd_ps(p, v3, a##h##_3);                                               \
    }
        KV_FMA4(0);
        KV_FMA4(1);
        KV_FMA4(2);
        KV_FMA4(3);
#undef KV_FMA4
    }
#define KV_STORE4(h)                                                                               \
    _mm512_storeu_ps(y##h, a##h##_0);                                                              \
    _mm512_storeu_ps(y##h + 16, a##h##_1);                                                         \
    _mm512_storeu_ps(y##h + 32, a##h##_2);                                                         \
    _mm512_storeu_ps(y##h + 48, a##h##_3)
    KV_STORE4(0);
    KV_STORE4(1);
    KV_STORE4(2);
    KV_STORE4(3);
#undef KV_STORE4
}

template <typename Load>
void axpy_rows(int64_t hd, const void* rows, size_t stride, int64_t n, const float* w, float* y);

// Groups of four heads over whole 64-element slices; the rest (other head
// counts, other head sizes' tails) one head at a time.
template <typename Load>
void axpy_heads(int64_t hd, const void* rows_v, size_t stride, int64_t n, const float* w,
                size_t w_stride, int nh, float* const* y) {
    using Elem = typename Load::Elem;
    const auto* rows = static_cast<const uint8_t*>(rows_v);
    int j = 0;
    const int64_t whole = hd / 64 * 64;
    const size_t tail_at = static_cast<size_t>(whole) * sizeof(Elem);
    for (; j + 4 <= nh && whole > 0; j += 4) {
        for (int64_t k0 = 0; k0 < whole; k0 += 64)
            axpy_heads4_64<Load>(rows, stride, n, w + j * w_stride, w_stride, y + j, k0);
        if (whole < hd)
            for (int h = j; h < j + 4; h++)
                axpy_rows<Load>(hd - whole, rows + tail_at, stride, n, w + h * w_stride,
                                y[h] + whole);
    }
    for (; j < nh; j++) axpy_rows<Load>(hd, rows, stride, n, w + j * w_stride, y[j]);
}

// Scores of NH query heads over one key tile (see gl::key_tile_index): per
// dimension, the tile's keys are one vector (widened as loaded) and each
// head's query element is broadcast into an FMA, NH accumulators of 16 keys,
// no horizontal sums. FMA-bound: 2 cycles per (head, key) at head_dim 64,
// measured, against ~6 for widening rows to F32 and dotting them one by one.
template <typename Load, int NH>
void dot_tile_n(int64_t hd, const typename Load::Elem* k, int width, int lo, int hi, const float* q,
                float scale, float* out, size_t os) {
    __m512 acc[NH];
#pragma GCC unroll 8
    for (int j = 0; j < NH; j++) acc[j] = _mm512_setzero_ps();
    auto step = [&](const __m512 kv, int64_t d) {
#pragma GCC unroll 8
        for (int j = 0; j < NH; j++)
            acc[j] = _mm512_fmadd_ps(_mm512_set1_ps(q[j * hd + d]), kv, acc[j]);
    };
    if (width == kKeyTile) {
        for (int64_t d = 0; d < hd; d++) step(Load::get(k + d * kKeyTile), d);
    } else {
        const auto m = static_cast<__mmask16>((1u << width) - 1);
        for (int64_t d = 0; d < hd; d++) step(Load::masked(m, k + d * width), d);
    }
    const __m512 vs = _mm512_set1_ps(scale);
    if (lo == 0 && hi == kKeyTile) {
#pragma GCC unroll 8
        for (int j = 0; j < NH; j++) _mm512_storeu_ps(out + j * os, _mm512_mul_ps(acc[j], vs));
        return;
    }
    // Keys [lo, hi) only, moved down to out[0 ..).
    const auto keep = static_cast<__mmask16>(((1u << hi) - 1) & ~((1u << lo) - 1));
    const auto n = static_cast<__mmask16>((1u << (hi - lo)) - 1);
#pragma GCC unroll 8
    for (int j = 0; j < NH; j++)
        _mm512_mask_storeu_ps(out + j * os, n,
                              _mm512_maskz_compress_ps(keep, _mm512_mul_ps(acc[j], vs)));
}

template <typename Load>
void dot_tile(int64_t hd, const void* tile, int width, int lo, int hi, const float* q, int nh,
              float scale, float* out, size_t os) {
    const auto* k = static_cast<const typename Load::Elem*>(tile);
    for_static_groups<kKeyTileHeads>(nh, [&](auto n, int j0) {
        dot_tile_n<Load, decltype(n)::value>(hd, k, width, lo, hi, q + j0 * hd, scale,
                                             out + j0 * os, os);
    });
}

// Callers prefetch (attention streams a chunk of rows through several heads).
template <typename Load>
void dot_rows(int64_t hd, const void* rows, size_t stride, int64_t n, const float* q, float scale,
              float* out) {
    const auto* base = static_cast<const uint8_t*>(rows);
    if (with_static_count<8>(static_cast<int>((hd + 15) / 16), [&](auto nc) {
            dot_rows_n<Load, decltype(nc)::value>(hd, base, stride, n, q, scale, out);
        }))
        return;
    for (int64_t i = 0; i < n; i++)
        out[i] = dot_float<Load>(
                     hd, reinterpret_cast<const typename Load::Elem*>(base + i * stride), q) *
                 scale;
}

template <typename Load>
void axpy_rows(int64_t hd, const void* rows, size_t stride, int64_t n, const float* w, float* y) {
    const auto* base = static_cast<const uint8_t*>(rows);
    if (with_static_count<8>(static_cast<int>((hd + 15) / 16), [&](auto nc) {
            axpy_rows_n<Load, decltype(nc)::value>(hd, base, stride, n, w, y);
        }))
        return;
    for (int64_t i = 0; i < n; i++)
        axpy_float<Load>(hd, w[i], reinterpret_cast<const typename Load::Elem*>(base + i * stride),
                         y);
}

// exp(x) = 2^n * e^r with n = round(x / ln 2) and r = x - n ln 2 taken in
// two steps (ln 2 split in a high part exact in float and a low part, so r is
// exact to float precision even for |x| ~ 100), |r| <= ln2 / 2, e^r by its
// degree-6 Taylor polynomial (relative error < 2e-7). _mm512_scalef_ps
// applies 2^n and flushes to 0 below x = -104.
__m512 exp512(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-104.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860682030941723e-6f), r);
    __m512 p = _mm512_set1_ps(1.0f / 720);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

float exp_sum(float* x, int64_t n, float mx) {
    const __m512 vmx = _mm512_set1_ps(mx), ninf = _mm512_set1_ps(-INFINITY);
    __m512 sum = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? static_cast<__mmask16>(0xffff)
                                        : static_cast<__mmask16>((1u << (n - i)) - 1);
        const __m512 v = _mm512_maskz_loadu_ps(m, x + i);
        const __mmask16 live = _mm512_mask_cmp_ps_mask(m, v, ninf, _CMP_NEQ_OQ);
        const __m512 e = _mm512_maskz_mov_ps(live, exp512(_mm512_sub_ps(v, vmx)));
        _mm512_mask_storeu_ps(x + i, m, e);
        sum = _mm512_add_ps(sum, e);
    }
    return _mm512_reduce_add_ps(sum);
}

// vmaxps returns its second operand when either is NaN: max(x, acc) keeps
// acc, so NaNs are skipped as in the reference's x > m ? x : m.
float max_of(const float* x, int64_t n) {
    __m512 a0 = _mm512_set1_ps(-INFINITY), a1 = a0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        a0 = _mm512_max_ps(_mm512_loadu_ps(x + i), a0);
        a1 = _mm512_max_ps(_mm512_loadu_ps(x + i + 16), a1);
    }
    for (; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? static_cast<__mmask16>(0xffff)
                                        : static_cast<__mmask16>((1u << (n - i)) - 1);
        a0 = _mm512_max_ps(_mm512_mask_loadu_ps(a0, m, x + i), a0);
    }
    return _mm512_reduce_max_ps(_mm512_max_ps(a0, a1));
}

// ---- quantize -------------------------------------------------------------------

// roundf (halves away from zero): truncate, then step one away from zero
// where the exact remainder is >= 0.5. Bit-identical to the reference.
__m512 round_half_away(__m512 v) {
    const __m512 sign = _mm512_set1_ps(-0.0f);
    const __m512 t = _mm512_roundscale_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __m512 frac = _mm512_abs_ps(_mm512_sub_ps(v, t));
    const __mmask16 up = _mm512_cmp_ps_mask(frac, _mm512_set1_ps(0.5f), _CMP_GE_OQ);
    const __m512 step = _mm512_or_ps(_mm512_set1_ps(1.0f), _mm512_and_ps(v, sign));
    return _mm512_mask_add_ps(t, up, t, step);
}

// Same algorithm as gl::ref: amax / 127 rounded to fp16, q = roundf(x / d)
// against the stored d, clamped to +-127. Division, not a reciprocal multiply,
// so the result is bit-identical.
void quantize_block_q8_0(const float* x, BlockQ8_0* out) {
    const __m512 v0 = _mm512_loadu_ps(x), v1 = _mm512_loadu_ps(x + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
    const uint16_t dh = _cvtss_sh(amax / 127.0f, _MM_FROUND_TO_NEAREST_INT);
    std::memcpy(&out->d, &dh, sizeof dh);
    const float d = _cvtsh_ss(dh);
    if (d == 0.0f) {
        std::memset(out->qs, 0, sizeof out->qs);
        return;
    }
    const __m512 vd = _mm512_set1_ps(d);
    const __m512 lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
    const __m512 v[2] = {v0, v1};
    for (int k = 0; k < 2; k++) {
        const __m512 r = round_half_away(_mm512_div_ps(v[k], vd));
        const __m512i q = _mm512_cvttps_epi32(_mm512_min_ps(hi, _mm512_max_ps(r, lo)));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out->qs + 16 * k), _mm512_cvtepi32_epi8(q));
    }
}

void quantize_row_q8_0(const float* src, void* dst, int64_t n) {
    auto* b = static_cast<BlockQ8_0*>(dst);
    for (int64_t i = 0; i < n / QK8_0; i++) quantize_block_q8_0(src + i * QK8_0, b + i);
}

// vcvtps2ph rounds to nearest even and keeps NaN payloads like
// gl::fp32_to_fp16: bit-identical to the reference.
void quantize_row_f16(const float* src, void* dst, int64_t n) {
    auto* d = static_cast<uint16_t*>(dst);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i),
                            _mm512_cvtps_ph(_mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    if (i < n) {
        const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
        const __m256i h =
            _mm512_cvtps_ph(_mm512_maskz_loadu_ps(m, src + i), _MM_FROUND_TO_NEAREST_INT);
        _mm256_mask_storeu_epi16(d + i, m, h);
    }
}

// ---- dequantize -----------------------------------------------------------------

void dequantize_row_f16(const void* src, float* dst, int64_t n) {
    const auto* s = static_cast<const uint16_t*>(src);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, F16::get(s + i));
    if (i < n) {
        const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(dst + i, m, F16::masked(m, s + i));
    }
}

void dequantize_row_bf16(const void* src, float* dst, int64_t n) {
    const auto* s = static_cast<const uint16_t*>(src);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, BF16::get(s + i));
    if (i < n) {
        const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(dst + i, m, BF16::masked(m, s + i));
    }
}

// 32 signed bytes -> 32 floats times d.
void store_scaled_i8(__m256i q, float d, float* out) {
    const __m512 vd = _mm512_set1_ps(d);
    const __m128i part[2] = {_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1)};
    for (int k = 0; k < 2; k++)
        _mm512_storeu_ps(out + 16 * k,
                         _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(part[k])), vd));
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
    KernelTable t = {"avx512", {}, {}, {}, {}, {}, {}, {}, {}, {}, nullptr, nullptr, nullptr, {}, {}, {}};
    t.vec_dot[id(Type::F32)] = vec_dot_float<F32>;
    t.vec_dot[id(Type::F16)] = vec_dot_float<F16>;
    t.vec_dot[id(Type::BF16)] = vec_dot_float<BF16>;
    t.vec_dot[id(Type::Q8_0)] = vec_dot_q8_0;
    t.vec_dot[id(Type::Q4_0)] = vec_dot_q4_0;
    t.matvec[id(Type::Q4_0)] = matvec_rows4<Q4Rows>;
    t.matvec[id(Type::Q8_0)] = matvec_rows4<Q8Rows>;
    // The block-chain GEMM (x86/avx512_chain.cpp): prompt batches.
    KVRUN_SET_CHAIN_GEMMS(t, avx512_chain);
    // On packed weights (kernels.h): generation and prompts, one code path.
    t.gemm_packed[id(Type::Q4_0)] = avx512_chain::gemm_packed_q4_0;
    t.gemm_packed[id(Type::Q8_0)] = avx512_chain::gemm_packed_q8_0;
    t.quantize_row[id(Type::Q8_0)] = quantize_row_q8_0;
    t.quantize_row[id(Type::Q8_1)] = quantize_row_q8_1<quantize_block_q8_0>;
    t.quantize_row[id(Type::F16)] = quantize_row_f16;
    t.dequantize_row[id(Type::F16)] = dequantize_row_f16;
    t.dequantize_row[id(Type::BF16)] = dequantize_row_bf16;
    t.dequantize_row[id(Type::Q8_0)] = dequantize_row_q8_0;
    t.dequantize_row[id(Type::Q4_0)] = dequantize_row_q4_0;
    t.axpy[id(Type::F32)] = axpy<F32>;
    t.axpy[id(Type::F16)] = axpy<F16>;
    t.axpy[id(Type::BF16)] = axpy<BF16>;
    t.dot_rows[id(Type::F32)] = dot_rows<F32>;
    t.dot_rows[id(Type::F16)] = dot_rows<F16>;
    t.dot_rows[id(Type::BF16)] = dot_rows<BF16>;
    t.axpy_rows[id(Type::F32)] = axpy_rows<F32>;
    t.axpy_rows[id(Type::F16)] = axpy_rows<F16>;
    t.axpy_rows[id(Type::BF16)] = axpy_rows<BF16>;
    t.rows_to_f32[id(Type::F16)] = rows_to_f32<F16>;
    t.rows_to_f32[id(Type::BF16)] = rows_to_f32<BF16>;
    t.axpy_heads[id(Type::F32)] = axpy_heads<F32>;
    t.axpy_heads[id(Type::F16)] = axpy_heads<F16>;
    t.axpy_heads[id(Type::BF16)] = axpy_heads<BF16>;
    t.dot_tile[id(Type::F32)] = dot_tile<F32>;
    t.dot_tile[id(Type::F16)] = dot_tile<F16>;
    t.dot_tile[id(Type::BF16)] = dot_tile<BF16>;
    t.exp_sum = exp_sum;
    t.max_of = max_of;
    t.delta_rule = avx512_delta::delta_rule; // x86/avx512_delta.cpp
    add_kernels_k(t, kAvx512KernelsK); // x86/avx512_k.cpp
    GL_ADD_MATVEC_K(t, avx512_k);
    return t;
}

} // namespace

// constinit: dispatch may read the table from another file's static initializer.
extern const KernelTable kAvx512Table;
constinit const KernelTable kAvx512Table = make_table();

} // namespace gl
