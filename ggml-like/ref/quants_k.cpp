// gl::ref for the types of blocks_k.h: dequantize, dot products, quantizers.
//
// Every weight format is first unpacked into one plain form, "sub-blocks of
// integers with integer scales" (Unpacked below):
//
//     w[i] = d * sc[i / len] * q[i] - dmin * m[i / len]
//
// so the bit layouts live in one unpack/pack pair per type, and dequantize,
// the dot products and the quantizers share the arithmetic. The dot products
// sum each (super-)block exactly in integers, then add it with a float FMA
// per block (the block-chain arithmetic, kernels.h, which the GEMM gives bit
// for bit).
#include "ggml-like/blocks_k.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

namespace gl {

namespace {

float half(uint16_t h) {
    return kFp16ToFp32[h];
}

// ---- the plain form -----------------------------------------------------------

// One block as integers: element i is d * sc[i / len] * q[i] - dmin * m[i / len].
// n is the block's element count (32 or 256); len the sub-block length.
struct Unpacked {
    int n = 0, len = 0;
    float d = 0.0f, dmin = 0.0f;
    int q[QK_K] = {};
    int sc[QK_K / 16] = {};
    int m[QK_K / 16] = {};
};

// The SIMD dequantizers must give the same bits, so the rounding is pinned
// down: the two scale products, then one fused multiply-add. (An explicit fma
// because compilers may contract a * b - c into one on their own in a file
// built with FMA enabled, and not in this one.)
void dequant_unpacked(const Unpacked& u, float* y) {
    for (int j = 0; j < u.n / u.len; j++) {
        const float dl = u.d * static_cast<float>(u.sc[j]);
        const float ml = u.dmin * static_cast<float>(u.m[j]);
        for (int l = 0; l < u.len; l++) {
            const int i = j * u.len + l;
            y[i] = std::fma(dl, static_cast<float>(u.q[i]), -ml);
        }
    }
}

// sum_i w[i] * a[i] over a row of unpacked super-blocks and Q8_K
// activations, in the block-chain arithmetic (kernels.h): exact integer sums
// per sub-block times their integer scales (qsum) and the mins' term (msum)
// per super-block, then y = fma(d * da, qsum, y) and, for the types with
// mins, y = fma(-(dmin * da), msum, y). Both sums fit int32.
void dot_unpacked(const Unpacked& u, const int8_t* a, float da, bool mins, float& y) {
    int32_t qsum = 0, msum = 0;
    for (int j = 0; j < u.n / u.len; j++) {
        int32_t qa = 0, as = 0;
        for (int l = 0; l < u.len; l++) {
            const int i = j * u.len + l;
            qa += u.q[i] * a[i];
            as += a[i];
        }
        qsum += u.sc[j] * qa;
        msum += u.m[j] * as;
    }
    y = std::fma(u.d * da, static_cast<float>(qsum), y);
    if (mins) y = std::fma(-(u.dmin * da), static_cast<float>(msum), y);
}

// ---- K-quant layouts ------------------------------------------------------------

// Scale j (0..7) and min j of the 12-byte 6-bit packing of Q4_K/Q5_K.
void scale_min_k4(const uint8_t* s, int j, int* sc, int* m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

void pack_scale_min_k4(const int* sc, const int* m, uint8_t* s) {
    for (int j = 0; j < 4; j++) {
        s[j] = static_cast<uint8_t>(sc[j] | ((sc[j + 4] >> 4) << 6));
        s[j + 4] = static_cast<uint8_t>(m[j] | ((m[j + 4] >> 4) << 6));
        s[j + 8] = static_cast<uint8_t>((sc[j + 4] & 0x0f) | ((m[j + 4] & 0x0f) << 4));
    }
}

// Q3_K's sixteen 6-bit scales (stored with +32), as unsigned 0..63.
int scale_k3(const uint8_t* s, int j) {
    const int lo = j < 8 ? (s[j] & 0x0f) : (s[j - 8] >> 4);
    const int hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
    return lo | (hi << 4);
}

void pack_scale_k3(const int* v, uint8_t* s) {
    std::memset(s, 0, kScaleK);
    for (int j = 0; j < 16; j++) {
        s[j % 8] |= static_cast<uint8_t>((v[j] & 0x0f) << (j < 8 ? 0 : 4));
        s[8 + j % 4] |= static_cast<uint8_t>((v[j] >> 4) << (2 * (j / 4)));
    }
}

// 2-bit fields of Q2_K/Q3_K (and the low 4 / top 2 of Q6_K): in half h of the
// super-block, element 128 h + 32 k + l sits at bits 2k.. of byte 32 h + l.
int crumb(const uint8_t* qs, int i) {
    const int h = i / 128, k = (i % 128) / 32, l = i % 32;
    return (qs[32 * h + l] >> (2 * k)) & 3;
}

void unpack_q4_K(const BlockQ4_K& b, Unpacked& u) {
    u.n = QK_K;
    u.len = 32;
    u.d = half(b.d);
    u.dmin = half(b.dmin);
    for (int j = 0; j < 8; j++) scale_min_k4(b.scales, j, &u.sc[j], &u.m[j]);
    for (int i = 0; i < QK_K; i++) {
        const int c = i / 64, l = i % 32, hi = (i / 32) & 1;
        u.q[i] = (b.qs[32 * c + l] >> (4 * hi)) & 0x0f;
    }
}

void unpack_q5_K(const BlockQ5_K& b, Unpacked& u) {
    u.n = QK_K;
    u.len = 32;
    u.d = half(b.d);
    u.dmin = half(b.dmin);
    for (int j = 0; j < 8; j++) scale_min_k4(b.scales, j, &u.sc[j], &u.m[j]);
    for (int i = 0; i < QK_K; i++) {
        const int c = i / 64, l = i % 32, hi = (i / 32) & 1;
        const int high_bit = (b.qh[l] >> (i / 32)) & 1;
        u.q[i] = ((b.qs[32 * c + l] >> (4 * hi)) & 0x0f) | (high_bit << 4);
    }
}

void unpack_q6_K(const BlockQ6_K& b, Unpacked& u) {
    u.n = QK_K;
    u.len = 16;
    u.d = half(b.d);
    for (int j = 0; j < 16; j++) u.sc[j] = b.scales[j];
    for (int i = 0; i < QK_K; i++) {
        const int h = i / 128, k = (i % 128) / 32, l = i % 32;
        const int low = (b.ql[64 * h + l + 32 * (k & 1)] >> (4 * (k >> 1))) & 0x0f;
        u.q[i] = (low | (crumb(b.qh, i) << 4)) - 32;
    }
}

void unpack_q2_K(const BlockQ2_K& b, Unpacked& u) {
    u.n = QK_K;
    u.len = 16;
    u.d = half(b.d);
    u.dmin = half(b.dmin);
    for (int j = 0; j < 16; j++) {
        u.sc[j] = b.scales[j] & 0x0f;
        u.m[j] = b.scales[j] >> 4;
    }
    for (int i = 0; i < QK_K; i++) u.q[i] = crumb(b.qs, i);
}

void unpack_q3_K(const BlockQ3_K& b, Unpacked& u) {
    u.n = QK_K;
    u.len = 16;
    u.d = half(b.d);
    for (int j = 0; j < 16; j++) u.sc[j] = scale_k3(b.scales, j) - 32;
    for (int i = 0; i < QK_K; i++) {
        const int high = (b.hmask[i % 32] >> (i / 32)) & 1;
        u.q[i] = (crumb(b.qs, i) | (high << 2)) - 4;
    }
}

// ---- 32-element layouts ------------------------------------------------------------

// Element j of a 32-block's nibbles: low nibble of byte j for j < 16, else high of j - 16.
int nibble32(const uint8_t* qs, int j) {
    return j < 16 ? (qs[j] & 0x0f) : (qs[j - 16] >> 4);
}

uint32_t load_u32(const uint8_t* p) {
    uint32_t v;
    std::memcpy(&v, p, sizeof v);
    return v;
}

// The single-sub-block blocks use sc = 1 and fold the offset into q (Q5_0)
// or into the min (Q4_1, Q5_1: w = d q + m, i.e. dmin = -m with m[0] = 1).
void unpack_q4_1(const BlockQ4_1& b, Unpacked& u) {
    u.n = u.len = 32;
    u.d = half(b.d);
    u.dmin = -half(b.m);
    u.sc[0] = u.m[0] = 1;
    for (int j = 0; j < 32; j++) u.q[j] = nibble32(b.qs, j);
}

void unpack_q5_0(const BlockQ5_0& b, Unpacked& u) {
    u.n = u.len = 32;
    u.d = half(b.d);
    u.sc[0] = 1;
    const uint32_t qh = load_u32(b.qh);
    for (int j = 0; j < 32; j++) u.q[j] = (nibble32(b.qs, j) | (((qh >> j) & 1) << 4)) - 16;
}

void unpack_q5_1(const BlockQ5_1& b, Unpacked& u) {
    u.n = u.len = 32;
    u.d = half(b.d);
    u.dmin = -half(b.m);
    u.sc[0] = u.m[0] = 1;
    const uint32_t qh = load_u32(b.qh);
    for (int j = 0; j < 32; j++) u.q[j] = nibble32(b.qs, j) | (((qh >> j) & 1) << 4);
}

void unpack_iq4_nl(const BlockIQ4_NL& b, Unpacked& u) {
    u.n = u.len = 32;
    u.d = half(b.d);
    u.sc[0] = 1;
    for (int j = 0; j < 32; j++) u.q[j] = kIQ4NL[nibble32(b.qs, j)];
}

// Row walkers: unpack every block of a row. The block size and the unpacker
// are template arguments so each instance has the plain DequantizeFn
// signature and can sit in the kernel table.
template <typename Block, int64_t BS, auto Unpack>
void dequant_row(const void* src, float* dst, int64_t n) {
    const auto* b = static_cast<const Block*>(src);
    Unpacked u;
    for (int64_t i = 0; i < n / BS; i++) {
        Unpack(b[i], u);
        dequant_unpacked(u, dst + i * BS);
    }
}

// ---- activations -------------------------------------------------------------------

// Q8_K: d = amax / 127 (a float, no fp16 rounding) and q = round-to-nearest-
// even(x * (127 / amax)). The SIMD quantizers compute the same two scalars
// and the same products, so their bytes are identical to these. A block too
// small for 127 / amax to be finite is stored as zero.
void quantize_block_q8_K(const float* x, BlockQ8_K* out) {
    float amax = 0.0f;
    for (int j = 0; j < QK_K; j++) amax = std::max(amax, std::fabs(x[j]));
    const float iscale = amax != 0.0f ? 127.0f / amax : 0.0f;
    if (!std::isfinite(iscale) || iscale == 0.0f) {
        std::memset(out, 0, sizeof *out);
        return;
    }
    out->d = amax / 127.0f;
    for (int j = 0; j < QK_K; j++) {
        const float q = std::nearbyint(x[j] * iscale);
        out->qs[j] = static_cast<int8_t>(std::min(127.0f, std::max(-127.0f, q)));
    }
    for (int g = 0; g < QK_K / 16; g++) {
        int s = 0;
        for (int l = 0; l < 16; l++) s += out->qs[16 * g + l];
        out->bsums[g] = static_cast<int16_t>(s);
    }
}

// Q8_1 is Q8_0 (same d and q, hence the same bytes as the Q8_0 quantizer)
// plus s = d * sum(q).
void quantize_block_q8_1(const float* x, BlockQ8_1* out) {
    BlockQ8_0 b;
    ref::quantize_row(Type::Q8_0, x, &b, QK8_0);
    int sum = 0;
    for (int j = 0; j < QK8_0; j++) sum += b.qs[j];
    out->d = b.d;
    out->s = fp32_to_fp16(half(b.d) * static_cast<float>(sum));
    std::memcpy(out->qs, b.qs, sizeof out->qs);
}

void dequant_q8_K(const void* src, float* dst, int64_t n) {
    const auto* b = static_cast<const BlockQ8_K*>(src);
    for (int64_t i = 0; i < n / QK_K; i++)
        for (int j = 0; j < QK_K; j++) dst[i * QK_K + j] = b[i].d * static_cast<float>(b[i].qs[j]);
}

void dequant_q8_1(const void* src, float* dst, int64_t n) {
    const auto* b = static_cast<const BlockQ8_1*>(src);
    for (int64_t i = 0; i < n / 32; i++)
        for (int j = 0; j < 32; j++)
            dst[i * 32 + j] = half(b[i].d) * static_cast<float>(b[i].qs[j]);
}

// ---- dot products ------------------------------------------------------------------

// Q2_K (with mins) and Q3_K (without).
template <typename Block, auto Unpack> float dot_k(int64_t n, const void* w, const void* a) {
    const auto* x = static_cast<const Block*>(w);
    const auto* y = static_cast<const BlockQ8_K*>(a);
    Unpacked u;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        Unpack(x[i], u);
        dot_unpacked(u, y[i].qs, y[i].d, !std::is_same_v<Block, BlockQ3_K>, sum);
    }
    return sum;
}

// Q4_K, Q5_K and Q6_K carry most of the weights of common files, and on CPUs
// without a SIMD table the reference is the kernel, so these read the bits
// directly instead of through Unpacked (several times faster; the tests
// check them against the float dot of the Unpacked-based dequantization).
// Q4_K and Q5_K: Q5_K adds a fifth bit from qh (bit 2c + hi of qh[l]).
template <typename Block> float dot_q45_K(int64_t n, const void* w, const void* a) {
    constexpr bool kFifth = std::is_same_v<Block, BlockQ5_K>;
    const auto* x = static_cast<const Block*>(w);
    const auto* y = static_cast<const BlockQ8_K*>(a);
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int64_t qsum = 0, msum = 0;
        for (int c = 0; c < 4; c++) {
            const uint8_t* q = x[i].qs + 32 * c;
            const int8_t* av = y[i].qs + 64 * c;
            int32_t lo = 0, hi = 0, alo = 0, ahi = 0;
            for (int l = 0; l < 32; l++) {
                int ql = q[l] & 0x0f, qh = q[l] >> 4;
                if constexpr (kFifth) {
                    ql |= ((x[i].qh[l] >> (2 * c)) & 1) << 4;
                    qh |= ((x[i].qh[l] >> (2 * c + 1)) & 1) << 4;
                }
                lo += ql * av[l];
                hi += qh * av[l + 32];
                alo += av[l];
                ahi += av[l + 32];
            }
            int sc0, m0, sc1, m1;
            scale_min_k4(x[i].scales, 2 * c, &sc0, &m0);
            scale_min_k4(x[i].scales, 2 * c + 1, &sc1, &m1);
            qsum += sc0 * lo + sc1 * hi;
            msum += m0 * alo + m1 * ahi;
        }
        // The block-chain arithmetic (kernels.h): both sums fit int32.
        sum = std::fma(half(x[i].d) * y[i].d, static_cast<float>(static_cast<int32_t>(qsum)), sum);
        sum = std::fma(-(half(x[i].dmin) * y[i].d), static_cast<float>(static_cast<int32_t>(msum)),
                       sum);
    }
    return sum;
}

float dot_q6_K(int64_t n, const void* w, const void* a) {
    const auto* x = static_cast<const BlockQ6_K*>(w);
    const auto* y = static_cast<const BlockQ8_K*>(a);
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int64_t qsum = 0;
        for (int h = 0; h < 2; h++) {
            const uint8_t* ql = x[i].ql + 64 * h;
            const uint8_t* qh = x[i].qh + 32 * h;
            for (int k = 0; k < 4; k++) {
                // Group k: 32 weights, sub-blocks 8h + 2k (l < 16) and + 1.
                const int8_t* av = y[i].qs + 128 * h + 32 * k;
                const uint8_t* lowb = ql + 32 * (k & 1);
                const int shift = 4 * (k >> 1);
                for (int g = 0; g < 2; g++) {
                    int32_t s = 0;
                    for (int l = 16 * g; l < 16 * g + 16; l++) {
                        const int low = (lowb[l] >> shift) & 0x0f, top = (qh[l] >> (2 * k)) & 3;
                        s += ((low | (top << 4)) - 32) * av[l];
                    }
                    qsum += x[i].scales[8 * h + 2 * k + g] * s;
                }
            }
        }
        sum = std::fma(half(x[i].d) * y[i].d, static_cast<float>(static_cast<int32_t>(qsum)), sum);
    }
    return sum;
}

