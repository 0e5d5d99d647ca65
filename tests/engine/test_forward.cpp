// The optimized forward pass against the plain reference on small random
// models of head layouts the goldens do not cover: one KV head (multi-query),
// no grouping, qwen2-style biases and NeoX RoPE, each weight type.
#include <doctest/doctest.h>

#include <random>

#include "error.h"
#include "forward.h"
#include "ggml-like/kernels.h"
#include "random_model.h"
#include "reference_model.h"
#include "loader.h"
#include "test_util.h"

using namespace kvrun;
using kvtest::random_model;
using kvtest::Shape;

namespace {

void compare_with_reference(const Shape& s, double tol, int keep = 4, int64_t longrope_orig_ctx = 0,
                            int k_rotate = 0, int v_rotate = 0) {
    const std::vector<uint8_t> bytes = random_model(s, 1234, longrope_orig_ctx);
    GgufFile f = GgufFile::parse(bytes.data(), bytes.size(), "random");
    Model m = Model::load(f);
    CHECK(m.hp.n_head_kv == s.n_head_kv);
    const int n_ctx = 48, n_tok = 120; // slides past the window
    std::vector<int32_t> toks(n_tok);
    std::mt19937 rng(7);
    for (auto& t : toks) t = static_cast<int32_t>(rng() % 512);
    kvtest::ReferenceModel ref(m, n_ctx, keep);
    auto be = gl::make_cpu_backend(2);
    KvCacheConfig cfg =
        KvCacheConfig::for_model(m.hp, n_ctx, keep, gl::Type::F32, gl::Type::F32, k_rotate);
    cfg.v_rotate = v_rotate; // F32 values: only a test rotates them
    KvCache kv(cfg);
    Forward fwd(m, kv, *be, 5);
    double worst = 0;
    for (int i = 0; i < n_tok;) {
        const int n = std::min(5, n_tok - i);
        const float* rows = fwd.eval(&toks[i], n, true);
        for (int r = 0; r < n; r++) {
            std::vector<double> want = ref.step(toks[i + r], i + r);
            for (int v = 0; v < m.hp.n_vocab; v++)
                worst = std::max(worst, std::abs(rows[r * m.hp.n_vocab + v] - want[v]));
        }
        i += n;
    }
    const std::string what =
        std::string(s.arch) + " heads " + std::to_string(s.n_head) + "/" +
        std::to_string(s.n_head_kv) + " " + gl::type_name(s.wtype) +
        (k_rotate ? " keys rotated in blocks of " + std::to_string(k_rotate) : "") +
        (v_rotate ? " values rotated in blocks of " + std::to_string(v_rotate) : "");
    MESSAGE(what, ": max |diff| ", worst);
    CHECK(worst < tol);
}

} // namespace

TEST_CASE("forward: random models of other head layouts match the reference") {
    // F32 weights: the reference and the fast path differ only in summation order.
    compare_with_reference({"llama", 64, 4, 1, 96, 2, gl::Type::F32}, 1e-3); // one KV head
    compare_with_reference({"llama", 64, 4, 4, 96, 2, gl::Type::F32}, 1e-3); // no grouping
    compare_with_reference({"llama", 96, 6, 2, 64, 2, gl::Type::F32},
                           1e-3); // 3 queries per KV head
    compare_with_reference({"qwen2", 64, 4, 2, 96, 2, gl::Type::F32}, 1e-3); // biases, NeoX RoPE
    // Half-precision weights meet F32 activations: still only summation order.
    compare_with_reference({"llama", 64, 4, 1, 96, 2, gl::Type::F16}, 1e-3);
    compare_with_reference({"llama", 64, 4, 2, 96, 2, gl::Type::BF16}, 1e-3);
    // Quantized weights: the fast path quantizes activations to 8 bits (Q8_0),
    // the reference does not; 0.1 is the goldens' tolerance for quantized models.
    compare_with_reference({"llama", 64, 4, 2, 96, 2, gl::Type::Q8_0}, 0.1);
    compare_with_reference({"llama", 64, 4, 2, 96, 2, gl::Type::Q4_0}, 0.1);
    // No sinks: the pure sliding window that Mistral-style models declare.
    compare_with_reference({"llama", 64, 4, 2, 96, 2, gl::Type::F32}, 1e-3, 0);
    // phi3: fused QKV and gate|up, NeoX RoPE over 3/4 of each head (Phi-4-mini's).
    compare_with_reference({"phi3", 64, 4, 2, 96, 2, gl::Type::F32}, 1e-3);
    compare_with_reference({"phi3", 128, 2, 1, 64, 2, gl::Type::Q8_0}, 0.1);
    // LongRoPE: the short factors (context 48 within the original 64) and the
    // long ones (past 32), both with the attention factor, sinks re-rotated.
    compare_with_reference({"phi3", 64, 4, 2, 96, 2, gl::Type::F32}, 1e-3, 4, 64);
    compare_with_reference({"phi3", 64, 4, 2, 96, 2, gl::Type::F32}, 1e-3, 4, 32);
}

