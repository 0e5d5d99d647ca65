// The CUDA backend.
//
// Part 1 runs everywhere (no GPU needed): the element access the kernels use
// (ggml-like/cuda/dequant.h, host+device code) against the scalar reference,
// bit for bit, for every type; the KV quantizers; the visibility rules; and a
// host emulation of the split-and-merge attention against gl::attention.
//
// Part 2 needs a GPU (gl::cuda_available) and is skipped with a MESSAGE
// otherwise: every CUDA op against the CPU reference on odd sizes and every
// supported type, the KV mirror, zero-copy weights, the goldens
// (../shared/golden, or $KVRUN_SHARED_DIR) through the CUDA backend, the
// hot/cold KV split (--kv-gpu-window) against all-GPU, -ngl splits, and the
// device-resident decode step recorded as a CUDA graph against eager launches
// (bit for bit) and against the CPU, with a forced graph failure redone.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "cli/common.h"
#include "error.h"
#include "forward.h"
#include "ggml-like/backend.h"
#include "ggml-like/cuda/dequant.h"
#include "ggml-like/cuda/cuda_backend.h"
#include "ggml-like/cpu/ops.h"
#include "ggml-like/kernels.h"
#include "ggml-like/blocks_k.h"
#include "kv_cache.h"
#include "memory_plan.h"
#include "loader.h"
#include "attention_problem.h"
#include "test_util.h"

namespace fs = std::filesystem;
using gl::Type;
namespace gc = gl::cuda;

