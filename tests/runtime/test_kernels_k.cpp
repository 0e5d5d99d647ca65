// Tests for the types of blocks_k.h: hand-built blocks against values worked
// out from the layout, every kernel table against gl::ref, the activation
// quantizers bit for bit, and the float quantizers' round trip.
#include <doctest/doctest.h>

#include "ggml-like/blocks_k.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace {

using gl::Type;

constexpr uint32_t id(Type t) {
    return static_cast<uint32_t>(t);
}

// The compute types whose reference kernels are ref/quants_k.cpp's (the
// others are test_kernels.cpp's), in GL_COMPUTE_TYPES order.
const std::vector<Type> kTypesK = [] {
    std::vector<Type> v;
    for (Type t : gl::kComputeTypes)
        if (gl::ref::kRowKernelsK[id(t)].vec_dot) v.push_back(t);
    return v;
}();

bool is_k(Type t) {
    return gl::type_info(t).block_size == gl::QK_K;
}

// Row lengths: 1, 3, 5, 7 and 17 super-blocks for every type (odd counts run
// the unrolled loops' remainders), plus odd numbers of 32-blocks for the
// 32-element types.
std::vector<int64_t> sizes_for(Type t) {
    std::vector<int64_t> n = {256, 3 * 256, 5 * 256, 7 * 256, 17 * 256};
    if (!is_k(t)) n.insert(n.end(), {32, 3 * 32, 5 * 32, 7 * 32});
    return n;
}

// ---- table accessors (a null entry means "use gl::ref") -----------------------------

float t_vec_dot(const gl::KernelTable& k, Type w, int64_t n, const void* wp, const void* ap) {
    auto f = k.vec_dot[id(w)];
    return f ? f(n, wp, ap) : gl::ref::vec_dot(w, n, wp, ap);
}
void t_quantize(const gl::KernelTable& k, Type t, const float* src, void* dst, int64_t n) {
    auto f = k.quantize_row[id(t)];
    f ? f(src, dst, n) : gl::ref::quantize_row(t, src, dst, n);
}
void t_dequantize(const gl::KernelTable& k, Type t, const void* src, float* dst, int64_t n) {
    auto f = k.dequantize_row[id(t)];
    f ? f(src, dst, n) : gl::ref::dequantize_row(t, src, dst, n);
}

template <typename F> void for_each_table(F f) {
    REQUIRE(gl::kernel_table_count() >= 1);
    for (int i = 0; i < gl::kernel_table_count(); i++) {
        const gl::KernelTable& k = gl::kernel_table(i);
        INFO("kernel table ", std::string(k.isa));
        f(k);
    }
}

// Bytes starting `skew` past a 64-byte boundary: file rows are only 2-aligned.
struct Buffer {
    std::vector<uint8_t> mem;
    uint8_t* p;
    Buffer(const std::vector<uint8_t>& src, size_t skew) : mem(src.size() + 64 + skew) {
        auto addr = reinterpret_cast<uintptr_t>(mem.data());
        p = mem.data() + ((64 - addr % 64) % 64) + skew;
        std::memcpy(p, src.data(), src.size());
    }
};

int64_t first_diff(const void* a, const void* b, size_t bytes) {
    const auto* x = static_cast<const uint8_t*>(a);
    const auto* y = static_cast<const uint8_t*>(b);
    for (size_t i = 0; i < bytes; i++)
        if (x[i] != y[i]) return static_cast<int64_t>(i);
    return -1;
}

void put_half(uint8_t* p, float v) {
    const uint16_t h = gl::fp32_to_fp16(v);
    std::memcpy(p, &h, 2);
}

// ---- where each format keeps its fields ------------------------------------------------

struct Layout {
    std::vector<size_t> halves; // offsets of the fp16 scale fields
    size_t quant_at, quant_len; // every byte holding weight bits
    size_t low_at, low_len;     // the bytes of the low bits (nibbles or crumbs)
    uint8_t one;                // a low-bits byte with every weight's raw q = 1
    int qmax;                   // raw q range is 0..qmax
};

Layout layout(Type t) {
    switch (t) {
    case Type::Q4_K:
        return {{0, 2}, 16, 128, 16, 128, 0x11, 15};
    case Type::Q5_K:
        return {{0, 2}, 16, 160, 48, 128, 0x11, 31};
    case Type::Q6_K:
        return {{208}, 0, 192, 0, 128, 0x11, 63};
    case Type::Q2_K:
        return {{80, 82}, 16, 64, 16, 64, 0x55, 3};
    case Type::Q3_K:
        return {{108}, 0, 96, 32, 64, 0x55, 7};
    case Type::Q4_1:
        return {{0, 2}, 4, 16, 4, 16, 0x11, 15};
    case Type::Q5_0:
        return {{0}, 2, 20, 6, 16, 0x11, 31};
    case Type::Q5_1:
        return {{0, 2}, 4, 20, 8, 16, 0x11, 31};
    case Type::IQ4_NL:
        return {{0}, 2, 16, 2, 16, 0x11, 15};
    default:
        FAIL("no layout for ", std::string(gl::type_name(t)));
        return {};
    }
}

