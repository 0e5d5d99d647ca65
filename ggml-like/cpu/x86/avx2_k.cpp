// AVX2 kernels for the types of blocks_k.h (compiled with -mavx2 -mfma -mf16c,
// reached only after dispatch.cpp has checked the CPU).
//
// Shape of every dot product: unpack the weights to unsigned bytes, multiply
// with the int8 activations by maddubs (u8 x s8 -> pairs summed into s16; no
// pair can saturate: at most 2 * 63 * 128 for 6-bit weights), and widen with
// madd against the sub-block's scale as int16, which applies the scale and
// sums to int32 in one uop. Each super-block's integer sum is exact and is
// scaled by d_w * d_a in float once. Offsets and mins never touch the weights
// a second time: they are a 16-wide dot of the scales (or mins) with the
// activation block sums Q8_K carries.
//
// Generation streams each weight row once from DRAM, so the loops only need
// to outrun memory; the per super-block work is kept to a few dozen uops and
// the scale broadcasts (the only shuffles) to one per 32 weights.
#include "ggml-like/blocks_k.h"
#include "ggml-like/cpu/rows4.h"
#include "ggml-like/cpu/x86/k_scales.h"
#include "ggml-like/cpu/x86/dequant_k.h"

#include <immintrin.h>

#include <cmath>
#include <cstring>
#include <type_traits>

namespace gl::avx2_k {

namespace {

float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
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

__m256i bytes(int v) {
    return _mm256_set1_epi8(static_cast<char>(v));
}

// int16 element j of each 128-bit lane, broadcast across that lane (shuffle
// control for _mm256_shuffle_epi8); lo and hi pick for the two lanes.
__m256i pick16(int lo, int hi) {
    return _mm256_set_m128i(_mm_set1_epi16(static_cast<short>((2 * hi + 1) << 8 | 2 * hi)),
                            _mm_set1_epi16(static_cast<short>((2 * lo + 1) << 8 | 2 * lo)));
}

// Eight int32 partial sums of w * a for signed bytes w, a (a != -128): maddubs
// wants one unsigned operand, so it gets |w| and a carrying w's sign.
__m256i dot_i8(__m256i w, __m256i a) {
    const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

// Sub-block sums of a Q8_K block weighted by 16 int16 scales: 8 int32 lanes
// whose total is sum_j scale[j] * bsums[j].
__m256i scaled_bsums(__m256i scale16, const BlockQ8_K& y) {
    return _mm256_madd_epi16(scale16, load256(y.bsums));
}

// ---- Q4_K / Q5_K --------------------------------------------------------------------

// One 64-weight chunk c: unsigned lo (sub-block 2c) and hi (2c + 1) weights
// against their activations, scaled by sc as int16. Adds to two int32 sums.
void chunk_k4(__m256i lo, __m256i hi, const int8_t* a, __m256i sc16, int c, __m256i* s0,
              __m256i* s1) {
    const __m256i plo = _mm256_maddubs_epi16(lo, load256(a));
    const __m256i phi = _mm256_maddubs_epi16(hi, load256(a + 32));
    const __m256i sc_lo = _mm256_shuffle_epi8(sc16, pick16(2 * c, 2 * c));
    const __m256i sc_hi = _mm256_shuffle_epi8(sc16, pick16(2 * c + 1, 2 * c + 1));
    *s0 = _mm256_add_epi32(*s0, _mm256_madd_epi16(plo, sc_lo));
    *s1 = _mm256_add_epi32(*s1, _mm256_madd_epi16(phi, sc_hi));
}

// acc += d * sum(sc q a) and accm += dmin * sum(m * bsums) for one super-block
// of Q4_K (qh == nullptr) or Q5_K.
template <bool kFive>
__attribute__((always_inline)) inline void
block_k4(uint16_t d, uint16_t dmin, const uint8_t* scales, const uint8_t* qh, const uint8_t* qs,
         const BlockQ8_K& y, __m256* acc, __m256* accm) {
    const __m128i sm = unpack_scales_k4(scales);
    const __m256i sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sm));
    // m_j pairs with bsums 2j and 2j + 1: widen the mins with each repeated.
    const __m128i m8 = _mm_unpackhi_epi8(sm, sm);
    const __m256i mins = scaled_bsums(_mm256_cvtepu8_epi16(m8), y);

