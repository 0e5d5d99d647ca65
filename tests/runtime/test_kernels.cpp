// Kernel layer tests: the type table, half-precision conversions, and every
// kernel table compiled in and usable on this CPU checked against gl::ref.
#include <doctest/doctest.h>

#include "ggml-like/blocks_k.h"
#include "ggml-like/kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace {

using gl::Type;

constexpr uint32_t id(Type t) {
    return static_cast<uint32_t>(t);
}

// The compute types whose reference kernels are ref/quants.cpp's (the others,
// blocks_k.h's, are test_kernels_k.cpp's), and the float ones among them.
const std::vector<Type> kSupported = [] {
    std::vector<Type> v;
    for (Type t : gl::kComputeTypes)
        if (!gl::ref::kRowKernelsK[id(t)].vec_dot) v.push_back(t);
    return v;
}();
const std::vector<Type> kFloatTypes = [] {
    std::vector<Type> v;
    for (Type t : gl::kComputeTypes)
        if (gl::type_info(t).block_size == 1) v.push_back(t);
    return v;
}();

// Multiples of 32 with odd block counts (1, 3, 5, 7, 127, 131) and some even
// ones, so every unrolled loop's remainder path runs.
const int64_t kQuantSizes[] = {32, 64, 96, 160, 224, 256, 4064, 4096, 4096 + 32 * 3};
// Float rows need not be multiples of anything: hit every SIMD tail length.
const int64_t kFloatSizes[] = {1, 7, 8, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 1001, 4096, 4192};

float bits_to_float(uint32_t u) {
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
}

// ---- table accessors: a null entry means "use gl::ref" --------------------------

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
void t_axpy(const gl::KernelTable& k, Type t, int64_t n, float alpha, const void* x, float* y) {
    auto f = k.axpy[id(t)];
    f ? f(n, alpha, x, y) : gl::ref::axpy(t, n, alpha, x, y);
}

template <typename F> void for_each_table(F f) {
    REQUIRE(gl::kernel_table_count() >= 1);
    for (int i = 0; i < gl::kernel_table_count(); i++) {
        const gl::KernelTable& k = gl::kernel_table(i);
        INFO("kernel table ", std::string(k.isa));
        f(k);
    }
}

// A buffer whose data starts `skew` bytes past a 64-byte boundary, so the
// kernels are exercised on the misaligned rows they meet in a mapped file.
struct Buffer {
    std::vector<uint8_t> mem;
    uint8_t* p;
    Buffer(size_t bytes, size_t skew) : mem(bytes + 64 + skew) {
        auto addr = reinterpret_cast<uintptr_t>(mem.data());
        p = mem.data() + ((64 - addr % 64) % 64) + skew;
    }
};

// ---- data -------------------------------------------------------------------------

std::vector<float> random_floats(int64_t n, uint32_t seed, float scale = 1.0f) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, scale);
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = dist(rng);
    // An outlier per 32 values, like real activations, so block scales vary.
    for (size_t i = 0; i < v.size(); i += 37) v[i] *= 9.0f;
    return v;
}

// Weight row of type t with random contents, as raw bytes. Q8_0 weights use
// the full int8 range including -128; scales vary over a few octaves.
std::vector<uint8_t> random_weights(Type t, int64_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<uint8_t> out(gl::row_size(t, n));
    if (t == Type::Q8_0 || t == Type::Q4_0) {
        std::uniform_int_distribution<int> byte(0, 255);
        std::uniform_real_distribution<float> scale(0.001f, 0.1f);
        const size_t bs = gl::type_info(t).type_size;
        for (size_t b = 0; b < out.size(); b += bs) {
            const uint16_t d = gl::fp32_to_fp16(scale(rng));
            std::memcpy(&out[b], &d, 2);
            for (size_t j = 2; j < bs; j++) out[b + j] = static_cast<uint8_t>(byte(rng));
        }
        return out;
    }
    std::vector<float> f = random_floats(n, seed);
    gl::ref::quantize_row(t, f.data(), out.data(), n);
    return out;
}

// Activation row for weight type w: F32, or Q8_0 produced by ref quantization.
std::vector<uint8_t> random_activations(Type w, int64_t n, uint32_t seed) {
    const Type at = gl::vec_dot_type(w);
    std::vector<float> f = random_floats(n, seed);
    std::vector<uint8_t> out(gl::row_size(at, n));
    gl::ref::quantize_row(at, f.data(), out.data(), n);
    return out;
}

// Rows whose dot product is exact in float in any summation order: small
// integers (times power-of-two block scales) keep every partial sum a
// multiple of the smallest unit and below 2^24 units. See the test below.
std::vector<uint8_t> exact_weights(Type t, int64_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<uint8_t> out(gl::row_size(t, n));
    std::uniform_int_distribution<int> small(-15, 15), nibble(0, 15), octave(-2, 0);
    if (t == Type::Q8_0 || t == Type::Q4_0) {
        const size_t bs = gl::type_info(t).type_size;
        for (size_t b = 0; b < out.size(); b += bs) {
            const uint16_t d = gl::fp32_to_fp16(std::ldexp(1.0f, octave(rng)));
            std::memcpy(&out[b], &d, 2);
            for (size_t j = 2; j < bs; j++)
                out[b + j] = t == Type::Q8_0
                                 ? static_cast<uint8_t>(static_cast<int8_t>(small(rng)))
                                 : static_cast<uint8_t>(nibble(rng) | (nibble(rng) << 4));
        }
        return out;
    }
    std::vector<float> f(static_cast<size_t>(n));
    std::uniform_int_distribution<int> w16(-16, 16);
    for (float& x : f) x = static_cast<float>(w16(rng));
    gl::ref::quantize_row(t, f.data(), out.data(), n);
    return out;
}

std::vector<uint8_t> exact_activations(Type w, int64_t n, uint32_t seed) {
    if (gl::vec_dot_type(w) == Type::Q8_0) return exact_weights(Type::Q8_0, n, seed);
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int> a16(-16, 16);
    std::vector<float> f(static_cast<size_t>(n));
    for (float& x : f) x = static_cast<float>(a16(rng));
    std::vector<uint8_t> out(static_cast<size_t>(n) * sizeof(float));
    std::memcpy(out.data(), f.data(), out.size());
    return out;
}

// Sum of |w_i * a_i| over the dequantized rows, in double.
double abs_dot(Type w, int64_t n, const void* wp, const void* ap) {
    std::vector<float> wf(static_cast<size_t>(n)), af(static_cast<size_t>(n));
    gl::ref::dequantize_row(w, wp, wf.data(), n);
    gl::ref::dequantize_row(gl::vec_dot_type(w), ap, af.data(), n);
    double s = 0.0;
    for (size_t i = 0; i < wf.size(); i++) s += std::fabs(static_cast<double>(wf[i]) * af[i]);
    return s;
}

// Index of the first differing byte, or -1.
int64_t first_diff(const void* a, const void* b, size_t bytes) {
    const auto* x = static_cast<const uint8_t*>(a);
    const auto* y = static_cast<const uint8_t*>(b);
    for (size_t i = 0; i < bytes; i++)
        if (x[i] != y[i]) return static_cast<int64_t>(i);
    return -1;
}

} // namespace

// ---- type table -------------------------------------------------------------------