// 32-blocks against Q8_0 (no min) or Q8_1 (min: its s must equal d * sum(q)
// up to fp16 rounding, and the reference uses s as stored, like the kernels).
template <typename Block, auto Unpack>
float dot_q8_0_act(int64_t n, const void* w, const void* a) {
    const auto* x = static_cast<const Block*>(w);
    const auto* y = static_cast<const BlockQ8_0*>(a);
    Unpacked u;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / 32; i++) {
        Unpack(x[i], u);
        // The block-chain arithmetic (kernels.h); sc = 1 and no min here.
        int32_t qa = 0;
        for (int j = 0; j < 32; j++) qa += u.q[j] * y[i].qs[j];
        sum = std::fma(u.d * half(y[i].d), static_cast<float>(qa), sum);
    }
    return sum;
}

template <typename Block, auto Unpack>
float dot_q8_1_act(int64_t n, const void* w, const void* a) {
    const auto* x = static_cast<const Block*>(w);
    const auto* y = static_cast<const BlockQ8_1*>(a);
    Unpacked u;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / 32; i++) {
        Unpack(x[i], u);
        int32_t qa = 0;
        for (int j = 0; j < 32; j++) qa += u.q[j] * y[i].qs[j];
        // w = d q + m: d * da * sum(q a) + m * s, in the block-chain
        // arithmetic (kernels.h), s as the block stores it (fp16 of
        // da * sum(a), as every kernel of these types reads it); m = -dmin.
        sum = std::fma(u.d * half(y[i].d), static_cast<float>(qa), sum);
        sum = std::fma(-u.dmin, half(y[i].s), sum);
    }
    return sum;
}

} // namespace

