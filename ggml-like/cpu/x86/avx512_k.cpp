// AVX-512 (F, BW, VL, DQ) + VNNI kernels for the types of blocks_k.h;
// compiled with those flags and reached only after dispatch.cpp has checked
// the CPU.
//
// K-quants use 512-bit registers holding 64 weights: the 32 bytes of packed
// bits that feed 64 weights are loaded into both 256-bit halves with one
// broadcast load (a load-port uop only), and a per-64-bit-lane variable shift
// gives each half its own bits. vpdpbusd (u8 x s8, four products summed per
// int32 lane) then dots them with 64 activation bytes in one uop.
//
// Sub-block scales are applied in the integers with vpdpwssd (int16 pairs
// multiplied and summed into int32). A dpbusd lane is a sum of four products,
// at most 4 * 63 * 128 < 2^15 in magnitude, so its low int16 half read as
// signed is exactly the lane; the scale vector holds (sc, 0) per lane, which
// multiplies the high half (0 or -1, the sign extension) by zero. One uop
// thus scales a lane and accumulates it.
//
// Offsets and mins are dots of 16 scales with Q8_K's block sums, as in the
// AVX2 file. The 32-element blocks use 256-bit VNNI, one block per register.
#include "ggml-like/blocks_k.h"
#include "ggml-like/cpu/rows4.h"
#include "ggml-like/cpu/x86/k_scales.h"
#include "ggml-like/cpu/x86/dequant_k.h"

// GCC 12's AVX-512 headers trip false -Wuninitialized warnings once inlined
// (GCC PR 105593, fixed in GCC 13); see x86/avx512.cpp.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <cmath>
#include <cstring>
#include <type_traits>

namespace gl::avx512_k {

namespace {

float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

float hsum(__m512 v) {
    return hsum(_mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1)));
}

__m512i load512(const void* p) {
    return _mm512_loadu_si512(p);
}
__m256i load256(const void* p) {
    return _mm256_loadu_si256(static_cast<const __m256i*>(p));
}
__m128i load128(const void* p) {
    return _mm_loadu_si128(static_cast<const __m128i*>(p));
}
uint32_t load_u32(const void* p) {
    uint32_t v;
    std::memcpy(&v, p, sizeof v);
    return v;
}

// Generation streams each weight row once from DRAM. The hardware prefetcher
// alone left these loops at ~7 GB/s per core on a machine that reads 16 GB/s
// (most of the time waiting on misses); asking for the weights this far
// ahead measured 12-13 GB/s for Q4_K. Past the end of a row it fetches the
// next row, which a matrix multiply reads next; a prefetch never faults.
constexpr size_t kPrefetchBytes = 8192;

// One prefetch per 64-byte line of the block kPrefetchBytes ahead of `block`.
template <typename Block> void prefetch_ahead(const Block* block) {
    const char* p = reinterpret_cast<const char*>(block) + kPrefetchBytes;
    for (size_t off = 0; off < sizeof(Block); off += 64) _mm_prefetch(p + off, _MM_HINT_T0);
}

// 32 bytes into both halves of a register (vbroadcasti64x4 from memory).
__m512i load_both(const void* p) {
    return _mm512_broadcast_i64x4(load256(p));
}

// Bit b set in every byte of a 64-bit lane.
long long every_byte(int b) {
    return static_cast<long long>(0x0101010101010101ull << b);
}

__m512i bytes(int v) {
    return _mm512_set1_epi8(static_cast<char>(v));
}

// Per-64-bit-lane shift counts: lo for the low 256 bits, hi for the high.
__m512i halves(long long lo, long long hi) {
    return _mm512_setr_epi64(lo, lo, lo, lo, hi, hi, hi, hi);
}

__m512i dpbusd(__m512i u, __m512i s) {
    return _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, s);
}

// Scales as (int16, 0) pairs per int32 lane, from sign- or zero-extended bytes.
__m512i scale_pairs(__m512i v) {
    return _mm512_and_si512(v, _mm512_set1_epi32(0xffff));
}

// Lane L of the result is scale (first + L / 4): a 64-weight group split in
// four 16-weight sub-blocks, each covering four dpbusd lanes.
__m512i scales_by_4(__m512i sc32, int first) {
    const __m512i idx =
        _mm512_add_epi32(_mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3),
                         _mm512_set1_epi32(first));
    return _mm512_permutexvar_epi32(idx, sc32);
}