namespace {

// The byte offsets dequant.h uses are the structs' layouts.
static_assert(offsetof(gl::BlockQ4_K, scales) == 4 && offsetof(gl::BlockQ4_K, qs) == 16);
static_assert(offsetof(gl::BlockQ5_K, qh) == 16 && offsetof(gl::BlockQ5_K, qs) == 48);
static_assert(offsetof(gl::BlockQ6_K, qh) == 128 && offsetof(gl::BlockQ6_K, scales) == 192 &&
              offsetof(gl::BlockQ6_K, d) == 208);
static_assert(offsetof(gl::BlockQ2_K, qs) == 16 && offsetof(gl::BlockQ2_K, d) == 80 &&
              offsetof(gl::BlockQ2_K, dmin) == 82);
static_assert(offsetof(gl::BlockQ3_K, qs) == 32 && offsetof(gl::BlockQ3_K, scales) == 96 &&
              offsetof(gl::BlockQ3_K, d) == 108);
static_assert(offsetof(gl::BlockQ4_1, qs) == 4 && offsetof(gl::BlockQ5_0, qh) == 2 &&
              offsetof(gl::BlockQ5_0, qs) == 6 && offsetof(gl::BlockQ5_1, qh) == 4 &&
              offsetof(gl::BlockQ5_1, qs) == 8 && offsetof(gl::BlockIQ4_NL, qs) == 2);
static_assert(gc::TypeTraits<gc::tid(Type::Q4_K)>::bytes == sizeof(gl::BlockQ4_K) &&
              gc::TypeTraits<gc::tid(Type::Q5_K)>::bytes == sizeof(gl::BlockQ5_K) &&
              gc::TypeTraits<gc::tid(Type::Q6_K)>::bytes == sizeof(gl::BlockQ6_K) &&
              gc::TypeTraits<gc::tid(Type::Q2_K)>::bytes == sizeof(gl::BlockQ2_K) &&
              gc::TypeTraits<gc::tid(Type::Q3_K)>::bytes == sizeof(gl::BlockQ3_K));

// The CUDA matmul takes every compute type and attention every KV type.
constexpr const auto& kMatmulTypes = gl::kComputeTypes;
constexpr const auto& kKvTypes = gl::kKvTypes;

using kvtest::random_floats;

std::vector<uint8_t> quantize(Type t, const std::vector<float>& x, int64_t n, int64_t rows) {
    const size_t rb = gl::row_size(t, n);
    std::vector<uint8_t> q(rb * rows);
    for (int64_t r = 0; r < rows; r++)
        gl::ref::quantize_row(t, x.data() + r * n, q.data() + r * rb, n);
    return q;
}

bool same_bits(float a, float b) {
    return std::memcmp(&a, &b, sizeof a) == 0 || (std::isnan(a) && std::isnan(b));
}

template <uint32_t T> void dequant8_row(const uint8_t* row, int64_t n, float* out) {
    for (int64_t k = 0; k < n / 8 * 8; k += 8) gc::dequant8<T>(row, k, out + k);
    for (int64_t k = n / 8 * 8; k < n; k++) out[k] = gc::load1<T>(row, k);
}

void dequant_dev_path(Type t, const uint8_t* row, int64_t n, float* out) {
    switch (t) {
#define GL_CASE(X)                                                                                 \
    case Type::X:                                                                                  \
        return dequant8_row<gc::tid(Type::X)>(row, n, out);
        GL_CASE(F32)
        GL_CASE(F16)
        GL_CASE(BF16)
        GL_CASE(Q8_0)
        GL_CASE(Q4_0)
        GL_CASE(Q4_1)
        GL_CASE(Q5_0)
        GL_CASE(Q5_1)
        GL_CASE(IQ4_NL)
        GL_CASE(Q2_K)
        GL_CASE(Q3_K)
        GL_CASE(Q4_K)
        GL_CASE(Q5_K)
        GL_CASE(Q6_K)
#undef GL_CASE
    default:
        FAIL("no device path for ", gl::type_name(t));
    }
}

std::string shared_dir() {
    if (const char* e = std::getenv("KVRUN_SHARED_DIR")) return e;
    return kvtest::shared("");
}

// A model under ../shared/models, or null (after saying so) when it is missing.
auto shared_model(const char* name) -> decltype(kvrun::LoadedModel::load(std::string())) {
    const fs::path mp = fs::path(shared_dir()) / "models" / name;
    if (!fs::exists(mp)) {
        MESSAGE("skipped: no ", mp.string());
        return nullptr;
    }
    return kvrun::LoadedModel::load(mp.string());
}

bool gpu_or_skip() {
    std::string why;
    if (gl::cuda_available(&why)) return true;
    MESSAGE("CUDA tests skipped: ", why);
    return false;
}

// ---- a host emulation of the CUDA attention: chunks, then the log-sum-exp merge ----

float kv_dot_host(const gl::AttentionArgs& a, const uint8_t* row, int64_t e0, const float* q) {
    float acc = 0.0f;
    for (int d = 0; d < a.head_dim; d++) acc += gc::kv_elem(a.k_type, row, e0 + d) * q[d];
    return acc;
}

void emulate_attention(const gl::AttentionArgs& a, float* out) {
    const int hd = a.head_dim, kvd = a.n_head_kv * hd;
    const int n_split = (a.n_ctx + a.n_tok + 255) / 256;
    for (int t = 0; t < a.n_tok; t++)
        for (int h = 0; h < a.n_head; h++) {
            const int kvh = h / (a.n_head / a.n_head_kv);
            const int64_t e0 = static_cast<int64_t>(kvh) * hd, p = a.pos[t];
            const float* q = a.q + (static_cast<int64_t>(t) * a.n_head + h) * hd;
            const float* qu =
                a.q_unrot ? a.q_unrot + (static_cast<int64_t>(t) * a.n_head + h) * hd : nullptr;
            std::vector<float> m(n_split), l(n_split), acc(static_cast<size_t>(n_split) * hd, 0.0f);
            for (int sp = 0; sp < n_split; sp++) {
                const int k0 = sp * 256, k1 = std::min(k0 + 256, a.n_ctx + a.n_tok);
                std::vector<float> sc(k1 - k0, -INFINITY);
                for (int i = k0; i < k1; i++) {
                    if (i < a.n_ctx) {
                        const int64_t spos = a.slot_pos[i];
                        const int kind = gc::slot_kind(spos, p, a.n_ctx, a.n_sink, a.window);
                        if (kind == gc::kShiftedSink) {
                            const float* sk = a.sink_k + spos * kvd + e0;
                            float s = 0;
                            for (int d = 0; d < hd; d++) s += sk[d] * qu[d];
                            sc[i - k0] = s * a.scale;
                        } else if (kind == gc::kKey) {
                            sc[i - k0] = kv_dot_host(a,
                                                     static_cast<const uint8_t*>(a.k_slots) +
                                                         i * a.k_row_bytes,
                                                     e0, q) *
                                         a.scale;
                        }
                    } else {
                        const int u = i - a.n_ctx;
                        if (u <= t && gc::batch_kind(u, t, a.pos[u], p, a.n_ctx, a.n_sink,
                                                     a.window) == gc::kKey)
                            sc[i - k0] = kv_dot_host(a,
                                                     static_cast<const uint8_t*>(a.k_new) +
                                                         u * a.k_row_bytes,
                                                     e0, q) *
                                         a.scale;
                    }
                }
                float mx = -INFINITY;
                for (float s : sc) mx = std::max(mx, s);
                float sum = 0;
                for (float& s : sc) {
                    s = s == -INFINITY ? 0.0f : std::exp(s - mx);
                    sum += s;
                }
                m[sp] = mx;
                l[sp] = sum;
                for (int i = k0; i < k1; i++) {
                    if (sc[i - k0] == 0.0f) continue;
                    const auto* row =
                        i < a.n_ctx
                            ? static_cast<const uint8_t*>(a.v_slots) + i * a.v_row_bytes
                            : static_cast<const uint8_t*>(a.v_new) + (i - a.n_ctx) * a.v_row_bytes;
                    for (int d = 0; d < hd; d++)
                        acc[sp * hd + d] += sc[i - k0] * gc::kv_elem(a.v_type, row, e0 + d);
                }
            }
            float M = -INFINITY, L = 0;
            for (int sp = 0; sp < n_split; sp++)
                if (l[sp] > 0) M = std::max(M, m[sp]);
            for (int sp = 0; sp < n_split; sp++)
                if (l[sp] > 0) L += l[sp] * std::exp(m[sp] - M);
            float* o = out + (static_cast<int64_t>(t) * a.n_head + h) * hd;
            for (int d = 0; d < hd; d++) {
                float s = 0;
                for (int sp = 0; sp < n_split; sp++)
                    if (l[sp] > 0) s += acc[sp * hd + d] * std::exp(m[sp] - M);
                o[d] = s / L;
            }
        }
}

using AttnCase = kvtest::AttentionCase;
using AttnData = kvtest::AttentionProblem;

// Attention of problem d on `be` against the CPU backend: max |diff|.
double backend_vs_cpu(gl::Backend& cpu, gl::Backend& be, AttnData& d) {
    const AttnCase& c = d.c;
    cpu.reserve(
        0, gl::attention_scratch_floats(1, c.n_ctx, c.n_tok, c.n_head_kv * c.head_dim, c.head_dim));
    cpu.attention(d.a);
    const std::vector<float> want = d.out;
    std::fill(d.out.begin(), d.out.end(), NAN);
    be.attention(d.a);
    return kvtest::max_abs_diff(d.out, want);
}

const AttnCase kAttnCases[] = {
    // n_tok n_head n_kv hd n_ctx sink past  K          V
    {1, 4, 4, 32, 64, 4, 10, Type::F16, Type::F16},     // decode, partly filled
    {7, 6, 2, 48, 100, 4, 20, Type::F32, Type::F16},    // 3:1 GQA, odd head dim, prompt batch
    {1, 8, 2, 64, 3000, 4, 2999, Type::F16, Type::F16}, // long context: 12 chunks, full ring
    {1, 4, 1, 64, 128, 4, 700, Type::F16, Type::F32},   // slid: shifted sinks, wrapped ring
    {3, 4, 2, 64, 128, 4, 300, Type::F16, Type::F16},   // slid batch
    {5, 4, 4, 16, 64, 4, 90, Type::Q8_0, Type::Q4_0},   // heads start mid-block
    {2, 2, 2, 80, 96, 0, 200, Type::BF16, Type::Q8_0},  // no sinks, slid
    {33, 4, 2, 32, 300, 4, 0, Type::F16, Type::F16},    // first batch: empty ring
};

// Tolerance for float results: relative to the sum of |terms|.
void check_close(const float* got, const std::vector<double>& want, const std::vector<double>& mag,
                 size_t n, double rel, const std::string& what) {
    double worst = 0;
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        const double err = std::abs(got[i] - want[i]) / (mag[i] + 1e-6);
        if (!(err <= rel)) bad++;
        worst = std::max(worst, std::isnan(err) ? 1e30 : err);
    }
    INFO(what, ": worst relative error ", worst);
    CHECK(bad == 0);
}

} // namespace

// =============================== part 1: host ===============================

