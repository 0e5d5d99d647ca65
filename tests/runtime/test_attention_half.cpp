// Attention with half-precision products (AVX512-FP16, ggml-like/cpu/x86/fp16.h):
// the two kernels against a double-precision reference of the same F16
// inputs, within the worst-case rounding bound of their F16 spans; their
// refusal (nothing written) when a span overflows half precision; and a
// whole model's decode steps against the reference engine's goldens.
// Skipped where the CPU lacks AVX512-FP16.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "forward.h"
#include "ggml-like/attention.h"
#include "ggml-like/kernels.h"
#include "ggml-like/types.h"
#include "loader.h"
#include "test_util.h"

#if defined(__x86_64__)
#include "ggml-like/cpu/x86/fp16.h"

namespace {

// Unit roundoff of F16 (10 stored mantissa bits).
constexpr double kHalfU = 1.0 / 2048;

std::vector<uint16_t> halves(const std::vector<float>& x) {
    std::vector<uint16_t> h(x.size());
    for (size_t i = 0; i < x.size(); i++) h[i] = gl::fp32_to_fp16(x[i]);
    return h;
}

bool have_fp16() {
    if (gl::fp16::cpu_supported()) return true;
    MESSAGE("no AVX512-FP16 here: the half-precision attention path is not used");
    return false;
}

} // namespace

TEST_CASE(
    "attention half: score_tiles matches double-precision scores within its F16 spans' bound") {
    // Two whole 16-key tiles; 1..8 heads; head sizes that are multiples of the
    // span, short and long. The bound: the query's rounding to F16, each
    // product's and each span's kSpanDims additions' roundings, each at most
    // u times the sum of |products| (recursive summation's worst case).
    if (!have_fp16()) return;
    uint32_t seed = 7100;
    for (int hd : {16, 32, 48, 64, 128, 256})
        for (int nh : {1, 3, 4, 7, 8}) {
            INFO("head_dim ", hd, " heads ", nh);
            const int n_keys = 2 * gl::kKeyTile;
            const auto kf = kvtest::random_floats(static_cast<size_t>(hd) * n_keys, seed++, 3.0f);
            const auto qf = kvtest::random_floats(static_cast<size_t>(hd) * nh, seed++, 2.0f);
            const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
            // Key tiles of n_keys keys: both tiles are whole.
            std::vector<uint16_t> tiles(kf.size());
            std::vector<float> k(kf.size()); // the keys as their F16 values
            for (int s = 0; s < n_keys; s++)
                for (int d = 0; d < hd; d++) {
                    const uint16_t h = gl::fp32_to_fp16(kf[s * hd + d]);
                    tiles[gl::key_tile_index(s, d, hd, n_keys)] = h;
                    k[s * hd + d] = gl::fp16_to_fp32(h);
                }
            std::vector<uint16_t> q16(qf.size());
            gl::fp16::to_half(qf.data(), scale, static_cast<int64_t>(qf.size()), q16.data());
            const size_t os = 37; // > 32: stray writes show
            std::vector<float> out(os * nh, -7.0f);
            REQUIRE(gl::fp16::score_tiles(hd, tiles.data(), tiles.data() + gl::kKeyTile * hd,
                                          q16.data(), nh, out.data(), os));
            int bad = 0, stray = 0;
            double worst = 0;
            for (int j = 0; j < nh; j++)
                for (int i = 0; i < static_cast<int>(os); i++) {
                    const float got = out[j * os + i];
                    if (i >= n_keys) {
                        stray += got != -7.0f;
                        continue;
                    }
                    double exact = 0, mag = 0;
                    for (int d = 0; d < hd; d++) {
                        const double p =
                            static_cast<double>(qf[j * hd + d]) * scale * k[i * hd + d];
                        exact += p;
                        mag += std::fabs(p);
                    }
                    const double err = std::fabs(got - exact);
                    worst = std::max(worst, err / mag);
                    bad += err > (gl::fp16::kSpanDims + 3) * kHalfU * mag + 1e-6;
                }
            CHECK(bad == 0);
            CHECK(stray == 0);
            CHECK(worst > 0); // exactly the double sums would mean F32 products ran
        }
}

TEST_CASE("attention half: add_values matches double-precision sums within its F16 spans' bound") {
    // 1..4 heads over 1..64 value rows (spans of kSpanKeys keys and a short
    // last one), head sizes 32 to 256 (64-wide slices and a 32-wide one), rows
    // further apart than a head (a cache row of several KV heads).
    if (!have_fp16()) return;
    uint32_t seed = 7200;
    for (int hd : {32, 64, 96, 128, 256})
        for (int n : {1, 7, 16, 33, 64})
            for (int nh : {1, 2, 3, 4}) {
                INFO("head_dim ", hd, " rows ", n, " heads ", nh);
                const size_t stride = static_cast<size_t>(hd + 32) * 2;
                const auto vf =
                    kvtest::random_floats(static_cast<size_t>(hd + 32) * n, seed++, 4.0f);
                const std::vector<uint16_t> rows = halves(vf); // F16 value rows
                const size_t ws = 70;
                std::vector<float> w(ws * nh);
                for (float& x : w)
                    x = 0.5f + 0.5f * kvtest::random_floats(1, seed++)[0]; // in [0, 1]
                std::vector<std::vector<float>> y(nh);
                std::vector<float*> yp(nh);
                for (int j = 0; j < nh; j++) {
                    y[j] = kvtest::random_floats(hd + 5, seed++);
                    yp[j] = y[j].data();
                }
                const auto y0 = y;
                REQUIRE(gl::fp16::add_values(hd, reinterpret_cast<const uint8_t*>(rows.data()),
                                             stride, n, w.data(), ws, nh, yp.data()));
                int bad = 0, stray = 0;
                for (int j = 0; j < nh; j++) {
                    for (int d = 0; d < hd; d++) {
                        double exact = y0[j][d], mag = 0;
                        for (int i = 0; i < n; i++) {
                            const double v = gl::fp16_to_fp32(rows[i * (stride / 2) + d]);
                            // the weight as the kernel rounds it to F16
                            const double wi = gl::fp16_to_fp32(gl::fp32_to_fp16(w[j * ws + i]));
                            exact += wi * v;
                            mag += std::fabs(wi * v);
                        }
                        bad += std::fabs(y[j][d] - exact) >
                               (gl::fp16::kSpanKeys + 2) * kHalfU * mag + 1e-5 * std::fabs(exact);
                    }
                    for (int d = hd; d < hd + 5; d++) stray += y[j][d] != y0[j][d];
                }
                CHECK(bad == 0);
                CHECK(stray == 0);
            }
}