// sum_j scale16[j] * bsums[j] as 8 int32 lanes.
__m256i scaled_bsums(__m256i scale16, const BlockQ8_K& y) {
    return _mm256_madd_epi16(scale16, load256(y.bsums));
}

// ---- Q4_K / Q5_K ------------------------------------------------------------------

// shuffle_epi8 control giving int32 lanes (byte lo, 0) in the low half and
// (byte hi, 0) in the high half, from a register whose every 128-bit lane
// holds the 16 scale bytes.
__m512i pick_byte(int lo, int hi) {
    const __m256i l = _mm256_set1_epi32(static_cast<int>(0x80808000u | static_cast<unsigned>(lo)));
    const __m256i h = _mm256_set1_epi32(static_cast<int>(0x80808000u | static_cast<unsigned>(hi)));
    return _mm512_inserti64x4(_mm512_castsi256_si512(l), h, 1);
}

template <bool kFive>
__attribute__((always_inline)) inline void
block_k4(uint16_t d, uint16_t dmin, const uint8_t* scales, const uint8_t* qh, const uint8_t* qs,
         const BlockQ8_K& y, __m512* acc, __m256* accm) {
    const __m128i sm = unpack_scales_k4(scales);
    const __m512i sc = _mm512_broadcast_i32x4(sm);
    const __m128i m8 = _mm_unpackhi_epi8(sm, sm); // m_j twice: pairs with bsums 2j, 2j + 1
    const __m256i mins = scaled_bsums(_mm256_cvtepu8_epi16(m8), y);

    const __m512i shift = halves(0, 4);
    const __m512i hbits = kFive ? load_both(qh) : _mm512_setzero_si512();
    __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
    for (int c = 0; c < 4; c++) {
        // Low half: sub-block 2c (low nibbles), high half: 2c + 1 (high nibbles).
        __m512i q = _mm512_and_si512(_mm512_srlv_epi64(load_both(qs + 32 * c), shift), bytes(0x0f));
        if (kFive) {
            // Fifth bits: bit 2c of qh[l] for the low half, 2c + 1 for the high.
            const __m512i bit = halves(every_byte(2 * c), every_byte(2 * c + 1));
            q = _mm512_mask_add_epi8(q, _mm512_test_epi8_mask(hbits, bit), q, bytes(16));
        }
        const __m512i p = dpbusd(q, load512(y.qs + 64 * c));
        const __m512i scv = _mm512_shuffle_epi8(sc, pick_byte(2 * c, 2 * c + 1));
        if (c % 2 == 0) {
            s0 = _mm512_dpwssd_epi32(s0, p, scv);
        } else {
            s1 = _mm512_dpwssd_epi32(s1, p, scv);
        }
    }
    const float da = y.d;
    *acc = _mm512_fmadd_ps(_mm512_set1_ps(kFp16ToFp32[d] * da),
                           _mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1)), *acc);
    *accm =
        _mm256_fmadd_ps(_mm256_set1_ps(kFp16ToFp32[dmin] * da), _mm256_cvtepi32_ps(mins), *accm);
}

// One row's running sum over Q4_K or Q5_K blocks.
template <bool kFive, typename B> struct RowK4 {
    using Block = B;
    __m512 acc = _mm512_setzero_ps();
    __m256 accm = _mm256_setzero_ps();
    static void prefetch(const Block* x) { prefetch_ahead(x); }
    __attribute__((always_inline)) void add(const Block& x, const BlockQ8_K& y) {
        const uint8_t* qh = nullptr;
        if constexpr (kFive) qh = x.qh;
        block_k4<kFive>(x.d, x.dmin, x.scales, qh, x.qs, y, &acc, &accm);
    }
    float total() const { return hsum(acc) - hsum(accm); }
};

} // namespace

float vec_dot_q4_K(int64_t n, const void* w, const void* a) {
    return rows4::vec_dot_row<RowK4<false, BlockQ4_K>>(n, w, a);
}

float vec_dot_q5_K(int64_t n, const void* w, const void* a) {
    return rows4::vec_dot_row<RowK4<true, BlockQ5_K>>(n, w, a);
}

void matvec_q4_K(int64_t n, const void* w, size_t row_bytes, int64_t n_rows, const void* a,
                 float* y) {
    rows4::matvec_rows4<RowK4<false, BlockQ4_K>>(n, w, row_bytes, n_rows, a, y);
}

void matvec_q5_K(int64_t n, const void* w, size_t row_bytes, int64_t n_rows, const void* a,
                 float* y) {
    rows4::matvec_rows4<RowK4<true, BlockQ5_K>>(n, w, row_bytes, n_rows, a, y);
}