    const __m256i m4 = bytes(0x0f);
    __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
    __m256i hb = kFive ? load256(qh) : _mm256_setzero_si256();
    for (int c = 0; c < 4; c++) {
        const __m256i q = load256(qs + 32 * c);
        __m256i lo = _mm256_and_si256(q, m4);
        __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
        if (kFive) {
            // Bits 2c and 2c + 1 of qh (shifted down to bits 0 and 1) become bit 4.
            lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi16(hb, 4), bytes(0x10)));
            hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_slli_epi16(hb, 3), bytes(0x10)));
            hb = _mm256_srli_epi16(hb, 2);
        }
        chunk_k4(lo, hi, y.qs + 64 * c, sc16, c, &s0, &s1);
    }
    const __m256 dd = _mm256_set1_ps(kFp16ToFp32[d] * y.d);
    const __m256 dm = _mm256_set1_ps(kFp16ToFp32[dmin] * y.d);
    *acc = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(_mm256_add_epi32(s0, s1)), *acc);
    *accm = _mm256_fmadd_ps(dm, _mm256_cvtepi32_ps(mins), *accm);
}

// One row's running sums over Q4_K or Q5_K blocks.
template <bool kFive, typename B> struct RowK4 {
    using Block = B;
    __m256 acc = _mm256_setzero_ps(), accm = _mm256_setzero_ps();
    static void prefetch(const Block* x) { prefetch_ahead(x); }
    __attribute__((always_inline)) void add(const Block& x, const BlockQ8_K& y) {
        const uint8_t* qh = nullptr;
        if constexpr (kFive) qh = x.qh;
        block_k4<kFive>(x.d, x.dmin, x.scales, qh, x.qs, y, &acc, &accm);
    }
    float total() const { return hsum(_mm256_sub_ps(acc, accm)); }
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

// ---- Q6_K ---------------------------------------------------------------------------

namespace {

// The four 32-weight groups of one 128-weight half, 6-bit unsigned (q + 32).
// Group k's low 4 bits come from ql[32 (k & 1)..] (high nibble for k >= 2),
// its top two from bits 2k, 2k + 1 of qh, moved to bits 4, 5. The 16-bit
// shifts drag bits across bytes, but only into positions the masks clear.
void unpack_q6_half(const uint8_t* ql, const uint8_t* qh, __m256i q[4]) {
    const __m256i m4 = bytes(0x0f), m30 = bytes(0x30);
    const __m256i l0 = load256(ql), l1 = load256(ql + 32), h = load256(qh);
    q[0] =
        _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(h, 4), m30));
    q[1] =
        _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(h, 2), m30));
    q[2] =
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(h, m30));
    q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                           _mm256_and_si256(_mm256_srli_epi16(h, 2), m30));
}

// sum over one 128-weight half of scale * q * a, for 16-weight sub-blocks
// whose int16 scales (eight, this half's) sit in both lanes of sc16: group k
// covers sub-blocks 2k (low lane) and 2k + 1 (high lane).
__m256i half_16(const __m256i q[4], const int8_t* a, __m256i sc16, __m256i sum) {
    for (int k = 0; k < 4; k++) {
        const __m256i p = _mm256_maddubs_epi16(q[k], load256(a + 32 * k));
        sum = _mm256_add_epi32(
            sum, _mm256_madd_epi16(p, _mm256_shuffle_epi8(sc16, pick16(2 * k, 2 * k + 1))));
    }
    return sum;
}

// Sixteen int16 scales from signed bytes, and each half's eight in both lanes.
__m256i half_scales(__m128i sc8, int h) {
    const __m128i s = h == 0 ? sc8 : _mm_srli_si128(sc8, 8);
    return _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(s));
}