// Gemma 3's layers of two kinds, each with its own ring: sliding-window
// layers 8 slots and no sinks, global layers 48 with 4 sinks, over 120
// tokens (the small rings wrap 14 times, the large ones twice), against the
// reference's explicit per-layer eviction. Also its norms after each block,
// per-head Q/K norms, GELU gate, scaled embeddings and two RoPE bases.
// Rotated keys (--k-rotate) in an F32 cache: the rotation leaves every q·k
// as it was, so the logits still match the (unrotated) reference through a
// ring that slides past its window, the sinks' pre-rotated copies met by the
// rotated unrotated query, NeoX and partial RoPE, LongRoPE's factor, one KV
// head or several, and blocks smaller than a head.
TEST_CASE("forward: rotated keys match the reference through sliding rings and sinks") {
    compare_with_reference({"llama", 64, 4, 1, 96, 2, gl::Type::F32}, 1e-5, 4, 0, 16);
    compare_with_reference({"llama", 96, 6, 2, 64, 2, gl::Type::F32}, 1e-5, 4, 0,
                           16); // heads of 16
    compare_with_reference({"qwen2", 64, 4, 2, 96, 2, gl::Type::F32}, 1e-5, 4, 0, 8);
    compare_with_reference({"phi3", 64, 4, 2, 96, 2, gl::Type::F32}, 1e-5, 4, 32, 16);
    compare_with_reference({"llama", 64, 4, 2, 96, 2, gl::Type::F32}, 1e-5, 0, 0, 16);  // no sinks
    compare_with_reference({"gemma3", 64, 4, 2, 96, 6, gl::Type::F32}, 1e-5, 4, 0, 16); // two rings
}

// Rotated values (KvCacheConfig::v_rotate, on with rotated keys for 4-bit V):
// stored as R v, the output turned back by R^-1; with F32 values the logits
// are the reference's, whatever the blocks, the heads sharing a KV head or the
// ring's slides. (A forward transform in place of the inverse is off by the
// whole output.)
TEST_CASE("forward: rotated values match the reference") {
    compare_with_reference({"llama", 64, 4, 1, 96, 2, gl::Type::F32}, 1e-5, 4, 0, 0, 16);
    compare_with_reference({"llama", 96, 6, 2, 64, 2, gl::Type::F32}, 1e-5, 4, 0, 16, 16);
    compare_with_reference({"qwen2", 64, 4, 2, 96, 2, gl::Type::F32}, 1e-5, 4, 0, 8, 8);
    compare_with_reference({"gemma3", 64, 4, 2, 96, 6, gl::Type::F32}, 1e-5, 4, 0, 16, 16);
}