TEST_CASE("cuda dequant.h: dequant8 matches the reference bit for bit, every type") {
    for (Type t : kMatmulTypes) {
        const int64_t bs = gl::type_info(t).block_size;
        for (int64_t n : {bs == 1 ? int64_t{37} : bs, bs == 1 ? int64_t{256} : 4 * bs}) {
            INFO("type ", std::string(gl::type_name(t)), " n ", n);
            const auto x =
                random_floats(static_cast<size_t>(n) * 3, 7u + static_cast<uint32_t>(n), 0.7f);
            const auto q = quantize(t, x, n, 3);
            // Random bytes too: every bit pattern of scales and quants.
            std::vector<uint8_t> rnd(q.size());
            std::mt19937 rng(11);
            for (auto& b : rnd) b = static_cast<uint8_t>(rng());
            const std::vector<uint8_t>* sources[] = {&q, &rnd};
            for (const std::vector<uint8_t>* src : sources) {
                const size_t rb = gl::row_size(t, n);
                for (int r = 0; r < 3; r++) {
                    std::vector<float> want(n), got(n);
                    gl::ref::dequantize_row(t, src->data() + r * rb, want.data(), n);
                    dequant_dev_path(t, src->data() + r * rb, n, got.data());
                    int mismatches = 0;
                    for (int64_t i = 0; i < n; i++) mismatches += !same_bits(want[i], got[i]);
                    CHECK(mismatches == 0);
                }
            }
        }
    }
}

TEST_CASE("cuda dequant.h: KV element access, conversions and quantizers match the reference") {
    const int64_t n = 96;
    for (Type t : kKvTypes) {
        INFO("type ", std::string(gl::type_name(t)));
        const auto x = random_floats(n, 3, 2.0f);
        const auto q = quantize(t, x, n, 1);
        std::vector<float> want(n);
        gl::ref::dequantize_row(t, q.data(), want.data(), n);
        int bad = 0;
        for (int64_t e = 0; e < n; e++) bad += !same_bits(want[e], gc::kv_elem(t, q.data(), e));
        CHECK(bad == 0);
    }
    // Q8_0 / Q4_0 block quantizers (convert_rows on the device), with zeros and a tie.
    auto x = random_floats(32 * 8, 5, 3.0f);
    std::fill(x.begin() + 64, x.begin() + 96, 0.0f);
    x[100] = 0.5f;
    for (Type t : {Type::Q8_0, Type::Q4_0}) {
        const auto want = quantize(t, x, 32, 8);
        std::vector<uint8_t> got(want.size());
        const size_t bb = gl::type_info(t).type_size;
        for (int b = 0; b < 8; b++) {
            if (t == Type::Q8_0)
                gc::quantize_block_q8_0(x.data() + 32 * b, got.data() + bb * b);
            else
                gc::quantize_block_q4_0(x.data() + 32 * b, got.data() + bb * b);
        }
        CHECK_MESSAGE(got == want, std::string(gl::type_name(t)));
    }
    // Half and bfloat16 conversions, including specials and subnormals.
    std::mt19937 rng(9);
    std::vector<float> vals = {0.0f,      -0.0f,   1.0f,     65504.0f,  65520.0f,
                               1e-8f,     6.1e-5f, 5.96e-8f, 2.98e-8f,  INFINITY,
                               -INFINITY, NAN,     3.0e38f,  -1.17e-38f};
    for (int i = 0; i < 20000; i++) {
        uint32_t u = static_cast<uint32_t>(rng());
        float f;
        std::memcpy(&f, &u, sizeof f);
        vals.push_back(f);
    }
    int bad = 0;
    for (float f : vals) {
        bad += gc::f32_to_half(f) != gl::fp32_to_fp16(f);
        bad += gc::f32_to_bf16(f) != gl::fp32_to_bf16(f);
    }
    for (uint32_t h = 0; h < 65536; h++)
        bad += !same_bits(gc::half_to_f32(static_cast<uint16_t>(h)),
                          gl::fp16_to_fp32(static_cast<uint16_t>(h)));
    CHECK(bad == 0);
}

TEST_CASE(
    "cuda attention: chunked scores merged by log-sum-exp equal gl::attention (host emulation)") {
    auto cpu = gl::make_cpu_backend(1);
    uint32_t seed = 100;
    for (const AttnCase& c : kAttnCases) {
        INFO("n_tok ", c.n_tok, " heads ", c.n_head, "/", c.n_head_kv, " hd ", c.head_dim,
             " n_ctx ", c.n_ctx, " past ", c.past, " types ", gl::type_name(c.tk), "/",
             gl::type_name(c.tv));
        AttnData d(c, seed++);
        const size_t qd = static_cast<size_t>(c.n_tok) * c.n_head * c.head_dim;
        cpu->reserve(0, gl::attention_scratch_floats(1, c.n_ctx, c.n_tok, c.n_head_kv * c.head_dim,
                                                     c.head_dim));
        cpu->attention(d.a);
        std::vector<float> got(qd);
        emulate_attention(d.a, got.data());
        double worst = 0;
        for (size_t i = 0; i < qd; i++)
            worst = std::max(worst, static_cast<double>(std::abs(got[i] - d.out[i])));
        INFO("worst |diff| ", worst);
        CHECK(worst < 2e-5);
    }
}

TEST_CASE("cuda backend: the stub or the real thing answers cuda_available consistently") {
    std::string why;
    const bool ok = gl::cuda_available(&why);
    if (!ok) {
        CHECK(!why.empty());
        CHECK_THROWS_AS(gl::make_cuda_backend(0), std::runtime_error);
        MESSAGE("no CUDA here: ", why);
    } else {
        CHECK(gl::make_cuda_backend(0)->name().rfind("cuda:0", 0) == 0);
    }
}

TEST_CASE("cuda backend: --device picks the backend, or fails with the reason") {
    kvrun::cli::CommonOptions o;
    CHECK(kvrun::cli::make_backend(o, 1)->name().rfind("cpu", 0) == 0);
    o.device = "gpu";
    CHECK_THROWS_AS(kvrun::cli::make_backend(o, 1), kvrun::Error);
    o.device = "cuda:x";
    CHECK_THROWS_AS(kvrun::cli::make_backend(o, 1), kvrun::Error);
    std::string why;
    o.device = "cuda";
    if (!gl::cuda_available(&why)) {
        try {
            kvrun::cli::make_backend(o, 1);
            FAIL("--device cuda should fail here");
        } catch (const kvrun::Error& e) {
            CHECK(e.code() == kvrun::Exit::usage);
            CHECK(std::string(e.what()).find(why) != std::string::npos);
        }
    } else {
        CHECK(kvrun::cli::make_backend(o, 1)->name().rfind("cuda:0", 0) == 0);
        o.device = "cuda:4096";
        CHECK_THROWS_AS(kvrun::cli::make_backend(o, 1), kvrun::Error);
    }
}