// One row's running sum over Q6_K blocks.
struct RowQ6 {
    using Block = BlockQ6_K;
    __m256 acc = _mm256_setzero_ps();
    static void prefetch(const Block* x) { prefetch_ahead(x); }
    __attribute__((always_inline)) void add(const Block& x, const BlockQ8_K& y) {
        const __m128i sc8 = load128(x.scales);
        // The -32 offset of every weight: 32 * sum_j sc_j * bsums_j.
        const __m256i off = scaled_bsums(_mm256_cvtepi8_epi16(sc8), y);
        __m256i sum = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            __m256i q[4];
            unpack_q6_half(x.ql + 64 * h, x.qh + 32 * h, q);
            sum = half_16(q, y.qs + 128 * h, half_scales(sc8, h), sum);
        }
        sum = _mm256_sub_epi32(sum, _mm256_slli_epi32(off, 5));
        const __m256 dd = _mm256_set1_ps(kFp16ToFp32[x.d] * y.d);
        acc = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(sum), acc);
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

// ---- Q2_K / Q3_K ----------------------------------------------------------------------

namespace {

// One row's running sum over Q2_K blocks.
struct RowQ2 {
    using Block = BlockQ2_K;
    __m256 acc = _mm256_setzero_ps(), accm = _mm256_setzero_ps();
    static void prefetch(const Block* x) { prefetch_ahead(x); }
    __attribute__((always_inline)) void add(const Block& x, const BlockQ8_K& y) {
        const __m256i m3 = bytes(3);
        const __m128i s = load128(x.scales);
        const __m128i sc8 = _mm_and_si128(s, _mm_set1_epi8(0x0f));
        const __m128i m8 = _mm_and_si128(_mm_srli_epi16(s, 4), _mm_set1_epi8(0x0f));
        const __m256i mins = scaled_bsums(_mm256_cvtepu8_epi16(m8), y);
        __m256i sum = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            const __m256i qv = load256(x.qs + 32 * h);
            const __m256i q[4] = {_mm256_and_si256(qv, m3),
                                  _mm256_and_si256(_mm256_srli_epi16(qv, 2), m3),
                                  _mm256_and_si256(_mm256_srli_epi16(qv, 4), m3),
                                  _mm256_and_si256(_mm256_srli_epi16(qv, 6), m3)};
            sum = half_16(q, y.qs + 128 * h, half_scales(sc8, h), sum);
        }
        const __m256 dd = _mm256_set1_ps(kFp16ToFp32[x.d] * y.d);
        const __m256 dm = _mm256_set1_ps(kFp16ToFp32[x.dmin] * y.d);
        acc = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(sum), acc);
        accm = _mm256_fmadd_ps(dm, _mm256_cvtepi32_ps(mins), accm);
    }
    float total() const { return hsum(_mm256_sub_ps(acc, accm)); }
};

// One row's running sum over Q3_K blocks.
struct RowQ3 {
    using Block = BlockQ3_K;
    __m256 acc = _mm256_setzero_ps();
    static void prefetch(const Block* x) { prefetch_ahead(x); }
    __attribute__((always_inline)) void add(const Block& x, const BlockQ8_K& y) {
        const __m256i m3 = bytes(3), m4 = bytes(4);
        const __m128i sc8 = unpack_scales_k3(x.scales);
        // Weights are stored as q + 4 (0..7): take 4 * sum_j sc_j * bsums_j off.
        const __m256i off = scaled_bsums(_mm256_cvtepi8_epi16(sc8), y);
        __m256i hb = load256(x.hmask); // bit 4h + k of byte l, shifted down as we go
        __m256i sum = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            const __m256i qv = load256(x.qs + 32 * h);
            __m256i q[4];
            for (int k = 0; k < 4; k++) {
                const __m256i crumb = _mm256_and_si256(_mm256_srli_epi16(qv, 2 * k), m3);
                q[k] = _mm256_or_si256(crumb, _mm256_and_si256(_mm256_slli_epi16(hb, 2), m4));
                hb = _mm256_srli_epi16(hb, 1);
            }
            sum = half_16(q, y.qs + 128 * h, half_scales(sc8, h), sum);
        }
        sum = _mm256_sub_epi32(sum, _mm256_slli_epi32(off, 2));
        const __m256 dd = _mm256_set1_ps(kFp16ToFp32[x.d] * y.d);
        acc = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(sum), acc);
    }
    float total() const { return hsum(acc); }
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