TEST_CASE("type table: GGUF block and byte sizes") {
    struct Want {
        Type t;
        const char* name;
        int64_t block;
        size_t bytes;
        bool supported;
    };
    const Want want[] = {
        {Type::F32, "f32", 1, 4, true},
        {Type::F16, "f16", 1, 2, true},
        {Type::Q4_0, "q4_0", 32, 18, true},
        {Type::Q4_1, "q4_1", 32, 20, true},
        {Type::Q5_0, "q5_0", 32, 22, true},
        {Type::Q5_1, "q5_1", 32, 24, true},
        {Type::Q8_0, "q8_0", 32, 34, true},
        {Type::Q8_1, "q8_1", 32, 36, false},
        {Type::Q2_K, "q2_K", 256, 84, true},
        {Type::Q3_K, "q3_K", 256, 110, true},
        {Type::Q4_K, "q4_K", 256, 144, true},
        {Type::Q5_K, "q5_K", 256, 176, true},
        {Type::Q6_K, "q6_K", 256, 210, true},
        {Type::Q8_K, "q8_K", 256, 292, false},
        {Type::IQ2_XXS, "iq2_xxs", 256, 66, false},
        {Type::IQ2_XS, "iq2_xs", 256, 74, false},
        {Type::IQ3_XXS, "iq3_xxs", 256, 98, false},
        {Type::IQ1_S, "iq1_s", 256, 50, false},
        {Type::IQ4_NL, "iq4_nl", 32, 18, true},
        {Type::IQ3_S, "iq3_s", 256, 110, false},
        {Type::IQ2_S, "iq2_s", 256, 82, false},
        {Type::IQ4_XS, "iq4_xs", 256, 136, false},
        {Type::I8, "i8", 1, 1, false},
        {Type::I16, "i16", 1, 2, false},
        {Type::I32, "i32", 1, 4, false},
        {Type::I64, "i64", 1, 8, false},
        {Type::F64, "f64", 1, 8, false},
        {Type::IQ1_M, "iq1_m", 256, 56, false},
        {Type::BF16, "bf16", 1, 2, true},
        {Type::TQ1_0, "tq1_0", 256, 54, false},
        {Type::TQ2_0, "tq2_0", 256, 66, false},
    };
    for (const Want& w : want) {
        INFO("type ", w.name);
        const gl::TypeInfo& ti = gl::type_info(w.t);
        REQUIRE(ti.name != nullptr);
        CHECK(std::string(ti.name) == w.name);
        CHECK(std::string(gl::type_name(w.t)) == w.name);
        CHECK(ti.block_size == w.block);
        CHECK(ti.type_size == w.bytes);
        CHECK(ti.supported == w.supported);
        Type back = Type::F32;
        CHECK(gl::type_from_name(w.name, &back));
        CHECK(back == w.t);
    }
    int known = 0;
    for (uint32_t i = 0; i < gl::kTypeIdLimit; i++) known += gl::type_info(i).name != nullptr;
    CHECK(known == static_cast<int>(sizeof want / sizeof want[0]));
}

TEST_CASE("type table: unknown ids, names, row sizes") {
    for (uint32_t bad : {4u, 5u, 31u, 32u, 33u, 36u, 39u, 40u, 1000u, 0xffffffffu}) {
        INFO("id ", bad);
        const gl::TypeInfo& ti = gl::type_info(bad);
        CHECK(ti.name == nullptr);
        CHECK(ti.block_size == 0);
        CHECK(ti.type_size == 0);
        CHECK_FALSE(ti.supported);
        CHECK(gl::type_name(static_cast<Type>(bad)) != nullptr);
        CHECK_FALSE(gl::row_size_ok(static_cast<Type>(bad), 32));
    }
    CHECK(std::string(gl::type_name(static_cast<Type>(4))) == "unknown(4)");
    CHECK(std::string(gl::type_name(static_cast<Type>(39))) == "unknown(39)");

    Type t = Type::F32;
    CHECK(gl::type_from_name("Q4_K", &t));
    CHECK(t == Type::Q4_K);
    CHECK(gl::type_from_name("BF16", &t));
    CHECK(t == Type::BF16);
    CHECK_FALSE(gl::type_from_name("q4", &t));
    CHECK_FALSE(gl::type_from_name("", &t));
    CHECK_FALSE(gl::type_from_name(nullptr, &t));

    CHECK(gl::row_size(Type::Q4_0, 4096) == 2304);
    CHECK(gl::row_size(Type::Q8_0, 4096) == 4352);
    CHECK(gl::row_size(Type::Q4_K, 4096) == 16 * 144);
    CHECK(gl::row_size(Type::F16, 7) == 14);
    CHECK(gl::row_size_ok(Type::F32, 7));
    CHECK(gl::row_size_ok(Type::Q4_0, 0));
    CHECK_FALSE(gl::row_size_ok(Type::Q4_0, 33));
    CHECK_FALSE(gl::row_size_ok(Type::Q6_K, 128));
    CHECK_FALSE(gl::row_size_ok(Type::F32, -1));

    CHECK(gl::vec_dot_type(Type::Q4_0) == Type::Q8_0);
    CHECK(gl::vec_dot_type(Type::Q8_0) == Type::Q8_0);
    CHECK(gl::vec_dot_type(Type::F32) == Type::F32);
    CHECK(gl::vec_dot_type(Type::F16) == Type::F32);
    CHECK(gl::vec_dot_type(Type::BF16) == Type::F32);
}

// ---- half precision -------------------------------------------------------------

TEST_CASE("fp16: special values") {
    const float inf = std::numeric_limits<float>::infinity();
    CHECK(gl::fp32_to_fp16(0.0f) == 0x0000);
    CHECK(gl::fp32_to_fp16(-0.0f) == 0x8000);
    CHECK(gl::fp32_to_fp16(1.0f) == 0x3c00);
    CHECK(gl::fp32_to_fp16(-2.0f) == 0xc000);
    CHECK(gl::fp32_to_fp16(65504.0f) == 0x7bff);
    CHECK(gl::fp32_to_fp16(65519.99f) == 0x7bff); // below the 65520 midpoint
    CHECK(gl::fp32_to_fp16(65520.0f) == 0x7c00);  // tie with the next (65536) rounds to even: inf
    CHECK(gl::fp32_to_fp16(1e9f) == 0x7c00);
    CHECK(gl::fp32_to_fp16(inf) == 0x7c00);
    CHECK(gl::fp32_to_fp16(-inf) == 0xfc00);
    const uint16_t nan = gl::fp32_to_fp16(std::numeric_limits<float>::quiet_NaN());
    CHECK((nan & 0x7c00) == 0x7c00);
    CHECK((nan & 0x03ff) != 0);
    CHECK(gl::fp32_to_fp16(bits_to_float(0x7f800001)) != 0x7c00); // signalling NaN stays NaN
    CHECK(gl::fp32_to_fp16(std::ldexp(1.0f, -24)) == 0x0001);     // smallest subnormal
    CHECK(gl::fp32_to_fp16(std::ldexp(1.0f, -25)) == 0x0000);     // half of it: tie to even 0
    CHECK(gl::fp32_to_fp16(std::ldexp(1.5f, -25)) == 0x0001);
    CHECK(gl::fp32_to_fp16(std::ldexp(3.0f, -25)) == 0x0002); // 1.5 units: tie to even 2
    CHECK(gl::fp32_to_fp16(std::ldexp(5.0f, -25)) == 0x0002); // 2.5 units: tie to even 2
    CHECK(gl::fp32_to_fp16(-std::ldexp(1.0f, -24)) == 0x8001);
    CHECK(gl::fp32_to_fp16(std::ldexp(1.0f, -14)) == 0x0400);        // smallest normal
    CHECK(gl::fp32_to_fp16(std::ldexp(1023.5f, -24)) == 0x0400);     // rounds up into the normals
    CHECK(gl::fp32_to_fp16(1.0f + std::ldexp(1.0f, -11)) == 0x3c00); // tie: even mantissa 0
    CHECK(gl::fp32_to_fp16(1.0f + std::ldexp(3.0f, -11)) == 0x3c02); // tie: even mantissa 2
    CHECK(gl::fp32_to_fp16(bits_to_float(0x3f801001)) == 0x3c01);    // just above a tie

    CHECK(gl::fp16_to_fp32(0x0000) == 0.0f);
    CHECK(std::signbit(gl::fp16_to_fp32(0x8000)));
    CHECK(gl::fp16_to_fp32(0x0001) == std::ldexp(1.0f, -24));
    CHECK(gl::fp16_to_fp32(0x03ff) == std::ldexp(1023.0f, -24));
    CHECK(gl::fp16_to_fp32(0x0400) == std::ldexp(1.0f, -14));
    CHECK(gl::fp16_to_fp32(0x3c00) == 1.0f);
    CHECK(gl::fp16_to_fp32(0x3800) == 0.5f);
    CHECK(gl::fp16_to_fp32(0xc000) == -2.0f);
    CHECK(gl::fp16_to_fp32(0x7bff) == 65504.0f);
    CHECK(gl::fp16_to_fp32(0x7c00) == inf);
    CHECK(gl::fp16_to_fp32(0xfc00) == -inf);
    CHECK(std::isnan(gl::fp16_to_fp32(0x7e00)));
    CHECK(std::isnan(gl::fp16_to_fp32(0x7c01)));
}

