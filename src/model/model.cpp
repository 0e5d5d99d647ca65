#include "model.h"

#include <algorithm>
#include <cmath>

#include "arch/family.h"
#include "error.h"
#include "tensor_names.h"
#include "ggml-like/kernels.h"

namespace kvrun {

namespace tn = tensor_names;

namespace {

class Binder {
  public:
    Binder(const GgufFile& f) : f_(f) {}

    const GgufTensor* find(const std::string& name) const { return f_.tensor(name); }

    // A 2-D weight matrix: rows of `in` elements, `out` rows.
    gl::Tensor matrix(const std::string& name, int64_t in, int64_t out) const {
        const GgufTensor* t = find(name);
        if (!t) fail(Exit::bad_model, "{}: missing tensor '{}'", f_.path(), name);
        return view(*t, in, out);
    }

    gl::Tensor view(const GgufTensor& t, int64_t in, int64_t out) const {
        if (t.n_dims > 2 || t.ne[0] != in || t.ne[1] != out)
            fail(Exit::bad_model, "{}: tensor '{}' has shape {}, expected [{}, {}]", f_.path(),
                 t.name, t.shape_str(), in, out);
        check_type(t);
        gl::Tensor v;
        v.type = t.type;
        v.ne0 = in;
        v.ne1 = out;
        v.row_bytes = gl::row_size(t.type, in);
        v.data = t.data;
        return v;
    }

    // A 1-D tensor converted to F32 (norm weights, biases). Optional if !required.
    std::vector<float> vector(const std::string& name, int64_t n, bool required = true) const {
        const GgufTensor* t = find(name);
        if (!t) {
            if (required) fail(Exit::bad_model, "{}: missing tensor '{}'", f_.path(), name);
            return {};
        }
        if (t->n_elements() != n || t->ne[0] != n)
            fail(Exit::bad_model, "{}: tensor '{}' has shape {}, expected [{}]", f_.path(), name,
                 t->shape_str(), n);
        check_type(*t);
        std::vector<float> out(n);
        gl::ref::dequantize_row(t->type, t->data, out.data(), n);
        return out;
    }

    void check_type(const GgufTensor& t) const {
        if (!gl::type_info(t.type).supported)
            fail(Exit::bad_model, "{}: tensor '{}' has type {}, which kvrun does not support yet",
                 f_.path(), t.name, gl::type_name(t.type));
    }

    const std::string& path() const { return f_.path(); }