// ---- 32-element blocks ------------------------------------------------------------------

namespace {

// A 32-block's nibbles as bytes in element order (low nibbles are elements
// 0..15, high ones 16..31): the 16 bytes go to both lanes, the upper shifted.
__m256i unpack_nibbles(const uint8_t* qs) {
    const __m256i b = _mm256_broadcastsi128_si256(load128(qs));
    return _mm256_and_si256(_mm256_srlv_epi64(b, _mm256_setr_epi64x(0, 0, 4, 4)), bytes(0x0f));
}

// 0xff in byte j where bit j of the 32-bit word is set: each byte gets its
// word byte (j / 8) and is tested against its own bit.
__m256i expand_bits(const uint8_t* qh) {
    const __m256i v = _mm256_set1_epi32(static_cast<int>(load_u32(qh)));
    const __m256i spread = _mm256_shuffle_epi8(
        v, _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303));
    const __m256i bit = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ull));
    return _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
}

// Blocks with a min (x Q8_1): w = d q + m gives d * da * sum(q a) + m * s.
template <typename Block, typename Unpack>
float dot_with_min(int64_t n, const Block* x, const BlockQ8_1* y, Unpack unpack) {
    __m256 acc = _mm256_setzero_ps();
    float min_sum = 0.0f;
    for (int64_t i = 0; i < n / 32; i++) {
        prefetch_ahead(x + i);
        const __m256i p = _mm256_maddubs_epi16(unpack(x[i]), load256(y[i].qs));
        const __m256i s = _mm256_madd_epi16(p, _mm256_set1_epi16(1));
        const __m256 dd = _mm256_set1_ps(kFp16ToFp32[x[i].d] * kFp16ToFp32[y[i].d]);
        acc = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(s), acc);
        min_sum += kFp16ToFp32[x[i].m] * kFp16ToFp32[y[i].s];
    }
    return hsum(acc) + min_sum;
}

// Blocks of signed weights (x Q8_0).
template <typename Block, typename Unpack>
float dot_signed(int64_t n, const Block* x, const BlockQ8_0* y, Unpack unpack) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int64_t i = 0;
    auto block = [&](int64_t b, __m256 acc) {
        prefetch_ahead(x + b);
        const __m256i s = dot_i8(unpack(x[b]), load256(y[b].qs));
        const __m256 dd = _mm256_set1_ps(kFp16ToFp32[x[b].d] * kFp16ToFp32[y[b].d]);
        return _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(s), acc);
    };
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
                        [](const BlockQ5_1& b) {
                            const __m256i hi = _mm256_and_si256(expand_bits(b.qh), bytes(0x10));
                            return _mm256_or_si256(unpack_nibbles(b.qs), hi);
                        });
}

// Q5_0: q - 16 as a signed byte is the nibble with 0xf0 or'ed in where the
// fifth bit is clear.
float vec_dot_q5_0(int64_t n, const void* w, const void* a) {
    return dot_signed(n, static_cast<const BlockQ5_0*>(w), static_cast<const BlockQ8_0*>(a),
                      [](const BlockQ5_0& b) {
                          const __m256i neg = _mm256_andnot_si256(expand_bits(b.qh), bytes(0xf0));
                          return _mm256_or_si256(unpack_nibbles(b.qs), neg);
                      });
}

// IQ4_NL: the codebook is 16 bytes, so one in-lane shuffle looks all 32 up.
float vec_dot_iq4_nl(int64_t n, const void* w, const void* a) {
    const __m256i book = _mm256_broadcastsi128_si256(load128(kIQ4NL));
    return dot_signed(
        n, static_cast<const BlockIQ4_NL*>(w), static_cast<const BlockQ8_0*>(a),
        [book](const BlockIQ4_NL& b) { return _mm256_shuffle_epi8(book, unpack_nibbles(b.qs)); });
}

