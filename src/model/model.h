// Hyperparameters and weights of a decoder-only transformer, bound by name and
// expected shape from a GgufFile. Weight matrices are views into the mmapped
// file (no copy); small 1-D tensors (norms, biases) are converted to F32.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "ggml-like/tensor.h"
#include "gguf.h"

namespace kvrun {

struct Hparams {
    std::string arch;       // "llama", "qwen2"
    int n_vocab = 0;
    int n_embd = 0;         // model width
    int n_layer = 0;
    int n_head = 0, n_head_kv = 0, head_dim = 0;
    int n_ff = 0;           // FFN hidden width (the widest layer's)
    std::vector<int> n_ff_layers; // per-layer widths where the file has an array (Gemma 4 E2B)
    int64_t n_ctx_train = 0; // context the model was trained for
    float rms_eps = 1e-5f;
    double rope_base = 10000.0;
    int rope_dims = 0;      // rotated dims per head (<= head_dim)
    bool rope_neox = false; // rotate pairs (i, i + d/2) instead of (2i, 2i+1)
    double rope_linear_factor = 1.0; // rope.scaling.type = linear: positions / factor
    // LongRoPE: rope.scaling.attn_factor scales the rotated dims of Q and K;
    // the long factors apply past rope.scaling.original_context_length.
    double rope_attn_factor = 1.0;
    int64_t rope_orig_ctx = 0;
    int64_t sliding_window = 0; // attention span declared by the file (Mistral), 0 = none
    // Per-layer windows (Gemma 3): a layer with swa_layers[l] sees only the
    // last swa_window positions, the others all of them. Empty: every layer
    // alike (a uniform sliding_window is the context plan's business).
    int swa_window = 0;
    std::vector<uint8_t> swa_layers;    // [n_layer] 1 = sliding-window layer
    double rope_base_swa = 0;           // RoPE base of the sliding-window layers (0: rope_base)
    float attn_scale = 0;               // query-key scale, 0 = 1/sqrt(head_dim)
    // Gemma 4: sliding-window layers with heads of their own size (0: head_dim)
    // and rotated dims (0: rope_dims); the last n_kv_shared layers store no
    // K/V and attend with an earlier layer's (kv_source); per-layer token
    // inputs of n_embd_per_layer; logits soft-capped at final_softcap (0: not).
    int head_dim_swa = 0, rope_dims_swa = 0;
    int n_kv_shared = 0;
    int n_embd_per_layer = 0;
    float final_softcap = 0;
    // Qwen 3.5: Gated DeltaNet layers (recurrent_layers[l] = 1) keep a fixed
    // state instead of K/V: a causal conv of ssm_conv_kernel taps over the
    // q|k|v channels, and per value head a ssm_d_state x v-head-size matrix;
    // ssm_n_k_heads key heads of ssm_d_state, ssm_n_v_heads value heads
    // sharing ssm_d_inner. Full-attention layers there gate their output
    // (attn_q holds each head's query, then its gate).
    std::vector<uint8_t> recurrent_layers;
    int ssm_conv_kernel = 0, ssm_d_inner = 0, ssm_d_state = 0;
    int ssm_n_k_heads = 0, ssm_n_v_heads = 0;
    bool attn_output_gate = false;
    int n_mtp_layers = 0; // multi-token-prediction layers in the file, not run
    // Mixture of experts (qwen3moe, qwen35moe): every FFN routes each token
    // to n_expert_used of n_expert SwiGLU experts of width n_ff_exp, weighted
    // by the router's softmax over the chosen ones (renormalised to sum 1),
    // plus, where n_ff_shexp > 0, an always-on shared expert scaled by a
    // sigmoid gate. n_ff is then the widest FFN a token runs.
    int n_expert = 0, n_expert_used = 0, n_ff_exp = 0, n_ff_shexp = 0;
    bool is_moe() const { return n_expert > 0; }
    bool is_swa(int layer) const { return !swa_layers.empty() && swa_layers[layer] != 0; }
    bool is_recurrent(int l) const { return !recurrent_layers.empty() && recurrent_layers[l] != 0; }
    int ssm_conv_dim() const { return 2 * ssm_n_k_heads * ssm_d_state + ssm_d_inner; }
    int ssm_v_head_dim() const { return ssm_n_v_heads ? ssm_d_inner / ssm_n_v_heads : 0; }
    // A recurrent layer's state, in floats: the conv's last kernel-1 inputs
    // of every channel, and the value heads' matrices.
    int64_t conv_state_floats() const {
        return static_cast<int64_t>(ssm_conv_kernel - 1) * ssm_conv_dim();
    }
    int64_t ssm_state_floats() const {
        return static_cast<int64_t>(ssm_n_v_heads) * ssm_d_state * ssm_v_head_dim();
    }
    // Global layers' sizes (every layer's, but for Gemma 4's window layers).
    int q_dim() const { return n_head * head_dim; }
    int kv_dim() const { return n_head_kv * head_dim; }
    int layer_head_dim(int l) const { return is_swa(l) && head_dim_swa ? head_dim_swa : head_dim; }
    int layer_rope_dims(int l) const {
        return is_swa(l) && rope_dims_swa ? rope_dims_swa : rope_dims;
    }
    int layer_n_ff(int l) const { return n_ff_layers.empty() ? n_ff : n_ff_layers[l]; }
    int layer_q_dim(int l) const { return n_head * layer_head_dim(l); }
    int layer_kv_dim(int l) const { return n_head_kv * layer_head_dim(l); }
    int max_head_dim() const { return std::max(head_dim, head_dim_swa); }
    int kv_source(int l) const { return shared_kv_source(l, n_layer, n_kv_shared, is_swa(l)); }
    bool owns_kv(int l) const { return kv_source(l) == l && !is_recurrent(l); }