// =============================== part 2: GPU ===============================

TEST_CASE("cuda matmul: every supported type, odd sizes, decode and prompt batches") {
    if (!gpu_or_skip()) return;
    auto be = gl::make_cuda_backend(0);
    uint32_t seed = 1;
    for (Type t : kMatmulTypes) {
        const int64_t bs = gl::type_info(t).block_size;
        for (int64_t n_in : {bs == 1 ? int64_t{37} : bs * 3, bs == 1 ? int64_t{200} : 8 * bs})
            for (int64_t n_out : {1, 33, 67})
                for (int64_t n_tok : {1, 3, 8, 9, 70}) {
                    INFO("type ", std::string(gl::type_name(t)), " n_in ", n_in, " n_out ", n_out,
                         " n_tok ", n_tok);
                    const auto wf = random_floats(static_cast<size_t>(n_in * n_out), seed++, 0.5f);
                    const auto wq = quantize(t, wf, n_in, n_out);
                    const auto x = random_floats(static_cast<size_t>(n_in * n_tok), seed++);
                    gl::Tensor w{t, n_in, n_out, gl::row_size(t, n_in), wq.data()};
                    std::vector<float> wd(static_cast<size_t>(n_in));
                    std::vector<double> want(static_cast<size_t>(n_tok * n_out)), mag(want.size());
                    for (int64_t r = 0; r < n_out; r++) {
                        gl::ref::dequantize_row(t, w.row(r), wd.data(), n_in);
                        for (int64_t tk = 0; tk < n_tok; tk++) {
                            double s = 0, m = 0;
                            for (int64_t k = 0; k < n_in; k++) {
                                s += static_cast<double>(wd[k]) * x[tk * n_in + k];
                                m += std::abs(static_cast<double>(wd[k]) * x[tk * n_in + k]);
                            }
                            want[tk * n_out + r] = s;
                            mag[tk * n_out + r] = m;
                        }
                    }
                    std::vector<float> y(want.size(), NAN);
                    be->matmul(w, x.data(), n_tok, y.data());
                    check_close(y.data(), want, mag, y.size(), 1e-4, "matmul");
                }
    }
    // A type without a kernel fails with its name.
    std::vector<uint8_t> junk(gl::row_size(Type::IQ2_XXS, 256) * 2, 0);
    gl::Tensor w{Type::IQ2_XXS, 256, 2, gl::row_size(Type::IQ2_XXS, 256), junk.data()};
    std::vector<float> x(256, 1.0f), y(2);
    try {
        be->matmul(w, x.data(), 1, y.data());
        FAIL("matmul on iq2_xxs should throw");
    } catch (const std::runtime_error& e) {
        CHECK(std::string(e.what()).find("iq2_xxs") != std::string::npos);
    }
}

TEST_CASE(
    "cuda ops: rmsnorm, rope, hadamard_rows, silu_mul, add, convert_rows against the CPU backend") {
    if (!gpu_or_skip()) return;
    auto be = gl::make_cuda_backend(0);
    auto cpu = gl::make_cpu_backend(1);
    auto compare = [](const std::vector<float>& a, const std::vector<float>& b, double tol,
                      const char* what) {
        REQUIRE(a.size() == b.size());
        double worst = 0;
        for (size_t i = 0; i < a.size(); i++)
            worst = std::max(worst,
                             std::abs(static_cast<double>(a[i]) - b[i]) / (1.0 + std::abs(b[i])));
        INFO(what, " worst ", worst);
        CHECK(worst <= tol);
    };
    for (int64_t n : {1, 7, 288, 4097}) {
        const int64_t rows = 3;
        const auto x = random_floats(n * rows, 1, 3.0f), w = random_floats(n, 2);
        std::vector<float> a(n * rows), b(n * rows);
        be->rmsnorm(x.data(), w.data(), n, rows, 1e-5f, a.data());
        cpu->rmsnorm(x.data(), w.data(), n, rows, 1e-5f, b.data());
        compare(a, b, 1e-6, "rmsnorm");
        auto g1 = random_floats(n * rows, 3, 4.0f), g2 = g1;
        const auto up = random_floats(n * rows, 4);
        be->silu_mul(g1.data(), up.data(), n * rows);
        cpu->silu_mul(g2.data(), up.data(), n * rows);
        compare(g1, g2, 1e-6, "silu_mul");
        auto y1 = random_floats(n * rows, 5), y2 = y1;
        be->add(y1.data(), x.data(), n * rows);
        cpu->add(y2.data(), x.data(), n * rows);
        compare(y1, y2, 0, "add");
    }
    for (bool neox : {false, true})
        for (int rope_dims : {64, 32, 6}) {
            const int64_t rows = 5;
            const int n_heads = 3, head_dim = 64;
            const auto base = random_floats(rows * n_heads * head_dim, 6);
            std::vector<float> cs(rows * rope_dims / 2), sn(cs.size());
            std::vector<double> inv(rope_dims / 2);
            for (int i = 0; i < rope_dims / 2; i++)
                inv[i] = std::pow(10000.0, -2.0 * i / rope_dims);
            for (int64_t r = 0; r < rows; r++)
                gl::ops::rope_angles(1000.0 + r, rope_dims / 2, inv.data(),
                                     cs.data() + r * rope_dims / 2, sn.data() + r * rope_dims / 2);
            auto a = base, b = base;
            be->rope(a.data(), rows, n_heads, head_dim, rope_dims, cs.data(), sn.data(), neox);
            cpu->rope(b.data(), rows, n_heads, head_dim, rope_dims, cs.data(), sn.data(), neox);
            compare(a, b, 1e-6, "rope");
        }
    // Rotated keys: the same sign flips and butterflies in the same order.
    for (int block : {2, 8, 32, 256})
        for (int64_t rows : {1, 5}) {
            const int64_t n = 3 * block;
            const auto base = random_floats(rows * n, 9, 3.0f);
            auto a = base, b = base;
            be->hadamard_rows(a.data(), rows, n, block);
            cpu->hadamard_rows(b.data(), rows, n, block);
            compare(a, b, 0, "hadamard_rows");
        }
    for (Type t : kKvTypes) {
        const int64_t n = 96, rows = 5;
        const auto x = random_floats(n * rows, 8, 2.0f);
        const auto want = quantize(t, x, n, rows);
        std::vector<uint8_t> got(want.size());
        be->convert_rows(t, x.data(), n, rows, got.data());
        CHECK_MESSAGE(got == want, "convert_rows ", std::string(gl::type_name(t)));
    }
}