// ---- quantizers from float ------------------------------------------------------------
//
// The search, shared by all formats: fit each sub-block with a float scale
// (and, for the formats with mins, a float min) by trying a small set of
// candidate scales around the one that spans the sub-block's range, choosing
// q for each candidate and refitting scale (and min) by least squares for that
// choice of q; keep the fit with the smallest squared error. Then quantize the
// sub-block scales against the super-block scale (6 bits, or 4 for Q2_K) and
// finally choose every q against the scales exactly as the decoder will see
// them, so each value's error is at most half a step unless it lies outside
// the sub-block's representable range.

namespace {

constexpr int kCandidates = 10; // candidate scales on each side of the range fit
constexpr float kCandidateStep = 0.1f;

int nearest(float v) {
    return static_cast<int>(std::nearbyint(v));
}

int clampi(int v, int lo, int hi) {
    return std::min(hi, std::max(lo, v));
}

// x ~ s * q + b with q in 0..qmax and b <= 0 (the formats store a
// non-negative min subtracted from the value). Returns s >= 0, min = -b >= 0.
void fit_scale_min(const float* x, int len, int qmax, float* s_out, float* min_out) {
    float lo = 0.0f, hi = x[0];
    for (int l = 0; l < len; l++) {
        lo = std::min(lo, x[l]);
        hi = std::max(hi, x[l]);
    }
    *s_out = 0.0f;
    *min_out = -lo;
    if (hi <= lo) return; // all values equal lo <= 0: the min alone is exact
    float best_err = INFINITY;
    for (int c = -kCandidates; c <= kCandidates; c++) {
        const float iscale = (static_cast<float>(qmax) + kCandidateStep * c) / (hi - lo);
        double sq = 0, sq2 = 0, sx = 0, sqx = 0;
        int q[QK_K];
        for (int l = 0; l < len; l++) {
            q[l] = clampi(nearest((x[l] - lo) * iscale), 0, qmax);
            sq += q[l];
            sq2 += static_cast<double>(q[l]) * q[l];
            sx += x[l];
            sqx += static_cast<double>(q[l]) * x[l];
        }
        // Least squares for (s, b); if that wants b > 0 (or all q are equal,
        // leaving b free), refit with b = 0.
        const double det = len * sq2 - sq * sq;
        double s = 0, b = 1;
        if (det > 0) {
            s = (len * sqx - sq * sx) / det;
            b = (sx - s * sq) / len;
        }
        if (b > 0) {
            if (sq2 == 0) continue;
            b = 0;
            s = sqx / sq2;
        }
        if (s <= 0) continue;
        double err = 0;
        for (int l = 0; l < len; l++) {
            const double e = s * q[l] + b - x[l];
            err += e * e;
        }
        if (err < best_err) {
            best_err = static_cast<float>(err);
            *s_out = static_cast<float>(s);
            *min_out = static_cast<float>(-b);
        }
    }
}

// x ~ s * q with q in -qneg..qpos (s may be negative: the value of largest
// magnitude goes to the wide end, -qneg, of the asymmetric range).
float fit_scale(const float* x, int len, int qneg, int qpos) {
    float max = 0.0f;
    for (int l = 0; l < len; l++)
        if (std::fabs(x[l]) > std::fabs(max)) max = x[l];
    if (max == 0.0f) return 0.0f;
    float best_s = max / static_cast<float>(-qneg), best_err = INFINITY;
    for (int c = -kCandidates; c <= kCandidates; c++) {
        const float iscale = -(static_cast<float>(qneg) + kCandidateStep * c) / max;
        double sq2 = 0, sqx = 0;
        int q[QK_K];
        for (int l = 0; l < len; l++) {
            q[l] = clampi(nearest(x[l] * iscale), -qneg, qpos);
            sq2 += static_cast<double>(q[l]) * q[l];
            sqx += static_cast<double>(q[l]) * x[l];
        }
        if (sq2 == 0) continue;
        const double s = sqx / sq2;
        double err = 0;
        for (int l = 0; l < len; l++) {
            const double e = s * q[l] - x[l];
            err += e * e;
        }
        if (err < best_err) {
            best_err = static_cast<float>(err);
            best_s = static_cast<float>(s);
        }
    }
    return best_s;
}

// Quantizes non-negative sub-block values v[] to 0..vmax against one fp16
// super-block scale (max(v) / vmax). Returns the stored fp16.
uint16_t quantize_scales(const float* v, int count, int vmax, int* out) {
    float max = 0.0f;
    for (int j = 0; j < count; j++) max = std::max(max, v[j]);
    const uint16_t dh = fp32_to_fp16(max / static_cast<float>(vmax));
    const float d = half(dh);
    for (int j = 0; j < count; j++) out[j] = d > 0.0f ? clampi(nearest(v[j] / d), 0, vmax) : 0;
    return dh;
}

// Same for signed scales, to -vneg..vpos against max(|v|) / vpos.
uint16_t quantize_signed_scales(const float* v, int count, int vneg, int vpos, int* out) {
    float amax = 0.0f;
    for (int j = 0; j < count; j++) amax = std::max(amax, std::fabs(v[j]));
    const uint16_t dh = fp32_to_fp16(amax / static_cast<float>(vpos));
    const float d = half(dh);
    for (int j = 0; j < count; j++) out[j] = d > 0.0f ? clampi(nearest(v[j] / d), -vneg, vpos) : 0;
    return dh;
}

// Chooses every q of an Unpacked whose scales are final: the nearest level to
// x against d * sc - dmin * m as the decoder computes them (same float ops).
void choose_q(const float* x, Unpacked& u, int qlo, int qhi) {
    for (int j = 0; j < u.n / u.len; j++) {
        const float dl = u.d * static_cast<float>(u.sc[j]);
        const float ml = u.dmin * static_cast<float>(u.m[j]);
        for (int l = 0; l < u.len; l++) {
            const int i = j * u.len + l;
            u.q[i] = dl != 0.0f ? clampi(nearest((x[i] + ml) / dl), qlo, qhi) : 0;
        }
    }
}

// Asymmetric K-quant (Q2_K, Q4_K, Q5_K): per sub-block scale and min, both
// quantized to 0..smax against fp16 d and dmin.
void quantize_asym_k(const float* x, int len, int qmax, int smax, Unpacked& u, uint16_t* dh,
                     uint16_t* dminh) {
    float s[16], mn[16];
    const int subs = QK_K / len;
    for (int j = 0; j < subs; j++) fit_scale_min(x + j * len, len, qmax, &s[j], &mn[j]);
    u.n = QK_K;
    u.len = len;
    *dh = quantize_scales(s, subs, smax, u.sc);
    *dminh = quantize_scales(mn, subs, smax, u.m);
    u.d = half(*dh);
    u.dmin = half(*dminh);
    choose_q(x, u, 0, qmax);
}

// Symmetric K-quant (Q3_K, Q6_K): q in -qneg..qpos, signed sub-block scales.
void quantize_sym_k(const float* x, int len, int qneg, int qpos, int sneg, int spos, Unpacked& u,
                    uint16_t* dh) {
    float s[16];
    const int subs = QK_K / len;
    for (int j = 0; j < subs; j++) s[j] = fit_scale(x + j * len, len, qneg, qpos);
    u.n = QK_K;
    u.len = len;
    *dh = quantize_signed_scales(s, subs, sneg, spos, u.sc);
    u.d = half(*dh);
    choose_q(x, u, -qneg, qpos);
}

void quantize_block_q4_K(const float* x, BlockQ4_K* b) {
    Unpacked u;
    quantize_asym_k(x, 32, 15, 63, u, &b->d, &b->dmin);
    pack_scale_min_k4(u.sc, u.m, b->scales);
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++)
            b->qs[32 * c + l] = static_cast<uint8_t>(u.q[64 * c + l] | (u.q[64 * c + 32 + l] << 4));
}