    // The layer whose K/V layer l attends with: itself, or for the last
    // n_shared layers (Gemma 4) the last layer before them of the same kind,
    // which the file format fixes by position: the one before them for a
    // global layer, the one before that for a window layer (read_hparams
    // checks those kinds).
    static int shared_kv_source(int l, int n_layer, int n_shared, bool swa) {
        const int first = n_layer - n_shared;
        return n_shared == 0 || l < first ? l : first - (swa ? 2 : 1);
    }
};

// How keys are rotated (Model::rope()): the KV cache re-rotates its sink
// copies with it.
struct Rope {
    const double* inv_freq = nullptr; // [dims / 2]
    int dims = 0;                     // rotated dims per head
    bool neox = false;                // pairs (i, i + dims/2) instead of (2i, 2i+1)
    double attn_factor = 1.0;         // rotated dims scaled by it (cos and sin times the factor)
};

struct LayerWeights {
    std::vector<float> attn_norm;            // [n_embd]
    gl::Tensor wq, wk, wv;                   // [n_embd] -> [q_dim], [kv_dim], [kv_dim]
    std::vector<float> bq, bk, bv;           // optional biases (qwen2)
    std::vector<float> q_norm, k_norm;       // optional per-head norms [head_dim] (qwen3)
    gl::Tensor wo;                           // [q_dim] -> [n_embd]
    std::vector<float> post_attn_norm;       // optional norm of the attention output [n_embd] (gemma3)
    std::vector<float> ffn_norm;             // [n_embd]
    std::vector<float> post_ffn_norm;        // optional norm of the FFN output [n_embd] (gemma3)
    gl::Tensor w_gate, w_up;                 // [n_embd] -> [n_ff]
    gl::Tensor w_down;                       // [n_ff] -> [n_embd]
    // Gemma 4: no attn_v (values are the keys), V normed without a weight;
    // the per-layer input's gate [n_embd] -> [n_embd_per_layer], projection
    // back and its norm; a scale of the layer's output.
    bool v_is_k = false;
    gl::Tensor w_inp_gate, w_inp_proj;
    std::vector<float> inp_post_norm;
    float output_scale = 1.0f;
    // Qwen 3.5's Gated DeltaNet: the q|k|v projection (ssm_conv_dim rows),
    // the output gate z (d_inner), the conv taps [conv_dim][kernel] in F32,
    // the per-value-head write strength (beta) and decay inputs (alpha), the
    // decay's time-step bias and -exp(A), the heads' output norm and the
    // projection back to the width.
    gl::Tensor w_ssm_qkv, w_ssm_z, w_ssm_beta, w_ssm_alpha, w_ssm_out;
    std::vector<float> ssm_conv, ssm_dt_bias, ssm_a, ssm_norm;
    // A mixture-of-experts FFN (w_gate/w_up/w_down then absent): the router
    // [n_embd] -> [n_expert] logits; each expert's gate, up and down (views
    // of the file's 3-D tensors, one per expert, each in its own type); the
    // shared expert and its gate [n_embd] (qwen35moe; absent elsewhere).
    gl::Tensor w_router;
    std::vector<gl::Tensor> exp_gate, exp_up, exp_down; // [n_expert]
    gl::Tensor w_shexp_gate, w_shexp_up, w_shexp_down;
    std::vector<float> shexp_gate_inp;