TEST_CASE("kv cache: rotated keys rotate 4-bit values too, not others") {
    Hparams hp;
    hp.n_layer = 2, hp.n_head_kv = 2, hp.head_dim = 64;
    using gl::Type;
    CHECK(KvCacheConfig::for_model(hp, 64, 4, Type::Q4_0, Type::Q4_0, 32).v_rotate == 32);
    CHECK(KvCacheConfig::for_model(hp, 64, 4, Type::Q8_0, Type::Q4_0, 32).v_rotate == 32);
    CHECK(KvCacheConfig::for_model(hp, 64, 4, Type::Q4_0, Type::Q8_0, 32).v_rotate == 0);
    CHECK(KvCacheConfig::for_model(hp, 64, 4, Type::Q4_0, Type::F16, 32).v_rotate == 0);
    CHECK(KvCacheConfig::for_model(hp, 64, 4, Type::Q4_0, Type::Q4_0, 0).v_rotate == 0);
}

TEST_CASE("forward: gemma3 per-layer rings match explicit per-layer eviction") {
    const std::vector<uint8_t> bytes = random_model({"gemma3", 64, 4, 2, 96, 6, gl::Type::F32}, 99);
    GgufFile f = GgufFile::parse(bytes.data(), bytes.size(), "gemma3");
    Model m = Model::load(f);
    REQUIRE(m.hp.swa_window == 8);
    CHECK(m.hp.swa_layers == std::vector<uint8_t>{1, 1, 0, 1, 1, 0});
    CHECK(m.rope_inv_freq_swa.size() == m.rope_inv_freq.size());
    CHECK(m.rope_inv_freq_swa[1] == doctest::Approx(std::pow(10000.0, -2.0 / m.hp.rope_dims)));
    CHECK(m.rope_inv_freq[1] == doctest::Approx(std::pow(1e6, -2.0 / m.hp.rope_dims)));
    CHECK(m.embed_scale == doctest::Approx(8.0f));
    compare_with_reference({"gemma3", 64, 4, 2, 96, 6, gl::Type::F32}, 1e-3);
    // 8-bit activations after the post-norms and GELU: 0.18 measured.
    compare_with_reference({"gemma3", 64, 4, 1, 96, 6, gl::Type::Q8_0}, 0.25);
}

namespace {
// The random model again, with extra metadata set by `edit`.
template <typename Edit>
std::vector<uint8_t> with_metadata(const std::vector<uint8_t>& base, Edit edit) {
    GgufFile f = GgufFile::parse(base.data(), base.size(), "base");
    GgufWriter w;
    for (const auto& [k, v] : f.metadata()) w.copy_kv(k, v);
    edit(w);
    for (const auto& t : f.tensors())
        w.add_tensor(t.name, t.type, std::vector<int64_t>(t.ne, t.ne + t.n_dims), t.data, t.nbytes);
    return w.bytes();
}
} // namespace

TEST_CASE("model: RoPE scaling types") {
    const auto base = random_model({"llama", 64, 4, 2, 96, 1, gl::Type::F32}, 5);
    SUBCASE("linear divides every frequency by the factor") {
        const auto bytes = with_metadata(base, [](GgufWriter& w) {
            w.set_str("llama.rope.scaling.type", "linear");
            w.set_f32("llama.rope.scaling.factor", 4.0f);
        });
        GgufFile f = GgufFile::parse(bytes.data(), bytes.size(), "linear");
        Model m = Model::load(f);
        for (size_t i = 0; i < m.rope_inv_freq.size(); i++)
            CHECK(m.rope_inv_freq[i] ==
                  doctest::Approx(std::pow(10000.0, -2.0 * i / m.hp.rope_dims) / 4.0));
    }
    SUBCASE("an unsupported scaling is an error naming it") {
        const auto bytes = with_metadata(
            base, [](GgufWriter& w) { w.set_str("llama.rope.scaling.type", "yarn"); });
        GgufFile f = GgufFile::parse(bytes.data(), bytes.size(), "yarn");
        try {
            Model::load(f);
            FAIL("no error");
        } catch (const Error& e) {
            CHECK(std::string(e.what()).find("yarn") != std::string::npos);
        }
    }
}