// ---- Q6_K --------------------------------------------------------------------------

namespace {

// One 128-weight half as two registers of unsigned 6-bit values (q + 32):
// q01 = groups 0 and 1 (low nibbles of ql[0..31], ql[32..63]; qh bits 0-1,
// 2-3), q23 = groups 2 and 3 (high nibbles; qh bits 4-5, 6-7). The qh bits
// are shifted to bits 4-5 per 64-bit lane; bits dragged across bytes by the
// wide shifts land outside the 0x30 mask.
void unpack_q6_half(const uint8_t* ql, const uint8_t* qh, __m512i* q01, __m512i* q23) {
    const __m512i l = load512(ql), h = load_both(qh);
    const __m512i h01 = _mm512_and_si512(_mm512_sllv_epi64(h, halves(4, 2)), bytes(0x30));
    const __m512i h23 = _mm512_and_si512(_mm512_srlv_epi64(h, halves(0, 2)), bytes(0x30));
    // ternlog 0xf8: a | (b & c)
    *q01 = _mm512_ternarylogic_epi64(h01, l, bytes(0x0f), 0xf8);
    *q23 = _mm512_ternarylogic_epi64(h23, _mm512_srli_epi64(l, 4), bytes(0x0f), 0xf8);
}

// One row's running sum over Q6_K blocks.
struct RowQ6 {
    using Block = BlockQ6_K;
    __m512 acc = _mm512_setzero_ps();
    static void prefetch(const BlockQ6_K* x) { prefetch_ahead(x); }
    __attribute__((always_inline)) void add(const BlockQ6_K& x, const BlockQ8_K& y) {
        const __m128i sc8 = load128(x.scales);
        const __m512i sc = scale_pairs(_mm512_cvtepi8_epi32(sc8));
        // The -32 offset of every weight: 32 * sum_j sc_j * bsums_j.
        const __m256i off = scaled_bsums(_mm256_cvtepi8_epi16(sc8), y);
        __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
        for (int h = 0; h < 2; h++) {
            __m512i q01, q23;
            unpack_q6_half(x.ql + 64 * h, x.qh + 32 * h, &q01, &q23);
            const int8_t* ah = y.qs + 128 * h;
            s0 = _mm512_dpwssd_epi32(s0, dpbusd(q01, load512(ah)), scales_by_4(sc, 8 * h));
            s1 = _mm512_dpwssd_epi32(s1, dpbusd(q23, load512(ah + 64)), scales_by_4(sc, 8 * h + 4));
        }
        const __m512i sum = _mm512_sub_epi32(_mm512_add_epi32(s0, s1),
                                             _mm512_zextsi256_si512(_mm256_slli_epi32(off, 5)));
        acc = _mm512_fmadd_ps(_mm512_set1_ps(kFp16ToFp32[x.d] * y.d), _mm512_cvtepi32_ps(sum), acc);
    }
    float total() const { return hsum(acc); }
};

} // namespace

float vec_dot_q6_K(int64_t n, const void* w, const void* a) {
    return rows4::vec_dot_row<RowQ6>(n, w, a);
}

void matvec_q6_K(int64_t n, const void* w, size_t row_bytes, int64_t n_rows, const void* a,
                 float* y) {
    rows4::matvec_rows4<RowQ6>(n, w, row_bytes, n_rows, a, y);
}

// ---- Q2_K / Q3_K ---------------------------------------------------------------------