TEST_CASE("fp16: every value round-trips and every midpoint rounds to even") {
    int bad_roundtrip = 0, bad_rounding = 0;
    for (uint32_t h = 0; h < 0x10000; h++) {
        const float f = gl::fp16_to_fp32(static_cast<uint16_t>(h));
        if (std::isnan(f)) {
            bad_roundtrip += !std::isnan(gl::fp16_to_fp32(gl::fp32_to_fp16(f)));
            continue;
        }
        bad_roundtrip += gl::fp32_to_fp16(f) != h;
    }
    // Between consecutive positive halves h and h+1 (0x7bff's successor is
    // 65536, where inf begins) the midpoint is exact in float: it must go to
    // the even one, and the floats on either side of it to the near one.
    for (uint32_t h = 0; h < 0x7c00; h++) {
        const float lo = gl::fp16_to_fp32(static_cast<uint16_t>(h));
        const float hi = h == 0x7bff ? 65536.0f : gl::fp16_to_fp32(static_cast<uint16_t>(h + 1));
        const float mid = lo + (hi - lo) / 2;
        const uint32_t even = (h & 1) ? h + 1 : h;
        bad_rounding += gl::fp32_to_fp16(mid) != even;
        bad_rounding += gl::fp32_to_fp16(std::nextafter(mid, 0.0f)) != h;
        bad_rounding += gl::fp32_to_fp16(std::nextafter(mid, 1e30f)) != h + 1;
        bad_rounding += gl::fp32_to_fp16(-mid) != (even | 0x8000);
    }
    CHECK(bad_roundtrip == 0);
    CHECK(bad_rounding == 0);

    // The lookup table the kernels use agrees with the function bit for bit.
    int bad_table = 0;
    for (uint32_t h = 0; h < 0x10000; h++) {
        const float a = gl::fp16_to_fp32(static_cast<uint16_t>(h));
        bad_table += std::memcmp(&a, &gl::kFp16ToFp32[h], sizeof a) != 0;
    }
    CHECK(bad_table == 0);
}

TEST_CASE("bf16: conversion and rounding") {
    CHECK(gl::fp32_to_bf16(1.0f) == 0x3f80);
    CHECK(gl::bf16_to_fp32(0x3f80) == 1.0f);
    CHECK(gl::bf16_to_fp32(0xc040) == -3.0f);
    CHECK(gl::fp32_to_bf16(-0.0f) == 0x8000);
    CHECK(gl::fp32_to_bf16(bits_to_float(0x3f808000)) == 0x3f80); // tie: even
    CHECK(gl::fp32_to_bf16(bits_to_float(0x3f818000)) == 0x3f82); // tie: even
    CHECK(gl::fp32_to_bf16(bits_to_float(0x3f808001)) == 0x3f81); // above the tie
    CHECK(gl::fp32_to_bf16(bits_to_float(0x7f7fffff)) == 0x7f80); // max float rounds to inf
    CHECK(gl::fp32_to_bf16(std::numeric_limits<float>::infinity()) == 0x7f80);
    CHECK(gl::fp32_to_bf16(bits_to_float(0x00000001)) == 0x0000);     // tiny subnormal
    CHECK(gl::fp32_to_bf16(bits_to_float(0x00018000)) == 0x0002);     // subnormal tie: even
    const uint16_t nan = gl::fp32_to_bf16(bits_to_float(0x7f800001)); // would truncate to inf
    CHECK(std::isnan(gl::bf16_to_fp32(nan)));
    CHECK(std::isnan(gl::bf16_to_fp32(gl::fp32_to_bf16(-std::numeric_limits<float>::quiet_NaN()))));
}

// ---- hand-built blocks ------------------------------------------------------------

TEST_CASE("dequantize: hand-built blocks give hand-computed values") {
    // Q4_0 with d = 0.5: byte j holds element j (low nibble, j) and element
    // j+16 (high nibble, 15-j); value = (q - 8) * d.
    gl::BlockQ4_0 q4[2];
    q4[0].d = 0x3800; // 0.5
    q4[1].d = 0xc000; // -2
    for (int j = 0; j < 16; j++) {
        q4[0].qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
        q4[1].qs[j] = static_cast<uint8_t>(0x08 | (j << 4));
    }
    float want4[64];
    for (int j = 0; j < 16; j++) {
        want4[j] = (j - 8) * 0.5f;
        want4[j + 16] = (7 - j) * 0.5f;
        want4[32 + j] = -0.0f; // q = 8 is zero, signed like d: 0 * -2 = -0
        want4[48 + j] = (j - 8) * -2.0f;
    }
    CHECK(want4[0] == -4.0f);
    CHECK(want4[31] == -4.0f);
    CHECK(want4[16] == 3.5f);

    gl::BlockQ8_0 q8;
    q8.d = 0x3400; // 0.25
    float want8[32];
    for (int j = 0; j < 32; j++) {
        const int v = j * 8 - 128; // -128 .. 120
        q8.qs[j] = static_cast<int8_t>(v);
        want8[j] = v * 0.25f;
    }

    const uint16_t f16[4] = {0x3c00, 0xc000, 0x0001, 0x7bff};
    const float want_f16[4] = {1.0f, -2.0f, std::ldexp(1.0f, -24), 65504.0f};
    const uint16_t b16[3] = {0x3f80, 0xc040, 0x4049};
    const float want_b16[3] = {1.0f, -3.0f, bits_to_float(0x40490000)};

    for_each_table([&](const gl::KernelTable& k) {
        float got[64];
        t_dequantize(k, Type::Q4_0, q4, got, 64);
        CHECK(first_diff(got, want4, sizeof want4) == -1);
        t_dequantize(k, Type::Q8_0, &q8, got, 32);
        CHECK(first_diff(got, want8, sizeof want8) == -1);
        t_dequantize(k, Type::F16, f16, got, 4);
        CHECK(first_diff(got, want_f16, sizeof want_f16) == -1);
        t_dequantize(k, Type::BF16, b16, got, 3);
        CHECK(first_diff(got, want_b16, sizeof want_b16) == -1);
    });
}