void quantize_block_q5_K(const float* x, BlockQ5_K* b) {
    Unpacked u;
    quantize_asym_k(x, 32, 31, 63, u, &b->d, &b->dmin);
    pack_scale_min_k4(u.sc, u.m, b->scales);
    std::memset(b->qh, 0, sizeof b->qh);
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            const int lo = u.q[64 * c + l], hi = u.q[64 * c + 32 + l];
            b->qs[32 * c + l] = static_cast<uint8_t>((lo & 0x0f) | ((hi & 0x0f) << 4));
        }
    for (int i = 0; i < QK_K; i++) b->qh[i % 32] |= static_cast<uint8_t>((u.q[i] >> 4) << (i / 32));
}

// Puts the 2-bit field of element i (layout of crumb()).
void put_crumb(uint8_t* qs, int i, int v) {
    const int h = i / 128, k = (i % 128) / 32, l = i % 32;
    qs[32 * h + l] |= static_cast<uint8_t>((v & 3) << (2 * k));
}

void quantize_block_q6_K(const float* x, BlockQ6_K* b) {
    Unpacked u;
    // The int8 sub-block scales are kept within +-127, like the quants' -32..31
    // kept symmetric enough for either sign of scale.
    quantize_sym_k(x, 16, 32, 31, 127, 127, u, &b->d);
    for (int j = 0; j < 16; j++) b->scales[j] = static_cast<int8_t>(u.sc[j]);
    std::memset(b->ql, 0, sizeof b->ql);
    std::memset(b->qh, 0, sizeof b->qh);
    for (int i = 0; i < QK_K; i++) {
        const int q = u.q[i] + 32;
        const int h = i / 128, k = (i % 128) / 32, l = i % 32;
        b->ql[64 * h + l + 32 * (k & 1)] |= static_cast<uint8_t>((q & 0x0f) << (4 * (k >> 1)));
        put_crumb(b->qh, i, q >> 4);
    }
}