TEST_CASE("cuda attention: against gl::attention, every KV type, GQA, long and slid rings") {
    if (!gpu_or_skip()) return;
    auto be = gl::make_cuda_backend(0);
    auto cpu = gl::make_cpu_backend(1);
    uint32_t seed = 500;
    for (const AttnCase& c : kAttnCases) {
        INFO("n_tok ", c.n_tok, " heads ", c.n_head, "/", c.n_head_kv, " hd ", c.head_dim,
             " n_ctx ", c.n_ctx, " past ", c.past, " types ", gl::type_name(c.tk), "/",
             gl::type_name(c.tv));
        AttnData d(c, seed++);
        double worst = backend_vs_cpu(*cpu, *be, d);
        INFO("worst |diff| ", worst);
        CHECK(worst < 1e-4);

        // Same ring, new contents at the same positions (a cache cleared and
        // refilled between calls): the device mirror must notice.
        const auto fresh = quantize(c.tk, random_floats(d.ks.size() * 4, seed + 1000),
                                    c.n_head_kv * c.head_dim, c.n_ctx);
        std::copy(fresh.begin(), fresh.begin() + d.ks.size(), d.ks.begin());
        worst = backend_vs_cpu(*cpu, *be, d);
        INFO("after refill: worst |diff| ", worst);
        CHECK(worst < 1e-4);
    }
}

TEST_CASE("cuda weights: zero-copy (registered host memory) gives the same products") {
    if (!gpu_or_skip()) return;
    setenv("KVRUN_CUDA_ZERO_COPY", "1", 1);
    auto zc = gl::make_cuda_backend(0);
    unsetenv("KVRUN_CUDA_ZERO_COPY");
    auto be = gl::make_cuda_backend(0);
    MESSAGE("zero-copy backend: ", zc->name());
    const int64_t n_in = 512, n_out = 300;
    const auto wq = quantize(Type::Q4_0, random_floats(n_in * n_out, 1), n_in, n_out);
    gl::Tensor w{Type::Q4_0, n_in, n_out, gl::row_size(Type::Q4_0, n_in), wq.data()};
    const auto x = random_floats(n_in * 2, 2);
    std::vector<float> a(n_out * 2), b(n_out * 2);
    zc->matmul(w, x.data(), 2, a.data());
    be->matmul(w, x.data(), 2, b.data());
    CHECK(a == b);
}

namespace {

double lse(const float* row, int n) {
    const float mx = *std::max_element(row, row + n);
    double s = 0;
    for (int i = 0; i < n; i++) s += std::exp(static_cast<double>(row[i]) - mx);
    return mx + std::log(s);
}

} // namespace

TEST_CASE("cuda goldens: teacher-forced logits through the CUDA backend") {
    if (!gpu_or_skip()) return;
    const fs::path dir = fs::path(shared_dir()) / "golden";
    if (!fs::exists(dir)) {
        MESSAGE("CUDA goldens skipped: no ", dir.string(), " (set KVRUN_SHARED_DIR)");
        return;
    }
    auto be = gl::make_cuda_backend(0);
    int ran = 0;
    std::vector<fs::path> files; // and the newer families' (qwen3, phi3's fused row views)
    for (const fs::path& d : {dir, fs::path(shared_dir()) / "golden-families"})
        if (fs::exists(d))
            for (const auto& e : fs::directory_iterator(d))
                if (e.path().extension() == ".json") files.push_back(e.path());
    std::sort(files.begin(), files.end());
    for (const fs::path& file : files) {
        std::ifstream in(file);
        const nlohmann::json g = nlohmann::json::parse(in);
        const std::string model = g["model"];
        fs::path mp = fs::path(shared_dir()) / "models" / model;
        if (!fs::exists(mp)) mp = fs::path(shared_dir()) / "models" / "synthetic" / model;
        if (!fs::exists(mp)) mp = fs::path(shared_dir()) / "models" / "families" / model;
        if (!fs::exists(mp)) continue;
        const double tol =
            model.find("-f16") != std::string::npos || model.find("-f32") != std::string::npos
                ? 0.02
                : 0.1;
        auto lm = kvrun::LoadedModel::load(mp.string());
        const kvrun::Hparams& hp = lm->model.hp;
        auto seq = g["prompt_tokens"].get<std::vector<int32_t>>();
        const auto gen = g["gen_tokens"].get<std::vector<int32_t>>();
        const size_t n_prompt = seq.size();
        seq.insert(seq.end(), gen.begin(), gen.end() - 1);
        std::vector<std::pair<double, std::vector<std::pair<int32_t, double>>>> ref;
        for (const char* key : {"prompt_logits", "gen_logits"})
            for (const auto& r : g[key]) {
                std::vector<std::pair<int32_t, double>> top;
                for (const auto& t : r["top"])
                    top.emplace_back(t[0].get<int32_t>(), t[1].get<double>());
                ref.emplace_back(r["lse"].get<double>(), top);
            }
        REQUIRE(ref.size() == seq.size());
        const int n = static_cast<int>(seq.size());
        kvrun::KvCache kv({hp.n_layer, hp.n_head_kv, hp.head_dim, n, 4, Type::F16, Type::F16});
        kvrun::Forward fwd(lm->model, kv, *be, 512);
        double worst = 0;
        // The prompt as one batch (tiled matmul), then one token at a time (matrix-vector).
        for (int i = 0; i < n;) {
            const int nb = i == 0 ? static_cast<int>(std::min<size_t>(n_prompt, 512)) : 1;
            const float* rows = fwd.eval(seq.data() + i, nb, true);
            for (int r = 0; r < nb; r++) {
                const float* row = rows + static_cast<size_t>(r) * hp.n_vocab;
                worst = std::max(worst, std::abs(lse(row, hp.n_vocab) - ref[i + r].first));
                for (auto [id, logit] : ref[i + r].second)
                    worst = std::max(worst, std::abs(row[id] - logit));
            }
            i += nb;
        }
        MESSAGE(file.filename().string(), " via ", be->name(), ": max |diff| ", worst, " over ", n,
                " rows");
        CHECK(worst <= tol);
        ran++;
    }
    if (ran == 0) MESSAGE("CUDA goldens skipped: no golden model found under ", shared_dir());
}