// ---- 32-element blocks, four rows at a time -------------------------------------------------
//
// As Q4_0 does in x86/avx2.cpp: the four rows share the activation block's
// load, its scale and the offset term (offset * a as maddubs pairs, taken off
// each row's pairs before they are widened), and stream as one span
// prefetched linearly. A type with a min adds m * s per row-block with one
// more FMA, s (the activation block's) in lane 0 and zeros elsewhere.
// maddubs pairs cannot saturate: unsigned q <= 31 gives at most 2 * 31 * 127;
// IQ4_NL goes in as |w| with w's sign on a (at most 2 * 127 * 127).

namespace {

template <typename B, typename A, int Offset> struct Rows32 {
    using Block = B;
    using Act = A;
    static constexpr int kOffset = Offset;
};
struct Q4_1Rows : Rows32<BlockQ4_1, BlockQ8_1, 0> {
    static __m256i pairs(const Block& x, __m256i a) {
        return _mm256_maddubs_epi16(unpack_nibbles(x.qs), a);
    }
    static float one_row(int64_t n, const void* w, const void* a) { return vec_dot_q4_1(n, w, a); }
};
__m256i five_bits(const uint8_t* qs, const uint8_t* qh) {
    return _mm256_or_si256(unpack_nibbles(qs), _mm256_and_si256(expand_bits(qh), bytes(0x10)));
}
struct Q5_1Rows : Rows32<BlockQ5_1, BlockQ8_1, 0> {
    static __m256i pairs(const Block& x, __m256i a) {
        return _mm256_maddubs_epi16(five_bits(x.qs, x.qh), a);
    }
    static float one_row(int64_t n, const void* w, const void* a) { return vec_dot_q5_1(n, w, a); }
};
struct Q5_0Rows : Rows32<BlockQ5_0, BlockQ8_0, 16> {
    static __m256i pairs(const Block& x, __m256i a) {
        return _mm256_maddubs_epi16(five_bits(x.qs, x.qh), a);
    }
    static float one_row(int64_t n, const void* w, const void* a) { return vec_dot_q5_0(n, w, a); }
};
struct IQ4NLRows : Rows32<BlockIQ4_NL, BlockQ8_0, 0> {
    static __m256i pairs(const Block& x, __m256i a) {
        const __m256i book = _mm256_broadcastsi128_si256(load128(kIQ4NL));
        const __m256i v = _mm256_shuffle_epi8(book, unpack_nibbles(x.qs));
        return _mm256_maddubs_epi16(_mm256_sign_epi8(v, v), _mm256_sign_epi8(a, v));
    }
    static float one_row(int64_t n, const void* w, const void* a) {
        return vec_dot_iq4_nl(n, w, a);
    }
};

template <typename R> constexpr bool kHasMin = std::is_same_v<typename R::Act, BlockQ8_1>;

template <typename R>
__attribute__((always_inline)) inline void row_block32(const typename R::Block& x, __m256i a,
                                                       __m256i offset, __m256 da, __m256 sa,
                                                       __m256& acc) {
    __m256i p = R::pairs(x, a);
    if constexpr (R::kOffset != 0) p = _mm256_sub_epi16(p, offset);
    const __m256i s = _mm256_madd_epi16(p, _mm256_set1_epi16(1));
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
            __m256i offset = _mm256_setzero_si256();
            if constexpr (R::kOffset != 0) offset = _mm256_maddubs_epi16(bytes(R::kOffset), av);
            const __m256 da = _mm256_broadcast_ss(&kFp16ToFp32[ya[i].d]);
            // s in lane 0 only (a lane the Q4_1 unscale leaves alone).
            __m256 sa = _mm256_setzero_ps();
            if constexpr (kHasMin<R>)
                sa = _mm256_zextps128_ps256(_mm_load_ss(&kFp16ToFp32[ya[i].s]));
            row_block32<R>(x0[i], av, offset, da, sa, c0);
            row_block32<R>(x1[i], av, offset, da, sa, c1);
            row_block32<R>(x2[i], av, offset, da, sa, c2);
            row_block32<R>(x3[i], av, offset, da, sa, c3);
        }
        y[r] = hsum(c0);
        y[r + 1] = hsum(c1);
        y[r + 2] = hsum(c2);
        y[r + 3] = hsum(c3);
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

// ---- Q8_K activations --------------------------------------------------------------------

namespace {

// Largest |x| of 256 floats. max_ps returns its second operand when the
// first is NaN, so a NaN input is skipped exactly as std::max skips it in
// the reference (which keeps its running max).
float block_amax(const float* x) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_setzero_ps();
    for (int k = 0; k < QK_K; k += 8)
        m = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + k)), m);
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    return _mm_cvtss_f32(m4);
}