void quantize_block_q2_K(const float* x, BlockQ2_K* b) {
    Unpacked u;
    quantize_asym_k(x, 16, 3, 15, u, &b->d, &b->dmin);
    for (int j = 0; j < 16; j++) b->scales[j] = static_cast<uint8_t>(u.sc[j] | (u.m[j] << 4));
    std::memset(b->qs, 0, sizeof b->qs);
    for (int i = 0; i < QK_K; i++) put_crumb(b->qs, i, u.q[i]);
}

void quantize_block_q3_K(const float* x, BlockQ3_K* b) {
    Unpacked u;
    quantize_sym_k(x, 16, 4, 3, 32, 31, u, &b->d);
    int v[16];
    for (int j = 0; j < 16; j++) v[j] = u.sc[j] + 32;
    pack_scale_k3(v, b->scales);
    std::memset(b->qs, 0, sizeof b->qs);
    std::memset(b->hmask, 0, sizeof b->hmask);
    for (int i = 0; i < QK_K; i++) {
        const int q = u.q[i] + 4;
        put_crumb(b->qs, i, q);
        b->hmask[i % 32] |= static_cast<uint8_t>((q >> 2) << (i / 32));
    }
}

// ---- 32-element quantizers ----------------------------------------------------------

void pack_nibbles32(const int* q, uint8_t* qs) {
    for (int j = 0; j < 16; j++)
        qs[j] = static_cast<uint8_t>((q[j] & 0x0f) | ((q[j + 16] & 0x0f) << 4));
}