TEST_CASE("cuda forward: a wrapping ring with sinks matches the CPU backend") {
    if (!gpu_or_skip()) return;
    auto lm = shared_model("stories260K.gguf");
    if (!lm) return;
    const kvrun::Hparams& hp = lm->model.hp;
    auto cuda = gl::make_cuda_backend(0);
    auto cpu = gl::make_cpu_backend(2);
    for (Type t : {Type::F16, Type::Q8_0}) {
        if (!gl::row_size_ok(t, hp.kv_dim())) continue;
        kvrun::KvCache kv1({hp.n_layer, hp.n_head_kv, hp.head_dim, 48, 4, t, t});
        kvrun::KvCache kv2({hp.n_layer, hp.n_head_kv, hp.head_dim, 48, 4, t, t});
        kvrun::Forward f1(lm->model, kv1, *cuda, 16), f2(lm->model, kv2, *cpu, 16);
        std::mt19937 rng(3);
        double worst = 0;
        for (int step = 0; step < 40; step++) {
            // 16-token batches until the window slides, single tokens after.
            const int nb = kv1.n_past() + 16 <= kv1.n_ctx() ? 16 : 1;
            std::vector<int32_t> toks(nb);
            for (auto& tk : toks) tk = static_cast<int32_t>(rng() % hp.n_vocab);
            const float* a = f1.eval(toks.data(), nb, false);
            const float* b = f2.eval(toks.data(), nb, false);
            for (int i = 0; i < hp.n_vocab; i++)
                worst = std::max(worst, static_cast<double>(std::abs(a[i] - b[i])));
        }
        MESSAGE("ring wrap, cache ", std::string(gl::type_name(t)), ": max |cuda - cpu| ", worst);
        CHECK(worst < 0.05);
    }
}

// ---- hot/cold KV (--kv-gpu-window) and partial offload (-ngl) ----

TEST_CASE(
    "cuda hot/cold attention: GPU window merged with the CPU's cold part equals gl::attention") {
    if (!gpu_or_skip()) return;
    auto cpu = gl::make_cpu_backend(1);
    uint32_t seed = 900;
    for (int w : {1, 5, 64, 200}) {
        auto be = gl::make_cuda_backend(0, {w, 2});
        for (const AttnCase& c : kAttnCases) {
            INFO("window ", w, " n_tok ", c.n_tok, " heads ", c.n_head, "/", c.n_head_kv, " hd ",
                 c.head_dim, " n_ctx ", c.n_ctx, " past ", c.past, " types ", gl::type_name(c.tk),
                 "/", gl::type_name(c.tv));
            AttnData d(c, seed++);
            const double worst = backend_vs_cpu(*cpu, *be, d);
            INFO("worst |diff| ", worst);
            CHECK(worst < 1e-4);
        }
        // The device holds the sinks and the window only.
        const gl::MemoryUse u = be->memory_use();
        CHECK(u.device);
        CHECK(u.kv > 0);
    }
}

namespace {

// Logits of a sequence that wraps a 96-slot ring twice: 16-token batches while
// they fit, single tokens after.
std::vector<std::vector<float>> wrap_logits(const kvrun::LoadedModel& lm, kvrun::Placement p,
                                            Type t, int n_steps) {
    const kvrun::Hparams& hp = lm.model.hp;
    kvrun::KvCache kv({hp.n_layer, hp.n_head_kv, hp.head_dim, 96, 4, t, t});
    kvrun::Forward f(lm.model, kv, std::move(p), 16);
    std::mt19937 rng(5);
    std::vector<std::vector<float>> rows;
    for (int step = 0; step < n_steps; step++) {
        const int nb = kv.n_past() + 16 <= kv.n_ctx() ? 16 : 1;
        std::vector<int32_t> toks(nb);
        for (auto& tk : toks) tk = static_cast<int32_t>(rng() % hp.n_vocab);
        const float* r = f.eval(toks.data(), nb, false);
        rows.emplace_back(r, r + hp.n_vocab);
    }
    return rows;
}

double worst_diff(const std::vector<std::vector<float>>& a,
                  const std::vector<std::vector<float>>& b) {
    double worst = 0;
    for (size_t i = 0; i < a.size(); i++)
        for (size_t j = 0; j < a[i].size(); j++)
            worst = std::max(worst, static_cast<double>(std::abs(a[i][j] - b[i][j])));
    return worst;
}

} // namespace

TEST_CASE("cuda hot/cold forward: --kv-gpu-window logits equal all-GPU logits") {
    if (!gpu_or_skip()) return;
    for (const char* name : {"stories260K.gguf", "synthetic/tiny-f16.gguf"}) {
        auto lm = shared_model(name);
        if (!lm) continue;
        const kvrun::Hparams& hp = lm->model.hp;
        auto all = gl::make_cuda_backend(0);
        const auto want = wrap_logits(*lm, kvrun::Placement::all(*all, hp.n_layer), Type::F16, 200);
        const uint64_t row = 2 * gl::row_size(Type::F16, hp.kv_dim());
        CHECK(all->memory_use().kv == static_cast<uint64_t>(hp.n_layer) * 96 * row);
        for (int w : {8, 33}) {
            auto hc = gl::make_cuda_backend(0, {w, 2});
            const auto got =
                wrap_logits(*lm, kvrun::Placement::all(*hc, hp.n_layer), Type::F16, 200);
            const double worst = worst_diff(got, want);
            MESSAGE(std::string(name), " --kv-gpu-window ", w, ": max |hot/cold - all-GPU| ", worst,
                    " over ", got.size(), " steps; device KV ", hc->memory_use().kv, " bytes");
            CHECK(worst <= 0.02); // the F16 golden tolerance
            CHECK(hc->memory_use().kv == static_cast<uint64_t>(hp.n_layer) * (4 + w) * row);
        }
    }
}