// Eight floats times iscale, rounded to nearest even, clamped to +-127 in the
// reference's order (a NaN becomes -127 there and here).
__m256i quant8(const float* x, __m256 iscale) {
    __m256 r = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x), iscale),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    r = _mm256_min_ps(_mm256_max_ps(r, _mm256_set1_ps(-127.0f)), _mm256_set1_ps(127.0f));
    return _mm256_cvtps_epi32(r);
}

void quantize_block_q8_K(const float* x, BlockQ8_K* out) {
    const float amax = block_amax(x);
    const float iscale = amax != 0.0f ? 127.0f / amax : 0.0f;
    if (!std::isfinite(iscale) || iscale == 0.0f) {
        std::memset(out, 0, sizeof *out);
        return;
    }
    out->d = amax / 127.0f;
    const __m256 vs = _mm256_set1_ps(iscale);
    for (int c = 0; c < QK_K; c += 32) {
        const __m256i q0 = quant8(x + c, vs), q1 = quant8(x + c + 8, vs);
        const __m256i q2 = quant8(x + c + 16, vs), q3 = quant8(x + c + 24, vs);
        // The packs interleave 128-bit lanes; the permute restores the order.
        const __m256i p =
            _mm256_packs_epi16(_mm256_packs_epi32(q0, q1), _mm256_packs_epi32(q2, q3));
        _mm256_storeu_si256(
            reinterpret_cast<__m256i*>(out->qs + c),
            _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
        // Two sums of 16: a = q0 + q1, b = q2 + q3, each reduced across lanes.
        const __m256i h = _mm256_hadd_epi32(_mm256_add_epi32(q0, q1), _mm256_add_epi32(q2, q3));
        const __m256i h2 = _mm256_hadd_epi32(h, h); // lanes: a_lo, b_lo, . , . | a_hi, b_hi
        const __m128i s =
            _mm_add_epi32(_mm256_castsi256_si128(h2), _mm256_extracti128_si256(h2, 1));
        out->bsums[c / 16] = static_cast<int16_t>(_mm_cvtsi128_si32(s));
        out->bsums[c / 16 + 1] = static_cast<int16_t>(_mm_extract_epi32(s, 1));
    }
}

} // namespace

void quantize_row_q8_K(const float* src, void* dst, int64_t n) {
    auto* b = static_cast<BlockQ8_K*>(dst);
    for (int64_t i = 0; i < n / QK_K; i++) quantize_block_q8_K(src + i * QK_K, b + i);
}

// ---- dequantize ----------------------------------------------------------------------------

namespace {

// 32 unsigned bytes -> fma(dl, q, -ml), 8 at a time; the reference rounds the
// same way (see ref/quants_k.cpp).
void store_fma_u8(__m256i q, float dl, float ml, float* out) {
    const __m256 vd = _mm256_set1_ps(dl), vm = _mm256_set1_ps(ml);
    const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
    const __m128i part[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
    for (int k = 0; k < 4; k++)
        _mm256_storeu_ps(
            out + 8 * k,
            _mm256_fmsub_ps(vd, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(part[k])), vm));
}

} // namespace

