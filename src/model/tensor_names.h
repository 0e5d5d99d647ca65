// GGUF tensor names, spelled once. They are facts of the file format: the
// model binder, the quantizer's recipes, the memory plan and synth all ask
// here rather than spelling them again.
#pragma once

#include <cstdio>
#include <optional>
#include <string>
#include <string_view>

namespace kvrun::tensor_names {

// Whole-model tensors.
inline constexpr std::string_view token_embd = "token_embd.weight";
inline constexpr std::string_view output_norm = "output_norm.weight";
inline constexpr std::string_view output = "output.weight"; // absent when tied to token_embd
inline constexpr std::string_view rope_freqs = "rope_freqs.weight";
// LongRoPE (phi3 128k): frequency divisors for long and short contexts.
inline constexpr std::string_view rope_factors_long = "rope_factors_long.weight";
inline constexpr std::string_view rope_factors_short = "rope_factors_short.weight";
// Gemma 4's per-layer token inputs.
inline constexpr std::string_view per_layer_token_embd = "per_layer_token_embd.weight";
inline constexpr std::string_view per_layer_model_proj = "per_layer_model_proj.weight";
inline constexpr std::string_view per_layer_proj_norm = "per_layer_proj_norm.weight";

// Per-layer tensors: blk(l, attn_q) = "blk.<l>.attn_q.weight".
inline constexpr std::string_view attn_norm = "attn_norm.weight";
inline constexpr std::string_view attn_q = "attn_q.weight";
inline constexpr std::string_view attn_k = "attn_k.weight";
inline constexpr std::string_view attn_v = "attn_v.weight";
// Fused Q, K, V (phi3): Q rows, then K, then V. A phi3 ffn_up without
// ffn_gate holds the gate rows, then the up rows.
inline constexpr std::string_view attn_qkv = "attn_qkv.weight";
inline constexpr std::string_view attn_q_bias = "attn_q.bias";
inline constexpr std::string_view attn_k_bias = "attn_k.bias";
inline constexpr std::string_view attn_v_bias = "attn_v.bias";
inline constexpr std::string_view attn_output = "attn_output.weight";
inline constexpr std::string_view attn_q_norm = "attn_q_norm.weight"; // [head_dim], per head
inline constexpr std::string_view attn_k_norm = "attn_k_norm.weight";
inline constexpr std::string_view post_attention_norm = "post_attention_norm.weight"; // gemma3
inline constexpr std::string_view ffn_norm = "ffn_norm.weight";
inline constexpr std::string_view post_ffw_norm = "post_ffw_norm.weight"; // gemma3
inline constexpr std::string_view ffn_gate = "ffn_gate.weight";
inline constexpr std::string_view ffn_up = "ffn_up.weight";
inline constexpr std::string_view ffn_down = "ffn_down.weight";
// Gemma 4: the per-layer input's gate and projection, its norm, and the
// layer's output scale ([1]).
inline constexpr std::string_view inp_gate = "inp_gate.weight";
inline constexpr std::string_view inp_proj = "proj.weight";
inline constexpr std::string_view inp_post_norm = "post_norm.weight";
inline constexpr std::string_view layer_output_scale = "layer_output_scale.weight";
// Qwen 3.5's Gated DeltaNet layers (attn_qkv holds q|k|v there).
inline constexpr std::string_view attn_gate = "attn_gate.weight";
inline constexpr std::string_view ssm_conv1d = "ssm_conv1d.weight";
inline constexpr std::string_view ssm_dt_bias = "ssm_dt.bias";
inline constexpr std::string_view ssm_a = "ssm_a";
inline constexpr std::string_view ssm_beta = "ssm_beta.weight";
inline constexpr std::string_view ssm_alpha = "ssm_alpha.weight";
inline constexpr std::string_view ssm_norm = "ssm_norm.weight";
inline constexpr std::string_view ssm_out = "ssm_out.weight";
// Mixture-of-experts FFNs (qwen3moe, qwen35moe): the router, the experts as
// 3-D tensors (expert e is slice e of the last dimension; a merged gate_up
// holds each expert's gate rows, then its up rows) and the shared expert with
// its per-token gate (a 1-D weight: one scalar per token).
inline constexpr std::string_view ffn_gate_inp = "ffn_gate_inp.weight";
inline constexpr std::string_view ffn_gate_exps = "ffn_gate_exps.weight";
inline constexpr std::string_view ffn_up_exps = "ffn_up_exps.weight";
inline constexpr std::string_view ffn_gate_up_exps = "ffn_gate_up_exps.weight";
inline constexpr std::string_view ffn_down_exps = "ffn_down_exps.weight";
inline constexpr std::string_view ffn_gate_inp_shexp = "ffn_gate_inp_shexp.weight";
inline constexpr std::string_view ffn_gate_shexp = "ffn_gate_shexp.weight";
inline constexpr std::string_view ffn_up_shexp = "ffn_up_shexp.weight";
inline constexpr std::string_view ffn_down_shexp = "ffn_down_shexp.weight";

// A mixture's experts, "blk.N.ffn_{gate,up,down,gate_up}_exps.weight" (3-D:
// expert e is slice e of the last dimension).
inline bool is_experts(std::string_view name) {
    constexpr std::string_view kSuffix = "_exps.weight";
    return name.rfind("blk.", 0) == 0 && name.size() > kSuffix.size() &&
           name.substr(name.size() - kSuffix.size()) == kSuffix;
}

inline std::string blk(int layer, std::string_view suffix) {
    return "blk." + std::to_string(layer) + "." + std::string(suffix);
}

// The layer a per-layer tensor belongs to ("blk.12.ffn_up.weight" -> 12).
inline std::optional<int> layer_of(const std::string& name) {
    int layer = -1;
    if (std::sscanf(name.c_str(), "blk.%d.", &layer) == 1 && layer >= 0) return layer;
    return std::nullopt;
}

// Whether `name` is the per-layer tensor `suffix` of some layer.
inline bool is_layer_tensor(std::string_view name, std::string_view suffix) {
    return name.rfind("blk.", 0) == 0 && name.size() > suffix.size() &&
           name.substr(name.size() - suffix.size()) == suffix && name[name.size() - suffix.size() - 1] == '.';
}

} // namespace kvrun::tensor_names