TEST_CASE("cuda -ngl: layers split between the GPU and the CPU match the CPU") {
    if (!gpu_or_skip()) return;
    auto lm = shared_model("stories260K.gguf");
    if (!lm) return;
    const int n_layer = lm->model.hp.n_layer;
    auto cpu = gl::make_cpu_backend(2);
    const auto want = wrap_logits(*lm, kvrun::Placement::all(*cpu, n_layer), Type::F16, 120);
    for (int k : {1, n_layer - 1, n_layer}) {
        auto cuda = gl::make_cuda_backend(0, {k == 1 ? 8 : 0, 2});
        const auto got =
            wrap_logits(*lm, kvrun::Placement::split(*cuda, *cpu, k, n_layer), Type::F16, 120);
        const double worst = worst_diff(got, want);
        MESSAGE("-ngl ", k, " of ", n_layer, ": max |split - cpu| ", worst);
        CHECK(worst < 0.05);
    }
}

TEST_CASE("cuda mixture of experts: experts on the GPU or kept on the host (--cpu-moe, "
          "--n-cpu-moe) within the golden's tolerance") {
    if (!gpu_or_skip()) return;
    auto lm = shared_model("next/tiny-qwen3moe-Q4_K_M.gguf");
    const fs::path golden =
        fs::path(shared_dir()) / "golden-next" / "tiny-qwen3moe-Q4_K_M__story.json";
    if (!lm || !fs::exists(golden)) return;
    const kvrun::Hparams& hp = lm->model.hp;
    const int n_layer = hp.n_layer;
    std::ifstream in(golden);
    const nlohmann::json g = nlohmann::json::parse(in);
    std::vector<int32_t> seq = g["prompt_tokens"].get<std::vector<int32_t>>();
    const size_t n_prompt = seq.size();
    const auto gen = g["gen_tokens"].get<std::vector<int32_t>>();
    seq.insert(seq.end(), gen.begin(), gen.end() - 1);
    std::vector<nlohmann::json> ref(g["prompt_logits"].begin(), g["prompt_logits"].end());
    ref.insert(ref.end(), g["gen_logits"].begin(), g["gen_logits"].end());
    REQUIRE(ref.size() == seq.size());
    // The prompt in one batch (experts grouped), the rest one token at a
    // time (a generated token's experts); the worst |lse| or top-logit
    // difference from the reference engine's.
    auto worst_of = [&](kvrun::Placement p) {
        const int n = static_cast<int>(seq.size());
        kvrun::KvCache kv(kvrun::KvCacheConfig::for_model(hp, n, 4, Type::F16, Type::F16));
        kvrun::Forward f(lm->model, kv, std::move(p), static_cast<int>(n_prompt));
        double worst = 0;
        for (int i = 0; i < n;) {
            const int nb = i == 0 ? static_cast<int>(n_prompt) : 1;
            const float* rows = f.eval(seq.data() + i, nb, true);
            for (int r = 0; r < nb; r++) {
                const float* row = rows + static_cast<size_t>(r) * hp.n_vocab;
                const float mx = *std::max_element(row, row + hp.n_vocab);
                double sum = 0;
                for (int j = 0; j < hp.n_vocab; j++) sum += std::exp(double(row[j]) - mx);
                const nlohmann::json& want = ref[i + r];
                worst = std::max(worst, std::abs(mx + std::log(sum) - want["lse"].get<double>()));
                for (const auto& t : want["top"])
                    worst = std::max(worst, std::abs(row[t[0].get<int>()] - t[1].get<double>()));
            }
            i += nb;
        }
        return worst;
    };
    auto cpu = gl::make_cpu_backend(2);
    // The reference engine's own CPU path lands 0.16 from it, kvrun's CPU
    // 0.27 (test_golden.cpp): a changed routing moves logits by units.
    const double tol = 4 * 0.16;
    for (int host_layers : {0, 1, n_layer}) {
        for (int gpu_layers : {n_layer, 2}) {
            auto cuda = gl::make_cuda_backend(0);
            kvrun::Placement p = gpu_layers == n_layer
                                     ? kvrun::Placement::all(*cuda, n_layer)
                                     : kvrun::Placement::split(*cuda, *cpu, gpu_layers, n_layer);
            p.experts_on(*cpu, std::min(host_layers, gpu_layers));
            const double worst = worst_of(std::move(p));
            MESSAGE("tiny-qwen3moe story, -ngl ", gpu_layers, " --n-cpu-moe ", host_layers,
                    ": max |diff| from the reference ", worst);
            CHECK(worst <= tol);
            // Experts kept on the host are never copied to the device.
            if (host_layers == n_layer && gpu_layers == n_layer) {
                uint64_t attention = 0;
                for (const auto& L : lm->model.layers)
                    for (const gl::Tensor* w : L.matrices()) attention += w->bytes();
                CHECK(cuda->memory_use().weights <= attention + lm->model.output.bytes());
            }
        }
    }
}

// ---- device-resident activations and CUDA graphs ----

namespace {

// Sets an environment variable for a scope (the backend reads it when made).
class ScopedEnv {
  public:
    ScopedEnv(const char* name, const char* value) : name_(name) {
        if (const char* old = std::getenv(name)) old_ = old, had_ = true;
        if (value)
            setenv(name, value, 1);
        else
            unsetenv(name);
    }
    ~ScopedEnv() {
        if (had_)
            setenv(name_, old_.c_str(), 1);
        else
            unsetenv(name_);
    }

  private:
    const char* name_;
    std::string old_;
    bool had_ = false;
};

std::unique_ptr<gl::Backend> cuda_with_graphs(const char* graphs, const char* fail_at = nullptr) {
    ScopedEnv g("KVRUN_CUDA_GRAPHS", graphs), f("KVRUN_CUDA_GRAPHS_TEST_FAIL", fail_at);
    return gl::make_cuda_backend(0);
}

} // namespace