namespace {

// The four 2-bit groups of one 128-weight half: c01 = groups 0, 1 (bits 0-1
// and 2-3 of the 32 bytes), c23 = groups 2, 3 (bits 4-5, 6-7). The odd
// groups (the high 256 bits) stay in place, 4 q, which saves two of the four
// shifts (no faster measurably, one instruction fewer per 64 weights): their
// lanes of the sums come out 4x, undone once a row by quarter_high(). A lane
// of vpdpbusd stays below 2^15 (4 * 28 * 127 for Q3_K) for vpdpwssd.
void crumbs(const uint8_t* qs, __m512i* c01, __m512i* c23) {
    const __m512i v = load_both(qs);
    const __m512i m = _mm512_inserti64x4(_mm512_set1_epi8(3), _mm256_set1_epi8(12), 1);
    *c01 = _mm512_and_si512(v, m);
    *c23 = _mm512_and_si512(_mm512_srli_epi64(v, 4), m);
}

__m512 quarter_high() {
    return _mm512_insertf32x8(_mm512_set1_ps(1.0f), _mm256_set1_ps(0.25f), 1);
}

// One row's running sum over Q2_K blocks.
struct RowQ2 {
    using Block = BlockQ2_K;
    __m512 acc = _mm512_setzero_ps();
    __m256 accm = _mm256_setzero_ps();
    static void prefetch(const Block* x) { prefetch_ahead(x); }
    __attribute__((always_inline)) void add(const Block& x, const BlockQ8_K& y) {
        const __m128i s = load128(x.scales);
        const __m128i sc8 = _mm_and_si128(s, _mm_set1_epi8(0x0f));
        const __m128i m8 = _mm_and_si128(_mm_srli_epi16(s, 4), _mm_set1_epi8(0x0f));
        const __m256i mins = scaled_bsums(_mm256_cvtepu8_epi16(m8), y);
        const __m512i sc = _mm512_cvtepu8_epi32(sc8); // (sc, 0) pairs already
        __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
        for (int h = 0; h < 2; h++) {
            __m512i c01, c23;
            crumbs(x.qs + 32 * h, &c01, &c23);
            const int8_t* ah = y.qs + 128 * h;
            s0 = _mm512_dpwssd_epi32(s0, dpbusd(c01, load512(ah)), scales_by_4(sc, 8 * h));
            s1 = _mm512_dpwssd_epi32(s1, dpbusd(c23, load512(ah + 64)), scales_by_4(sc, 8 * h + 4));
        }
        const float da = y.d;
        acc = _mm512_fmadd_ps(_mm512_set1_ps(kFp16ToFp32[x.d] * da),
                              _mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1)), acc);
        accm = _mm256_fmadd_ps(_mm256_set1_ps(kFp16ToFp32[x.dmin] * da), _mm256_cvtepi32_ps(mins),
                               accm);
    }
    float total() const { return hsum(_mm512_mul_ps(acc, quarter_high())) - hsum(accm); }
};

// One row's running sum over Q3_K blocks.
struct RowQ3 {
    using Block = BlockQ3_K;
    __m512 acc = _mm512_setzero_ps();
    static void prefetch(const Block* x) { prefetch_ahead(x); }
    __attribute__((always_inline)) void add(const Block& x, const BlockQ8_K& y) {
        const __m128i sc8 = unpack_scales_k3(x.scales);
        const __m512i sc = scale_pairs(_mm512_cvtepi8_epi32(sc8));
        // Weights are stored as q + 4 (0..7): take 4 * sum_j sc_j * bsums_j off.
        const __m256i off = scaled_bsums(_mm256_cvtepi8_epi16(sc8), y);
        const __m512i hm = load_both(x.hmask);
        __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
        for (int h = 0; h < 2; h++) {
            __m512i c01, c23;
            crumbs(x.qs + 32 * h, &c01, &c23);
            // Third bit of group k (k = 0..3 of half h) is bit 4h + k of hmask.
            const int b = 4 * h;
            const __m512i t01 = halves(every_byte(b), every_byte(b + 1));
            const __m512i t23 = halves(every_byte(b + 2), every_byte(b + 3));
            // 4 in the even groups, 16 in the odd ones (kept 4x, see crumbs).
            const __m512i four = _mm512_inserti64x4(bytes(4), _mm256_set1_epi8(16), 1);
            c01 = _mm512_mask_add_epi8(c01, _mm512_test_epi8_mask(hm, t01), c01, four);
            c23 = _mm512_mask_add_epi8(c23, _mm512_test_epi8_mask(hm, t23), c23, four);
            const int8_t* ah = y.qs + 128 * h;
            s0 = _mm512_dpwssd_epi32(s0, dpbusd(c01, load512(ah)), scales_by_4(sc, 8 * h));
            s1 = _mm512_dpwssd_epi32(s1, dpbusd(c23, load512(ah + 64)), scales_by_4(sc, 8 * h + 4));
        }
        const __m512i sum = _mm512_sub_epi32(_mm512_add_epi32(s0, s1),
                                             _mm512_zextsi256_si512(_mm256_slli_epi32(off, 2)));
        acc = _mm512_fmadd_ps(_mm512_set1_ps(kFp16ToFp32[x.d] * y.d), _mm512_cvtepi32_ps(sum), acc);
    }
    float total() const { return hsum(_mm512_mul_ps(acc, quarter_high())); }
};

} // namespace

float vec_dot_q2_K(int64_t n, const void* w, const void* a) {
    return rows4::vec_dot_row<RowQ2>(n, w, a);
}