// Random weights covering every bit pattern of quants and sub-block scales,
// with sane fp16 scales (random bits there would give inf / NaN).
std::vector<uint8_t> random_weights(Type t, int64_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int> byte(0, 255);
    std::uniform_real_distribution<float> scale(-0.05f, 0.05f);
    std::vector<uint8_t> out(gl::row_size(t, n));
    for (uint8_t& b : out) b = static_cast<uint8_t>(byte(rng));
    const size_t bs = gl::type_info(t).type_size;
    for (size_t b = 0; b < out.size(); b += bs)
        for (size_t h : layout(t).halves) put_half(&out[b + h], scale(rng));
    return out;
}

std::vector<float> random_floats(int64_t n, uint32_t seed, float sigma = 1.0f) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, sigma);
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = dist(rng);
    for (size_t i = 0; i < v.size(); i += 37) v[i] *= 9.0f; // outliers vary the block scales
    return v;
}

std::vector<uint8_t> quantized(Type t, const std::vector<float>& x) {
    std::vector<uint8_t> out(gl::row_size(t, static_cast<int64_t>(x.size())));
    gl::ref::quantize_row(t, x.data(), out.data(), static_cast<int64_t>(x.size()));
    return out;
}

std::vector<float> dequantized(Type t, const void* p, int64_t n) {
    std::vector<float> y(static_cast<size_t>(n));
    gl::ref::dequantize_row(t, p, y.data(), n);
    return y;
}

// Weight rows with every weight's raw q set to 0 (z) and to 1 (z + step):
// each weight is z + step * q, so this gives the level grid the decoder uses.
void level_grid(Type t, const std::vector<uint8_t>& w, int64_t n, std::vector<float>* z,
                std::vector<float>* step) {
    const Layout L = layout(t);
    const size_t bs = gl::type_info(t).type_size;
    std::vector<uint8_t> zero(w), one(w);
    for (size_t b = 0; b < w.size(); b += bs) {
        std::memset(&zero[b + L.quant_at], 0, L.quant_len);
        std::memset(&one[b + L.quant_at], 0, L.quant_len);
        std::memset(&one[b + L.low_at], L.one, L.low_len);
    }
    *z = dequantized(t, zero.data(), n);
    const std::vector<float> o = dequantized(t, one.data(), n);
    step->resize(o.size());
    for (size_t i = 0; i < o.size(); i++) (*step)[i] = o[i] - (*z)[i];
}

// Bound on every partial sum a kernel may form: it may add the q-proportional
// part and the offset / min part of a weight separately, so count both:
// sum |a_i| (|w_i - z_i| + |z_i|), z_i the weight at raw q = 0.
double magnitude(Type t, int64_t n, const std::vector<uint8_t>& w, const void* a) {
    std::vector<float> z, step;
    level_grid(t, w, n, &z, &step);
    const std::vector<float> wf = dequantized(t, w.data(), n);
    const std::vector<float> af = dequantized(gl::vec_dot_type(t), a, n);
    double s = 0;
    for (size_t i = 0; i < wf.size(); i++)
        s += std::fabs(static_cast<double>(af[i])) * (std::fabs(wf[i] - z[i]) + std::fabs(z[i]));
    return s;
}

} // namespace

// ---- the type table -----------------------------------------------------------------------

TEST_CASE("k-quants: table entries match the block structs and activation types") {
    struct Want {
        Type t;
        size_t bytes;
        int64_t block;
        Type act;
    };
    const Want want[] = {
        {Type::Q2_K, sizeof(gl::BlockQ2_K), 256, Type::Q8_K},
        {Type::Q3_K, sizeof(gl::BlockQ3_K), 256, Type::Q8_K},
        {Type::Q4_K, sizeof(gl::BlockQ4_K), 256, Type::Q8_K},
        {Type::Q5_K, sizeof(gl::BlockQ5_K), 256, Type::Q8_K},
        {Type::Q6_K, sizeof(gl::BlockQ6_K), 256, Type::Q8_K},
        {Type::Q4_1, sizeof(gl::BlockQ4_1), 32, Type::Q8_1},
        {Type::Q5_0, sizeof(gl::BlockQ5_0), 32, Type::Q8_0},
        {Type::Q5_1, sizeof(gl::BlockQ5_1), 32, Type::Q8_1},
        {Type::IQ4_NL, sizeof(gl::BlockIQ4_NL), 32, Type::Q8_0},
    };
    for (const Want& w : want) {
        INFO("type ", std::string(gl::type_name(w.t)));
        CHECK(gl::type_info(w.t).type_size == w.bytes);
        CHECK(gl::type_info(w.t).block_size == w.block);
        CHECK(gl::type_info(w.t).supported);
        CHECK(gl::vec_dot_type(w.t) == w.act);
    }
    CHECK(gl::type_info(Type::Q8_K).type_size == sizeof(gl::BlockQ8_K));
    CHECK(gl::type_info(Type::Q8_1).type_size == sizeof(gl::BlockQ8_1));
}