TEST_CASE("cuda add_rmsnorm: KVRUN_CUDA_FUSED=1's one kernel gives the two ops' bits, and "
          "Forward's logits with it") {
    if (!gpu_or_skip()) return;
    std::unique_ptr<gl::Backend> two, one;
    {
        ScopedEnv off("KVRUN_CUDA_FUSED", nullptr);
        two = gl::make_cuda_backend(0);
    }
    {
        ScopedEnv on("KVRUN_CUDA_FUSED", "1");
        one = gl::make_cuda_backend(0);
    }
    std::mt19937 rng(3);
    std::uniform_real_distribution<float> u(-3.0f, 3.0f);
    for (int64_t n : {1, 7, 257, 2048})
        for (int64_t rows : {1, 5}) {
            for (bool in_place : {false, true}) {
                std::vector<float> x0(n * rows), y0(n * rows), w(n);
                for (auto* v : {&x0, &y0, &w})
                    for (float& f : *v) f = u(rng);
                auto run = [&](gl::Backend& be, std::vector<float>& x, std::vector<float>& y,
                               std::vector<float>& o) {
                    x = x0, y = y0, o.assign(x0.size(), NAN);
                    be.add_rmsnorm(x.data(), y.data(), w.data(), n, rows, 1e-6f,
                                   in_place ? y.data() : o.data());
                };
                std::vector<float> xa, ya, oa, xb, yb, ob;
                run(*two, xa, ya, oa);
                run(*one, xb, yb, ob);
                CAPTURE(n);
                CAPTURE(rows);
                CAPTURE(in_place);
                CHECK(std::memcmp(xa.data(), xb.data(), 4 * xa.size()) == 0);
                CHECK(std::memcmp(ya.data(), yb.data(), 4 * ya.size()) == 0);
                if (!in_place) CHECK(std::memcmp(oa.data(), ob.data(), 4 * oa.size()) == 0);
            }
        }
    // A whole model: the fused kernel is one launch less a layer, and the
    // logits do not move.
    auto lm = shared_model("stories260K.gguf");
    if (!lm) return;
    const int n_layer = lm->model.hp.n_layer;
    const auto want = wrap_logits(*lm, kvrun::Placement::all(*two, n_layer), Type::F16, 40);
    const auto got = wrap_logits(*lm, kvrun::Placement::all(*one, n_layer), Type::F16, 40);
    CHECK(worst_diff(got, want) == 0);
}

TEST_CASE("cuda graphs: recorded decode steps equal eager ones bit for bit, and a lost graph is "
          "redone") {
    if (!gpu_or_skip()) return;
    for (const char* name : {"stories260K.gguf", "synthetic/tiny-f16.gguf"}) {
        auto lm = shared_model(name);
        if (!lm) continue;
        const int n_layer = lm->model.hp.n_layer;
        auto eager = cuda_with_graphs("0");
        CHECK(eager->name().find(", graphs") == std::string::npos);
        // 200 steps over a 96-slot ring: prompt batches, then single tokens
        // that wrap the ring twice (sinks slid, position tags changing).
        const auto want = wrap_logits(*lm, kvrun::Placement::all(*eager, n_layer), Type::F16, 200);
        auto graphs = cuda_with_graphs(nullptr);
        CHECK(graphs->name().find(", graphs") != std::string::npos);
        const auto got = wrap_logits(*lm, kvrun::Placement::all(*graphs, n_layer), Type::F16, 200);
        CHECK(graphs->name().find(", graphs") != std::string::npos); // never fell back
        MESSAGE(std::string(name), ": max |graphs - eager| ", worst_diff(got, want));
        CHECK(worst_diff(got, want) == 0.0);
        // Both against the CPU, as the other forward tests.
        auto cpu = gl::make_cpu_backend(2);
        const auto ref = wrap_logits(*lm, kvrun::Placement::all(*cpu, n_layer), Type::F16, 200);
        MESSAGE(std::string(name), ": max |graphs - cpu| ", worst_diff(got, ref));
        CHECK(worst_diff(got, ref) < 0.05);

        // The 5th recorded step fails: it is redone eagerly, graphs stay off,
        // the logits do not change.
        auto failing = cuda_with_graphs(nullptr, "5");
        const auto redone =
            wrap_logits(*lm, kvrun::Placement::all(*failing, n_layer), Type::F16, 200);
        CHECK(failing->name().find(", graphs") == std::string::npos);
        CHECK(worst_diff(redone, want) == 0.0);

        // -ngl: the GPU's part recorded, the crossing downloads the residual stream.
        for (int k : {1, n_layer - 1}) {
            auto part = cuda_with_graphs(nullptr);
            const auto split =
                wrap_logits(*lm, kvrun::Placement::split(*part, *cpu, k, n_layer), Type::F16, 200);
            MESSAGE(std::string(name), " -ngl ", k, ": max |split with graphs - cpu| ",
                    worst_diff(split, ref));
            CHECK(worst_diff(split, ref) < 0.05);
        }
    }
}

TEST_CASE("cuda resident: direct op calls on untracked memory still read and write the host") {
    if (!gpu_or_skip()) return;
    auto lm = shared_model("stories260K.gguf");
    if (!lm) return;
    auto be = gl::make_cuda_backend(0);
    // A Forward tracks buffers, then goes; a later direct call at a reused
    // address must not be mistaken for a twin.
    const kvrun::Hparams& hp = lm->model.hp;
    {
        kvrun::KvCache kv({hp.n_layer, hp.n_head_kv, hp.head_dim, 32, 4, Type::F16, Type::F16});
        kvrun::Forward f(lm->model, kv, *be, 4);
        const int32_t t[2] = {1, 2};
        f.eval(t, 2, false);
        f.eval(t, 1, false);
    }
    std::vector<float> x = kvtest::random_floats(4096, 1), y(4096, 0.0f);
    be->add(y.data(), x.data(), 4096);
    CHECK(y == x);
    be->silu_mul(y.data(), x.data(), 4096);
    CHECK(std::isfinite(y[17]));
    // And memory_use counts the twins while a Forward lives.
    kvrun::KvCache kv({hp.n_layer, hp.n_head_kv, hp.head_dim, 32, 4, Type::F16, Type::F16});
    const uint64_t before = be->memory_use().scratch;
    kvrun::Forward f(lm->model, kv, *be, 4);
    CHECK(be->memory_use().scratch > before);

    // kvrun info's estimate of the GPU scratch (memory_plan.cpp) is of the
    // order of what a fresh backend holds after a prompt and a few tokens.
    auto fresh = gl::make_cuda_backend(0);
    {
        kvrun::KvCache kv2({hp.n_layer, hp.n_head_kv, hp.head_dim, 96, 4, Type::F16, Type::F16});
        kvrun::Forward f2(lm->model, kv2, *fresh, 16);
        std::vector<int32_t> toks(16, 1);
        f2.eval(toks.data(), 16, false);
        for (int i = 0; i < 4; i++) f2.eval(toks.data(), 1, false);
        const kvrun::GpuPlan plan =
            kvrun::plan_gpu(lm->file, hp, 96, 4, Type::F16, Type::F16, hp.n_layer, 0, 16);
        const uint64_t used = fresh->memory_use().scratch;
        MESSAGE("GPU scratch: estimate ", plan.scratch_gpu, " bytes, used ", used);
        CHECK(used <= 2 * plan.scratch_gpu + 65536);
        CHECK(plan.scratch_gpu <= 2 * used + 65536);
    }
}
