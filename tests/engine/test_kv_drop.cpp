// KvCache::drop: a span of positions dropped in place, the later keys
// re-rotated to their new positions in the cache's own type.
//
// A one-layer model's K/V depend only on each token and its position, so
// there the drop must give what evaluating the kept tokens afresh gives, to
// the cache type's rounding. In deeper layers the kept tokens keep the K/V
// they were computed with (the dropped span in view): there layer 0 is
// compared with a fresh evaluation, and the later layers' values must have
// moved unchanged.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

#include "forward.h"
#include "random_model.h"

using namespace kvrun;

namespace {

std::vector<int32_t> random_tokens(int n, uint32_t seed) {
    std::vector<int32_t> t(n);
    std::mt19937 rng(seed);
    for (auto& x : t) x = static_cast<int32_t>(1 + rng() % 511);
    return t;
}

// Logits of `next` (every row) after the cache holds `held`, evaluated in
// batches of 7 (drop: then positions [from, to) dropped in place first).
struct Run {
    std::vector<float> logits;
    std::vector<std::vector<uint8_t>> k0, v0; // layer 0's slots as rows, after the drop
    bool dropped = true;
};
Run run(const Model& m, gl::Type type, int n_ctx, const std::vector<int32_t>& held, int64_t from,
        int64_t to, const std::vector<int32_t>& next, int k_rotate = 0) {
    auto be = gl::make_cpu_backend(2);
    KvCache kv(KvCacheConfig::for_model(m.hp, n_ctx, 0, type, type, k_rotate));
    Forward fwd(m, kv, *be, 7);
    for (size_t i = 0; i < held.size(); i += 7) {
        const int n = static_cast<int>(std::min<size_t>(7, held.size() - i));
        fwd.eval(held.data() + i, n, false);
    }
    Run r;
    r.dropped = kv.drop(from, to, m);
    if (!r.dropped) return r;
    r.k0.resize(m.hp.n_layer);
    r.v0.resize(m.hp.n_layer);
    for (int l = 0; l < m.hp.n_layer; l++) {
        r.k0[l].resize(kv.slots(l) * kv.row_bytes_k(l));
        r.v0[l].resize(kv.slots(l) * kv.row_bytes_v(l));
        kv.read_rows(l, kv.slots(l), r.k0[l].data(), r.v0[l].data());
    }
    const float* rows = fwd.eval(next.data(), static_cast<int>(next.size()), true);
    r.logits.assign(rows, rows + next.size() * m.hp.n_vocab);
    return r;
}

double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
    REQUIRE(a.size() == b.size());
    double w = 0;
    for (size_t i = 0; i < a.size(); i++) w = std::max(w, std::fabs(double(a[i]) - b[i]));
    return w;
}

double max_abs(const std::vector<float>& a) {
    double w = 0;
    for (float x : a) w = std::max(w, std::fabs(double(x)));
    return w;
}

// Each cache type's tolerance, relative to the largest logit: f32 rounding;
// f16/bf16 one more rounding of each moved key; q8_0/q4_0 a second
// quantization of it.
struct TypeTol {
    gl::Type type;
    double tol;
};
constexpr TypeTol kTypes[] = {{gl::Type::F32, 2e-6},
                              {gl::Type::F16, 1e-3},
                              {gl::Type::BF16, 1e-2},
                              {gl::Type::Q8_0, 2e-2},
                              {gl::Type::Q4_0, 1.5e-1}};

struct DropCase {
    kvtest::Shape s;
    int64_t longrope_orig_ctx;
};

// Each case's one-layer model holds 40 tokens and drops [6, 21) in place,
// keys rotated in blocks of `rotate` (0: plain); its logits for 3 more
// tokens equal those of a cache that evaluated only the 25 kept ones.
void check_drop_equals_reevaluation(std::initializer_list<DropCase> cases, int rotate) {
    const std::vector<int32_t> all = random_tokens(40, 11), next = random_tokens(3, 12);
    for (const auto& [s, longrope] : cases) {
        const std::vector<uint8_t> bytes = kvtest::random_model(s, 21, longrope);
        GgufFile f = GgufFile::parse(bytes.data(), bytes.size(), s.arch);
        const Model m = Model::load(f);
        std::vector<int32_t> kept(all.begin(), all.begin() + 6);
        kept.insert(kept.end(), all.begin() + 21, all.end());
        for (const TypeTol& t : kTypes) {
            const std::string what = std::string(s.arch) + (longrope ? " longrope" : "") +
                                     (rotate ? " rotated " : " ") + gl::type_name(t.type);
            CAPTURE(what);
            const Run a = run(m, t.type, 64, all, 6, 21, next, rotate);
            REQUIRE(a.dropped);
            const Run b = run(m, t.type, 64, kept, 0, 0, next, rotate);
            const double rel = max_diff(a.logits, b.logits) / max_abs(b.logits);
            MESSAGE(what, ": max |diff| / max |logit| ", rel);
            CHECK(rel < t.tol);
            // The rotation changed what is stored (it is not a no-op here).
            if (rotate && t.type == gl::Type::F32)
                CHECK(a.k0[0] != run(m, t.type, 64, all, 6, 21, next).k0[0]);
        }
    }
}

} // namespace