uint32_t high_bits32(const int* q) {
    uint32_t qh = 0;
    for (int j = 0; j < 32; j++) qh |= static_cast<uint32_t>((q[j] >> 4) & 1) << j;
    return qh;
}

// Q4_1 / Q5_1: w = d q + m spanning [min, max] of the block; m is the block
// minimum (of either sign), d = (max - min) / qmax, q chosen against both as
// stored.
void quantize_min_block(const float* x, int qmax, uint16_t* dh, uint16_t* mh, int* q) {
    float lo = x[0], hi = x[0];
    for (int j = 1; j < 32; j++) {
        lo = std::min(lo, x[j]);
        hi = std::max(hi, x[j]);
    }
    *dh = fp32_to_fp16((hi - lo) / static_cast<float>(qmax));
    *mh = fp32_to_fp16(lo);
    const float d = half(*dh), m = half(*mh);
    for (int j = 0; j < 32; j++) q[j] = d != 0.0f ? clampi(nearest((x[j] - m) / d), 0, qmax) : 0;
}

void quantize_block_q4_1(const float* x, BlockQ4_1* b) {
    int q[32];
    quantize_min_block(x, 15, &b->d, &b->m, q);
    pack_nibbles32(q, b->qs);
}

void quantize_block_q5_1(const float* x, BlockQ5_1* b) {
    int q[32];
    quantize_min_block(x, 31, &b->d, &b->m, q);
    pack_nibbles32(q, b->qs);
    const uint32_t qh = high_bits32(q);
    std::memcpy(b->qh, &qh, sizeof qh);
}