TEST_CASE("model: LongRoPE picks short or long factors by context size") {
    const auto bytes = random_model({"phi3", 64, 4, 2, 96, 1, gl::Type::F32}, 5, 64);
    GgufFile f = GgufFile::parse(bytes.data(), bytes.size(), "longrope");
    Model m = Model::load(f);
    REQUIRE(m.hp.rope_dims == 12);
    CHECK(m.hp.rope_orig_ctx == 64);
    CHECK(m.hp.rope_attn_factor == doctest::Approx(1.19));
    const Rope at_64 = m.rope(64), at_65 = m.rope(65);
    CHECK(at_64.attn_factor == doctest::Approx(1.19));
    for (int i = 0; i < 6; i++) {
        const double base = std::pow(10000.0, -2.0 * i / 12);
        CHECK(at_64.inv_freq[i] == doctest::Approx(base / (1.0 + 0.05 * i)));
        CHECK(at_65.inv_freq[i] == doctest::Approx(base / (1.0 + 40.0 * i / 6)));
    }
    SUBCASE("one set of factors alone, or a bad factor, is an error naming the tensor") {
        GgufWriter w;
        for (const auto& [k, v] : f.metadata()) w.copy_kv(k, v);
        const std::vector<float> bad(6, -1.0f);
        for (const auto& t : f.tensors()) {
            if (t.name == "rope_factors_short.weight") continue;
            if (t.name == "rope_factors_long.weight") {
                w.add_tensor(t.name, t.type, {6}, bad.data(), bad.size() * 4);
                continue;
            }
            w.add_tensor(t.name, t.type, std::vector<int64_t>(t.ne, t.ne + t.n_dims), t.data,
                         t.nbytes);
        }
        const auto broken = w.bytes();
        GgufFile g = GgufFile::parse(broken.data(), broken.size(), "broken");
        try {
            Model::load(g);
            FAIL("no error");
        } catch (const Error& e) {
            CHECK(std::string(e.what()).find("rope_factors_") != std::string::npos);
        }
    }
}

TEST_CASE("model: phi3 attends to the whole context whatever attention.sliding_window says") {
    const auto base = random_model({"phi3", 64, 4, 2, 96, 1, gl::Type::F32}, 5);
    const auto bytes = with_metadata(
        base, [](GgufWriter& w) { w.set_u32("phi3.attention.sliding_window", 2047); });
    GgufFile f = GgufFile::parse(bytes.data(), bytes.size(), "phi3-swa");
    CHECK(read_hparams(f).sliding_window == 0);
}

TEST_CASE("model: phi3 fused matrices that do not fit the heads are an error naming them") {
    const auto base = random_model({"phi3", 64, 4, 2, 96, 1, gl::Type::F32}, 5);
    GgufFile f = GgufFile::parse(base.data(), base.size(), "phi3");
    for (const char* broken : {"blk.0.attn_qkv.weight", "blk.0.ffn_up.weight"}) {
        CAPTURE(broken);
        GgufWriter w;
        for (const auto& [k, v] : f.metadata()) w.copy_kv(k, v);
        for (const auto& t : f.tensors()) {
            std::vector<int64_t> ne(t.ne, t.ne + t.n_dims);
            size_t bytes = t.nbytes;
            if (t.name == broken) { // one head's rows short
                ne[1] -= 16;
                bytes = static_cast<size_t>(ne[0] * ne[1]) * 4;
            }
            w.add_tensor(t.name, t.type, ne, t.data, bytes);
        }
        const auto bytes = w.bytes();
        GgufFile g = GgufFile::parse(bytes.data(), bytes.size(), "broken");
        try {
            Model::load(g);
            FAIL("no error");
        } catch (const Error& e) {
            CHECK(std::string(e.what()).find(broken) != std::string::npos);
        }
    }
}