float vec_dot_q3_K(int64_t n, const void* w, const void* a) {
    return rows4::vec_dot_row<RowQ3>(n, w, a);
}

void matvec_q2_K(int64_t n, const void* w, size_t row_bytes, int64_t n_rows, const void* a,
                 float* y) {
    rows4::matvec_rows4<RowQ2>(n, w, row_bytes, n_rows, a, y);
}

void matvec_q3_K(int64_t n, const void* w, size_t row_bytes, int64_t n_rows, const void* a,
                 float* y) {
    rows4::matvec_rows4<RowQ3>(n, w, row_bytes, n_rows, a, y);
}

// ---- 32-element blocks -------------------------------------------------------------------

namespace {

__m256i unpack_nibbles(const uint8_t* qs) {
    const __m256i b = _mm256_broadcastsi128_si256(load128(qs));
    return _mm256_and_si256(_mm256_srlv_epi64(b, _mm256_setr_epi64x(0, 0, 4, 4)),
                            _mm256_set1_epi8(0x0f));
}

// Nibbles plus 16 where the block's fifth bit is set: q of Q5_0 / Q5_1.
__m256i unpack_five(const uint8_t* qs, const uint8_t* qh) {
    const __m256i q = unpack_nibbles(qs);
    return _mm256_mask_add_epi8(q, static_cast<__mmask32>(load_u32(qh)), q, _mm256_set1_epi8(16));
}

__m256i dpbusd256(__m256i u, __m256i s) {
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
}

// Blocks with a min (x Q8_1): w = d q + m gives d * da * sum(q a) + m * s.
template <typename Block, typename Unpack>
float dot_with_min(int64_t n, const Block* x, const BlockQ8_1* y, Unpack unpack) {
    __m256 acc = _mm256_setzero_ps();
    float min_sum = 0.0f;
    for (int64_t i = 0; i < n / 32; i++) {
        prefetch_ahead(x + i);
        const __m256i s = dpbusd256(unpack(x[i]), load256(y[i].qs));
        const __m256 dd = _mm256_set1_ps(kFp16ToFp32[x[i].d] * kFp16ToFp32[y[i].d]);
        acc = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(s), acc);
        min_sum += kFp16ToFp32[x[i].m] * kFp16ToFp32[y[i].s];
    }
    return hsum(acc) + min_sum;
}

// Blocks against Q8_0, `block_sum` giving a block's eight int32 partial sums.
template <typename Block, typename Sum>
float dot_q8_0_act(int64_t n, const Block* x, const BlockQ8_0* y, Sum block_sum) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    auto block = [&](int64_t b, __m256 acc) {
        prefetch_ahead(x + b);
        const __m256 dd = _mm256_set1_ps(kFp16ToFp32[x[b].d] * kFp16ToFp32[y[b].d]);
        return _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(block_sum(x[b], load256(y[b].qs))), acc);
    };
    int64_t i = 0;
    for (; i + 2 <= n / 32; i += 2) {
        acc0 = block(i, acc0);
        acc1 = block(i + 1, acc1);
    }
    if (i < n / 32) acc0 = block(i, acc0);
    return hsum(_mm256_add_ps(acc0, acc1));
}

} // namespace

float vec_dot_q4_1(int64_t n, const void* w, const void* a) {
    return dot_with_min(n, static_cast<const BlockQ4_1*>(w), static_cast<const BlockQ8_1*>(a),
                        [](const BlockQ4_1& b) { return unpack_nibbles(b.qs); });
}

float vec_dot_q5_1(int64_t n, const void* w, const void* a) {
    return dot_with_min(n, static_cast<const BlockQ5_1*>(w), static_cast<const BlockQ8_1*>(a),
                        [](const BlockQ5_1& b) { return unpack_five(b.qs, b.qh); });
}

// Q5_0: sum (q - 16) a = sum q a - sum 16 a, both with vpdpbusd.
float vec_dot_q5_0(int64_t n, const void* w, const void* a) {
    return dot_q8_0_act(n, static_cast<const BlockQ5_0*>(w), static_cast<const BlockQ8_0*>(a),
                        [](const BlockQ5_0& b, __m256i av) {
                            return _mm256_sub_epi32(dpbusd256(unpack_five(b.qs, b.qh), av),
                                                    dpbusd256(_mm256_set1_epi8(16), av));
                        });
}