// ---- hand-built blocks ----------------------------------------------------------------------
//
// Each block is filled field by field from the layout description, and the
// expected values come straight from the format's formula. All values are
// exact in float, so every table must give them bit for bit.

namespace {

// Compared as values: d * s * 0 may be -0 where the formula written with
// integers gives +0.
void check_dequant(Type t, const void* block, const std::vector<float>& want) {
    const auto n = static_cast<int64_t>(want.size());
    for_each_table([&](const gl::KernelTable& k) {
        std::vector<float> got(want.size() + 1, -1.0f);
        t_dequantize(k, t, block, got.data(), n);
        int bad = 0;
        for (size_t i = 0; i < want.size(); i++) bad += got[i] != want[i];
        CHECK(bad == 0);
        CHECK(got.back() == -1.0f);
    });
}

} // namespace

TEST_CASE("dequantize: hand-built Q4_K and Q5_K blocks") {
    // Scales and mins with high bits set, to exercise the 6-bit packing:
    // bytes 0-3 = sc[0..3] | (sc[4..7] >> 4) << 6, bytes 4-7 likewise for m,
    // bytes 8-11 = (sc[4..7] & 15) | (m[4..7] & 15) << 4.
    const int sc[8] = {1, 2, 3, 4, 17, 33, 50, 63};
    const int m[8] = {0, 5, 10, 15, 20, 40, 60, 63};
    const uint8_t packed[12] = {65, 130, 195, 196, 64, 133, 202, 207, 0x41, 0x81, 0xc2, 0xff};

    gl::BlockQ4_K b4{};
    b4.d = 0x3c00;    // 1
    b4.dmin = 0x3800; // 0.5
    std::memcpy(b4.scales, packed, 12);
    gl::BlockQ5_K b5{};
    b5.d = 0x3c00;
    b5.dmin = 0x3800;
    std::memcpy(b5.scales, packed, 12);
    std::vector<float> want4(256), want5(256);
    for (int i = 0; i < 256; i++) {
        const int c = i / 64, l = i % 32, high = (i / 32) % 2;
        const int q4 = (i + i / 32) % 16, q5 = (7 * i + 3) % 32;
        b4.qs[32 * c + l] |= static_cast<uint8_t>(q4 << (4 * high));
        b5.qs[32 * c + l] |= static_cast<uint8_t>((q5 & 15) << (4 * high));
        b5.qh[l] |= static_cast<uint8_t>((q5 >> 4) << (i / 32));
        want4[i] = 1.0f * sc[i / 32] * q4 - 0.5f * m[i / 32];
        want5[i] = 1.0f * sc[i / 32] * q5 - 0.5f * m[i / 32];
    }
    CHECK(want4[255] == 63.0f * ((255 + 7) % 16) - 31.5f);
    check_dequant(Type::Q4_K, &b4, want4);
    check_dequant(Type::Q5_K, &b5, want5);
}

TEST_CASE("dequantize: hand-built Q6_K block") {
    // Element 128 h + 32 k + l: low 4 bits in ql[64 h + 32 (k & 1) + l]
    // (high nibble for k >= 2), top 2 bits at bits 2k of qh[32 h + l].
    gl::BlockQ6_K b{};
    b.d = 0x3400; // 0.25
    for (int j = 0; j < 16; j++) b.scales[j] = static_cast<int8_t>((j - 8) * 3);
    std::vector<float> want(256);
    for (int i = 0; i < 256; i++) {
        const int h = i / 128, k = (i % 128) / 32, l = i % 32, q = (5 * i) % 64;
        b.ql[64 * h + 32 * (k & 1) + l] |= static_cast<uint8_t>((q & 15) << (4 * (k / 2)));
        b.qh[32 * h + l] |= static_cast<uint8_t>((q >> 4) << (2 * k));
        want[i] = 0.25f * static_cast<float>((i / 16 - 8) * 3) * static_cast<float>(q - 32);
    }
    check_dequant(Type::Q6_K, &b, want);
}

