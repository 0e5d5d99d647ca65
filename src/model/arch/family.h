// A model family: what one `general.architecture` value means to kvrun.
//
// Every family kvrun runs is a pre-norm decoder (embedding -> n_layer x
// [attention block, FFN block] -> norm -> output matrix) and the forward pass
// is written once for all of them (src/engine/forward.cpp). What differs between
// families is described here, as data, one small file per family
// (src/model/arch/<name>.cpp), so that adding one touches that file, the list in
// families.cpp and, only for a new kind of difference, the forward pass.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace kvrun {

class GgufFile;
struct Hparams;

struct Family {
    const char* name;       // general.architecture
    bool rope_neox = false; // RoPE rotates pairs (i, i + d/2) instead of (2i, 2i+1)
    bool qkv_bias = false;  // the Q, K and V projections carry biases
    bool qk_norm = false;   // per-head RMS norms of Q and K (attn_q_norm, attn_k_norm) before RoPE
    bool post_norms = false;  // RMS norms of the attention and FFN outputs before the residual add
    bool gelu_ffn = false;    // GELU (tanh form) gate instead of SiLU
    bool embed_scale = false; // token embeddings multiplied by sqrt(n_embd)
    // Gemma 4: attn_v may be absent (values are then the keys), values are
    // RMS-normed per head without a weight, and rope_freqs factors may be
    // huge (1e30: that frequency is switched off, "proportional" RoPE).
    bool optional_v = false;
    bool v_norm = false;
    bool rope_factors_off = false;
    // Qwen 3.5: the norm before the FFN is named post_attention_norm.
    bool ffn_norm_is_post_attention = false;
    // Every FFN a mixture of experts (arch/experts.cpp reads its keys;
    // feed_forward_length is then optional and unused).
    bool experts = false;
    // Family-specific metadata, read after the keys every family shares
    // (model.cpp); may throw Error(bad_model). Null: nothing more to read.
    void (*read_hparams)(const GgufFile& f, Hparams& hp) = nullptr;
};

// Sliding-window layers (Gemma 3 and 4, src/model/arch/gemma3.cpp): the file's
// window moves to Hparams::swa_window, and swa_layers comes from
// attention.sliding_window_pattern, per-layer flags or, where default_period
// is given, a period (or that default).
void read_window_layers(const GgufFile& f, Hparams& hp, std::optional<uint64_t> default_period);

// A mixture-of-experts family's keys (expert_count, expert_used_count,
// expert_feed_forward_length, expert_shared_feed_forward_length,
// expert_gating_func), checked; throws Error(bad_model).
void read_expert_hparams(const GgufFile& f, Hparams& hp);

// Qwen 3.5's hybrid layers (arch/qwen35.cpp), for qwen35 and qwen35moe.
void read_qwen35_hparams(const GgufFile& f, Hparams& hp);

// The family of `arch`, or null when kvrun does not run it.
const Family* find_family(std::string_view arch);
// "llama, qwen2": for messages.
const std::string& family_names();

} // namespace kvrun
