// `kvrun synth --preset NAME --type TYPE --vocab VOCAB.gguf -o OUT.gguf`:
// a random-weight GGUF with the dimensions of a real model, for benchmarks.
// The numbers are meaningless; the shapes, types and byte counts are real, so
// speed and memory measured on it are those of the real model.
#include <cmath>
#include <cstdio>

#include "cli/common.h"
#include "cli/quant_recipe.h"
#include "tensor_names.h"
#include "error.h"
#include "ggml-like/kernels.h"
#include "ggml-like/cpu/thread_pool.h"
#include "gguf.h"
#include "gguf_writer.h"

namespace kvrun::cli {

namespace {

struct Preset {
    const char* name;
    const char* arch;
    int n_embd, n_layer, n_head, n_head_kv, n_ff;
    int64_t n_ctx;
    float rope_base;
    bool tied;         // output matrix shared with the embedding
    int rope_dims = 0; // rotated dims per head (0: all); phi3 presets fuse QKV and gate|up
    // gemma4: heads of head_dim on global layers (every swa_period-th) and
    // head_dim_swa on window ones, the last n_kv_shared layers sharing K/V
    // (and n_ff_shared wide), per-layer inputs of ple.
    int head_dim = 0, head_dim_swa = 0, swa_period = 0, window = 0;
    int n_kv_shared = 0, n_ff_shared = 0, ple = 0;
    // qwen35: every full_attention-th layer gated attention (heads of
    // head_dim, rope_dims rotated), the others Gated DeltaNet with ssm_k_heads
    // key and ssm_v_heads value heads of ssm_head (conv of 4 taps).
    int full_attention = 0, ssm_k_heads = 0, ssm_v_heads = 0, ssm_head = 0;
    // Mixtures of experts (qwen3moe, qwen35moe): n_expert experts of width
    // n_ff_exp per layer, n_expert_used per token, a shared one of n_ff_shexp.
    int n_expert = 0, n_expert_used = 0, n_ff_exp = 0, n_ff_shexp = 0;
    const char* note = nullptr; // how the preset differs from the model it is named for
};

constexpr Preset kPresets[] = {
    {"tinyllama-1.1b", "llama", 2048, 22, 32, 4, 5632, 2048, 10000.0f, false},
    {"llama-3.2-1b", "llama", 2048, 16, 32, 8, 8192, 131072, 500000.0f, true},
    {"qwen2.5-0.5b", "qwen2", 896, 24, 14, 2, 4864, 32768, 1000000.0f, true},
    {"llama-2-7b", "llama", 4096, 32, 32, 32, 11008, 4096, 10000.0f, false},
    {"mini", "llama", 256, 4, 8, 4, 768, 2048, 10000.0f, false},
    {"phi-3-mini", "phi3", 3072, 32, 32, 32, 8192, 4096, 10000.0f, false},
    {"phi-4-mini", "phi3", 3072, 32, 24, 8, 8192, 131072, 10000.0f, true,
     96}, // without LongRoPE factors
    // Gemma 4 E2B: 35 layers, a global one every fifth (heads of 512, a
    // quarter of their frequencies rotated), windows of 512 (heads of 256),
    // the last 20 layers on layers 13 and 14's K/V with FFNs twice as wide,
    // per-layer inputs of 256.
    {"gemma-4-e2b", "gemma4", 1536, 35, 8, 1, 6144, 131072, 1000000.0f, true, 512, 512, 256, 5, 512,
     20, 12288, 256},
    // Qwen 3.5 0.8B: 24 layers, every fourth gated attention (8 heads / 2 KV
    // heads of 256, 64 dims rotated), the rest Gated DeltaNet (16 key and 16
    // value heads of 128).
    {"qwen3.5-0.8b",
     "qwen35",
     1024,
     24,
     8,
     2,
     3584,
     262144,
     10000000.0f,
     true,
     64,
     256,
     0,
     0,
     0,
     0,
     0,
     0,
     4,
     16,
     16,
     128},
    // Qwen3-30B-A3B: width 2048, 32 heads / 4 KV heads of 128, 128 experts of
    // 768 (8 used), untied; 16 of its 48 layers, so that Q4_K_M (about 6 GB)
    // fits a 24 GiB machine's page cache beside the reference's run.
    {"qwen3-30b-a3b",
     "qwen3moe",
     2048,
     16,
     32,
     4,
     6144,
     40960,
     1000000.0f,
     false,
     0,
     128,
     0,
     0,
     0,
     0,
     0,
     0,
     0,
     0,
     0,
     0,
     128,
     8,
     768,
     0,
     "16 of its 48 layers"},
    // Qwen3.5-35B-A3B: width 2048, every fourth layer gated attention (16
    // heads / 2 KV heads of 256, 64 dims rotated), the rest Gated DeltaNet
    // (16 key and 32 value heads of 128); 256 experts of 512 (8 used) and a
    // shared one of 512, untied; 12 of its 40 layers (three attention).
    {"qwen3.5-35b-a3b",
     "qwen35moe",
     2048,
     12,
     16,
     2,
     512,
     262144,
     10000000.0f,
     false,
     64,
     256,
     0,
     0,
     0,
     0,
     0,
     0,
     4,
     16,
     32,
     128,
     256,
     8,
     512,
     512,
     "12 of its 40 layers"},
};

// Uniform in [-scale, scale), from a per-row seed: reproducible and parallel.
void fill_row(float* x, int64_t n, uint64_t seed, float scale) {
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull;
    for (int64_t i = 0; i < n; i++) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        x[i] = (static_cast<float>(s >> 40) * 0x1.0p-24f * 2.0f - 1.0f) * scale;
    }
}

} // namespace

