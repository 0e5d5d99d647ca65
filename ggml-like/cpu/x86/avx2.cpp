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
#include "ggml-like/kernels.h"
#include "ggml-like/cpu/q8_1.h"
#include "ggml-like/blocks_k.h"
#include "ggml-like/cpu/chain_gemms.h"
#include "ggml-like/cpu/static_count.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

namespace gl::avx2_delta {
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

// ---- matvec ---------------------------------------------------------------------

// Q4_0 weight rows against one activation row, four rows at a time. The
// rows share the activation block's load, its scale broadcast and the
// offset term 8 * a, so a row's block costs 8 vector ALU ops and 2 loads
// instead of vec_dot's 9 and 4. The four rows are one contiguous span read
// at four blocks a step, so it is prefetched linearly, kPrefetchBytes ahead,
// rather than as four strided streams. Named accumulators, not an array:
// GCC 12 keeps arrays of vectors on the stack, which puts a store-load round
// trip on every FMA chain.
//
// The same loop serves Q8_0 (Q8Rows): a row's block is the sign-moving
// maddubs of dot_i8, and only the activation load and scale are shared.
struct Q4Rows {
    using Block = BlockQ4_0;
    static __m256i offset(__m256i a) { return _mm256_maddubs_epi16(_mm256_set1_epi8(8), a); }
    static __m256i pairs(const Block& x, __m256i a, __m256i offset) {
        return _mm256_sub_epi16(_mm256_maddubs_epi16(unpack_q4(x.qs), a), offset);
    }
    static float one_row(int64_t n, const void* w, const void* a) { return vec_dot_q4_0(n, w, a); }
};
struct Q8Rows {
    using Block = BlockQ8_0;
    static __m256i offset(__m256i) { return _mm256_setzero_si256(); }
    static __m256i pairs(const Block& x, __m256i a, __m256i) {
        const __m256i w = load256(x.qs);
        return _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w));
    }
    static float one_row(int64_t n, const void* w, const void* a) { return vec_dot_q8_0(n, w, a); }
};

template <typename R>
__attribute__((always_inline)) inline void row_block(const typename R::Block& x, __m256i a,
                                                     __m256i offset, __m256 da, __m256& acc) {
    const __m256i s = _mm256_madd_epi16(R::pairs(x, a, offset), _mm256_set1_epi16(1));
    acc = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_broadcast_ss(&kFp16ToFp32[x.d]), da),
                          _mm256_cvtepi32_ps(s), acc);
}

template <typename R>
void matvec_rows4(int64_t n, const void* w, size_t row_bytes, int64_t n_rows, const void* a,
                  float* y) {
    using Block = typename R::Block;
    const auto* y8 = static_cast<const BlockQ8_0*>(a);
    const int64_t nb = n / QK8_0;
    const auto* base = static_cast<const uint8_t*>(w);
    constexpr int kLines = (4 * sizeof(Block) + 63) / 64; // Q4_0: 72 bytes a step, two lines
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
            const __m256i offset = R::offset(av);
            const __m256 da = _mm256_broadcast_ss(&kFp16ToFp32[y8[i].d]);
            row_block<R>(x0[i], av, offset, da, c0);
            row_block<R>(x1[i], av, offset, da, c1);
            row_block<R>(x2[i], av, offset, da, c2);
            row_block<R>(x3[i], av, offset, da, c3);
        }
        y[r] = hsum(c0);
        y[r + 1] = hsum(c1);
        y[r + 2] = hsum(c2);
        y[r + 3] = hsum(c3);
    }
    for (; r < n_rows; r++) y[r] = R::one_row(n, base + r * row_bytes, a);
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

// ---- attention over cached rows --------------------------------------------------

// Sixteen ymm registers shape these kernels: each keeps at most eight
// accumulators and a few loaded vectors live, always in named variables
// (GCC 12 keeps arrays of vectors on the stack, storing them every row). Two
// FMAs issue per cycle with a latency of 4, so eight independent chains keep
// the FMA units busy.