TEST_CASE("attention half: a span past half precision's range is refused and nothing is written") {
    if (!have_fp16()) return;
    const int hd = 64;
    // Scores: 16 products of 300 x 300 overflow 65504 within one span.
    std::vector<uint16_t> tiles(static_cast<size_t>(hd) * 2 * gl::kKeyTile,
                                gl::fp32_to_fp16(300.0f));
    std::vector<uint16_t> q(hd, gl::fp32_to_fp16(300.0f));
    std::vector<float> out(64, -7.0f);
    CHECK_FALSE(gl::fp16::score_tiles(hd, tiles.data(), tiles.data() + gl::kKeyTile * hd, q.data(),
                                      1, out.data(), 32));
    CHECK(std::all_of(out.begin(), out.end(), [](float x) { return x == -7.0f; }));
    // The same keys with a small query are fine.
    std::fill(q.begin(), q.end(), gl::fp32_to_fp16(0.01f));
    CHECK(gl::fp16::score_tiles(hd, tiles.data(), tiles.data() + gl::kKeyTile * hd, q.data(), 1,
                                out.data(), 32));
    // Values: 16 rows of 60000 with weight 1 overflow; y stays as it was.
    std::vector<uint16_t> rows(static_cast<size_t>(hd) * 16, gl::fp32_to_fp16(60000.0f));
    std::vector<float> w(64, 1.0f), y(hd, 1.5f);
    float* yp = y.data();
    CHECK_FALSE(gl::fp16::add_values(hd, reinterpret_cast<const uint8_t*>(rows.data()), hd * 2, 16,
                                     w.data(), 64, 1, &yp));
    CHECK(std::all_of(y.begin(), y.end(), [](float x) { return x == 1.5f; }));
}

TEST_CASE("attention half: decode steps of tiny-f16 stay within the goldens' tolerance") {
    // One token at a time (each a decode step on the half path; prompt
    // batches take the AMX or F32 paths), teacher-forced through the longest
    // golden, against the reference engine's logits: golden/README.md's 0.02
    // for F16 models. The F32 path's difference is printed beside it.
    if (!have_fp16()) return;
    std::ifstream in(kvtest::shared("golden/tiny-f16__long.json"));
    REQUIRE(in.good());
    const nlohmann::json g = nlohmann::json::parse(in);
    auto lm = kvrun::LoadedModel::load(kvtest::shared("models/synthetic/tiny-f16.gguf"));
    const kvrun::Hparams& hp = lm->model.hp;
    REQUIRE(hp.head_dim % gl::fp16::kSpanDims == 0); // the half path runs
    std::vector<int32_t> seq = g["prompt_tokens"].get<std::vector<int32_t>>();
    const auto gen = g["gen_tokens"].get<std::vector<int32_t>>();
    seq.insert(seq.end(), gen.begin(), gen.end() - 1);
    std::vector<nlohmann::json> ref(g["prompt_logits"].begin(), g["prompt_logits"].end());
    ref.insert(ref.end(), g["gen_logits"].begin(), g["gen_logits"].end());
    REQUIRE(ref.size() == seq.size());
    auto be = gl::make_cpu_backend(2);
    auto worst_diff = [&](bool generated) {
        const int n = static_cast<int>(seq.size());
        kvrun::KvCache kv(
            {hp.n_layer, hp.n_head_kv, hp.head_dim, n, 4, gl::Type::F16, gl::Type::F16});
        kvrun::Forward fwd(lm->model, kv, *be, 1);
        double worst = 0;
        for (int i = 0; i < n; i++) {
            const float* row =
                generated ? fwd.eval_generated(seq[i]) : fwd.eval(seq.data() + i, 1, true);
            for (const auto& t : ref[i]["top"])
                worst = std::max(worst, std::fabs(row[t[0].get<int32_t>()] - t[1].get<double>()));
        }
        return worst;
    };
    const double half = worst_diff(true), f32 = worst_diff(false);
    MESSAGE("decode steps over ", seq.size(), " tokens: max |diff| ", half, " with half products, ",
            f32, " with F32 ones");
    CHECK(half <= 0.02);
    CHECK(half != f32); // the two paths did run
}

#endif