TEST_CASE("vec_dot: hand-built Q4_0 x Q8_0 block") {
    // w = (q - 8) * 0.5 with q = j % 16; a = 1 * 2 for every element, so the
    // dot is 2 * 0.5 * sum(q - 8) = 2 * 0.5 * 2 * (-8) = -16.
    gl::BlockQ4_0 w;
    gl::BlockQ8_0 a;
    w.d = 0x3800;
    a.d = 0x4000; // 2
    for (int j = 0; j < 16; j++) w.qs[j] = static_cast<uint8_t>(j | (j << 4));
    for (int j = 0; j < 32; j++) a.qs[j] = 1;
    CHECK(gl::ref::vec_dot(Type::Q4_0, 32, &w, &a) == -16.0f);
    for_each_table(
        [&](const gl::KernelTable& k) { CHECK(t_vec_dot(k, Type::Q4_0, 32, &w, &a) == -16.0f); });
}

// ---- every table against the reference -------------------------------------------

TEST_CASE("vec_dot: exact-arithmetic rows give identical results in every table") {
    // Float rows hold integers in [-16, 16]: every product and partial sum is
    // an integer below 4192 * 256 < 2^24, so float arithmetic is exact in any
    // order. Quantized rows use q in [-15, 15] (or nibbles) and block scales
    // 2^-2..2^0: products are multiples of 2^-4 and all partial sums stay
    // below 131 * 32 * 15 * 15 < 2^20 = 2^24 units. Any difference from ref
    // is then a real bug (a dropped block, a wrong nibble), not rounding.
    uint32_t seed = 1;
    for (Type w : kSupported) {
        const bool quant = gl::type_info(w).block_size > 1;
        const std::vector<int64_t> sizes =
            quant ? std::vector<int64_t>(std::begin(kQuantSizes), std::end(kQuantSizes))
                  : std::vector<int64_t>(std::begin(kFloatSizes), std::end(kFloatSizes));
        for (int64_t n : sizes) {
            INFO("type ", std::string(gl::type_name(w)), " n ", n);
            const auto wb = exact_weights(w, n, seed++);
            const auto ab = exact_activations(w, n, seed++);
            const float want = gl::ref::vec_dot(w, n, wb.data(), ab.data());
            for_each_table([&](const gl::KernelTable& k) {
                CHECK(t_vec_dot(k, w, n, wb.data(), ab.data()) == want);
            });
        }
    }
}

TEST_CASE("vec_dot: random rows agree with ref within the float rounding bound") {
    // Tolerance: the reference sums in double (near exact). A fast kernel
    // rounds d_w * d_a once, each product at most once (none with FMA), and
    // adds at most n terms in some order; each add errs by at most u = 2^-24
    // times a partial sum, and every partial sum (lane or block) is bounded
    // by S = sum |w_i * a_i|. So |fast - exact| <= (n + 2) u S to first order;
    // we allow (n + 4) u S, plus the final rounding of ref to float.
    uint32_t seed = 100;
    for (Type w : kSupported) {
        const bool quant = gl::type_info(w).block_size > 1;
        const std::vector<int64_t> sizes =
            quant ? std::vector<int64_t>(std::begin(kQuantSizes), std::end(kQuantSizes))
                  : std::vector<int64_t>(std::begin(kFloatSizes), std::end(kFloatSizes));
        for (int64_t n : sizes) {
            INFO("type ", std::string(gl::type_name(w)), " n ", n);
            const auto wv = random_weights(w, n, seed++);
            const auto av = random_activations(w, n, seed++);
            // Copy to misaligned places (rows of a mapped file are only
            // guaranteed 2-byte alignment for 16-bit types and blocks).
            Buffer wb(wv.size(), 2), ab(av.size(), quant ? 2 : 4);
            std::memcpy(wb.p, wv.data(), wv.size());
            std::memcpy(ab.p, av.data(), av.size());
            const float want = gl::ref::vec_dot(w, n, wb.p, ab.p);
            const double tol =
                (static_cast<double>(n) + 4) * std::ldexp(1.0, -24) * abs_dot(w, n, wb.p, ab.p) +
                std::fabs(want) * std::ldexp(1.0, -24);
            for_each_table([&](const gl::KernelTable& k) {
                const float got = t_vec_dot(k, w, n, wb.p, ab.p);
                INFO("got ", got, " want ", want, " tol ", tol);
                CHECK(std::fabs(static_cast<double>(got) - want) <= tol);
            });
        }
    }
}

TEST_CASE("matvec: row groups of every table give each row's ref vec_dot") {
    // Multi-row kernels handle rows in groups (4 for Q4_0 on AVX-512 and
    // AVX2) plus a tail: every row count 1..9 and 13 hits full groups and
    // each tail length. Exact-arithmetic rows must match ref bit for bit (a
    // row or block taken from the wrong place cannot hide in rounding);
    // random rows must stay within the rounding bound of the vec_dot test
    // above. The rows start 2 bytes off alignment with a padded stride, as a
    // mapped file's rows may.
    uint32_t seed = 7000;
    for (Type w : kSupported) {
        const bool quant = gl::type_info(w).block_size > 1;
        for (int64_t n : quant ? std::vector<int64_t>{32, 96, 224, 4064}
                               : std::vector<int64_t>{1, 17, 33, 1001}) {
            for (int64_t rows : {1, 2, 3, 4, 5, 6, 7, 8, 9, 13}) {
                for (bool exact : {true, false}) {
                    INFO("type ", std::string(gl::type_name(w)), " n ", n, " rows ", rows,
                         " exact ", exact);
                    const size_t rb = gl::row_size(w, n), stride = rb + 6;
                    Buffer wb(stride * static_cast<size_t>(rows), 2);
                    std::vector<double> tol(static_cast<size_t>(rows));
                    const auto av =
                        exact ? exact_activations(w, n, seed++) : random_activations(w, n, seed++);
                    Buffer ab(av.size(), quant ? 2 : 4);
                    std::memcpy(ab.p, av.data(), av.size());
                    std::vector<float> want(static_cast<size_t>(rows));
                    for (int64_t r = 0; r < rows; r++) {
                        const auto wv =
                            exact ? exact_weights(w, n, seed++) : random_weights(w, n, seed++);
                        uint8_t* row = wb.p + static_cast<size_t>(r) * stride;
                        std::memcpy(row, wv.data(), rb);
                        want[r] = gl::ref::vec_dot(w, n, row, ab.p);
                        tol[r] = exact ? 0.0
                                       : (static_cast<double>(n) + 4) * std::ldexp(1.0, -24) *
                                                 abs_dot(w, n, row, ab.p) +
                                             std::fabs(want[r]) * std::ldexp(1.0, -24);
                    }
                    std::vector<float> ref_out(static_cast<size_t>(rows));
                    gl::ref::matvec(w, n, wb.p, stride, rows, ab.p, ref_out.data());
                    CHECK(ref_out == want);
                    for_each_table([&](const gl::KernelTable& k) {
                        std::vector<float> got(static_cast<size_t>(rows) + 1, -7.0f);
                        if (auto f = k.matvec[id(w)])
                            f(n, wb.p, stride, rows, ab.p, got.data());
                        else
                            gl::ref::matvec(w, n, wb.p, stride, rows, ab.p, got.data());
                        CHECK(got[rows] == -7.0f); // nothing written past the last row
                        for (int64_t r = 0; r < rows; r++) {
                            INFO("row ", r, " got ", got[r], " want ", want[r]);
                            CHECK(std::fabs(static_cast<double>(got[r]) - want[r]) <= tol[r]);
                        }
                    });
                }
            }
        }
    }
}