  private:
    const GgufFile& f_;
};

// LongRoPE divides each frequency by its factor: published files hold 1 to
// about 100. Far outside that (1e-30, 1e30) an angle is noise, not a scaling.
void check_factor(const GgufFile& f, std::string_view tensor, float x) {
    if (!(x > 0) || !std::isfinite(x))
        fail(Exit::bad_model, "{}: {} holds {}, expected positive factors", f.path(), tensor, x);
    if (x < 1e-3f || x > 1e4f)
        fail(Exit::bad_model, "{}: {} holds {}, expected factors from 0.001 to 10000", f.path(),
             tensor, x);
}

int as_int(uint64_t v, const GgufFile& f, const std::string& key, uint64_t max = 1u << 24) {
    if (v == 0 || v > max) fail(Exit::bad_model, "{}: '{}' = {} is out of range", f.path(), key, v);
    return static_cast<int>(v);
}

// A small 2-D tensor (conv taps) as F32 rows of `in`, `out` of them.
std::vector<float> small_matrix(const Binder& b, const std::string& name, int64_t in, int64_t out) {
    const gl::Tensor t = b.matrix(name, in, out);
    std::vector<float> v(static_cast<size_t>(in * out));
    for (int64_t r = 0; r < out; r++) gl::ref::dequantize_row(t.type, t.row(r), v.data() + r * in, in);
    return v;
}

// Qwen 3.5's Gated DeltaNet weights of layer l.
void bind_delta_net(const Binder& b, const Hparams& hp, int l, LayerWeights& L) {
    auto name = [l](std::string_view suffix) { return tn::blk(l, suffix); };
    const int hv = hp.ssm_n_v_heads;
    L.w_ssm_qkv = b.matrix(name(tn::attn_qkv), hp.n_embd, hp.ssm_conv_dim());
    L.w_ssm_z = b.matrix(name(tn::attn_gate), hp.n_embd, hp.ssm_d_inner);
    L.w_ssm_beta = b.matrix(name(tn::ssm_beta), hp.n_embd, hv);
    L.w_ssm_alpha = b.matrix(name(tn::ssm_alpha), hp.n_embd, hv);
    L.w_ssm_out = b.matrix(name(tn::ssm_out), hp.ssm_d_inner, hp.n_embd);
    L.ssm_conv = small_matrix(b, name(tn::ssm_conv1d), hp.ssm_conv_kernel, hp.ssm_conv_dim());
    L.ssm_dt_bias = b.vector(name(tn::ssm_dt_bias), hv);
    L.ssm_a = b.vector(name(tn::ssm_a), hv);
    L.ssm_norm = b.vector(name(tn::ssm_norm), hp.ssm_v_head_dim());
    // The decay exp(softplus(.) * a) must stay in (0, 1]: a = -exp(A_log) <= 0.
    for (float a : L.ssm_a)
        if (!(a <= 0) || !std::isfinite(a))
            fail(Exit::bad_model, "{}: {} holds {}, expected finite values <= 0 (-exp(A))", b.path(),
                 name(tn::ssm_a), a);
    for (const std::vector<float>* v : {&L.ssm_conv, &L.ssm_dt_bias, &L.ssm_norm})
        for (float x : *v)
            if (!std::isfinite(x))
                fail(Exit::bad_model, "{}: layer {}'s Gated DeltaNet weights hold {}", b.path(), l,
                     x);
}

// A mixture-of-experts FFN of layer l: the router, each expert's three
// matrices as views of the file's 3-D tensors, the shared expert and its gate.
void bind_experts(const Binder& b, const Hparams& hp, int l, LayerWeights& L) {
    auto name = [l](std::string_view suffix) { return tn::blk(l, suffix); };
    const int E = hp.n_expert, ff = hp.n_ff_exp;
    L.w_router = b.matrix(name(tn::ffn_gate_inp), hp.n_embd, E);
    // Expert e is slice e of the last dimension: rows e * out .. of the
    // tensor read as one matrix of E * out rows.
    auto experts = [&](std::string_view suffix, int64_t in, int64_t out) {
        const std::string n = name(suffix);
        const GgufTensor* t = b.find(n);
        if (!t) fail(Exit::bad_model, "{}: missing tensor '{}'", b.path(), n);
        if (t->n_dims != 3 || t->ne[0] != in || t->ne[1] != out || t->ne[2] != E)
            fail(Exit::bad_model, "{}: tensor '{}' has shape {}, expected [{}, {}, {}]", b.path(),
                 n, t->shape_str(), in, out, E);
        GgufTensor flat = *t;
        flat.n_dims = 2;
        flat.ne[1] = out * E;
        flat.ne[2] = 1;
        const gl::Tensor all = b.view(flat, in, out * E);
        std::vector<gl::Tensor> v;
        for (int e = 0; e < E; e++) v.push_back(all.rows(static_cast<int64_t>(e) * out, out));
        return v;
    };
    if (b.find(name(tn::ffn_gate_up_exps))) { // merged: each expert's gate rows, then up rows
        for (const gl::Tensor& gu : experts(tn::ffn_gate_up_exps, hp.n_embd, 2 * ff)) {
            L.exp_gate.push_back(gu.rows(0, ff));
            L.exp_up.push_back(gu.rows(ff, ff));
        }
    } else {
        L.exp_gate = experts(tn::ffn_gate_exps, hp.n_embd, ff);
        L.exp_up = experts(tn::ffn_up_exps, hp.n_embd, ff);
    }
    L.exp_down = experts(tn::ffn_down_exps, ff, hp.n_embd);

    const bool has_shared = b.find(name(tn::ffn_gate_shexp)) || b.find(name(tn::ffn_up_shexp)) ||
                            b.find(name(tn::ffn_down_shexp));
    if (has_shared && hp.n_ff_shexp == 0)
        fail(Exit::bad_model,
             "{}: layer {} has a shared expert but no '{}.expert_shared_feed_forward_length'",
             b.path(), l, hp.arch);
    if (hp.n_ff_shexp == 0) return;
    if (!b.find(name(tn::ffn_gate_inp_shexp)))
        fail(Exit::bad_model, "{}: layer {}'s shared expert has no gate ('{}')", b.path(), l,
             name(tn::ffn_gate_inp_shexp));
    L.w_shexp_gate = b.matrix(name(tn::ffn_gate_shexp), hp.n_embd, hp.n_ff_shexp);
    L.w_shexp_up = b.matrix(name(tn::ffn_up_shexp), hp.n_embd, hp.n_ff_shexp);
    L.w_shexp_down = b.matrix(name(tn::ffn_down_shexp), hp.n_ff_shexp, hp.n_embd);
    L.shexp_gate_inp = b.vector(name(tn::ffn_gate_inp_shexp), hp.n_embd);
    for (float x : L.shexp_gate_inp)
        if (!std::isfinite(x))
            fail(Exit::bad_model, "{}: {} holds {}", b.path(), name(tn::ffn_gate_inp_shexp), x);
}

} // namespace

float Model::attn_scale() const {
    return hp.attn_scale > 0 ? hp.attn_scale : 1.0f / std::sqrt(static_cast<float>(hp.head_dim));
}

const char* supported_architectures() {
    return family_names().c_str();
}

Hparams read_hparams(const GgufFile& f) {
    Hparams hp;
    hp.arch = std::string(f.need_str("general.architecture"));
    const Family* arch = find_family(hp.arch);
    if (!arch)
        fail(Exit::bad_model, "{}: architecture '{}' is not supported (kvrun runs: {})", f.path(),
             hp.arch, supported_architectures());
    const std::string p = hp.arch + ".";
    auto need = [&](const std::string& k, uint64_t max = 1u << 24) {
        return as_int(f.need_u64(p + k), f, p + k, max);
    };

    hp.n_embd = need("embedding_length");
    hp.n_layer = need("block_count", 4096);
    // One width, or one per layer (Gemma 4 E2B's last 20 layers are twice as wide).
    const std::string ff_key = p + "feed_forward_length";
    if (const GgufValue* ff = f.find(ff_key); ff && ff->type == GgufType::array) {
        const GgufType e = ff->elem_type;
        const bool integers = e != GgufType::f32 && e != GgufType::f64 && e != GgufType::string &&
                              e != GgufType::array && e != GgufType::boolean;
        if (ff->count != static_cast<uint64_t>(hp.n_layer) || !integers)
            fail(Exit::bad_model, "{}: '{}' must hold one integer per layer ({})", f.path(),
                 ff_key, hp.n_layer);
        for (int l = 0; l < hp.n_layer; l++) {
            const int64_t w = ff->array_i64(l);
            if (w <= 0 || w > (1 << 24))
                fail(Exit::bad_model, "{}: '{}' = {} at layer {} is out of range", f.path(), ff_key,
                     w, l);
            hp.n_ff_layers.push_back(static_cast<int>(w));
        }
        hp.n_ff = *std::max_element(hp.n_ff_layers.begin(), hp.n_ff_layers.end());
        if (std::all_of(hp.n_ff_layers.begin(), hp.n_ff_layers.end(),
                        [&](int w) { return w == hp.n_ff; }))
            hp.n_ff_layers.clear();
    } else if (!arch->experts) { // a mixture's is written but unused (experts.cpp)
        hp.n_ff = need("feed_forward_length");
    }
    hp.n_head = need("attention.head_count", 4096);
    hp.n_head_kv = f.get_u64(p + "attention.head_count_kv") ? need("attention.head_count_kv", 4096)
                                                            : hp.n_head;
    hp.n_ctx_train = need("context_length", 1u << 30);
    if (hp.n_head % hp.n_head_kv != 0)
        fail(Exit::bad_model, "{}: {} query heads cannot be grouped over {} KV heads", f.path(),
             hp.n_head, hp.n_head_kv);
    if (hp.n_embd % hp.n_head != 0 && !f.get_u64(p + "attention.key_length"))
        fail(Exit::bad_model, "{}: width {} is not a multiple of {} heads", f.path(), hp.n_embd,
             hp.n_head);
    hp.head_dim = f.get_u64(p + "attention.key_length") ? need("attention.key_length", 4096)
                                                        : hp.n_embd / hp.n_head;
    if (auto vl = f.get_u64(p + "attention.value_length");
        vl && *vl != static_cast<uint64_t>(hp.head_dim))
        fail(Exit::bad_model, "{}: key length {} != value length {} is not supported", f.path(),
             hp.head_dim, *vl);
    if (hp.head_dim % 2 != 0)
        fail(Exit::bad_model, "{}: head size {} is odd", f.path(), hp.head_dim);
    // Checked as a double: a value past float's range (inf included) would
    // make every norm's output zero; an epsilon is far below 1.
    const double rms_eps = f.get_f64(p + "attention.layer_norm_rms_epsilon").value_or(1e-5);
    if (!(rms_eps > 0 && rms_eps <= 1))
        fail(Exit::bad_model, "{}: the RMS epsilon {} is out of range (0 .. 1]", f.path(), rms_eps);
    hp.rms_eps = static_cast<float>(rms_eps);
    hp.rope_base = f.get_positive(p + "rope.freq_base").value_or(10000.0);
    hp.rope_dims =
        f.get_u64(p + "rope.dimension_count") ? need("rope.dimension_count", 4096) : hp.head_dim;
    if (hp.rope_dims > hp.head_dim || hp.rope_dims % 2 != 0)
        fail(Exit::bad_model, "{}: rope.dimension_count {} does not fit head size {}", f.path(),
             hp.rope_dims, hp.head_dim);
    hp.rope_neox = arch->rope_neox;
    // RoPE scaling: "linear" divides positions by the factor (the same as
    // dividing every frequency); "llama3" is carried by the rope_freqs tensor
    // and LongRoPE by rope_factors_short/long (applied in Model::load).
    // Others (yarn) would be silently wrong.
    const bool longrope = f.tensor(std::string(tn::rope_factors_long)) ||
                          f.tensor(std::string(tn::rope_factors_short));
    if (auto scaling = f.get_str(p + "rope.scaling.type"); scaling && *scaling != "none") {
        if (*scaling == "linear") {
            hp.rope_linear_factor = f.get_positive(p + "rope.scaling.factor").value_or(1.0);
        } else if (!(*scaling == "llama3" && f.tensor(std::string(tn::rope_freqs))) &&
                   !((*scaling == "longrope" || *scaling == "su") && longrope)) {
            fail(Exit::bad_model, "{}: RoPE scaling '{}' is not supported yet", f.path(), *scaling);
        }
    }
    // The reference engine scales cos and sin by rope.scaling.attn_factor
    // whatever the scaling (LongRoPE files set it: 1.19 for Phi-4-mini).
    hp.rope_attn_factor = f.get_f64(p + "rope.scaling.attn_factor").value_or(1.0);
    if (!(hp.rope_attn_factor > 0) || hp.rope_attn_factor > 16)
        fail(Exit::bad_model, "{}: rope.scaling.attn_factor {} is out of range", f.path(),
             hp.rope_attn_factor);
    hp.rope_orig_ctx = f.get_u64(p + "rope.scaling.original_context_length")
                           ? need("rope.scaling.original_context_length", 1u << 30)
                           : hp.n_ctx_train;

    // 0 declares no window. A window of one token attends to nothing but
    // itself, and one past 2^30 would wrap int64 and int: both are bad files.
    if (auto sw = f.get_u64(p + "attention.sliding_window"); sw && *sw != 0) {
        if (*sw < 2 || *sw > (uint64_t{1} << 30))
            fail(Exit::bad_model,
                 "{}: '{}attention.sliding_window' = {} is out of range (2 .. 2^30)", f.path(), p,
                 *sw);
        hp.sliding_window = static_cast<int64_t>(*sw);
    }
    if (arch->read_hparams) arch->read_hparams(f, hp);
    if (arch->experts) read_expert_hparams(f, hp);

    const GgufTensor* emb = f.tensor(std::string(tn::token_embd));
    if (!emb) fail(Exit::bad_model, "{}: missing tensor '{}'", f.path(), tn::token_embd);
    if (emb->n_dims != 2 || emb->ne[0] != hp.n_embd || emb->ne[1] > (1 << 26))
        fail(Exit::bad_model, "{}: {} has shape {}, expected [{}, n_vocab]", f.path(),
             tn::token_embd, emb->shape_str(), hp.n_embd);
    hp.n_vocab = static_cast<int>(emb->ne[1]);
    // Optional, but a file that states its vocabulary must agree with its
    // embedding: a mismatch means a converter wrote the wrong tensors.
    if (auto nv = f.get_u64(p + "vocab_size"); nv && *nv != static_cast<uint64_t>(hp.n_vocab))
        fail(Exit::bad_model, "{}: '{}vocab_size' = {} disagrees with {} ({} rows)", f.path(), p,
             *nv, tn::token_embd, hp.n_vocab);
    return hp;
}

Model Model::load(const GgufFile& f) {
    Model m;
    m.hp = read_hparams(f);
    const Hparams& hp = m.hp;
    const Family* arch = find_family(hp.arch);
    Binder b(f);
    m.token_embd = b.view(*f.tensor(std::string(tn::token_embd)), hp.n_embd, hp.n_vocab);
    m.output_norm = b.vector(std::string(tn::output_norm), hp.n_embd);
    m.output = b.find(std::string(tn::output))
                   ? b.matrix(std::string(tn::output), hp.n_embd, hp.n_vocab)
                   : m.token_embd;

    m.layers.resize(hp.n_layer);
    const int P = hp.n_embd_per_layer;
    for (int l = 0; l < hp.n_layer; l++) {
        LayerWeights& L = m.layers[l];
        auto name = [l](std::string_view suffix) { return tn::blk(l, suffix); };
        const int hd = hp.layer_head_dim(l), qd = hp.layer_q_dim(l), kvd = hp.layer_kv_dim(l);
        const bool own_kv = hp.owns_kv(l);
        L.attn_norm = b.vector(name(tn::attn_norm), hp.n_embd);
        if (hp.is_recurrent(l)) {
            bind_delta_net(b, hp, l, L);
        } else if (b.find(name(tn::attn_qkv))) { // fused (phi3): Q rows, then K, then V
            const gl::Tensor qkv = b.matrix(name(tn::attn_qkv), hp.n_embd, qd + 2 * kvd);
            L.wq = qkv.rows(0, qd);
            L.wk = qkv.rows(qd, kvd);
            L.wv = qkv.rows(qd + kvd, kvd);
        } else {
            // Qwen 3.5: each head's query, then its output gate.
            L.wq = b.matrix(name(tn::attn_q), hp.n_embd, hp.attn_output_gate ? 2 * qd : qd);
            // Layers sharing another's K/V (Gemma 4) have none to compute.
            if (own_kv) {
                L.wk = b.matrix(name(tn::attn_k), hp.n_embd, kvd);
                L.v_is_k = arch->optional_v && !b.find(name(tn::attn_v));
                if (!L.v_is_k) L.wv = b.matrix(name(tn::attn_v), hp.n_embd, kvd);
            }
        }
        if (!hp.is_recurrent(l)) {
            L.bq = b.vector(name(tn::attn_q_bias), qd, arch->qkv_bias);
            L.bk = b.vector(name(tn::attn_k_bias), kvd, arch->qkv_bias);
            L.bv = b.vector(name(tn::attn_v_bias), kvd, arch->qkv_bias);
            if (arch->qk_norm) {
                L.q_norm = b.vector(name(tn::attn_q_norm), hd);
                if (own_kv) L.k_norm = b.vector(name(tn::attn_k_norm), hd);
            }
            L.wo = b.matrix(name(tn::attn_output), qd, hp.n_embd);
        }
        L.ffn_norm = b.vector(
            name(arch->ffn_norm_is_post_attention ? tn::post_attention_norm : tn::ffn_norm),
            hp.n_embd);
        if (arch->post_norms) {
            L.post_attn_norm = b.vector(name(tn::post_attention_norm), hp.n_embd);
            L.post_ffn_norm = b.vector(name(tn::post_ffw_norm), hp.n_embd);
        }
        // Fused (phi3): no ffn_gate, and an ffn_up of other than n_ff rows
        // (2 n_ff: gate rows, then up; anything else is named as misshapen).
        const int ff = hp.layer_n_ff(l);
        const GgufTensor* up = b.find(name(tn::ffn_up));
        if (hp.is_moe()) {
            bind_experts(b, hp, l, L);
        } else if (!b.find(name(tn::ffn_gate)) && up && up->ne[1] != ff) {
            const gl::Tensor gate_up = b.matrix(name(tn::ffn_up), hp.n_embd, 2 * ff);
            L.w_gate = gate_up.rows(0, ff);
            L.w_up = gate_up.rows(ff, ff);
        } else {
            L.w_gate = b.matrix(name(tn::ffn_gate), hp.n_embd, ff);
            L.w_up = b.matrix(name(tn::ffn_up), hp.n_embd, ff);
        }
        if (!hp.is_moe()) L.w_down = b.matrix(name(tn::ffn_down), ff, hp.n_embd);
        if (P > 0) {
            L.w_inp_gate = b.matrix(name(tn::inp_gate), hp.n_embd, P);
            L.w_inp_proj = b.matrix(name(tn::inp_proj), P, hp.n_embd);
            L.inp_post_norm = b.vector(name(tn::inp_post_norm), hp.n_embd);
        }
        if (const std::vector<float> s = b.vector(name(tn::layer_output_scale), 1, false);
            !s.empty()) {
            if (!std::isfinite(s[0]) || std::fabs(s[0]) > 1e4f)
                fail(Exit::bad_model, "{}: {} holds {}", f.path(), name(tn::layer_output_scale),
                     s[0]);
            L.output_scale = s[0];
        }
    }
    if (P > 0) {
        const int64_t width = static_cast<int64_t>(P) * hp.n_layer;
        m.per_layer_token_embd =
            b.matrix(std::string(tn::per_layer_token_embd), width, hp.n_vocab);
        m.per_layer_model_proj = b.matrix(std::string(tn::per_layer_model_proj), hp.n_embd, width);
        m.per_layer_proj_norm = b.vector(std::string(tn::per_layer_proj_norm), P);
    }
    m.v_norm = arch->v_norm;

    // theta_i = base^(-2i/d); Llama 3 files carry per-frequency divisors in
    // rope_freqs, LongRoPE files two sets (short and long contexts).
    const int n_pairs = hp.rope_dims / 2;
    auto inv_freq = [&](const std::vector<float>& factors) {
        std::vector<double> v(n_pairs);
        for (int i = 0; i < n_pairs; i++) {
            v[i] = std::pow(hp.rope_base, -2.0 * i / hp.rope_dims);
            if (!factors.empty()) v[i] /= factors[i];
            v[i] /= hp.rope_linear_factor;
        }
        return v;
    };
    const std::vector<float> freq_factors = b.vector(std::string(tn::rope_freqs), n_pairs, false);
    for (float x : freq_factors)
        if (!(arch->rope_factors_off && x >= 1e4f && std::isfinite(x)))
            check_factor(f, tn::rope_freqs, x);
    m.rope_inv_freq = inv_freq(freq_factors);
    if (f.tensor(std::string(tn::rope_factors_long)) ||
        f.tensor(std::string(tn::rope_factors_short))) {
        if (f.tensor(std::string(tn::rope_freqs)))
            fail(Exit::bad_model, "{}: both rope_freqs and LongRoPE factors", f.path());
        const std::vector<float> lng = b.vector(std::string(tn::rope_factors_long), n_pairs);
        const std::vector<float> shrt = b.vector(std::string(tn::rope_factors_short), n_pairs);
        for (float x : lng) check_factor(f, tn::rope_factors_long, x);
        for (float x : shrt) check_factor(f, tn::rope_factors_short, x);
        m.rope_inv_freq = inv_freq(shrt);
        m.rope_inv_freq_long = inv_freq(lng);
    }
    // Sliding-window layers with a base of their own take it unscaled.
    if (hp.rope_base_swa > 0 && !hp.swa_layers.empty()) {
        const int dims_swa = hp.rope_dims_swa ? hp.rope_dims_swa : hp.rope_dims;
        m.rope_inv_freq_swa.resize(dims_swa / 2);
        for (int i = 0; i < dims_swa / 2; i++)
            m.rope_inv_freq_swa[i] = std::pow(hp.rope_base_swa, -2.0 * i / dims_swa);
    }
    m.embed_scale = arch->embed_scale ? std::sqrt(static_cast<float>(hp.n_embd)) : 1.0f;
    m.gelu_ffn = arch->gelu_ffn;
    for (const auto& t : f.tensors()) m.weight_bytes += t.nbytes;
    return m;
}

} // namespace kvrun