// Lane j of the result is the sum of a_j's eight lanes: a transpose-and-add
// tree (six hadds and one cross-half add for eight rows, instead of a
// five-step horizontal sum per row).
__attribute__((always_inline)) inline __m256 sum8(__m256 a0, __m256 a1, __m256 a2, __m256 a3,
                                                  __m256 a4, __m256 a5, __m256 a6, __m256 a7) {
    // Per 128-bit half: pair sums of rows 0,1 / 2,3 / 4,5 / 6,7, then the
    // half's sums of rows 0..3 and 4..7.
    const __m256 s0123 = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    const __m256 s4567 = _mm256_hadd_ps(_mm256_hadd_ps(a4, a5), _mm256_hadd_ps(a6, a7));
    return _mm256_add_ps(_mm256_permute2f128_ps(s0123, s4567, 0x20),
                         _mm256_permute2f128_ps(s0123, s4567, 0x31));
}

// The first m < 8 elements at p as floats, the rest zero, without reading
// past them (16-bit types have no masked load).
template <typename Load, typename Elem = typename Load::Elem>
__m256 load_tail(const Elem* p, int64_t m) {
    Elem t[8] = {};
    std::memcpy(t, p, static_cast<size_t>(m) * sizeof(Elem));
    return Load::get(t);
}