TEST_CASE("dequantize_row: every table is bit-identical to ref") {
    uint32_t seed = 200;
    for (Type t : kSupported) {
        const bool quant = gl::type_info(t).block_size > 1;
        const std::vector<int64_t> sizes =
            quant ? std::vector<int64_t>(std::begin(kQuantSizes), std::end(kQuantSizes))
                  : std::vector<int64_t>(std::begin(kFloatSizes), std::end(kFloatSizes));
        for (int64_t n : sizes) {
            INFO("type ", std::string(gl::type_name(t)), " n ", n);
            const auto src = random_weights(t, n, seed++);
            std::vector<float> want(static_cast<size_t>(n) + 1, -1.0f), got(want.size(), -1.0f);
            gl::ref::dequantize_row(t, src.data(), want.data(), n);
            for_each_table([&](const gl::KernelTable& k) {
                std::fill(got.begin(), got.end(), -1.0f);
                t_dequantize(k, t, src.data(), got.data(), n);
                CHECK(first_diff(got.data(), want.data(), got.size() * sizeof(float)) == -1);
            });
        }
    }
}

TEST_CASE("quantize_row Q8_0: every table is bit-identical to ref") {
    // The activation quantizer runs once per matrix multiply; a table that
    // rounded differently would make results depend on the CPU.
    std::vector<float> x;
    for (int scale_exp : {-30, -20, -12, -3, 0, 3, 10, 20}) {
        auto r = random_floats(4096, static_cast<uint32_t>(300 + scale_exp),
                               std::ldexp(1.0f, scale_exp));
        x.insert(x.end(), r.begin(), r.end());
    }
    // Blocks with amax 127 (d = 1 exactly) and values on .5: ties must go
    // away from zero, like roundf. Then an all-zero block and one with a
    // single nonzero value.
    for (int j = 0; j < 32; j++) x.push_back(j == 0 ? 127.0f : static_cast<float>(j - 16) + 0.5f);
    for (int j = 0; j < 32; j++) x.push_back(j == 5 ? -127.0f : -static_cast<float>(j) - 0.5f);
    for (int j = 0; j < 32; j++) x.push_back(0.0f);
    for (int j = 0; j < 32; j++) x.push_back(j == 31 ? -1e-3f : 0.0f);
    const int64_t n = static_cast<int64_t>(x.size());
    REQUIRE(n % 32 == 0);

    std::vector<uint8_t> want(gl::row_size(Type::Q8_0, n)), got(want.size() + 1);
    gl::ref::quantize_row(Type::Q8_0, x.data(), want.data(), n);
    // Spot-check the tie blocks against roundf by hand.
    const auto* tb = reinterpret_cast<const gl::BlockQ8_0*>(want.data()) + (n / 32 - 4);
    CHECK(gl::fp16_to_fp32(tb[0].d) == 1.0f);
    CHECK(tb[0].qs[1] == -15); // -14.5 -> -15
    CHECK(tb[0].qs[31] == 16); // 15.5 -> 16
    CHECK(tb[1].qs[1] == -2);  // -1.5 -> -2
    CHECK(tb[1].qs[0] == -1);  // -0.5 -> -1
    CHECK(tb[2].d == 0);

    for_each_table([&](const gl::KernelTable& k) {
        for (int64_t len : {int64_t{32}, int64_t{96}, n}) {
            INFO("n ", len);
            std::fill(got.begin(), got.end(), 0xee);
            t_quantize(k, Type::Q8_0, x.data() + (n - len), got.data(), len);
            const size_t bytes = gl::row_size(Type::Q8_0, len);
            CHECK(first_diff(got.data(), want.data() + (want.size() - bytes), bytes) == -1);
            CHECK(got[bytes] == 0xee); // nothing written past the row
        }
    });
}

TEST_CASE("quantize_row F16/BF16: every table is bit-identical to ref, specials included") {
    std::vector<float> x = random_floats(1001, 400, 100.0f);
    const float specials[] = {0.0f,
                              -0.0f,
                              65504.0f,
                              65519.0f,
                              65520.0f,
                              -65520.0f,
                              1e30f,
                              std::numeric_limits<float>::infinity(),
                              -std::numeric_limits<float>::infinity(),
                              std::numeric_limits<float>::quiet_NaN(),
                              bits_to_float(0x7f800001),
                              bits_to_float(0xffc12345),
                              std::ldexp(1.0f, -24),
                              std::ldexp(1.0f, -25),
                              std::ldexp(3.0f, -25),
                              std::ldexp(1.0f, -14),
                              1.0f + std::ldexp(1.0f, -11),
                              bits_to_float(0x00000001),
                              bits_to_float(0x3f808000)};
    x.insert(x.end(), std::begin(specials), std::end(specials));
    std::mt19937 rng(401);
    for (int i = 0; i < 4000; i++) x.push_back(bits_to_float(static_cast<uint32_t>(rng())));
    const int64_t n = static_cast<int64_t>(x.size());

    for (Type t : {Type::F16, Type::BF16}) {
        std::vector<uint16_t> want(static_cast<size_t>(n)), got(want.size() + 1);
        gl::ref::quantize_row(t, x.data(), want.data(), n);
        for_each_table([&](const gl::KernelTable& k) {
            for (int64_t len : {int64_t{1}, int64_t{7}, int64_t{17}, n}) {
                INFO("type ", std::string(gl::type_name(t)), " n ", len);
                std::fill(got.begin(), got.end(), uint16_t{0xeeee});
                t_quantize(k, t, x.data(), got.data(), len);
                CHECK(first_diff(got.data(), want.data(), static_cast<size_t>(len) * 2) == -1);
                CHECK(got[static_cast<size_t>(len)] == 0xeeee);
            }
        });
    }
}