TEST_CASE("dequantize: hand-built Q2_K and Q3_K blocks") {
    // 2-bit fields: element 128 h + 32 k + l at bits 2k of qs[32 h + l].
    gl::BlockQ2_K b2{};
    b2.d = 0x3c00;    // 1
    b2.dmin = 0x3800; // 0.5
    for (int j = 0; j < 16; j++) b2.scales[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
    // Q3_K: 6-bit scale v_j = 4 j + 1 (value v - 32): low 4 bits in byte j
    // (j < 8) or the high nibble of byte j - 8, top 2 at bits 2 (j / 4) of
    // byte 8 + j % 4; the third weight bit at bit i / 32 of hmask[i % 32].
    gl::BlockQ3_K b3{};
    b3.d = 0x3800; // 0.5
    for (int j = 0; j < 16; j++) {
        const int v = 4 * j + 1;
        b3.scales[j % 8] |= static_cast<uint8_t>((v & 15) << (j < 8 ? 0 : 4));
        b3.scales[8 + j % 4] |= static_cast<uint8_t>((v >> 4) << (2 * (j / 4)));
    }
    std::vector<float> want2(256), want3(256);
    for (int i = 0; i < 256; i++) {
        const int h = i / 128, k = (i % 128) / 32, l = i % 32, j = i / 16;
        const int q2 = (i + i / 16) % 4, q3 = (5 * i + i / 32) % 8;
        b2.qs[32 * h + l] |= static_cast<uint8_t>(q2 << (2 * k));
        b3.qs[32 * h + l] |= static_cast<uint8_t>((q3 & 3) << (2 * k));
        b3.hmask[l] |= static_cast<uint8_t>((q3 >> 2) << (i / 32));
        want2[i] = 1.0f * static_cast<float>(j * q2) - 0.5f * static_cast<float>(15 - j);
        want3[i] = 0.5f * static_cast<float>((4 * j + 1 - 32) * (q3 - 4));
    }
    check_dequant(Type::Q2_K, &b2, want2);
    check_dequant(Type::Q3_K, &b3, want3);
}

TEST_CASE("dequantize: hand-built 32-element blocks") {
    // Nibbles as in Q4_0 (element j low nibble of byte j, element j + 16 the
    // high one); fifth bits at bit j of the little-endian 32-bit qh.
    gl::BlockQ4_1 b41{};
    b41.d = 0x3800; // 0.5
    b41.m = 0xbd00; // -1.25
    gl::BlockQ5_0 b50{};
    b50.d = 0x3400; // 0.25
    gl::BlockQ5_1 b51{};
    b51.d = 0x3800; // 0.5
    b51.m = 0x4000; // 2
    gl::BlockIQ4_NL bnl{};
    bnl.d = 0xb800; // -0.5
    const int book[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
    std::vector<float> w41(32), w50(32), w51(32), wnl(32);
    for (int j = 0; j < 32; j++) {
        const int q4 = (3 * j + 1) % 16, q5 = (7 * j) % 32, shift = j < 16 ? 0 : 4;
        b41.qs[j % 16] |= static_cast<uint8_t>(q4 << shift);
        bnl.qs[j % 16] |= static_cast<uint8_t>(q4 << shift);
        b50.qs[j % 16] |= static_cast<uint8_t>((q5 & 15) << shift);
        b51.qs[j % 16] |= static_cast<uint8_t>((q5 & 15) << shift);
        b50.qh[j / 8] |= static_cast<uint8_t>((q5 >> 4) << (j % 8));
        b51.qh[j / 8] |= static_cast<uint8_t>((q5 >> 4) << (j % 8));
        w41[j] = 0.5f * q4 - 1.25f;
        w50[j] = 0.25f * (q5 - 16);
        w51[j] = 0.5f * q5 + 2.0f;
        wnl[j] = -0.5f * book[q4];
    }
    check_dequant(Type::Q4_1, &b41, w41);
    check_dequant(Type::Q5_0, &b50, w50);
    check_dequant(Type::Q5_1, &b51, w51);
    check_dequant(Type::IQ4_NL, &bnl, wnl);
}

TEST_CASE("vec_dot: hand-built Q4_K x Q8_K block") {
    // w = 1 * sc_j * q - 0.5 * m_j with q = 1 everywhere and a = 1 * 2:
    // sum = 2 * 32 * sum_j (sc_j - 0.5 m_j).
    gl::BlockQ4_K w{};
    w.d = 0x3c00;
    w.dmin = 0x3800;
    const uint8_t packed[12] = {65, 130, 195, 196, 64, 133, 202, 207, 0x41, 0x81, 0xc2, 0xff};
    std::memcpy(w.scales, packed, 12);
    std::memset(w.qs, 0x11, sizeof w.qs);
    gl::BlockQ8_K a{};
    a.d = 1.0f;
    std::memset(a.qs, 2, sizeof a.qs);
    for (int16_t& s : a.bsums) s = 32;
    const float want =
        2.0f * 32.0f *
        ((1 + 2 + 3 + 4 + 17 + 33 + 50 + 63) - 0.5f * (0 + 5 + 10 + 15 + 20 + 40 + 60 + 63));
    CHECK(gl::ref::vec_dot(Type::Q4_K, 256, &w, &a) == want);
    for_each_table(
        [&](const gl::KernelTable& k) { CHECK(t_vec_dot(k, Type::Q4_K, 256, &w, &a) == want); });
}

// ---- every table against the reference ------------------------------------------------------

TEST_CASE("vec_dot k: random rows agree with ref within the float rounding bound") {
    // ref sums each block exactly and adds in double. A kernel rounds each
    // block's integer sum once when converting, the scale products once, and
    // adds at most n such terms; each rounding errs by at most u = 2^-24 of a
    // partial sum, and every partial sum is bounded by the magnitude M (see
    // magnitude()). So |kernel - exact| <= (n + 4) u M, plus ref's own final
    // rounding to float.
    uint32_t seed = 1000;
    for (Type t : kTypesK) {
        const Type at = gl::vec_dot_type(t);
        for (int64_t n : sizes_for(t)) {
            INFO("type ", std::string(gl::type_name(t)), " n ", n);
            const auto w = random_weights(t, n, seed++);
            const auto a = quantized(at, random_floats(n, seed++));
            Buffer wb(w, 2), ab(a, at == Type::Q8_K ? 4 : 2);
            const float want = gl::ref::vec_dot(t, n, wb.p, ab.p);
            const double tol =
                (static_cast<double>(n) + 4) * std::ldexp(1.0, -24) * magnitude(t, n, w, a.data()) +
                std::fabs(want) * std::ldexp(1.0, -24);
            for_each_table([&](const gl::KernelTable& k) {
                const float got = t_vec_dot(k, t, n, wb.p, ab.p);
                INFO("got ", got, " want ", want, " tol ", tol);
                CHECK(std::fabs(static_cast<double>(got) - want) <= tol);
            });
        }
    }
}

TEST_CASE("matvec k: row groups of every table give each row's ref vec_dot") {
    // Multi-row kernels (four rows at a time for every type here, on AVX2
    // and AVX-512) with each row count 1..9 and 13: full groups and every
    // tail; the 32-element types also on rows of one and seven blocks.
    // Each row has its own random weights, so a row or block read from the
    // wrong place misses by far more than the rounding bound of the vec_dot
    // test above. Rows start 2 bytes off alignment with a padded stride, as a
    // mapped file's rows may; nothing may be written past the last output.
    uint32_t seed = 9000;
    for (Type t : kTypesK) {
        const Type at = gl::vec_dot_type(t);
        std::vector<int64_t> sizes = {256, 5 * 256};
        if (!is_k(t)) sizes.insert(sizes.end(), {32, 7 * 32});
        for (int64_t n : sizes) {
            for (int64_t rows : {1, 2, 3, 4, 5, 6, 7, 8, 9, 13}) {
                INFO("type ", std::string(gl::type_name(t)), " n ", n, " rows ", rows);
                const size_t rb = gl::row_size(t, n), stride = rb + 6;
                Buffer wb(std::vector<uint8_t>(stride * static_cast<size_t>(rows)), 2);
                const auto a = quantized(at, random_floats(n, seed++));
                Buffer ab(a, at == Type::Q8_K ? 4 : 2);
                std::vector<float> want(static_cast<size_t>(rows));
                std::vector<double> tol(static_cast<size_t>(rows));
                for (int64_t r = 0; r < rows; r++) {
                    const auto w = random_weights(t, n, seed++);
                    std::memcpy(wb.p + static_cast<size_t>(r) * stride, w.data(), rb);
                    want[r] = gl::ref::vec_dot(t, n, w.data(), ab.p);
                    tol[r] = (static_cast<double>(n) + 4) * std::ldexp(1.0, -24) *
                                 magnitude(t, n, w, a.data()) +
                             std::fabs(want[r]) * std::ldexp(1.0, -24);
                }
                for_each_table([&](const gl::KernelTable& k) {
                    std::vector<float> got(static_cast<size_t>(rows) + 1, -7.0f);
                    if (auto f = k.matvec[id(t)])
                        f(n, wb.p, stride, rows, ab.p, got.data());
                    else
                        gl::ref::matvec(t, n, wb.p, stride, rows, ab.p, got.data());
                    CHECK(got[rows] == -7.0f);
                    for (int64_t r = 0; r < rows; r++) {
                        INFO("row ", r, " got ", got[r], " want ", want[r]);
                        CHECK(std::fabs(static_cast<double>(got[r]) - want[r]) <= tol[r]);
                    }
                    // gl::cpu::matvec streams K-quant rows one at a time
                    // (vec_dot) on some CPUs and four at once on others
                    // (dispatch.cpp): a row's bits must not depend on which.
                    const auto dot = k.vec_dot[id(t)];
                    if (is_k(t) && dot && k.matvec[id(t)]) {
                        for (int64_t r = 0; r < rows; r++) {
                            INFO("row ", r);
                            CHECK(got[r] == dot(n, wb.p + static_cast<size_t>(r) * stride, ab.p));
                        }
                    }
                });
            }
        }
    }
}

TEST_CASE("vec_dot k: ref equals the float dot of the dequantized rows") {
    // The reference's integer bookkeeping (mins, offsets, bsums, Q8_1's s)
    // against the plain definition sum_i w_i a_i over dequantized values.
    uint32_t seed = 2000;
    for (Type t : kTypesK) {
        const int64_t n = 7 * 256;
        INFO("type ", std::string(gl::type_name(t)));
        const auto w = random_weights(t, n, seed++);
        const auto a = quantized(gl::vec_dot_type(t), random_floats(n, seed++));
        const auto wf = dequantized(t, w.data(), n);
        const auto af = dequantized(gl::vec_dot_type(t), a.data(), n);
        double want = 0;
        for (size_t i = 0; i < wf.size(); i++) want += static_cast<double>(wf[i]) * af[i];
        // Q8_1's s is d * sum(q) rounded to fp16 (2^-11 relative), and the
        // dequantized values carry one float rounding each.
        const double m = magnitude(t, n, w, a.data());
        const double tol = (t == Type::Q4_1 || t == Type::Q5_1 ? std::ldexp(1.0, -10) : 1e-6) * m;
        CHECK(std::fabs(gl::ref::vec_dot(t, n, w.data(), a.data()) - want) <= tol);
    }
}

TEST_CASE("vec_dot k: exact-arithmetic rows give identical results in every table") {
    // Scales are 1 or 2, sub-block scales and mins at most 4 in magnitude and
    // activations in [-2, 2]: every product is an integer and the largest
    // possible partial sum (17 Q6_K blocks: 17 * 256 * 4 * 63 * 2 * 4 < 2^24)
    // is exact in float, so any table must match ref exactly.
    uint32_t seed = 3000;
    for (Type t : kTypesK) {
        for (int64_t n : sizes_for(t)) {
            INFO("type ", std::string(gl::type_name(t)), " n ", n);
            std::mt19937 rng(seed++);
            std::uniform_int_distribution<int> pow2(0, 1), small(-2, 2), sub(0, 4);
            auto w = random_weights(t, n, seed++);
            const size_t bs = gl::type_info(t).type_size;
            for (size_t b = 0; b < w.size(); b += bs) {
                uint8_t* p = &w[b];
                for (size_t h : layout(t).halves)
                    put_half(p + h, static_cast<float>(1 << pow2(rng)));
                if (t == Type::Q4_K || t == Type::Q5_K) {
                    for (int j = 0; j < 12; j++)
                        p[4 + j] = static_cast<uint8_t>(sub(rng) | (sub(rng) << 4));
                    for (int j = 0; j < 8; j++) p[4 + j] &= 0x0f; // top bits of the 6-bit values
                } else if (t == Type::Q2_K) {
                    for (int j = 0; j < 16; j++)
                        p[j] = static_cast<uint8_t>(sub(rng) | (sub(rng) << 4));
                } else if (t == Type::Q6_K) {
                    for (int j = 0; j < 16; j++)
                        p[192 + j] = static_cast<uint8_t>(static_cast<int8_t>(sub(rng) - 2));
                } else if (t == Type::Q3_K) {
                    // Stored v = 32 + s, s = 0..4: every top-bit pair 2 (0xaa),
                    // every low nibble 0..4.
                    for (int j = 0; j < 8; j++)
                        p[96 + j] = static_cast<uint8_t>((sub(rng) << 4) | sub(rng));
                    for (int j = 8; j < 12; j++) p[96 + j] = 0xaa;
                }
            }
            std::vector<float> af(static_cast<size_t>(n));
            for (size_t i = 0; i < af.size(); i++) af[i] = static_cast<float>(small(rng));
            // The activation row by hand: q = af, block scales 1 or 2.
            const Type at = gl::vec_dot_type(t);
            std::vector<uint8_t> a(gl::row_size(at, n));
            if (at == Type::Q8_K) {
                auto* y = reinterpret_cast<gl::BlockQ8_K*>(a.data());
                for (int64_t i = 0; i < n / 256; i++) {
                    y[i].d = static_cast<float>(1 << pow2(rng));
                    for (int j = 0; j < 256; j++) y[i].qs[j] = static_cast<int8_t>(af[i * 256 + j]);
                    for (int g = 0; g < 16; g++) {
                        int s = 0;
                        for (int l = 0; l < 16; l++) s += y[i].qs[16 * g + l];
                        y[i].bsums[g] = static_cast<int16_t>(s);
                    }
                }
            } else {
                const size_t abs = gl::type_info(at).type_size;
                for (int64_t i = 0; i < n / 32; i++) {
                    uint8_t* p = &a[static_cast<size_t>(i) * abs];
                    const float d = static_cast<float>(1 << pow2(rng));
                    int sum = 0;
                    for (int j = 0; j < 32; j++) {
                        p[abs - 32 + j] = static_cast<uint8_t>(static_cast<int8_t>(af[i * 32 + j]));
                        sum += static_cast<int>(af[i * 32 + j]);
                    }
                    put_half(p, d);
                    if (at == Type::Q8_1) put_half(p + 2, d * static_cast<float>(sum));
                }
            }
            const float want = gl::ref::vec_dot(t, n, w.data(), a.data());
            for_each_table([&](const gl::KernelTable& k) {
                CHECK(t_vec_dot(k, t, n, w.data(), a.data()) == want);
            });
        }
    }
}

TEST_CASE("dequantize_row k: every table is bit-identical to ref") {
    uint32_t seed = 4000;
    for (Type t : kTypesK) {
        for (int64_t n : sizes_for(t)) {
            INFO("type ", std::string(gl::type_name(t)), " n ", n);
            const auto src = random_weights(t, n, seed++);
            Buffer sb(src, 2);
            std::vector<float> want(static_cast<size_t>(n) + 1, -1.0f), got(want.size());
            gl::ref::dequantize_row(t, sb.p, want.data(), n);
            for_each_table([&](const gl::KernelTable& k) {
                std::fill(got.begin(), got.end(), -1.0f);
                t_dequantize(k, t, sb.p, got.data(), n);
                CHECK(first_diff(got.data(), want.data(), got.size() * sizeof(float)) == -1);
            });
        }
    }
}

// ---- activation quantizers
// ------------------------------------------------------------------------

TEST_CASE("quantize_row Q8_K: every table is bit-identical to ref; d, q and bsums as specified") {
    std::vector<float> x;
    for (int e : {-30, -20, -12, -3, 0, 3, 10, 20}) {
        const auto r = random_floats(1024, static_cast<uint32_t>(5000 + e), std::ldexp(1.0f, e));
        x.insert(x.end(), r.begin(), r.end());
    }
    // amax 127 (scale exactly 1) with values on .5: ties go to even.
    for (int j = 0; j < 256; j++)
        x.push_back(j == 0 ? 127.0f : static_cast<float>(j % 64 - 32) + 0.5f);
    for (int j = 0; j < 256; j++) x.push_back(0.0f);                      // zero block
    for (int j = 0; j < 256; j++) x.push_back(j == 9 ? 1e-42f : 0.0f);    // 127 / amax overflows
    for (int j = 0; j < 256; j++) x.push_back(j == 200 ? -3e38f : 1e30f); // huge but finite
    const int64_t n = static_cast<int64_t>(x.size());
    REQUIRE(n % 256 == 0);

    std::vector<uint8_t> want(gl::row_size(Type::Q8_K, n));
    gl::ref::quantize_row(Type::Q8_K, x.data(), want.data(), n);
    const auto* y = reinterpret_cast<const gl::BlockQ8_K*>(want.data());
    const int64_t nb = n / 256;
    int bad_sums = 0, bad_range = 0;
    for (int64_t i = 0; i < nb; i++) {
        float amax = 0;
        for (int j = 0; j < 256; j++) amax = std::max(amax, std::fabs(x[i * 256 + j]));
        bad_range +=
            y[i].d != (127.0f / amax > 0 && std::isfinite(127.0f / amax) ? amax / 127.0f : 0.0f);
        for (int g = 0; g < 16; g++) {
            int s = 0;
            for (int l = 0; l < 16; l++) {
                s += y[i].qs[16 * g + l];
                bad_range += y[i].qs[16 * g + l] < -127;
            }
            bad_sums += s != y[i].bsums[g];
        }
    }
    CHECK(bad_sums == 0);
    CHECK(bad_range == 0);
    const gl::BlockQ8_K& ties = y[nb - 4];
    CHECK(ties.d == 1.0f);
    CHECK(ties.qs[1] == -30); // -30.5 -> -30 (even)
    CHECK(ties.qs[2] == -30); // -29.5 -> -30
    CHECK(ties.qs[63] == 32); // 31.5 -> 32
    CHECK(y[nb - 3].d == 0.0f);
    CHECK(y[nb - 2].d == 0.0f);
    CHECK(y[nb - 2].qs[9] == 0);
    CHECK(y[nb - 1].qs[200] == -127);

    for_each_table([&](const gl::KernelTable& k) {
        for (int64_t len : {int64_t{256}, int64_t{768}, n}) {
            INFO("n ", len);
            std::vector<uint8_t> got(gl::row_size(Type::Q8_K, len) + 1, 0xee);
            t_quantize(k, Type::Q8_K, x.data() + (n - len), got.data(), len);
            const size_t bytes = got.size() - 1;
            CHECK(first_diff(got.data(), want.data() + (want.size() - bytes), bytes) == -1);
            CHECK(got.back() == 0xee);
        }
    });
}

TEST_CASE("quantize_row Q8_1: the Q8_0 bytes plus s = d * sum(q)") {
    const auto x = random_floats(32 * 9, 6000);
    const auto q1 = quantized(Type::Q8_1, x);
    const auto q0 = quantized(Type::Q8_0, x);
    const auto* b1 = reinterpret_cast<const gl::BlockQ8_1*>(q1.data());
    const auto* b0 = reinterpret_cast<const gl::BlockQ8_0*>(q0.data());
    for (int i = 0; i < 9; i++) {
        CHECK(b1[i].d == b0[i].d);
        CHECK(std::memcmp(b1[i].qs, b0[i].qs, 32) == 0);
        int sum = 0;
        for (int8_t v : b0[i].qs) sum += v;
        CHECK(b1[i].s == gl::fp32_to_fp16(gl::fp16_to_fp32(b0[i].d) * static_cast<float>(sum)));
    }
    // Every table's quantizer gives the same bytes, on rows of 1..9 blocks,
    // writing nothing past the row.
    for_each_table([&](const gl::KernelTable& k) {
        for (int64_t len : {int64_t{32}, int64_t{3 * 32}, int64_t{9 * 32}}) {
            INFO("n ", len);
            const size_t bytes = gl::row_size(Type::Q8_1, len);
            std::vector<uint8_t> got(bytes + 1, 0xee);
            t_quantize(k, Type::Q8_1, x.data(), got.data(), len);
            CHECK(first_diff(got.data(), q1.data(), bytes) == -1);
            CHECK(got.back() == 0xee);
        }
    });
}

// ---- float quantizers
// -------------------------------------------------------------------------------

TEST_CASE("quantize -> dequantize: each value on the nearest level, error bounded per format") {
    // What every format implies: with the block's scales as stored, each
    // weight can be any of qmax + 1 levels z + step * q (IQ4_NL: d * book[q]);
    // the quantizer must pick the nearest, so the error is at most half a
    // step inside the block's range. The scale search decides the range; its
    // quality is pinned by the RMS error relative to the data's RMS, on
    // Gaussian data with a 9-sigma outlier every 37 values (so most blocks
    // have one), at about 5% above what the search achieves now. For scale:
    // plain min/max Q4_1/Q5_0/Q5_1 quantizers give 0.107 / 0.085 / 0.051 and
    // the Q4_0 one 0.165 on this data.
    struct Want {
        Type t;
        double rms; // max RMS error / RMS of the data
    };
    const Want want[] = {{Type::Q2_K, 0.31},  {Type::Q3_K, 0.22},  {Type::Q4_K, 0.107},
                         {Type::Q5_K, 0.054}, {Type::Q6_K, 0.032}, {Type::Q4_1, 0.113},
                         {Type::Q5_0, 0.089}, {Type::Q5_1, 0.055}, {Type::IQ4_NL, 0.13}};
    for (const Want& w : want) {
        for (int e : {-10, 0, 8}) {
            INFO("type ", std::string(gl::type_name(w.t)), " scale 2^", e);
            const int64_t n = 64 * 256;
            const auto x = random_floats(n, static_cast<uint32_t>(7000 + e), std::ldexp(1.0f, e));
            const auto q = quantized(w.t, x);
            const auto y = dequantized(w.t, q.data(), n);
            std::vector<float> z, step;
            level_grid(w.t, q, n, &z, &step);
            const int qmax = layout(w.t).qmax;
            double se = 0, sx = 0;
            int not_nearest = 0;
            for (int64_t i = 0; i < n; i++) {
                se += (static_cast<double>(x[i]) - y[i]) * (static_cast<double>(x[i]) - y[i]);
                sx += static_cast<double>(x[i]) * x[i];
                double best = INFINITY;
                for (int k = 0; k <= qmax; k++) {
                    // IQ4_NL: z = d * book[0] = -127 d (exact: 11 x 7 bits).
                    const double level =
                        w.t == Type::IQ4_NL
                            ? static_cast<double>(z[i]) / -127.0 * gl::kIQ4NL[k]
                            : static_cast<double>(z[i]) + static_cast<double>(step[i]) * k;
                    best = std::min(best, std::fabs(x[i] - level));
                }
                const double slack =
                    1e-5 * (std::fabs(x[i]) + std::fabs(z[i]) + std::fabs(step[i]) * 128);
                not_nearest += std::fabs(x[i] - y[i]) > best + slack;
            }
            CHECK(not_nearest == 0);
            CHECK(std::sqrt(se / sx) <= w.rms);
        }
    }
}

TEST_CASE("quantize -> dequantize: blocks a format can hold exactly come back exactly") {
    // Constant blocks (up to the fp16 rounding of the stored scales) and zero
    // blocks (exactly), and a Q4_K block whose values lie on a grid it holds.
    for (Type t : kTypesK) {
        INFO("type ", std::string(gl::type_name(t)));
        const int64_t n = 256;
        for (float v : {0.0f, -1.5f}) {
            const std::vector<float> x(static_cast<size_t>(n), v);
            const auto y = dequantized(t, quantized(t, x).data(), n);
            int bad = 0;
            for (int64_t i = 0; i < n; i++) bad += std::fabs(y[i] - x[i]) > 1e-3f * std::fabs(v);
            CHECK(bad == 0);
        }
    }
    // -1 .. 2.75 in steps of 0.25 in every sub-block: sc and m come out 63,
    // so only the fp16 rounding of d and dmin (2^-11 each) is left.
    std::vector<float> x(256);
    for (int i = 0; i < 256; i++) x[i] = 0.25f * static_cast<float>(i % 16) - 1.0f;
    const auto y = dequantized(Type::Q4_K, quantized(Type::Q4_K, x).data(), 256);
    int bad = 0;
    for (int i = 0; i < 256; i++) bad += std::fabs(y[i] - x[i]) > 4e-3f;
    CHECK(bad == 0);
}