// Scores of NH (up to 4) query heads over a whole key tile (see
// gl::key_tile_index): per dimension, the tile's 16 keys as two vectors times
// each head's broadcast query element; eight accumulators, no horizontal sums.
template <typename Load, int NH>
void dot_tile_n(int64_t hd, const typename Load::Elem* k, int lo, int hi, const float* q,
                float scale, float* out, size_t os) {
    __m256 a[NH], b[NH];
#pragma GCC unroll 4
    for (int j = 0; j < NH; j++) a[j] = b[j] = _mm256_setzero_ps();
    for (int64_t d = 0; d < hd; d++) {
        const __m256 k0 = Load::get(k + d * kKeyTile), k1 = Load::get(k + d * kKeyTile + 8);
#pragma GCC unroll 4
        for (int j = 0; j < NH; j++) {
            const __m256 qd = _mm256_broadcast_ss(q + j * hd + d);
            a[j] = _mm256_fmadd_ps(qd, k0, a[j]);
            b[j] = _mm256_fmadd_ps(qd, k1, b[j]);
        }
    }
    const __m256 vs = _mm256_set1_ps(scale);
#pragma GCC unroll 4
    for (int j = 0; j < NH; j++) {
        if (lo == 0 && hi == kKeyTile) {
            _mm256_storeu_ps(out + j * os, _mm256_mul_ps(a[j], vs));
            _mm256_storeu_ps(out + j * os + 8, _mm256_mul_ps(b[j], vs));
        } else {
            alignas(32) float all[kKeyTile];
            _mm256_store_ps(all, _mm256_mul_ps(a[j], vs));
            _mm256_store_ps(all + 8, _mm256_mul_ps(b[j], vs));
            std::copy(all + lo, all + hi, out + j * os);
        }
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

// Eight rows at a time, each with its own accumulator, sharing every load of
// q: nine loads per eight FMAs (one row at a time needs two per FMA, more
// than the two load ports give). Callers prefetch (attention streams a
// chunk of rows through several heads).
template <typename Load>
void dot_rows(int64_t hd, const void* rows, size_t stride, int64_t n, const float* q, float scale,
              float* out) {
    using Elem = typename Load::Elem;
    const auto* base = static_cast<const uint8_t*>(rows);
    auto row = [&](int64_t i) { return reinterpret_cast<const Elem*>(base + i * stride); };
    const int64_t whole = hd / 8 * 8, left = hd - whole;
    const __m256 qt = left ? load_tail<F32>(q + whole, left) : _mm256_setzero_ps();
    const __m256 vscale = _mm256_set1_ps(scale);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const Elem *r0 = row(i), *r1 = row(i + 1), *r2 = row(i + 2), *r3 = row(i + 3),
                   *r4 = row(i + 4), *r5 = row(i + 5), *r6 = row(i + 6), *r7 = row(i + 7);
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0,
               a7 = a0;
        for (int64_t k = 0; k < whole; k += 8) {
            const __m256 qv = _mm256_loadu_ps(q + k);
            a0 = _mm256_fmadd_ps(Load::get(r0 + k), qv, a0);
            a1 = _mm256_fmadd_ps(Load::get(r1 + k), qv, a1);
            a2 = _mm256_fmadd_ps(Load::get(r2 + k), qv, a2);
            a3 = _mm256_fmadd_ps(Load::get(r3 + k), qv, a3);
            a4 = _mm256_fmadd_ps(Load::get(r4 + k), qv, a4);
            a5 = _mm256_fmadd_ps(Load::get(r5 + k), qv, a5);
            a6 = _mm256_fmadd_ps(Load::get(r6 + k), qv, a6);
            a7 = _mm256_fmadd_ps(Load::get(r7 + k), qv, a7);
        }
        if (left) {
            a0 = _mm256_fmadd_ps(load_tail<Load>(r0 + whole, left), qt, a0);
            a1 = _mm256_fmadd_ps(load_tail<Load>(r1 + whole, left), qt, a1);
            a2 = _mm256_fmadd_ps(load_tail<Load>(r2 + whole, left), qt, a2);
            a3 = _mm256_fmadd_ps(load_tail<Load>(r3 + whole, left), qt, a3);
            a4 = _mm256_fmadd_ps(load_tail<Load>(r4 + whole, left), qt, a4);
            a5 = _mm256_fmadd_ps(load_tail<Load>(r5 + whole, left), qt, a5);
            a6 = _mm256_fmadd_ps(load_tail<Load>(r6 + whole, left), qt, a6);
            a7 = _mm256_fmadd_ps(load_tail<Load>(r7 + whole, left), qt, a7);
        }
        _mm256_storeu_ps(out + i, _mm256_mul_ps(sum8(a0, a1, a2, a3, a4, a5, a6, a7), vscale));
    }
    for (; i < n; i++) out[i] = dot_float<Load>(hd, row(i), q) * scale;
}

// One element of a row as float, for the scalar tails.
template <typename Load> float load_one(const typename Load::Elem* p) {
    if constexpr (std::is_same_v<Load, F32>)
        return *p;
    else if constexpr (std::is_same_v<Load, F16>)
        return load_half(p);
    else
        return bf16_to_fp32(*p);
}

// y += sum_i w[i] * row i. 64-element slices of y stay in eight registers
// while the rows stream past (row-outer): each row's weight is broadcast
// once for eight FMAs, nine loads per eight FMAs. Whole 8-element chunks
// past the last slice go one at a time with four chains over rows i mod 4,
// and the last 0..7 elements in scalar code.
template <typename Load>
void axpy_rows(int64_t hd, const void* rows, size_t stride, int64_t n, const float* w, float* y) {
    using Elem = typename Load::Elem;
    const auto* base = static_cast<const uint8_t*>(rows);
    auto row = [&](int64_t i) { return reinterpret_cast<const Elem*>(base + i * stride); };
    int64_t k = 0;
    for (; k + 64 <= hd; k += 64) {
        float* yk = y + k;
        __m256 a0 = _mm256_loadu_ps(yk), a1 = _mm256_loadu_ps(yk + 8),
               a2 = _mm256_loadu_ps(yk + 16), a3 = _mm256_loadu_ps(yk + 24),
               a4 = _mm256_loadu_ps(yk + 32), a5 = _mm256_loadu_ps(yk + 40),
               a6 = _mm256_loadu_ps(yk + 48), a7 = _mm256_loadu_ps(yk + 56);
        for (int64_t i = 0; i < n; i++) {
            const Elem* r = row(i) + k;
            const __m256 wv = _mm256_broadcast_ss(w + i);
            a0 = _mm256_fmadd_ps(wv, Load::get(r), a0);
            a1 = _mm256_fmadd_ps(wv, Load::get(r + 8), a1);
            a2 = _mm256_fmadd_ps(wv, Load::get(r + 16), a2);
            a3 = _mm256_fmadd_ps(wv, Load::get(r + 24), a3);
            a4 = _mm256_fmadd_ps(wv, Load::get(r + 32), a4);
            a5 = _mm256_fmadd_ps(wv, Load::get(r + 40), a5);
            a6 = _mm256_fmadd_ps(wv, Load::get(r + 48), a6);
            a7 = _mm256_fmadd_ps(wv, Load::get(r + 56), a7);
        }
        _mm256_storeu_ps(yk, a0);
        _mm256_storeu_ps(yk + 8, a1);
        _mm256_storeu_ps(yk + 16, a2);
        _mm256_storeu_ps(yk + 24, a3);
        _mm256_storeu_ps(yk + 32, a4);
        _mm256_storeu_ps(yk + 40, a5);
        _mm256_storeu_ps(yk + 48, a6);
        _mm256_storeu_ps(yk + 56, a7);
    }
    for (; k + 8 <= hd; k += 8) {
        __m256 a0 = _mm256_loadu_ps(y + k), a1 = _mm256_setzero_ps(), a2 = a1, a3 = a1;
        int64_t i = 0;
        for (; i + 4 <= n; i += 4) {
            a0 = _mm256_fmadd_ps(_mm256_broadcast_ss(w + i), Load::get(row(i) + k), a0);
            a1 = _mm256_fmadd_ps(_mm256_broadcast_ss(w + i + 1), Load::get(row(i + 1) + k), a1);
            a2 = _mm256_fmadd_ps(_mm256_broadcast_ss(w + i + 2), Load::get(row(i + 2) + k), a2);
            a3 = _mm256_fmadd_ps(_mm256_broadcast_ss(w + i + 3), Load::get(row(i + 3) + k), a3);
        }
        for (; i < n; i++)
            a0 = _mm256_fmadd_ps(_mm256_broadcast_ss(w + i), Load::get(row(i) + k), a0);
        _mm256_storeu_ps(y + k, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    }
    for (; k < hd; k++) {
        float s = y[k];
        for (int64_t i = 0; i < n; i++) s += w[i] * load_one<Load>(row(i) + k);
        y[k] = s;
    }
}

// One F16/BF16 row widened to F32: 8 elements a step, then the tail.
template <typename Load> void widen_row(const typename Load::Elem* r, float* dst, int64_t n) {
    int64_t k = 0;
    for (; k + 8 <= n; k += 8) _mm256_storeu_ps(dst + k, Load::get(r + k));
    for (; k < n; k++) dst[k] = load_one<Load>(r + k);
}

// A chunk of cached rows widened to one F32 tile.
template <typename Load>
void rows_to_f32(int64_t hd, const void* rows, size_t stride, int64_t n, float* dst) {
    const auto* base = static_cast<const uint8_t*>(rows);
    for (int64_t i = 0; i < n; i++, dst += hd)
        widen_row<Load>(reinterpret_cast<const typename Load::Elem*>(base + i * stride), dst, hd);
}

// Two heads' weighted sums over the same rows, on a 32-element slice: each
// row's four vectors are loaded (and, for F16 or BF16 rows, widened) once for
// both heads, six loads (four row vectors, two weight broadcasts) per eight
// FMAs. Eight accumulators, four row vectors and two broadcasts use 14 of the
// 16 registers; four heads (as on AVX-512) would not fit.
template <typename Load>
void axpy_heads2_32(const uint8_t* rows, size_t stride, int64_t n, const float* w0, const float* w1,
                    float* y0, float* y1) {
    using Elem = typename Load::Elem;
    __m256 a0 = _mm256_loadu_ps(y0), a1 = _mm256_loadu_ps(y0 + 8), a2 = _mm256_loadu_ps(y0 + 16),
           a3 = _mm256_loadu_ps(y0 + 24);
    __m256 b0 = _mm256_loadu_ps(y1), b1 = _mm256_loadu_ps(y1 + 8), b2 = _mm256_loadu_ps(y1 + 16),
           b3 = _mm256_loadu_ps(y1 + 24);
    for (int64_t i = 0; i < n; i++) {
        const Elem* r = reinterpret_cast<const Elem*>(rows + i * stride);
        const __m256 v0 = Load::get(r), v1 = Load::get(r + 8), v2 = Load::get(r + 16),
                     v3 = Load::get(r + 24);
        const __m256 p = _mm256_broadcast_ss(w0 + i);
        a0 = _mm256_fmadd_ps(p, v0, a0);
        a1 = _mm256_fmadd_ps(p, v1, a1);
        a2 = _mm256_fmadd_ps(p, v2, a2);
        a3 = _mm256_fmadd_ps(p, v3, a3);
        const __m256 s = _mm256_broadcast_ss(w1 + i);
        b0 = _mm256_fmadd_ps(s, v0, b0);
        b1 = _mm256_fmadd_ps(s, v1, b1);
        b2 = _mm256_fmadd_ps(s, v2, b2);
        b3 = _mm256_fmadd_ps(s, v3, b3);
    }
    _mm256_storeu_ps(y0, a0);
    _mm256_storeu_ps(y0 + 8, a1);
    _mm256_storeu_ps(y0 + 16, a2);
    _mm256_storeu_ps(y0 + 24, a3);
    _mm256_storeu_ps(y1, b0);
    _mm256_storeu_ps(y1 + 8, b1);
    _mm256_storeu_ps(y1 + 16, b2);
    _mm256_storeu_ps(y1 + 24, b3);
}

// Pairs of heads over whole 32-element slices; the rest (an odd head, the
// heads' last hd mod 32 elements) one head at a time.
template <typename Load>
void axpy_heads(int64_t hd, const void* rows_v, size_t stride, int64_t n, const float* w,
                size_t w_stride, int nh, float* const* y) {
    using Elem = typename Load::Elem;
    const auto* rows = static_cast<const uint8_t*>(rows_v);
    int j = 0;
    const int64_t whole = hd / 32 * 32;
    const size_t tail_at = static_cast<size_t>(whole) * sizeof(Elem);
    for (; j + 2 <= nh && whole > 0; j += 2) {
        const float* w0 = w + j * w_stride;
        const float* w1 = w0 + w_stride;
        for (int64_t k0 = 0; k0 < whole; k0 += 32)
            axpy_heads2_32<Load>(rows + k0 * sizeof(Elem), stride, n, w0, w1, y[j] + k0,
                                 y[j + 1] + k0);
        if (whole < hd) {
            axpy_rows<Load>(hd - whole, rows + tail_at, stride, n, w0, y[j] + whole);
            axpy_rows<Load>(hd - whole, rows + tail_at, stride, n, w1, y[j + 1] + whole);
        }
    }
    for (; j < nh; j++) axpy_rows<Load>(hd, rows, stride, n, w + j * w_stride, y[j]);
}

// exp(x) for x in [-87, 88] (the caller flushes smaller x to 0): 2^n * e^r
// with n = round(x / ln 2) and r = x - n ln 2 taken in two steps (ln 2 split
// in a high part exact in float and a low part, so r is exact to float
// precision even for |x| ~ 100), |r| <= ln2 / 2, e^r by its degree-6 Taylor
// polynomial (relative error < 2e-7). 2^n is built from its bits: n + 127 in
// the exponent field, a normal float for n in [-126, 127], which the clamp
// guarantees. The clamps take x second so that a NaN passes through.
__m256 exp256(__m256 x) {
    x = _mm256_min_ps(_mm256_set1_ps(88.0f), _mm256_max_ps(_mm256_set1_ps(-87.0f), x));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.42860682030941723e-6f), r);
    __m256 p = _mm256_set1_ps(1.0f / 720);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    const __m256i e =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

// exp(v - mx), exactly 0 where v is -inf (also when mx is -inf too, where
// v - mx is NaN) and where v - mx < -87: there exp is below float's normal
// range (< 1.7e-38), negligible against the max's weight of 1.
__m256 exp_weight(__m256 v, __m256 vmx) {
    const __m256 d = _mm256_sub_ps(v, vmx);
    const __m256 zero = _mm256_or_ps(_mm256_cmp_ps(v, _mm256_set1_ps(-INFINITY), _CMP_EQ_OQ),
                                     _mm256_cmp_ps(d, _mm256_set1_ps(-87.0f), _CMP_LT_OQ));
    return _mm256_andnot_ps(zero, exp256(d));
}

float exp_sum(float* x, int64_t n, float mx) {
    const __m256 vmx = _mm256_set1_ps(mx);
    __m256 sum = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 e = exp_weight(_mm256_loadu_ps(x + i), vmx);
        _mm256_storeu_ps(x + i, e);
        sum = _mm256_add_ps(sum, e);
    }
    if (i < n) { // masked load and store: nothing past x[n) is touched
        const __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n - i)),
                                             _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        const __m256 e =
            _mm256_and_ps(_mm256_castsi256_ps(m), exp_weight(_mm256_maskload_ps(x + i, m), vmx));
        _mm256_maskstore_ps(x + i, m, e);
        sum = _mm256_add_ps(sum, e);
    }
    return hsum(sum);
}

