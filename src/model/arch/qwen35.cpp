// Qwen 3.5 (dense): a hybrid of Gated DeltaNet layers, which keep a fixed
// recurrent state, and gated full-attention layers (every
// full_attention_interval-th, or as attention.recurrent_layers says):
//  - a DeltaNet layer projects q|k|v, runs a causal depthwise conv over them
//    (ssm.conv_kernel taps, SiLU), L2-normalises q and k per key head, and
//    updates per value head a state matrix by the gated delta rule (decay
//    from ssm_alpha, ssm_dt.bias and ssm_a = -exp(A); write strength
//    sigmoid(ssm_beta)); its output is RMS-normed per head, gated by
//    SiLU(attn_gate x) and projected back (ssm_out);
//  - an attention layer's attn_q holds each head's query, then a gate whose
//    sigmoid scales that head's attention output; per-head Q/K norms, NeoX
//    RoPE over rope.dimension_count dims (MRoPE sections: for text every
//    section sees the same position, so a plain rotation);
//  - post_attention_norm is the norm before the FFN (SwiGLU).
// MTP layers (nextn_predict_layers) at the end of the file are not run.
#include "arch/family.h"
#include "error.h"
#include "gguf.h"
#include "model.h"

namespace kvrun {

void read_qwen35_hparams(const GgufFile& f, Hparams& hp) {
    const std::string p = hp.arch + ".";
    if (auto mtp = f.get_u64(p + "nextn_predict_layers"); mtp && *mtp > 0) {
        if (*mtp >= static_cast<uint64_t>(hp.n_layer))
            fail(Exit::bad_model, "{}: {}nextn_predict_layers = {} leaves no layer of {}",
                 f.path(), p, *mtp, hp.n_layer);
        hp.n_mtp_layers = static_cast<int>(*mtp);
        hp.n_layer -= hp.n_mtp_layers;
    }
    auto need = [&](const std::string& key, uint64_t max) {
        const uint64_t v = f.need_u64(p + key);
        if (v == 0 || v > max)
            fail(Exit::bad_model, "{}: '{}{}' = {} is out of range (1 .. {})", f.path(), p, key, v,
                 max);
        return static_cast<int>(v);
    };
    hp.ssm_conv_kernel = need("ssm.conv_kernel", 64);
    hp.ssm_d_inner = need("ssm.inner_size", 1 << 16);
    hp.ssm_d_state = need("ssm.state_size", 1024);
    hp.ssm_n_v_heads = need("ssm.time_step_rank", 1024);
    hp.ssm_n_k_heads = need("ssm.group_count", 1024);
    if (hp.ssm_conv_kernel < 2)
        fail(Exit::bad_model, "{}: {}ssm.conv_kernel must be at least 2", f.path(), p);
    if (hp.ssm_d_inner % hp.ssm_n_v_heads != 0 || hp.ssm_v_head_dim() != hp.ssm_d_state)
        fail(Exit::bad_model,
             "{}: {}ssm.inner_size {} over {} value heads must give heads of the state size {}",
             f.path(), p, hp.ssm_d_inner, hp.ssm_n_v_heads, hp.ssm_d_state);
    if (hp.ssm_n_v_heads % hp.ssm_n_k_heads != 0)
        fail(Exit::bad_model, "{}: {} value heads cannot share {} key heads", f.path(),
             hp.ssm_n_v_heads, hp.ssm_n_k_heads);

    hp.recurrent_layers.assign(hp.n_layer, 0);
    const std::string flags_key = p + "attention.recurrent_layers";
    if (f.find(flags_key)) {
        const std::vector<bool> flags = f.need_flags(flags_key, hp.n_layer + hp.n_mtp_layers);
        for (int l = 0; l < hp.n_layer; l++) hp.recurrent_layers[l] = flags[l];
    } else {
        const uint64_t every = f.get_u64(p + "full_attention_interval").value_or(4);
        if (every == 0 || every > static_cast<uint64_t>(hp.n_layer + hp.n_mtp_layers))
            fail(Exit::bad_model, "{}: {}full_attention_interval = {} is out of range", f.path(), p,
                 every);
        for (int l = 0; l < hp.n_layer; l++) hp.recurrent_layers[l] = (l + 1) % every != 0;
    }
    // MRoPE sections: for text all four see the same position; they must
    // still cover the rotated dims, or the file means something else.
    if (const GgufValue* sec = f.find(p + "rope.dimension_sections")) {
        int64_t sum = 0;
        if (sec->type != GgufType::array || sec->count == 0 || sec->count > 4)
            fail(Exit::bad_model, "{}: {}rope.dimension_sections must hold up to 4 integers",
                 f.path(), p);
        for (uint64_t i = 0; i < sec->count; i++) {
            const int64_t x = sec->array_i64(i);
            if (x < 0 || x > 4096)
                fail(Exit::bad_model, "{}: {}rope.dimension_sections holds {}", f.path(), p, x);
            sum += x;
        }
        if (2 * sum != hp.rope_dims)
            fail(Exit::bad_model,
                 "{}: {}rope.dimension_sections cover {} dims, not the {} rotated ones", f.path(),
                 p, 2 * sum, hp.rope_dims);
    }
    hp.attn_output_gate = true;
}

extern const Family kQwen35;
const Family kQwen35{.name = "qwen35",
                     .rope_neox = true,
                     .qkv_bias = false,
                     .qk_norm = true,
                     .post_norms = false,
                     .gelu_ffn = false,
                     .embed_scale = false,
                     .ffn_norm_is_post_attention = true,
                     .read_hparams = read_qwen35_hparams};

} // namespace kvrun
