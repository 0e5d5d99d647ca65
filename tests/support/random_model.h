// Small random-weight GGUF models (F32 or quantized weights) with the
// stories260K vocabulary, for tests of head layouts and families the goldens
// do not cover.
#pragma once

#include <doctest/doctest.h>

#include <cstdio>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>
#include <unistd.h>
#include <memory>
#include <fstream>

#include "ggml-like/kernels.h"
#include "gguf.h"
#include "gguf_writer.h"
#include "loader.h"
#include "test_util.h"

namespace kvtest {

using kvrun::GgufFile;
using kvrun::GgufWriter;

struct Shape {
    const char* arch;
    int n_embd, n_head, n_head_kv, n_ff, n_layer;
    gl::Type wtype;
};

// A random-weight model with the stories260K vocabulary (512 SPM tokens).
// phi3: fused attn_qkv and gate|up, RoPE over 3/4 of each head, and with
// `longrope_orig_ctx` > 0 LongRoPE factors (long ones past that context).
// gemma3: post-norms, per-head Q/K norms, tied output, a window of 8 and a
// global layer every third (`swa_window` sets another window).
inline std::vector<uint8_t> random_model(const Shape& s, uint32_t seed,
                                         int64_t longrope_orig_ctx = 0, int swa_window = 8) {
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
    w.set_f32(a + ".rope.freq_base", a == "gemma3" ? 1e6f : 10000.0f);
    if (a == "gemma3") {
        // A window of 8 and a global layer every third (layers 2, 5, ...).
        w.set_u32(a + ".attention.sliding_window", static_cast<uint32_t>(swa_window));
        w.set_u32(a + ".attention.sliding_window_pattern", 3);
    }
    if (a == "phi3") w.set_u32(a + ".rope.dimension_count", s.n_embd / s.n_head * 3 / 4);
    if (longrope_orig_ctx > 0) {
        w.set_u32(a + ".rope.scaling.original_context_length",
                  static_cast<uint32_t>(longrope_orig_ctx));
        w.set_f32(a + ".rope.scaling.attn_factor", 1.19f);
    }
    for (const auto& [k, v] : vocab.metadata())
        if (k.rfind("tokenizer.", 0) == 0) w.copy_kv(k, v);
    const int n_vocab = 512, hd = s.n_embd / s.n_head;
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    auto add = [&](const std::string& name, int64_t in, int64_t out, gl::Type t, float scale) {
        std::vector<float> f(in * out);
        for (float& x : f) x = nd(rng) * scale;
        std::vector<uint8_t> q(gl::row_size(t, in) * out);
        for (int64_t r = 0; r < out; r++)
            gl::ref::quantize_row(t, f.data() + r * in, q.data() + r * gl::row_size(t, in), in);
        std::vector<int64_t> ne =
            out == 1 ? std::vector<int64_t>{in} : std::vector<int64_t>{in, out};
        w.add_tensor(name, t, ne, q.data(), q.size());
    };
    auto norm = [&](const std::string& name, int n = 0) {
        std::vector<float> f(n ? n : s.n_embd);
        for (float& x : f) x = 1.0f + 0.1f * nd(rng);
        w.add_tensor(name, gl::Type::F32, {static_cast<int64_t>(f.size())}, f.data(), f.size() * 4);
    };
    const float ws = 1.0f / std::sqrt(static_cast<float>(s.n_embd));
    const bool gemma = a == "gemma3";
    // Gemma scales the embeddings up by sqrt(width): keep the stream's size.
    add("token_embd.weight", s.n_embd, n_vocab, s.wtype, gemma ? ws : 1.0f);
    norm("output_norm.weight");
    if (!gemma) add("output.weight", s.n_embd, n_vocab, s.wtype, ws); // gemma3: tied
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
        add(n + "ffn_down.weight", s.n_ff, s.n_embd, s.wtype,
            1.0f / std::sqrt(static_cast<float>(s.n_ff)));
        if (gemma) {
            norm(n + "attn_q_norm.weight", hd);
            norm(n + "attn_k_norm.weight", hd);
            norm(n + "post_attention_norm.weight");
            norm(n + "post_ffw_norm.weight");
        }
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

// A random-weight model in a file (Session takes a LoadedModel), removed at the end.
struct RandomModelFile {
    std::string path;
    std::unique_ptr<kvrun::LoadedModel> lm;
    explicit RandomModelFile(const Shape& s, uint32_t seed = 4321, int swa_window = 8) {
        char name[] = "/tmp/kvrun-model-XXXXXX";
        const int fd = ::mkstemp(name);
        REQUIRE(fd >= 0);
        ::close(fd);
        path = name;
        const std::vector<uint8_t> bytes = random_model(s, seed, 0, swa_window);
        std::ofstream(path, std::ios::binary)
            .write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
        lm = kvrun::LoadedModel::load(path);
    }
    ~RandomModelFile() { std::remove(path.c_str()); }
};

} // namespace kvtest