// vmaxps returns its second operand when either is NaN: max(x, acc) keeps
// acc, so NaNs are skipped as in the reference's x > m ? x : m.
float max_of(const float* x, int64_t n) {
    __m256 a0 = _mm256_set1_ps(-INFINITY), a1 = a0;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        a0 = _mm256_max_ps(_mm256_loadu_ps(x + i), a0);
        a1 = _mm256_max_ps(_mm256_loadu_ps(x + i + 8), a1);
    }
    a0 = _mm256_max_ps(a0, a1);
    float lane[8];
    _mm256_storeu_ps(lane, a0);
    float mx = lane[0];
    for (int k = 1; k < 8; k++) mx = lane[k] > mx ? lane[k] : mx;
    for (; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    return mx;
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
        // max(r, lo): maxps returns its second operand for a NaN, so NaN becomes
        // -127 as in the reference (never -128, which the GEMM's sign trick
        // cannot negate).
        q[k] = _mm256_cvttps_epi32(_mm256_min_ps(hi, _mm256_max_ps(r, lo)));
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
    widen_row<F16>(static_cast<const uint16_t*>(src), dst, n);
}

void dequantize_row_bf16(const void* src, float* dst, int64_t n) {
    widen_row<BF16>(static_cast<const uint16_t*>(src), dst, n);
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
    KernelTable t = {"avx2", {}, {}, {}, {}, {}, {}, {}, {}, {}, nullptr, nullptr, nullptr, {}, {}, {}};
    t.vec_dot[id(Type::F32)] = vec_dot_float<F32>;
    t.vec_dot[id(Type::F16)] = vec_dot_float<F16>;
    t.vec_dot[id(Type::BF16)] = vec_dot_float<BF16>;
    t.vec_dot[id(Type::Q8_0)] = vec_dot_q8_0;
    t.vec_dot[id(Type::Q4_0)] = vec_dot_q4_0;
    t.matvec[id(Type::Q4_0)] = matvec_rows4<Q4Rows>;
    t.matvec[id(Type::Q8_0)] = matvec_rows4<Q8Rows>;
    // The block-chain GEMM (x86/avx2_chain.cpp): prompt batches.
    KVRUN_SET_CHAIN_GEMMS(t, avx2_chain);
    t.gemm_packed[id(Type::Q4_0)] = avx2_chain::gemm_packed_q4_0;
    t.gemm_packed[id(Type::Q8_0)] = avx2_chain::gemm_packed_q8_0;
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
    t.dot_tile[id(Type::F32)] = dot_tile<F32, Type::F32>;
    t.dot_tile[id(Type::F16)] = dot_tile<F16, Type::F16>;
    t.dot_tile[id(Type::BF16)] = dot_tile<BF16, Type::BF16>;
    t.exp_sum = exp_sum;
    t.max_of = max_of;
    t.delta_rule = avx2_delta::delta_rule; // x86/avx2_delta.cpp
    add_kernels_k(t, kAvx2KernelsK); // x86/avx2_k.cpp
    GL_ADD_MATVEC_K(t, avx2_k);
    return t;
}

// The AVX2 table with the AVX-VNNI GEMM (x86/avxvnni_chain.cpp, compiled
// with -mavxvnni; dispatch.cpp asks cpuid for it): everything else is AVX2.
constexpr KernelTable make_vnni_table() {
    KernelTable t = make_table();
    t.isa = "avxvnni";
    KVRUN_SET_CHAIN_GEMMS(t, avxvnni_chain);
    t.gemm_packed[id(Type::Q4_0)] = avxvnni_chain::gemm_packed_q4_0;
    t.gemm_packed[id(Type::Q8_0)] = avxvnni_chain::gemm_packed_q8_0;
    return t;
}

} // namespace

// constinit: dispatch may read the table from another file's static initializer.
extern const KernelTable kAvx2Table;
constinit const KernelTable kAvx2Table = make_table();
extern const KernelTable kAvxVnniTable;
constinit const KernelTable kAvxVnniTable = make_vnni_table();

} // namespace gl