void dequantize_row_q4_K(const void* src, float* dst, int64_t n) {
    const auto* b = static_cast<const BlockQ4_K*>(src);
    for (int64_t i = 0; i < n / QK_K; i++) {
        uint8_t sm[16];
        _mm_storeu_si128(reinterpret_cast<__m128i*>(sm), unpack_scales_k4(b[i].scales));
        const float d = kFp16ToFp32[b[i].d], dmin = kFp16ToFp32[b[i].dmin];
        float* out = dst + i * QK_K;
        for (int c = 0; c < 4; c++) {
            const __m256i q = load256(b[i].qs + 32 * c);
            const __m256i lo = _mm256_and_si256(q, bytes(0x0f));
            const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), bytes(0x0f));
            const int j = 2 * c;
            store_fma_u8(lo, d * static_cast<float>(sm[j]), dmin * static_cast<float>(sm[8 + j]),
                         out + 64 * c);
            store_fma_u8(hi, d * static_cast<float>(sm[j + 1]),
                         dmin * static_cast<float>(sm[9 + j]), out + 64 * c + 32);
        }
    }
}

// Q6_K: (q + 32) * dl - 32 dl would round differently from the reference's
// dl * q, so the offset is taken off in the integers first.
void dequantize_row_q6_K(const void* src, float* dst, int64_t n) {
    const auto* b = static_cast<const BlockQ6_K*>(src);
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = kFp16ToFp32[b[i].d];
        for (int h = 0; h < 2; h++) {
            __m256i q[4];
            unpack_q6_half(b[i].ql + 64 * h, b[i].qh + 32 * h, q);
            for (int k = 0; k < 4; k++) {
                const __m256i v = _mm256_sub_epi8(q[k], bytes(32));
                const __m128i part[2] = {_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1)};
                for (int g = 0; g < 2; g++) {
                    const int sub = 8 * h + 2 * k + g;
                    const __m256 vd = _mm256_set1_ps(d * static_cast<float>(b[i].scales[sub]));
                    float* out = dst + i * QK_K + 16 * sub;
                    const __m128i p = part[g];
                    _mm256_storeu_ps(
                        out, _mm256_mul_ps(vd, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(p))));
                    _mm256_storeu_ps(out + 8,
                                     _mm256_mul_ps(vd, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                                                           _mm_srli_si128(p, 8)))));
                }
            }
        }
    }
}

// The other types through the shared unpackers (x86/dequant_k.h), 8 floats
// a store.
namespace {

struct Store256 {
    static void u8_fma(__m128i q, float dl, float ml, float* out) {
        const __m256 vd = _mm256_set1_ps(dl), vm = _mm256_set1_ps(ml);
        _mm256_storeu_ps(out, _mm256_fmsub_ps(vd, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(q)), vm));
        _mm256_storeu_ps(
            out + 8, _mm256_fmsub_ps(
                         vd, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(q, 8))), vm));
    }
    static void i8_mul(__m128i q, float dl, float* out) {
        const __m256 vd = _mm256_set1_ps(dl);
        _mm256_storeu_ps(out, _mm256_mul_ps(vd, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q))));
        _mm256_storeu_ps(
            out + 8,
            _mm256_mul_ps(vd, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q, 8)))));
    }
};

} // namespace

void dequantize_row_q2_K(const void* src, float* dst, int64_t n) {
    dq::q2_K<Store256>(src, dst, n);
}
void dequantize_row_q3_K(const void* src, float* dst, int64_t n) {
    dq::q3_K<Store256>(src, dst, n);
}
void dequantize_row_q5_K(const void* src, float* dst, int64_t n) {
    dq::q5_K<Store256>(src, dst, n);
}
void dequantize_row_q4_1(const void* src, float* dst, int64_t n) {
    dq::q4_1<Store256>(src, dst, n);
}
void dequantize_row_q5_0(const void* src, float* dst, int64_t n) {
    dq::q5_0<Store256>(src, dst, n);
}
void dequantize_row_q5_1(const void* src, float* dst, int64_t n) {
    dq::q5_1<Store256>(src, dst, n);
}
void dequantize_row_iq4_nl(const void* src, float* dst, int64_t n) {
    dq::iq4_nl<Store256>(src, dst, n);
}

} // namespace gl::avx2_k