TEST_CASE("quantize -> dequantize round trip stays within half a step") {
    for (int scale_exp : {-10, 0, 8}) {
        INFO("scale 2^", scale_exp);
        const int64_t n = 4096;
        const auto x =
            random_floats(n, static_cast<uint32_t>(500 + scale_exp), std::ldexp(1.0f, scale_exp));
        std::vector<float> y(static_cast<size_t>(n));

        // Q8_0: q is chosen against the stored fp16 d and |x| / d <= 127.06,
        // so no clamping: |x - q d| <= d / 2, plus float rounding of x / d and
        // of q * d (a few ulps of |x|).
        std::vector<gl::BlockQ8_0> q8(static_cast<size_t>(n / 32));
        gl::ref::quantize_row(Type::Q8_0, x.data(), q8.data(), n);
        gl::ref::dequantize_row(Type::Q8_0, q8.data(), y.data(), n);
        int bad8 = 0;
        for (int64_t i = 0; i < n; i++) {
            const double d = gl::fp16_to_fp32(q8[static_cast<size_t>(i / 32)].d);
            bad8 += std::fabs(x[i] - y[i]) > d / 2 + std::fabs(x[i]) * 4e-7;
        }
        CHECK(bad8 == 0);

        // Q4_0: same half step, except the one case the asymmetric range
        // cannot hold: x near -max lands on x/d ~ +8 and is clamped to 7,
        // an error of up to one full step.
        std::vector<gl::BlockQ4_0> q4(static_cast<size_t>(n / 32));
        gl::ref::quantize_row(Type::Q4_0, x.data(), q4.data(), n);
        gl::ref::dequantize_row(Type::Q4_0, q4.data(), y.data(), n);
        int bad4 = 0;
        for (int64_t i = 0; i < n; i++) {
            const double d = gl::fp16_to_fp32(q4[static_cast<size_t>(i / 32)].d);
            const bool clamped = x[i] / d > 7.5;
            const double bound =
                (clamped ? std::fabs(d) : std::fabs(d) / 2) + std::fabs(x[i]) * 4e-7;
            bad4 += std::fabs(x[i] - y[i]) > bound;
        }
        CHECK(bad4 == 0);
    }
    // The largest-magnitude value itself maps to q = 0, i.e. exactly -8 d.
    float x[32] = {};
    x[3] = -3.0f;
    x[7] = 1.0f;
    gl::BlockQ4_0 b;
    gl::ref::quantize_row(Type::Q4_0, x, &b, 32);
    CHECK(gl::fp16_to_fp32(b.d) == 0.375f);
    CHECK((b.qs[3] & 0x0f) == 0);
    float y[32];
    gl::ref::dequantize_row(Type::Q4_0, &b, y, 32);
    CHECK(y[3] == -3.0f);
    CHECK(y[0] == 0.0f);
}

TEST_CASE("axpy: every table matches ref within one rounding") {
    // ref computes y + round(alpha * x); a kernel may fuse (one rounding).
    // The two differ by at most an ulp of each: 2^-23 (|alpha x| + |y|).
    uint32_t seed = 600;
    for (Type t : kFloatTypes) {
        for (int64_t n : kFloatSizes) {
            INFO("type ", std::string(gl::type_name(t)), " n ", n);
            const auto xb = random_weights(t, n, seed++);
            const auto y0 = random_floats(n, seed++);
            std::vector<float> xf(static_cast<size_t>(n));
            gl::ref::dequantize_row(t, xb.data(), xf.data(), n);
            const float alpha = -0.7f;
            std::vector<float> want(y0);
            gl::ref::axpy(t, n, alpha, xb.data(), want.data());
            for_each_table([&](const gl::KernelTable& k) {
                std::vector<float> got(y0);
                got.push_back(123.0f); // sentinel past the row
                t_axpy(k, t, n, alpha, xb.data(), got.data());
                int bad = 0;
                for (size_t i = 0; i < want.size(); i++) {
                    const double tol =
                        std::ldexp(1.0, -23) * (std::fabs(alpha * xf[i]) + std::fabs(y0[i]));
                    bad += std::fabs(static_cast<double>(got[i]) - want[i]) > tol;
                }
                CHECK(bad == 0);
                CHECK(got.back() == 123.0f);
            });
        }
    }
}

// ---- attention row kernels ---------------------------------------------------------

// n rows of `hd` elements of type t, each the head of a wider cache row (a
// stride apart) starting at an offset: how attention sees one head of K or V.
struct HeadRows {
    static constexpr int64_t kOffset = 3;
    int64_t row_elems;
    size_t stride;
    std::vector<uint8_t> cache;
    HeadRows(Type t, int64_t hd, int64_t n, uint32_t seed)
        : row_elems(hd + 19), stride(static_cast<size_t>(row_elems) * gl::type_info(t).type_size),
          cache(random_weights(t, row_elems * n, seed)) {}
    const uint8_t* head0() const { return cache.data() + stride / row_elems * kOffset; }
};

TEST_CASE("attention rows: dot_rows, axpy_rows and exp_sum of every table match ref") {
    uint32_t seed = 700;
    for (Type t : kFloatTypes) {
        // 200: more than the register-held chunks; 63, 72, 127: 8-wide chunks
        // with and without 64-element slices, and 8-wide tails after them.
        for (int64_t hd : {1, 7, 16, 33, 63, 64, 72, 80, 127, 128, 200})
            for (int64_t n : {1, 5, 17}) { // 17: groups of 8 and 16 rows, and the rest
                INFO("type ", std::string(gl::type_name(t)), " head_dim ", hd, " rows ", n);
                const HeadRows rows(t, hd, n, seed++);
                const size_t stride = rows.stride;
                const uint8_t* head0 = rows.head0();
                const auto q = random_floats(hd, seed++);
                const auto w = random_floats(n, seed++);
                std::vector<float> want_s(static_cast<size_t>(n)),
                    want_y(random_floats(hd, seed++)), y0 = want_y;
                gl::ref::dot_rows(t, hd, head0, stride, n, q.data(), 0.125f, want_s.data());
                gl::ref::axpy_rows(t, hd, head0, stride, n, w.data(), want_y.data());
                // Bounds: float rounding of sums of |terms| (dot: hd terms; axpy: n terms per
                // element).
                std::vector<float> rowf(static_cast<size_t>(hd));
                std::vector<double> mag_s(static_cast<size_t>(n)), mag_y(y0.begin(), y0.end());
                for (auto& m : mag_y) m = std::fabs(m);
                for (int64_t i = 0; i < n; i++) {
                    gl::ref::dequantize_row(t, head0 + i * stride, rowf.data(), hd);
                    for (int64_t d = 0; d < hd; d++) {
                        mag_s[i] += std::fabs(rowf[d] * q[d]) * 0.125;
                        mag_y[d] += std::fabs(rowf[d] * w[i]);
                    }
                }
                for_each_table([&](const gl::KernelTable& k) {
                    std::vector<float> s(static_cast<size_t>(n) + 1, 123.0f), y(y0);
                    y.push_back(123.0f);
                    const auto id_t = id(t);
                    k.dot_rows[id_t]
                        ? k.dot_rows[id_t](hd, head0, stride, n, q.data(), 0.125f, s.data())
                        : gl::ref::dot_rows(t, hd, head0, stride, n, q.data(), 0.125f, s.data());
                    k.axpy_rows[id_t]
                        ? k.axpy_rows[id_t](hd, head0, stride, n, w.data(), y.data())
                        : gl::ref::axpy_rows(t, hd, head0, stride, n, w.data(), y.data());
                    int bad = 0;
                    for (int64_t i = 0; i < n; i++)
                        bad +=
                            std::fabs(s[i] - want_s[i]) > 1e-6 * mag_s[i] * static_cast<double>(hd);
                    for (int64_t d = 0; d < hd; d++)
                        bad += std::fabs(y[d] - want_y[d]) >
                               1e-6 * mag_y[d] * static_cast<double>(n + 1);
                    CHECK(bad == 0);
                    CHECK(s[n] == 123.0f);
                    CHECK(y[hd] == 123.0f);
                });
            }
    }
    // exp_sum: scores from far below the max to the max, with -inf holes;
    // then scores 80..95 below the max (where fast exps flush to 0 or turn
    // denormal); then only -inf (the max is -inf too: every weight 0).
    enum Kind { Spread, NearUnderflow, AllMinusInf };
    const std::pair<int64_t, Kind> cases[] = {
        {1, Spread},   {7, Spread},    {15, Spread},         {16, Spread},     {17, Spread},
        {100, Spread}, {4099, Spread}, {100, NearUnderflow}, {13, AllMinusInf}};
    for (const auto& [n, kind] : cases) {
        INFO("exp_sum n ", n, " kind ", static_cast<int>(kind));
        std::vector<float> x = random_floats(n, seed++);
        for (int64_t i = 0; i < n; i++) {
            if (kind == Spread)
                x[i] = i % 7 == 3 ? -INFINITY : x[i] * 40.0f;
            else if (kind == NearUnderflow)
                x[i] = i == n - 1 ? 0.0f : -80.0f - 0.15f * static_cast<float>(i);
            else
                x[i] = -INFINITY;
        }
        const float mx = *std::max_element(x.begin(), x.end());
        std::vector<float> want = x;
        const float want_sum = gl::ref::exp_sum(want.data(), n, mx);
        for_each_table([&](const gl::KernelTable& k) {
            std::vector<float> got = x;
            got.push_back(123.0f);
            const float sum =
                k.exp_sum ? k.exp_sum(got.data(), n, mx) : gl::ref::exp_sum(got.data(), n, mx);
            int bad = 0;
            // Relative 1e-6, plus an absolute floor for results that are
            // denormal (exp below -87, where only the order of magnitude counts).
            for (int64_t i = 0; i < n; i++) {
                if (x[i] == -INFINITY)
                    bad += got[i] != 0.0f; // exactly 0, not tiny
                else
                    bad += std::fabs(got[i] - want[i]) > 1e-6 * want[i] + 1e-37;
            }
            CHECK(bad == 0);
            CHECK(std::fabs(sum - want_sum) <= 1e-5 * want_sum);
            if (mx == -INFINITY) CHECK(sum == 0.0f);
            CHECK(got.back() == 123.0f);
        });
    }
}