// Q5_0 like Q4_0: the signed value of largest magnitude maps to q = 0 (-16 d).
void quantize_block_q5_0(const float* x, BlockQ5_0* b) {
    float max = 0.0f;
    for (int j = 0; j < 32; j++)
        if (std::fabs(x[j]) > std::fabs(max)) max = x[j];
    b->d = fp32_to_fp16(max / -16.0f);
    const float d = half(b->d);
    int q[32];
    for (int j = 0; j < 32; j++) q[j] = d != 0.0f ? clampi(nearest(x[j] / d) + 16, 0, 31) : 16;
    pack_nibbles32(q, b->qs);
    const uint32_t qh = high_bits32(q);
    std::memcpy(b->qh, &qh, sizeof qh);
}

// Index of the codebook level nearest to v (levels ascend).
int nearest_iq4(float v) {
    int best = 0;
    for (int k = 1; k < 16; k++)
        if (std::fabs(v - kIQ4NL[k]) < std::fabs(v - kIQ4NL[best])) best = k;
    return best;
}

// IQ4_NL: a scale search like the K-quants' (candidates around mapping the
// largest-magnitude value to the -127 end, each refit by least squares).
void quantize_block_iq4_nl(const float* x, BlockIQ4_NL* b) {
    float max = 0.0f;
    for (int j = 0; j < 32; j++)
        if (std::fabs(x[j]) > std::fabs(max)) max = x[j];
    float best_d = max / -127.0f, best_err = INFINITY;
    for (int c = -kCandidates; c <= kCandidates && max != 0.0f; c++) {
        const float d = max / (-127.0f + 2.0f * c);
        double sk2 = 0, skx = 0;
        for (int j = 0; j < 32; j++) {
            const int k = kIQ4NL[nearest_iq4(x[j] / d)];
            sk2 += static_cast<double>(k) * k;
            skx += static_cast<double>(k) * x[j];
        }
        const double ls = skx / sk2;
        double err = 0;
        for (int j = 0; j < 32; j++) {
            const double e = ls * kIQ4NL[nearest_iq4(static_cast<float>(x[j] / ls))] - x[j];
            err += e * e;
        }
        if (err < best_err) {
            best_err = static_cast<float>(err);
            best_d = static_cast<float>(ls);
        }
    }
    b->d = fp32_to_fp16(best_d);
    const float d = half(b->d);
    int q[32];
    for (int j = 0; j < 32; j++) q[j] = d != 0.0f ? nearest_iq4(x[j] / d) : 8;
    pack_nibbles32(q, b->qs);
}