    // The weight matrices every token reads, in the order it uses them (the
    // routed experts are apart: a token reads only those it is sent to).
    std::vector<gl::Tensor*> matrices() {
        std::vector<gl::Tensor*> v;
        for (gl::Tensor* w : {&wq, &wk, &wv, &w_ssm_qkv, &w_ssm_z, &w_ssm_beta, &w_ssm_alpha, &wo,
                              &w_ssm_out, &w_router, &w_shexp_gate, &w_shexp_up, &w_shexp_down,
                              &w_gate, &w_up, &w_down, &w_inp_gate, &w_inp_proj})
            if (*w) v.push_back(w);
        return v;
    }
    // The routed experts' matrices: gate, up and down of expert 0, then 1, ...
    std::vector<const gl::Tensor*> expert_matrices() const {
        std::vector<const gl::Tensor*> v;
        for (size_t e = 0; e < exp_gate.size(); e++)
            for (const gl::Tensor* w : {&exp_gate[e], &exp_up[e], &exp_down[e]}) v.push_back(w);
        return v;
    }
    // What one generated token reads: matrices(), then the matrices of
    // n_used experts (the first ones: every expert of a layer has the same
    // types and sizes).
    std::vector<const gl::Tensor*> token_matrices(int n_used) const {
        std::vector<const gl::Tensor*> v = matrices();
        const std::vector<const gl::Tensor*> experts = expert_matrices();
        v.insert(v.end(), experts.begin(),
                 experts.begin() +
                     std::min<size_t>(experts.size(), 3 * static_cast<size_t>(n_used)));
        return v;
    }
    std::vector<const gl::Tensor*> matrices() const {
        const auto v = const_cast<LayerWeights*>(this)->matrices();
        return {v.begin(), v.end()};
    }
};

struct Model {
    Hparams hp;
    gl::Tensor token_embd;          // [n_vocab] rows of [n_embd]
    std::vector<float> output_norm; // [n_embd]
    gl::Tensor output;              // [n_embd] -> [n_vocab]; token_embd when tied
    std::vector<LayerWeights> layers;
    std::vector<double> rope_inv_freq; // [rope_dims / 2], with rope_freqs factors applied
    // The sliding-window layers' frequencies where their base differs
    // (Gemma 3: 10 000, unscaled); empty: the others' for every layer.
    std::vector<double> rope_inv_freq_swa;
    // LongRoPE (phi3 128k): rope_inv_freq holds the short factors, this the
    // long ones, for contexts past hp.rope_orig_ctx. Empty otherwise.
    std::vector<double> rope_inv_freq_long;
    float embed_scale = 1.0f;       // token embeddings are multiplied by it (gemma3: sqrt(n_embd))
    // Gemma 4's per-layer inputs: a token's [n_layer * n_embd_per_layer] rows,
    // the projection of the embedding to the same width, and its norm.
    gl::Tensor per_layer_token_embd, per_layer_model_proj;
    std::vector<float> per_layer_proj_norm;
    bool v_norm = false;            // V RMS-normed per head without a weight (gemma4)
    bool gelu_ffn = false;          // GELU-gated FFN instead of SwiGLU
    uint64_t weight_bytes = 0;      // bytes of all tensors in the file

    // How keys and queries are rotated in a context of n_ctx tokens: on
    // global layers (the forward pass, the cache's sink copies), or on
    // sliding-window ones.
    Rope rope(int64_t n_ctx, bool sliding = false) const {
        if (sliding && !rope_inv_freq_swa.empty())
            return Rope{rope_inv_freq_swa.data(), hp.rope_dims_swa ? hp.rope_dims_swa : hp.rope_dims,
                        hp.rope_neox};
        const bool long_factors = !rope_inv_freq_long.empty() && n_ctx > hp.rope_orig_ctx;
        return Rope{(long_factors ? rope_inv_freq_long : rope_inv_freq).data(), hp.rope_dims,
                    hp.rope_neox, hp.rope_attn_factor};
    }
    Rope layer_rope(int layer, int64_t n_ctx) const { return rope(n_ctx, hp.is_swa(layer)); }
    float attn_scale() const;

    // Throws Error(Exit::bad_model) naming what is missing, misshapen or unsupported.
    static Model load(const GgufFile& f);
};

// Hyperparameters only (no weights bound): enough to plan memory, and works
// for files whose tensor types kvrun cannot compute with yet.
Hparams read_hparams(const GgufFile& f);

// Architectures kvrun can run, for messages.
const char* supported_architectures();

} // namespace kvrun