// IQ4_NL: one in-lane shuffle looks the 32 levels up in the 16-byte codebook;
// the signed levels go to vpdpbusd as |w| with w's sign moved onto a (exact:
// Q8_0 activations are never -128).
float vec_dot_iq4_nl(int64_t n, const void* w, const void* a) {
    const __m256i book = _mm256_broadcastsi128_si256(load128(kIQ4NL));
    return dot_q8_0_act(n, static_cast<const BlockIQ4_NL*>(w), static_cast<const BlockQ8_0*>(a),
                        [book](const BlockIQ4_NL& b, __m256i av) {
                            const __m256i v = _mm256_shuffle_epi8(book, unpack_nibbles(b.qs));
                            return dpbusd256(_mm256_sign_epi8(v, v), _mm256_sign_epi8(av, v));
                        });
}

// ---- 32-element blocks, four rows at a time -------------------------------------------------
//
// As Q4_0 and Q8_0 do in x86/avx512.cpp: the four rows share the activation
// block's load, its scale and the offset term, which starts vpdpbusd's
// accumulator (-offset * sum(a)), so a row's block costs its unpacking,
// one vpdpbusd, a convert and two float ops. The four rows are one span read
// at four blocks a step and prefetched linearly. A type with a min adds
// m * s per row-block with one more FMA, s (Q8_1's d * sum(q), the
// activation block's, shared by the rows) in lane 0 and zeros elsewhere: one
// uop against two scalar ones.
//
//   Q4_1, Q5_1: unsigned q, min;  Q5_0: unsigned q, offset 16;
//   IQ4_NL: the codebook + 128 (1..241, unsigned), offset 128.

namespace {

// Q4_1 keeps the high nibbles in place (16 q) as Q4_0 does in x86/avx512.cpp,
// saving the shift: lanes 4..7 of its sums come out 16x, undone once a row.
struct Q4_1Rows {
    using Block = BlockQ4_1;
    using Act = BlockQ8_1;
    static constexpr int kOffset = 0;
    static __m256i weights(const Block& x) {
        const __m256i b = _mm256_broadcastsi128_si256(load128(x.qs));
        return _mm256_and_si256(
            b, _mm256_set_m128i(_mm_set1_epi8(static_cast<char>(0xf0)), _mm_set1_epi8(0x0f)));
    }
    static __m256 unscale() {
        return _mm256_setr_ps(1, 1, 1, 1, 1.0f / 16, 1.0f / 16, 1.0f / 16, 1.0f / 16);
    }
    static float one_row(int64_t n, const void* w, const void* a) { return vec_dot_q4_1(n, w, a); }
};
struct Q5_1Rows {
    using Block = BlockQ5_1;
    using Act = BlockQ8_1;
    static constexpr int kOffset = 0;
    static __m256i weights(const Block& x) { return unpack_five(x.qs, x.qh); }
    static __m256 unscale() { return _mm256_set1_ps(1.0f); }
    static float one_row(int64_t n, const void* w, const void* a) { return vec_dot_q5_1(n, w, a); }
};
struct Q5_0Rows {
    using Block = BlockQ5_0;
    using Act = BlockQ8_0;
    static constexpr int kOffset = 16;
    static __m256i weights(const Block& x) { return unpack_five(x.qs, x.qh); }
    static __m256 unscale() { return _mm256_set1_ps(1.0f); }
    static float one_row(int64_t n, const void* w, const void* a) { return vec_dot_q5_0(n, w, a); }
};
struct IQ4NLRows {
    using Block = BlockIQ4_NL;
    using Act = BlockQ8_0;
    static constexpr int kOffset = 128;
    static __m256i weights(const Block& x) {
        const __m256i book = _mm256_add_epi8(_mm256_broadcastsi128_si256(load128(kIQ4NL)),
                                             _mm256_set1_epi8(static_cast<char>(0x80)));
        return _mm256_shuffle_epi8(book, unpack_nibbles(x.qs));
    }
    static __m256 unscale() { return _mm256_set1_ps(1.0f); }
    static float one_row(int64_t n, const void* w, const void* a) {
        return vec_dot_iq4_nl(n, w, a);
    }
};

template <typename R> constexpr bool kHasMin = std::is_same_v<typename R::Act, BlockQ8_1>;

template <typename R>
__attribute__((always_inline)) inline void row_block32(const typename R::Block& x, __m256i start,
                                                       __m256i a, __m256 da, __m256 sa,
                                                       __m256& acc) {
    const __m256i s = _mm256_dpbusd_epi32(start, R::weights(x), a);
    acc = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_broadcast_ss(&kFp16ToFp32[x.d]), da),
                          _mm256_cvtepi32_ps(s), acc);
    if constexpr (kHasMin<R>) {
        acc = _mm256_fmadd_ps(_mm256_broadcast_ss(&kFp16ToFp32[x.m]), sa, acc);
    } else {
        (void)sa;
    }
}