template <typename Block, int64_t BS, auto Quant>
void quantize_row_blocks(const float* src, void* dst, int64_t n) {
    auto* b = static_cast<Block*>(dst);
    for (int64_t i = 0; i < n / BS; i++) Quant(src + i * BS, b + i);
}

// ---- the kernel table -----------------------------------------------------------------

struct Row {
    Type type;
    ref::RowKernels k;
};

// A weight type's row: Block is its struct, Unpack reads one into the plain
// form, Quant writes one from floats, Dot is its dot product against its
// vec_dot_type. The block size comes from the type table, and the struct is
// checked against it, so the row cannot disagree with a file's layout.
template <Type T, typename Block, auto Unpack, auto Quant, VecDotFn Dot> constexpr Row weight_row() {
    static_assert(sizeof(Block) == type_info(T).type_size, "block struct and type table disagree");
    constexpr int64_t bs = type_info(T).block_size;
    return {T, {&dequant_row<Block, bs, Unpack>, &quantize_row_blocks<Block, bs, Quant>, Dot}};
}

// An activation type's row: converted to and from floats, no dot product.
template <Type T, typename Block, DequantizeFn Dequant, auto Quant> constexpr Row activation_row() {
    static_assert(sizeof(Block) == type_info(T).type_size, "block struct and type table disagree");
    return {T, {Dequant, &quantize_row_blocks<Block, type_info(T).block_size, Quant>, nullptr}};
}

// clang-format off
constexpr Row kRows[] = {
    weight_row<Type::Q2_K, BlockQ2_K, unpack_q2_K, quantize_block_q2_K, &dot_k<BlockQ2_K, unpack_q2_K>>(),
    weight_row<Type::Q3_K, BlockQ3_K, unpack_q3_K, quantize_block_q3_K, &dot_k<BlockQ3_K, unpack_q3_K>>(),
    weight_row<Type::Q4_K, BlockQ4_K, unpack_q4_K, quantize_block_q4_K, &dot_q45_K<BlockQ4_K>>(),
    weight_row<Type::Q5_K, BlockQ5_K, unpack_q5_K, quantize_block_q5_K, &dot_q45_K<BlockQ5_K>>(),
    weight_row<Type::Q6_K, BlockQ6_K, unpack_q6_K, quantize_block_q6_K, &dot_q6_K>(),
    weight_row<Type::Q4_1, BlockQ4_1, unpack_q4_1, quantize_block_q4_1, &dot_q8_1_act<BlockQ4_1, unpack_q4_1>>(),
    weight_row<Type::Q5_0, BlockQ5_0, unpack_q5_0, quantize_block_q5_0, &dot_q8_0_act<BlockQ5_0, unpack_q5_0>>(),
    weight_row<Type::Q5_1, BlockQ5_1, unpack_q5_1, quantize_block_q5_1, &dot_q8_1_act<BlockQ5_1, unpack_q5_1>>(),
    weight_row<Type::IQ4_NL, BlockIQ4_NL, unpack_iq4_nl, quantize_block_iq4_nl,
               &dot_q8_0_act<BlockIQ4_NL, unpack_iq4_nl>>(),
    activation_row<Type::Q8_K, BlockQ8_K, dequant_q8_K, quantize_block_q8_K>(),
    activation_row<Type::Q8_1, BlockQ8_1, dequant_q8_1, quantize_block_q8_1>(),
};
// clang-format on

constexpr std::array<ref::RowKernels, kTypeIdLimit> make_table() {
    std::array<ref::RowKernels, kTypeIdLimit> t{};
    for (const Row& r : kRows) t[static_cast<uint32_t>(r.type)] = r.k;
    return t;
}

} // namespace

// constinit: filled by the compiler, so no start-up order to worry about.
constinit const std::array<ref::RowKernels, kTypeIdLimit> ref::kRowKernelsK = make_table();

} // namespace gl
