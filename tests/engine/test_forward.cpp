// The optimized forward pass against the plain reference on small random
// models of head layouts the goldens do not cover: one KV head (multi-query),
// no grouping, qwen2-style biases and NeoX RoPE, each weight type.
#include <doctest/doctest.h>

#include <random>

#include "error.h"
#include "forward.h"
#include "ggml-like/kernels.h"
#include "gguf_writer.h"
#include "reference_model.h"
#include "loader.h"
#include "test_util.h"

using namespace kvrun;

namespace {

struct Shape {
    const char* arch;
    int n_embd, n_head, n_head_kv, n_ff, n_layer;
    gl::Type wtype;
};

// A random-weight model with the stories260K vocabulary (512 SPM tokens).
// phi3: fused attn_qkv and gate|up, RoPE over 3/4 of each head, and with
// `longrope_orig_ctx` > 0 LongRoPE factors (long ones past that context).
std::vector<uint8_t> random_model(const Shape& s, uint32_t seed, int64_t longrope_orig_ctx = 0) {
    GgufFile vocab = GgufFile::open(kvtest::shared("models/stories260K.gguf"));
    GgufWriter w;
    w.set_str("general.architecture", s.arch);
    const std::string a = s.arch;
    w.set_u32(a + ".context_length", 256);
    w.set_u32(a + ".embedding_length", s.n_embd);
    w.set_u32(a + ".block_count", s.n_layer);
    w.set_u32(a + ".feed_forward_length", s.n_ff);
    w.set_u32(a + ".attention.head_count", s.n_head);
    w.set_u32(a + ".attention.head_count_kv", s.n_head_kv);
    w.set_f32(a + ".attention.layer_norm_rms_epsilon", 1e-5f);
    w.set_f32(a + ".rope.freq_base", 10000.0f);
    const int hd = s.n_embd / s.n_head;
    if (a == "phi3") w.set_u32(a + ".rope.dimension_count", hd * 3 / 4);
    if (longrope_orig_ctx > 0) {
        w.set_u32(a + ".rope.scaling.original_context_length",
                  static_cast<uint32_t>(longrope_orig_ctx));
        w.set_f32(a + ".rope.scaling.attn_factor", 1.19f);
    }
    for (const auto& [k, v] : vocab.metadata())
        if (k.rfind("tokenizer.", 0) == 0) w.copy_kv(k, v);
    const int n_vocab = 512;
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    auto add = [&](const std::string& name, int64_t in, int64_t out, gl::Type t, float scale) {
        std::vector<float> f(in * out);
        for (float& x : f) x = nd(rng) * scale;
        std::vector<uint8_t> q(gl::row_size(t, in) * out);
        for (int64_t r = 0; r < out; r++) gl::ref::quantize_row(t, f.data() + r * in, q.data() + r * gl::row_size(t, in), in);
        std::vector<int64_t> ne = out == 1 ? std::vector<int64_t>{in} : std::vector<int64_t>{in, out};
        w.add_tensor(name, t, ne, q.data(), q.size());
    };
    auto norm = [&](const std::string& name) {
        std::vector<float> f(s.n_embd);
        for (float& x : f) x = 1.0f + 0.1f * nd(rng);
        w.add_tensor(name, gl::Type::F32, {s.n_embd}, f.data(), f.size() * 4);
    };
    const float ws = 1.0f / std::sqrt(static_cast<float>(s.n_embd));
    add("token_embd.weight", s.n_embd, n_vocab, s.wtype, 1.0f);
    norm("output_norm.weight");
    add("output.weight", s.n_embd, n_vocab, s.wtype, ws);
    for (int l = 0; l < s.n_layer; l++) {
        const std::string n = "blk." + std::to_string(l) + ".";
        norm(n + "attn_norm.weight");
        norm(n + "ffn_norm.weight");
        if (a == "phi3") {
            add(n + "attn_qkv.weight", s.n_embd, (s.n_head + 2 * s.n_head_kv) * hd, s.wtype, ws);
            add(n + "ffn_up.weight", s.n_embd, 2 * s.n_ff, s.wtype, ws);
        } else {
            add(n + "attn_q.weight", s.n_embd, s.n_head * hd, s.wtype, ws);
            add(n + "attn_k.weight", s.n_embd, s.n_head_kv * hd, s.wtype, ws);
            add(n + "attn_v.weight", s.n_embd, s.n_head_kv * hd, s.wtype, ws);
            add(n + "ffn_gate.weight", s.n_embd, s.n_ff, s.wtype, ws);
            add(n + "ffn_up.weight", s.n_embd, s.n_ff, s.wtype, ws);
        }
        add(n + "attn_output.weight", s.n_head * hd, s.n_embd, s.wtype, ws);
        add(n + "ffn_down.weight", s.n_ff, s.n_embd, s.wtype, 1.0f / std::sqrt(static_cast<float>(s.n_ff)));
        if (a == "qwen2") {
            add(n + "attn_q.bias", s.n_head * hd, 1, gl::Type::F32, 0.5f);
            add(n + "attn_k.bias", s.n_head_kv * hd, 1, gl::Type::F32, 0.5f);
            add(n + "attn_v.bias", s.n_head_kv * hd, 1, gl::Type::F32, 0.5f);
        }
    }
    if (longrope_orig_ctx > 0) { // factors as in Phi-3's: about 1 (short), growing to tens (long)
        const int pairs = (a == "phi3" ? hd * 3 / 4 : hd) / 2;
        std::vector<float> lng(pairs), shrt(pairs);
        for (int i = 0; i < pairs; i++) {
            shrt[i] = 1.0f + 0.05f * i;
            lng[i] = 1.0f + 40.0f * static_cast<float>(i) / pairs;
        }
        w.add_tensor("rope_factors_long.weight", gl::Type::F32, {pairs}, lng.data(),
                     lng.size() * 4);
        w.add_tensor("rope_factors_short.weight", gl::Type::F32, {pairs}, shrt.data(),
                     shrt.size() * 4);
    }
    return w.bytes();
}

void compare_with_reference(const Shape& s, double tol, int keep = 4,
                            int64_t longrope_orig_ctx = 0) {
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
    KvCache kv({m.hp.n_layer, m.hp.n_head_kv, m.hp.head_dim, n_ctx, keep, gl::Type::F32, gl::Type::F32});
    Forward fwd(m, kv, *be, 5);
    double worst = 0;
    for (int i = 0; i < n_tok;) {
        const int n = std::min(5, n_tok - i);
        const float* rows = fwd.eval(&toks[i], n, true);
        for (int r = 0; r < n; r++) {
            std::vector<double> want = ref.step(toks[i + r], i + r);
            for (int v = 0; v < m.hp.n_vocab; v++) worst = std::max(worst, std::abs(rows[r * m.hp.n_vocab + v] - want[v]));
        }
        i += n;
    }
    const std::string what = std::string(s.arch) + " heads " + std::to_string(s.n_head) + "/" + std::to_string(s.n_head_kv) + " " + gl::type_name(s.wtype);
    MESSAGE(what, ": max |diff| ", worst);
    CHECK(worst < tol);
}

} // namespace

TEST_CASE("forward: random models of other head layouts match the reference") {
    // F32 weights: the reference and the fast path differ only in summation order.
    compare_with_reference({"llama", 64, 4, 1, 96, 2, gl::Type::F32}, 1e-3);  // one KV head
    compare_with_reference({"llama", 64, 4, 4, 96, 2, gl::Type::F32}, 1e-3);  // no grouping
    compare_with_reference({"llama", 96, 6, 2, 64, 2, gl::Type::F32}, 1e-3);  // 3 queries per KV head
    compare_with_reference({"qwen2", 64, 4, 2, 96, 2, gl::Type::F32}, 1e-3);  // biases, NeoX RoPE
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

namespace {
// The random model again, with extra metadata set by `edit`.
template <typename Edit> std::vector<uint8_t> with_metadata(const std::vector<uint8_t>& base, Edit edit) {
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
            CHECK(m.rope_inv_freq[i] == doctest::Approx(std::pow(10000.0, -2.0 * i / m.hp.rope_dims) / 4.0));
    }
    SUBCASE("an unsupported scaling is an error naming it") {
        const auto bytes = with_metadata(base, [](GgufWriter& w) { w.set_str("llama.rope.scaling.type", "yarn"); });
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