TEST_CASE("max_of: every table gives ref's largest value, skipping NaNs") {
    // Lengths around each unroll (8, 16, 32 lanes) and long; the largest
    // value placed first, last and in the middle; -inf holes and NaNs that a
    // plain vector max would return; all -inf and empty give -inf.
    uint32_t seed = 1300;
    for (int64_t n : {0, 1, 7, 8, 9, 15, 16, 17, 31, 32, 33, 47, 64, 100, 4099}) {
        for (int where : {0, 1, 2}) {
            for (bool holes : {false, true}) {
                INFO("n ", n, " max at ", where, " holes ", holes);
                std::vector<float> x = random_floats(n, seed++);
                if (holes)
                    for (int64_t i = 0; i < n; i++)
                        if (i % 5 == 2) x[i] = i % 2 ? NAN : -INFINITY;
                if (n > 0) x[where == 0 ? 0 : where == 1 ? n - 1 : n / 2] = 1e30f;
                const float want = gl::ref::max_of(x.data(), n);
                if (n > 0) CHECK(want == 1e30f);
                for_each_table([&](const gl::KernelTable& k) {
                    const float got = k.max_of ? k.max_of(x.data(), n) : want;
                    CHECK(got == want);
                });
            }
        }
    }
    const std::vector<float> minus_inf(13, -INFINITY);
    CHECK(gl::ref::max_of(minus_inf.data(), 0) == -INFINITY);
    for_each_table([&](const gl::KernelTable& k) {
        if (k.max_of) CHECK(k.max_of(minus_inf.data(), 13) == -INFINITY);
    });
}

// ---- dispatch -----------------------------------------------------------------------

TEST_CASE("attention tiles: rows_to_f32 is exact and axpy_heads matches ref in every table") {
    uint32_t seed = 900;
    // rows_to_f32: every float type widens exactly, so bit-identical to ref;
    // heads of every tail length, rows of a wider cache row at an offset.
    for (Type t : kFloatTypes) {
        for (int64_t hd : {1, 7, 16, 33, 63, 64, 80, 127, 128, 200})
            for (int64_t n : {1, 5, 17}) {
                INFO("rows_to_f32 ", std::string(gl::type_name(t)), " head_dim ", hd, " rows ", n);
                const HeadRows rows(t, hd, n, seed++);
                const size_t stride = rows.stride;
                const uint8_t* head0 = rows.head0();
                std::vector<float> want(static_cast<size_t>(hd * n));
                gl::ref::rows_to_f32(t, hd, head0, stride, n, want.data());
                for (int64_t i = 0; i < n; i++) { // against the plain row conversion too
                    std::vector<float> row(static_cast<size_t>(rows.row_elems));
                    gl::ref::dequantize_row(t, rows.cache.data() + i * stride, row.data(),
                                            rows.row_elems);
                    CHECK(std::equal(row.begin() + HeadRows::kOffset,
                                     row.begin() + HeadRows::kOffset + hd, want.begin() + i * hd));
                }
                for_each_table([&](const gl::KernelTable& k) {
                    std::vector<float> got(want.size() + 1, 123.0f);
                    auto f = k.rows_to_f32[id(t)];
                    f ? f(hd, head0, stride, n, got.data())
                      : gl::ref::rows_to_f32(t, hd, head0, stride, n, got.data());
                    CHECK(first_diff(got.data(), want.data(), want.size() * sizeof(float)) == -1);
                    CHECK(got.back() == 123.0f);
                });
            }
    }
    // axpy_heads: rows of every float type, 1..9 heads (groups of two or
    // four and every remainder), heads of 32 and 64 multiples and tails,
    // weights with zeros; each head's output within float rounding of n + 1
    // terms of the reference.
    for (Type t : kFloatTypes)
        for (int nh : {1, 2, 3, 4, 5, 7, 8, 9})
            for (int64_t hd : {7, 33, 64, 80, 128, 200})
                for (int64_t n : {1, 13, 64}) {
                    INFO("axpy_heads ", std::string(gl::type_name(t)), " heads ", nh, " head_dim ",
                         hd, " rows ", n);
                    const int64_t row_elems = hd + 5;
                    // The rows as stored (t) and as the floats they hold.
                    const auto floats = random_floats(row_elems * n, seed++);
                    const size_t stride = gl::row_size(t, row_elems);
                    std::vector<uint8_t> stored(stride * static_cast<size_t>(n));
                    std::vector<float> rows(floats.size());
                    for (int64_t i = 0; i < n; i++) {
                        gl::ref::quantize_row(t, floats.data() + i * row_elems,
                                              stored.data() + i * stride, row_elems);
                        gl::ref::dequantize_row(t, stored.data() + i * stride,
                                                rows.data() + i * row_elems, row_elems);
                    }
                    const size_t ws = static_cast<size_t>(n) + 3;
                    auto w = random_floats(static_cast<int64_t>(ws) * nh, seed++);
                    for (size_t i = 0; i < w.size(); i += 5) w[i] = 0.0f;
                    std::vector<std::vector<float>> want(static_cast<size_t>(nh));
                    std::vector<float*> want_p;
                    for (auto& v : want) {
                        v = random_floats(hd + 1, seed++);
                        want_p.push_back(v.data());
                    }
                    const auto start = want;
                    gl::ref::axpy_heads(t, hd, stored.data(), stride, n, w.data(), ws, nh,
                                        want_p.data());
                    for_each_table([&](const gl::KernelTable& k) {
                        auto got = start;
                        std::vector<float*> got_p;
                        for (auto& v : got) got_p.push_back(v.data());
                        auto f = k.axpy_heads[id(t)];
                        f ? f(hd, stored.data(), stride, n, w.data(), ws, nh, got_p.data())
                          : gl::ref::axpy_heads(t, hd, stored.data(), stride, n, w.data(), ws, nh,
                                                got_p.data());
                        int bad = 0;
                        for (int j = 0; j < nh; j++) {
                            for (int64_t d = 0; d < hd; d++) {
                                double mag = std::fabs(start[j][d]);
                                for (int64_t i = 0; i < n; i++)
                                    mag += std::fabs(rows[i * row_elems + d] * w[j * ws + i]);
                                bad += std::fabs(got[j][d] - want[j][d]) >
                                       1e-6 * mag * static_cast<double>(n + 1);
                            }
                            bad += got[j][hd] != start[j][hd]; // nothing written past the head
                        }
                        CHECK(bad == 0);
                    });
                }
}

