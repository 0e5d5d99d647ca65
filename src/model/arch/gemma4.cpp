// Gemma 4 (dense): Gemma 3's layer (norms before and after attention and
// FFN, per-head Q/K norms, GELU-gated FFN, sqrt(width) embedding scale, NeoX
// RoPE, window and global layers), and:
//  - window layers have heads of their own size (key_length_swa) and rotate
//    key_length_swa dims with base 10 000; global layers rotate with the
//    file's base and the rope_freqs factors (1e30 switches a frequency off);
//  - the last shared_kv_layers layers compute no K/V and attend with an
//    earlier layer's (Hparams::kv_source);
//  - a layer without attn_v uses its keys as values; values are RMS-normed
//    without a weight;
//  - per-layer token inputs: each layer adds a small gated projection of a
//    per-layer embedding row, then scales its output (layer_output_scale);
//  - attention scale 1 (the Q/K norms set the scale), logits soft-capped.
// The converter does not add 1 to the norm weights (unlike Gemma 3's).
#include "arch/family.h"
#include "error.h"
#include "gguf.h"
#include "model.h"

namespace kvrun {

namespace {

void read_gemma4(const GgufFile& f, Hparams& hp) {
    const std::string p = hp.arch + ".";
    if (auto experts = f.get_u64(p + "expert_count"); experts && *experts > 0)
        fail(Exit::bad_model,
             "{}: Gemma 4 with a mixture of experts ({} experts) is not supported yet; the dense "
             "Gemma 4 models are",
             f.path(), *experts);
    read_window_layers(f, hp, std::nullopt); // the per-layer flags are required

    auto dim = [&](const std::string& key, uint64_t def) -> int {
        const uint64_t v = f.get_u64(p + key).value_or(def);
        if (v == 0 || v > 4096 || v % 2 != 0)
            fail(Exit::bad_model, "{}: '{}{}' = {} is out of range (even, 2 .. 4096)", f.path(), p,
                 key, v);
        return static_cast<int>(v);
    };
    if (!f.get_u64(p + "attention.key_length_swa"))
        fail(Exit::bad_model, "{}: missing '{}attention.key_length_swa'", f.path(), p);
    hp.head_dim_swa = dim("attention.key_length_swa", 0);
    if (dim("attention.value_length_swa", hp.head_dim_swa) != hp.head_dim_swa)
        fail(Exit::bad_model, "{}: window layers' key and value lengths differ", f.path());
    hp.rope_dims_swa = dim("rope.dimension_count_swa", hp.head_dim_swa);
    if (hp.rope_dims_swa > hp.head_dim_swa)
        fail(Exit::bad_model, "{}: {}rope.dimension_count_swa {} exceeds the window heads' {}",
             f.path(), p, hp.rope_dims_swa, hp.head_dim_swa);
    hp.rope_base_swa = f.get_positive(p + "rope.freq_base_swa").value_or(10000.0);
    hp.attn_scale = 1.0f;

    const uint64_t shared = f.get_u64(p + "attention.shared_kv_layers").value_or(0);
    if (shared > 0) {
        // The sources sit right before the shared layers: the last one for
        // global layers, the one before it for window layers.
        if (shared + 2 > static_cast<uint64_t>(hp.n_layer))
            fail(Exit::bad_model, "{}: {}attention.shared_kv_layers = {} leaves fewer than 2 of {} "
                 "layers with K/V of their own", f.path(), p, shared, hp.n_layer);
        hp.n_kv_shared = static_cast<int>(shared);
        for (int l = hp.n_layer - hp.n_kv_shared; l < hp.n_layer; l++) {
            const int src = hp.kv_source(l);
            if (hp.is_swa(src) != hp.is_swa(l))
                fail(Exit::bad_model,
                     "{}: layer {} shares the K/V of layer {}, a layer of the other kind "
                     "(window / global)", f.path(), l, src);
        }
    }
    hp.n_embd_per_layer = dim("embedding_length_per_layer_input", 0);
    const double cap = f.get_f64(p + "final_logit_softcapping").value_or(30.0);
    if (!(cap >= 0) || cap > 1e6)
        fail(Exit::bad_model, "{}: {}final_logit_softcapping = {} is out of range", f.path(), p,
             cap);
    hp.final_softcap = static_cast<float>(cap);
}

} // namespace

extern const Family kGemma4;
const Family kGemma4{.name = "gemma4",
                     .rope_neox = true,
                     .qkv_bias = false,
                     .qk_norm = true,
                     .post_norms = true,
                     .gelu_ffn = true,
                     .embed_scale = true,
                     .optional_v = true,
                     .v_norm = true,
                     .rope_factors_off = true,
                     .read_hparams = read_gemma4};

} // namespace kvrun