TEST_CASE(
    "kv drop: one-layer models after an in-place drop equal a re-evaluation of the kept tokens") {
    // llama (pairs 2i, 2i+1), qwen2 (neox pairs, biases), phi3 (RoPE over
    // 3/4 of each head), gemma3 (one sliding-window layer with its own base:
    // an 8-slot ring that has wrapped), phi3 with LongRoPE (long factors
    // past a trained context of 32, keys scaled by the attention factor).
    check_drop_equals_reevaluation({{{"llama", 64, 4, 2, 96, 1, gl::Type::F32}, 0},
                                    {{"qwen2", 64, 4, 2, 96, 1, gl::Type::F32}, 0},
                                    {{"phi3", 64, 4, 2, 96, 1, gl::Type::F32}, 0},
                                    {{"gemma3", 64, 4, 2, 96, 1, gl::Type::F32}, 0},
                                    {{"phi3", 64, 4, 2, 96, 1, gl::Type::F32}, 32}},
                                   0);
}

// Rotated keys (--k-rotate): drop takes each moved key out of the Hadamard
// basis, rotates it by RoPE and puts it back, so the same holds.
TEST_CASE("kv drop: rotated keys: one-layer models after a drop equal a re-evaluation") {
    check_drop_equals_reevaluation({{{"llama", 64, 4, 2, 96, 1, gl::Type::F32}, 0},
                                    {{"qwen2", 64, 4, 2, 96, 1, gl::Type::F32}, 0},
                                    {{"gemma3", 64, 4, 2, 96, 1, gl::Type::F32}, 0},
                                    {{"phi3", 64, 4, 2, 96, 1, gl::Type::F32}, 32}},
                                   16);
}

TEST_CASE("kv drop: deeper layers: layer 0 as a fresh evaluation, the rest moved unchanged") {
    const std::vector<uint8_t> qwen =
        kvtest::random_model({"qwen2", 64, 4, 2, 96, 3, gl::Type::F32}, 5);
    GgufFile fq = GgufFile::parse(qwen.data(), qwen.size(), "qwen2");
    GgufFile fs = GgufFile::open(kvtest::shared("models/stories260K.gguf"));
    const Model models[] = {Model::load(fq), Model::load(fs)};
    const std::vector<int32_t> all = random_tokens(50, 3), next = random_tokens(2, 4);
    std::vector<int32_t> kept(all.begin(), all.begin() + 4);
    kept.insert(kept.end(), all.begin() + 24, all.end());
    for (const Model& m : models) {
        CAPTURE(m.hp.arch);
        const int n_kept = static_cast<int>(kept.size());
        const Run a = run(m, gl::Type::F32, 64, all, 4, 24, next);
        REQUIRE(a.dropped);
        const Run fresh = run(m, gl::Type::F32, 64, kept, 0, 0, next);
        const Run before = run(m, gl::Type::F32, 64, all, 0, 0, next); // nothing dropped
        const size_t row = m.hp.kv_dim();
        auto f32 = [](const std::vector<uint8_t>& v, size_t at) {
            return reinterpret_cast<const float*>(v.data())[at];
        };
        double worst0 = 0;
        for (size_t i = 0; i < n_kept * row; i++)
            worst0 = std::max({worst0, double(std::fabs(f32(a.k0[0], i) - f32(fresh.k0[0], i))),
                               double(std::fabs(f32(a.v0[0], i) - f32(fresh.v0[0], i)))});
        CHECK(worst0 < 1e-4);
        // Later layers: token j >= 4 (old position j + 20) has the values it had.
        for (int l = 1; l < m.hp.n_layer; l++)
            for (int j = 0; j < n_kept; j++) {
                const size_t old = j < 4 ? j : j + 20;
                bool same = true;
                for (size_t e = 0; e < row; e++)
                    same = same && f32(a.v0[l], j * row + e) == f32(before.v0[l], old * row + e);
                CHECK(same);
            }
        // Deeper layers saw the dropped span: the logits differ from a fresh
        // evaluation's, yet stay close to them.
        MESSAGE(m.hp.arch, ": logits vs a fresh evaluation, max |diff| / max |logit| ",
                max_diff(a.logits, fresh.logits) / max_abs(fresh.logits));
    }
}

TEST_CASE("kv drop: a wrapped sliding-window ring that lost the kept prefix refuses") {
    const std::vector<uint8_t> bytes =
        kvtest::random_model({"gemma3", 64, 4, 2, 96, 3, gl::Type::F32}, 5);
    GgufFile f = GgufFile::parse(bytes.data(), bytes.size(), "gemma3");
    const Model m = Model::load(f);
    const std::vector<int32_t> all = random_tokens(40, 8), next = random_tokens(1, 9);
    // The 8-slot rings hold 32..39; after dropping [30, 35) a query at 35
    // would need 27..29, long overwritten.
    const Run r = run(m, gl::Type::F16, 64, all, 30, 35, next);
    CHECK_FALSE(r.dropped);
    // Dropping [6, 21) leaves 25 tokens: the small rings need 17..24, which
    // were 32..39: possible.
    CHECK(run(m, gl::Type::F16, 64, all, 6, 21, next).dropped);
}