TEST_CASE("attention key tiles: dot_tile matches the row dot products in every table") {
    // Keys of every float type laid out as key tiles (gl::key_tile_index) of a
    // head's n keys: whole tiles and the short last one; 1..10 query heads
    // (more than kKeyTileHeads takes two groups); every head size from 1 to
    // past 128; key ranges [lo, hi) that start and end inside a tile. The
    // reference must give each key's plain dot product with the query, and
    // every table must give the reference's within float rounding; nothing is
    // written outside [0, hi - lo) of each head's output.
    uint32_t seed = 1300;
    for (Type t : kFloatTypes)
        for (int64_t hd : {1, 7, 16, 33, 64, 80, 128, 200})
            for (int64_t n_keys : {16, 21, 37}) {
                const size_t e = gl::type_info(t).type_size;
                const auto floats = random_floats(hd * n_keys, seed++);
                std::vector<uint8_t> rows(static_cast<size_t>(hd * n_keys) * e), tiles(rows.size());
                std::vector<float> keys(floats.size()); // as the floats t holds
                for (int64_t s = 0; s < n_keys; s++) {
                    gl::ref::quantize_row(t, floats.data() + s * hd, rows.data() + s * hd * e, hd);
                    gl::ref::dequantize_row(t, rows.data() + s * hd * e, keys.data() + s * hd, hd);
                    for (int64_t d = 0; d < hd; d++)
                        std::memcpy(tiles.data() + gl::key_tile_index(s, d, hd, n_keys) * e,
                                    rows.data() + (s * hd + d) * e, e);
                }
                for (int nh : {1, 3, 4, 5, 8, 10}) {
                    const auto q = random_floats(hd * nh, seed++);
                    const float scale = 0.37f;
                    for (int64_t t0 = 0; t0 < n_keys; t0 += gl::kKeyTile) {
                        const int width = gl::key_tile_width(t0, n_keys);
                        for (auto [lo, hi] : {std::pair{0, width}, std::pair{width / 3, width},
                                              std::pair{1, std::max(1, width - 2)}}) {
                            INFO("dot_tile ", std::string(gl::type_name(t)), " head_dim ", hd,
                                 " keys ", n_keys, " tile ", t0, " heads ", nh, " lanes ", lo, "..",
                                 hi);
                            const size_t os = 19; // > kKeyTile: room to see stray writes
                            const uint8_t* tile = tiles.data() + t0 * hd * e;
                            std::vector<float> want(os * nh, -7.0f);
                            gl::ref::dot_tile(t, hd, tile, width, lo, hi, q.data(), nh, scale,
                                              want.data(), os);
                            auto within = [&](const std::vector<float>& got,
                                              const std::vector<float>& exact) {
                                int bad = 0;
                                for (int j = 0; j < nh; j++)
                                    for (int i = 0; i < static_cast<int>(os); i++) {
                                        const float g = got[j * os + i];
                                        if (i >= hi - lo) {
                                            bad += g != -7.0f;
                                            continue;
                                        }
                                        double mag = 0;
                                        const float* key = keys.data() + (t0 + lo + i) * hd;
                                        for (int64_t d = 0; d < hd; d++)
                                            mag += std::fabs(key[d] * q[j * hd + d]) * scale;
                                        bad += std::fabs(g - exact[j * os + i]) >
                                               1e-6 * mag * static_cast<double>(hd + 1);
                                    }
                                return bad;
                            };
                            // The reference against each key's dot product.
                            std::vector<float> exact(want.size(), -7.0f);
                            for (int j = 0; j < nh; j++)
                                for (int i = lo; i < hi; i++) {
                                    double sum = 0;
                                    for (int64_t d = 0; d < hd; d++)
                                        sum += static_cast<double>(keys[(t0 + i) * hd + d]) *
                                               q[j * hd + d];
                                    exact[j * os + i - lo] = static_cast<float>(sum * scale);
                                }
                            CHECK(within(want, exact) == 0);
                            for_each_table([&](const gl::KernelTable& k) {
                                std::vector<float> got(want.size(), -7.0f);
                                auto f = k.dot_tile[id(t)];
                                f ? f(hd, tile, width, lo, hi, q.data(), nh, scale, got.data(), os)
                                  : gl::ref::dot_tile(t, hd, tile, width, lo, hi, q.data(), nh,
                                                      scale, got.data(), os);
                                CHECK(within(got, want) == 0);
                            });
                        }
                    }
                }
            }
}

TEST_CASE("dispatch: tables, cpu:: routing and force_scalar") {
    const int count = gl::kernel_table_count();
    REQUIRE(count >= 1);
    CHECK(std::string(gl::kernel_table(count - 1).isa) == "scalar");
    CHECK(std::string(gl::cpu::isa_name()) == gl::kernel_table(0).isa);
    MESSAGE("kernel tables: ", count, ", best: ", std::string(gl::kernel_table(0).isa));

    const int64_t n = 4096 + 96;
    const auto wb = random_weights(Type::Q4_0, n, 700);
    const auto x = random_floats(n, 701);
    std::vector<uint8_t> a(gl::row_size(Type::Q8_0, n)), a0(a.size());
    gl::cpu::quantize_row(Type::Q8_0, x.data(), a.data(), n);
    t_quantize(gl::kernel_table(0), Type::Q8_0, x.data(), a0.data(), n);
    CHECK(a == a0);
    CHECK(gl::cpu::vec_dot(Type::Q4_0, n, wb.data(), a.data()) ==
          t_vec_dot(gl::kernel_table(0), Type::Q4_0, n, wb.data(), a.data()));

    gl::cpu::force_scalar(true);
    CHECK(std::string(gl::cpu::isa_name()) == "scalar");
    CHECK(gl::cpu::vec_dot(Type::Q4_0, n, wb.data(), a.data()) ==
          gl::ref::vec_dot(Type::Q4_0, n, wb.data(), a.data()));
    std::vector<float> y(static_cast<size_t>(n)), y_ref(y.size());
    gl::cpu::dequantize_row(Type::Q4_0, wb.data(), y.data(), n);
    gl::ref::dequantize_row(Type::Q4_0, wb.data(), y_ref.data(), n);
    CHECK(y == y_ref);
    gl::cpu::force_scalar(false);
    CHECK(std::string(gl::cpu::isa_name()) == gl::kernel_table(0).isa);

    // Out-of-range indices give the scalar table rather than garbage.
    CHECK(std::string(gl::kernel_table(count).isa) == "scalar");
    CHECK(std::string(gl::kernel_table(-1).isa) == "scalar");
}