template <typename R>
void matvec_rows4_32(int64_t n, const void* w, size_t row_bytes, int64_t n_rows, const void* a,
                     float* y) {
    using Block = typename R::Block;
    const auto* ya = static_cast<const typename R::Act*>(a);
    const int64_t nb = n / 32;
    const auto* base = static_cast<const uint8_t*>(w);
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
            const __m256i av = load256(ya[i].qs);
            __m256i start = _mm256_setzero_si256();
            if constexpr (R::kOffset != 0)
                start = _mm256_sub_epi32(
                    start, dpbusd256(_mm256_set1_epi8(static_cast<char>(R::kOffset)), av));
            const __m256 da = _mm256_broadcast_ss(&kFp16ToFp32[ya[i].d]);
            // s in lane 0 only (a lane the Q4_1 unscale leaves alone).
            __m256 sa = _mm256_setzero_ps();
            if constexpr (kHasMin<R>)
                sa = _mm256_zextps128_ps256(_mm_load_ss(&kFp16ToFp32[ya[i].s]));
            row_block32<R>(x0[i], start, av, da, sa, c0);
            row_block32<R>(x1[i], start, av, da, sa, c1);
            row_block32<R>(x2[i], start, av, da, sa, c2);
            row_block32<R>(x3[i], start, av, da, sa, c3);
        }
        const __m256 unscale = R::unscale();
        y[r] = hsum(_mm256_mul_ps(c0, unscale));
        y[r + 1] = hsum(_mm256_mul_ps(c1, unscale));
        y[r + 2] = hsum(_mm256_mul_ps(c2, unscale));
        y[r + 3] = hsum(_mm256_mul_ps(c3, unscale));
    }
    for (; r < n_rows; r++) y[r] = R::one_row(n, base + r * row_bytes, a);
}

} // namespace

void matvec_q4_1(int64_t n, const void* w, size_t row_bytes, int64_t n_rows, const void* a,
                 float* y) {
    matvec_rows4_32<Q4_1Rows>(n, w, row_bytes, n_rows, a, y);
}
void matvec_q5_0(int64_t n, const void* w, size_t row_bytes, int64_t n_rows, const void* a,
                 float* y) {
    matvec_rows4_32<Q5_0Rows>(n, w, row_bytes, n_rows, a, y);
}
void matvec_q5_1(int64_t n, const void* w, size_t row_bytes, int64_t n_rows, const void* a,
                 float* y) {
    matvec_rows4_32<Q5_1Rows>(n, w, row_bytes, n_rows, a, y);
}
void matvec_iq4_nl(int64_t n, const void* w, size_t row_bytes, int64_t n_rows, const void* a,
                   float* y) {
    matvec_rows4_32<IQ4NLRows>(n, w, row_bytes, n_rows, a, y);
}

// ---- Q8_K activations ---------------------------------------------------------------------

namespace {

// max_ps returns its second operand when the first is NaN: NaN inputs are
// skipped like std::max skips them in the reference.
float block_amax(const float* x) {
    __m512 m = _mm512_setzero_ps();
    for (int k = 0; k < QK_K; k += 16) m = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(x + k)), m);
    return _mm512_reduce_max_ps(m);
}

void quantize_block_q8_K(const float* x, BlockQ8_K* out) {
    const float amax = block_amax(x);
    const float iscale = amax != 0.0f ? 127.0f / amax : 0.0f;
    if (!std::isfinite(iscale) || iscale == 0.0f) {
        std::memset(out, 0, sizeof *out);
        return;
    }
    out->d = amax / 127.0f;
    const __m512 vs = _mm512_set1_ps(iscale);
    for (int g = 0; g < QK_K / 16; g++) {
        __m512 r = _mm512_roundscale_ps(_mm512_mul_ps(_mm512_loadu_ps(x + 16 * g), vs),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        // Clamp in the reference's order (a NaN becomes -127 there and here).
        r = _mm512_min_ps(_mm512_max_ps(r, _mm512_set1_ps(-127.0f)), _mm512_set1_ps(127.0f));
        const __m512i q = _mm512_cvtps_epi32(r);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out->qs + 16 * g), _mm512_cvtepi32_epi8(q));
        out->bsums[g] = static_cast<int16_t>(_mm512_reduce_add_epi32(q));
    }
}

} // namespace