int run_synth(int argc, char** argv) {
    std::string preset_name, type_name = "q4_0", vocab_path, out;
    int threads = 0;
    uint64_t seed = 1;
    CLI::App app{"kvrun synth: write a random-weight GGUF with a real model's dimensions (for benchmarks)",
                 "kvrun synth"};
    std::string names;
    for (const Preset& p : kPresets)
        names += std::string(names.empty() ? "" : ", ") + p.name +
                 (p.note ? std::string(" (") + p.note + ")" : "");
    app.add_option("--preset", preset_name, "model shape: " + names)->required();
    app.add_option("--type", type_name,
                   "weight type of the matrices, or a recipe that mixes types per tensor (Q4_K_M)")
        ->capture_default_str();
    app.add_option("--vocab", vocab_path, "GGUF whose tokenizer.* metadata to copy (sets n_vocab)")->required();
    app.add_option("-o,--output", out, "output file")->required();
    app.add_option("-t,--threads", threads, "threads");
    app.add_option("--seed", seed, "weights seed")->capture_default_str();
    if (const auto done = parse_command_line(app, argc, argv)) return *done;
    const Preset* p = nullptr;
    for (const Preset& q : kPresets)
        if (preset_name == q.name) p = &q;
    if (!p) fail(Exit::usage, "--preset {}: unknown (known: {})", preset_name, names);
    // A type name puts every matrix in that type; a recipe that is not one
    // (Q4_K_M) mixes them per tensor.
    gl::Type wt = gl::Type::F32;
    const bool one_type = gl::type_from_name(type_name.c_str(), &wt);
    const QuantRecipe* recipe = one_type ? nullptr : find_quant_recipe(type_name);
    if (!recipe && (!one_type || !gl::type_info(wt).supported))
        fail(Exit::usage, "--type {}: not a weight type kvrun can write, nor a recipe ({})",
             type_name, quant_recipe_names());

    GgufFile vocab = GgufFile::open(vocab_path);
    const int64_t n_vocab = static_cast<int64_t>(vocab.need_array("tokenizer.ggml.tokens", GgufType::string).count);
    GgufWriter w;
    const std::string a = p->arch;
    w.set_str("general.architecture", a);
    w.set_str("general.name", std::string("kvrun synth ") + p->name);
    w.set_u32(a + ".context_length", static_cast<uint32_t>(p->n_ctx));
    w.set_u32(a + ".embedding_length", p->n_embd);
    w.set_u32(a + ".block_count", p->n_layer);
    if (a != "gemma4") w.set_u32(a + ".feed_forward_length", p->n_ff); // gemma4: per layer
    if (recipe) w.set_u32("general.file_type", recipe->file_type);
    const bool moe = p->n_expert > 0;
    if (moe) {
        w.set_u32(a + ".expert_count", p->n_expert);
        w.set_u32(a + ".expert_used_count", p->n_expert_used);
        w.set_u32(a + ".expert_feed_forward_length", p->n_ff_exp);
        if (p->n_ff_shexp) w.set_u32(a + ".expert_shared_feed_forward_length", p->n_ff_shexp);
    }
    w.set_u32(a + ".attention.head_count", p->n_head);
    w.set_u32(a + ".attention.head_count_kv", p->n_head_kv);
    w.set_f32(a + ".attention.layer_norm_rms_epsilon", 1e-5f);
    w.set_f32(a + ".rope.freq_base", p->rope_base);
    if (p->rope_dims) w.set_u32(a + ".rope.dimension_count", p->rope_dims);
    const bool gemma4 = a == "gemma4", qwen35 = a.rfind("qwen35", 0) == 0;
    auto recurrent = [&](int l) { return qwen35 && (l + 1) % p->full_attention != 0; };
    if (p->head_dim && !gemma4) {
        w.set_u32(a + ".attention.key_length", p->head_dim);
        w.set_u32(a + ".attention.value_length", p->head_dim);
    }
    if (qwen35) {
        w.set_u32(a + ".full_attention_interval", p->full_attention);
        const int q = p->rope_dims / 2; // MRoPE sections over the rotated pairs
        w.set_i32_array(a + ".rope.dimension_sections", {q - 2 * (q / 3), q / 3, q / 3, 0});
        w.set_u32(a + ".ssm.conv_kernel", 4);
        w.set_u32(a + ".ssm.inner_size", p->ssm_v_heads * p->ssm_head);
        w.set_u32(a + ".ssm.state_size", p->ssm_head);
        w.set_u32(a + ".ssm.time_step_rank", p->ssm_v_heads);
        w.set_u32(a + ".ssm.group_count", p->ssm_k_heads);
    }
    auto is_swa = [&](int l) { return gemma4 && l % p->swa_period != p->swa_period - 1; };
    auto n_ff_of = [&](int l) {
        return gemma4 && l >= p->n_layer - p->n_kv_shared ? p->n_ff_shared : p->n_ff;
    };
    if (gemma4) {
        std::vector<int32_t> pattern, widths;
        for (int l = 0; l < p->n_layer; l++) {
            pattern.push_back(is_swa(l));
            widths.push_back(n_ff_of(l));
        }
        w.set_i32_array(a + ".feed_forward_length", widths);
        w.set_i32_array(a + ".attention.sliding_window_pattern", pattern);
        w.set_u32(a + ".attention.key_length", p->head_dim);
        w.set_u32(a + ".attention.value_length", p->head_dim);
        w.set_u32(a + ".attention.key_length_swa", p->head_dim_swa);
        w.set_u32(a + ".attention.value_length_swa", p->head_dim_swa);
        w.set_u32(a + ".rope.dimension_count_swa", p->head_dim_swa);
        w.set_f32(a + ".rope.freq_base_swa", 10000.0f);
        w.set_u32(a + ".attention.sliding_window", p->window);
        w.set_u32(a + ".attention.shared_kv_layers", p->n_kv_shared);
        w.set_u32(a + ".embedding_length_per_layer_input", p->ple);
        w.set_f32(a + ".final_logit_softcapping", 30.0f);
    }
    for (const auto& [k, v] : vocab.metadata())
        if (k.rfind("tokenizer.", 0) == 0) w.copy_kv(k, v);

    gl::ThreadPool pool(resolve_threads(threads));
    uint64_t tensor_seed = seed * 1000003;
    // `shape`: the tensor's dimensions where they are not {in, out_rows}.
    auto matrix = [&](const std::string& name, int64_t in, int64_t out_rows, gl::Type t,
                      std::vector<int64_t> shape = {}) {
        if (!gl::row_size_ok(t, in))
            fail(Exit::usage, "{}: rows of {} do not fit type {}", name, in, gl::type_name(t));
        const size_t rb = gl::row_size(t, in);
        std::vector<uint8_t> data(rb * out_rows);
        const float scale = std::sqrt(3.0f / static_cast<float>(in)); // unit-variance outputs
        const uint64_t ts = ++tensor_seed;
        pool.parallel_for(out_rows, [&](int64_t b, int64_t e, int) {
            std::vector<float> row(in);
            for (int64_t r = b; r < e; r++) {
                fill_row(row.data(), in, ts * 0x100000001b3ull + r, scale);
                gl::cpu::quantize_row(t, row.data(), data.data() + r * rb, in);
            }
        });
        if (shape.empty())
            shape = out_rows == 1 ? std::vector<int64_t>{in} : std::vector<int64_t>{in, out_rows};
        w.add_tensor(name, t, std::move(shape), std::move(data));
    };
    // A matrix in --type's type, or the one its recipe gives that tensor.
    auto type_for = [&](const std::string& name, int64_t in) {
        return recipe ? recipe_type(*recipe, name, in, p->n_layer) : wt;
    };
    auto weight = [&](const std::string& name, int64_t in, int64_t out_rows) {
        matrix(name, in, out_rows, type_for(name, in));
    };
    // n experts as one 3-D tensor {in, out_rows, n} (expert e: rows e * out_rows ..).
    auto experts = [&](const std::string& name, int64_t in, int64_t out_rows, int64_t n) {
        matrix(name, in, out_rows * n, type_for(name, in), {in, out_rows, n});
    };
    auto ones = [&](const std::string& name, int64_t n) {
        std::vector<float> v(n, 1.0f);
        w.add_tensor(name, gl::Type::F32, {n}, v.data(), v.size() * sizeof(float));
    };
    namespace tn = tensor_names;
    weight(std::string(tn::token_embd), p->n_embd, n_vocab);
    ones(std::string(tn::output_norm), p->n_embd);
    if (!p->tied) weight(std::string(tn::output), p->n_embd, n_vocab);
    if (gemma4) {
        const int width = p->ple * p->n_layer;
        weight(std::string(tn::per_layer_token_embd), width, n_vocab);
        weight(std::string(tn::per_layer_model_proj), p->n_embd, width);
        ones(std::string(tn::per_layer_proj_norm), p->ple);
        // A quarter of the global heads' frequencies rotated, the rest off.
        std::vector<float> factors(p->head_dim / 2, 1e30f);
        for (int i = 0; i < p->head_dim / 8; i++) factors[i] = 1.0f;
        w.add_tensor(std::string(tn::rope_freqs), gl::Type::F32, {p->head_dim / 2},
                     factors.data(), factors.size() * sizeof(float));
    }
    auto floats = [&](const std::string& name, std::vector<int64_t> ne, float v) {
        int64_t n = 1;
        for (int64_t d : ne) n *= d;
        std::vector<float> x(static_cast<size_t>(n), v);
        w.add_tensor(name, gl::Type::F32, std::move(ne), x.data(), x.size() * sizeof(float));
    };
    // A layer's FFN: SwiGLU, or a mixture of experts (the router in F32,
    // as quantizers leave it) with its shared expert.
    auto ffn = [&](int l, int ff) {
        if (!moe) {
            weight(tn::blk(l, tn::ffn_gate), p->n_embd, ff);
            weight(tn::blk(l, tn::ffn_up), p->n_embd, ff);
            weight(tn::blk(l, tn::ffn_down), ff, p->n_embd);
            return;
        }
        matrix(tn::blk(l, tn::ffn_gate_inp), p->n_embd, p->n_expert, gl::Type::F32);
        experts(tn::blk(l, tn::ffn_gate_exps), p->n_embd, p->n_ff_exp, p->n_expert);
        experts(tn::blk(l, tn::ffn_up_exps), p->n_embd, p->n_ff_exp, p->n_expert);
        experts(tn::blk(l, tn::ffn_down_exps), p->n_ff_exp, p->n_embd, p->n_expert);
        if (p->n_ff_shexp) {
            floats(tn::blk(l, tn::ffn_gate_inp_shexp), {p->n_embd}, 1.0f / p->n_embd);
            weight(tn::blk(l, tn::ffn_gate_shexp), p->n_embd, p->n_ff_shexp);
            weight(tn::blk(l, tn::ffn_up_shexp), p->n_embd, p->n_ff_shexp);
            weight(tn::blk(l, tn::ffn_down_shexp), p->n_ff_shexp, p->n_embd);
        }
    };
    for (int l = 0; l < p->n_layer; l++) {
        const int hd = gemma4        ? (is_swa(l) ? p->head_dim_swa : p->head_dim)
                       : p->head_dim ? p->head_dim
                                     : p->n_embd / p->n_head;
        const int ff = n_ff_of(l);
        ones(tn::blk(l, tn::attn_norm), p->n_embd);
        ones(tn::blk(l, qwen35 ? tn::post_attention_norm : tn::ffn_norm), p->n_embd);
        if (recurrent(l)) { // Gated DeltaNet
            const int kd = p->ssm_k_heads * p->ssm_head, inner = p->ssm_v_heads * p->ssm_head;
            const int conv = 2 * kd + inner;
            weight(tn::blk(l, tn::attn_qkv), p->n_embd, conv);
            weight(tn::blk(l, tn::attn_gate), p->n_embd, inner);
            floats(tn::blk(l, tn::ssm_conv1d), {4, conv}, 0.25f);
            floats(tn::blk(l, tn::ssm_dt_bias), {p->ssm_v_heads}, 0.0f);
            floats(tn::blk(l, tn::ssm_a), {p->ssm_v_heads}, -0.5f);
            weight(tn::blk(l, tn::ssm_beta), p->n_embd, p->ssm_v_heads);
            weight(tn::blk(l, tn::ssm_alpha), p->n_embd, p->ssm_v_heads);
            ones(tn::blk(l, tn::ssm_norm), p->ssm_head);
            weight(tn::blk(l, tn::ssm_out), inner, p->n_embd);
            ffn(l, ff);
            continue;
        }
        if (qwen35 || a == "qwen3moe") {
            ones(tn::blk(l, tn::attn_q_norm), hd);
            ones(tn::blk(l, tn::attn_k_norm), hd);
        }
        if (a == "phi3") { // fused: Q|K|V rows, gate|up rows
            weight(tn::blk(l, tn::attn_qkv), p->n_embd, (p->n_head + 2 * p->n_head_kv) * hd);
            weight(tn::blk(l, tn::ffn_up), p->n_embd, 2 * ff);
        } else {
            weight(tn::blk(l, tn::attn_q), p->n_embd, (qwen35 ? 2 : 1) * p->n_head * hd);
            if (!gemma4 || l < p->n_layer - p->n_kv_shared) {
                weight(tn::blk(l, tn::attn_k), p->n_embd, p->n_head_kv * hd);
                weight(tn::blk(l, tn::attn_v), p->n_embd, p->n_head_kv * hd);
                if (gemma4) ones(tn::blk(l, tn::attn_k_norm), hd);
            }
        }
        weight(tn::blk(l, tn::attn_output), p->n_head * hd, p->n_embd);
        if (a == "phi3")
            weight(tn::blk(l, tn::ffn_down), ff, p->n_embd);
        else
            ffn(l, ff);
        if (gemma4) {
            ones(tn::blk(l, tn::attn_q_norm), hd);
            ones(tn::blk(l, tn::post_attention_norm), p->n_embd);
            ones(tn::blk(l, tn::post_ffw_norm), p->n_embd);
            weight(tn::blk(l, tn::inp_gate), p->n_embd, p->ple);
            weight(tn::blk(l, tn::inp_proj), p->ple, p->n_embd);
            ones(tn::blk(l, tn::inp_post_norm), p->n_embd);
            ones(tn::blk(l, tn::layer_output_scale), 1);
        }
        if (a == "qwen2")
            for (auto [nm, len] : {std::pair{tn::attn_q_bias, p->n_head * hd}, {tn::attn_k_bias, p->n_head_kv * hd},
                                   {tn::attn_v_bias, p->n_head_kv * hd}})
                matrix(tn::blk(l, nm), len, 1, gl::Type::F32);
    }
    w.write(out);
    std::fprintf(stderr, "kvrun synth: wrote %s (%s, %s)\n", out.c_str(), p->name,
                 recipe ? recipe->name : gl::type_name(wt));
    return 0;
}

} // namespace kvrun::cli