void quantize_row_q8_K(const float* src, void* dst, int64_t n) {
    auto* b = static_cast<BlockQ8_K*>(dst);
    for (int64_t i = 0; i < n / QK_K; i++) quantize_block_q8_K(src + i * QK_K, b + i);
}

// ---- dequantize ----------------------------------------------------------------------------

namespace {

// 16 unsigned bytes -> fma(dl, q, -ml), rounded like the reference.
void store_fma_u8(__m128i q, float dl, float ml, float* out) {
    _mm512_storeu_ps(out, _mm512_fmsub_ps(_mm512_set1_ps(dl),
                                          _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(q)),
                                          _mm512_set1_ps(ml)));
}

} // namespace

void dequantize_row_q4_K(const void* src, float* dst, int64_t n) {
    const auto* b = static_cast<const BlockQ4_K*>(src);
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    for (int64_t i = 0; i < n / QK_K; i++) {
        uint8_t sm[16];
        _mm_storeu_si128(reinterpret_cast<__m128i*>(sm), unpack_scales_k4(b[i].scales));
        const float d = kFp16ToFp32[b[i].d], dmin = kFp16ToFp32[b[i].dmin];
        for (int c = 0; c < 4; c++) {
            const __m256i q = load256(b[i].qs + 32 * c);
            const __m256i part[2] = {_mm256_and_si256(q, m4),
                                     _mm256_and_si256(_mm256_srli_epi16(q, 4), m4)};
            for (int k = 0; k < 2; k++) {
                const int j = 2 * c + k;
                const float dl = d * static_cast<float>(sm[j]);
                const float ml = dmin * static_cast<float>(sm[8 + j]);
                float* out = dst + i * QK_K + 32 * j;
                store_fma_u8(_mm256_castsi256_si128(part[k]), dl, ml, out);
                store_fma_u8(_mm256_extracti128_si256(part[k], 1), dl, ml, out + 16);
            }
        }
    }
}

// Q6_K: the offset comes off in the integers, then one multiply per weight,
// which rounds like the reference's fma(dl, q, -0).
void dequantize_row_q6_K(const void* src, float* dst, int64_t n) {
    const auto* b = static_cast<const BlockQ6_K*>(src);
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = kFp16ToFp32[b[i].d];
        for (int h = 0; h < 2; h++) {
            __m512i q[2];
            unpack_q6_half(b[i].ql + 64 * h, b[i].qh + 32 * h, &q[0], &q[1]);
            for (int r = 0; r < 2; r++) {
                alignas(64) int8_t v[64];
                _mm512_store_si512(v, _mm512_sub_epi8(q[r], bytes(32)));
                for (int g = 0; g < 4; g++) {
                    const int sub = 8 * h + 4 * r + g;
                    const __m128i p = load128(v + 16 * g);
                    _mm512_storeu_ps(
                        dst + i * QK_K + 16 * sub,
                        _mm512_mul_ps(_mm512_set1_ps(d * static_cast<float>(b[i].scales[sub])),
                                      _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(p))));
                }
            }
        }
    }
}

// The other types through the shared unpackers (x86/dequant_k.h), 16
// floats a store.
namespace {

struct Store512 {
    static void u8_fma(__m128i q, float dl, float ml, float* out) { store_fma_u8(q, dl, ml, out); }
    static void i8_mul(__m128i q, float dl, float* out) {
        _mm512_storeu_ps(
            out, _mm512_mul_ps(_mm512_set1_ps(dl), _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q))));
    }
};

} // namespace

void dequantize_row_q2_K(const void* src, float* dst, int64_t n) {
    dq::q2_K<Store512>(src, dst, n);
}
void dequantize_row_q3_K(const void* src, float* dst, int64_t n) {
    dq::q3_K<Store512>(src, dst, n);
}
void dequantize_row_q5_K(const void* src, float* dst, int64_t n) {
    dq::q5_K<Store512>(src, dst, n);
}
void dequantize_row_q4_1(const void* src, float* dst, int64_t n) {
    dq::q4_1<Store512>(src, dst, n);
}
void dequantize_row_q5_0(const void* src, float* dst, int64_t n) {
    dq::q5_0<Store512>(src, dst, n);
}
void dequantize_row_q5_1(const void* src, float* dst, int64_t n) {
    dq::q5_1<Store512>(src, dst, n);
}
void dequantize_row_iq4_nl(const void* src, float* dst, int64_t n) {
    dq::iq4_nl<Store512>(src, dst, n);
}

} // namespace gl::avx512_k
