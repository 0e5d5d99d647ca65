// Gemma 3: RMS norms before and after both the attention and the FFN blocks,
// per-head Q/K norms, a GELU-gated FFN, token embeddings scaled by
// sqrt(width), NeoX RoPE, an output tied to the embeddings, and layers of two
// kinds: five of every six see only the last `sliding_window` positions and
// rotate with a base of 10 000; the sixth sees everything and rotates with the
// file's base and RoPE scaling. The GGUF converter has already added Gemma's
// "+1" to every norm weight, so they are used as they are.
#include <cmath>

#include "arch/family.h"
#include "error.h"
#include "gguf.h"
#include "model.h"

namespace kvrun {

// Every layer of a uniform window would be the context plan's business;
// here the window is per layer, so it moves out of sliding_window. Which
// layers slide: an explicit per-layer array where the file has one, else a
// period (one global layer every `period`, the last of each group).
void read_window_layers(const GgufFile& f, Hparams& hp, std::optional<uint64_t> default_period) {
    const std::string p = hp.arch + ".";
    const int64_t window = hp.sliding_window;
    hp.sliding_window = 0;
    if (window <= 0 || window > (int64_t{1} << 30))
        fail(Exit::bad_model,
             "{}: {}attention.sliding_window must be set ({} has sliding-window layers)",
             f.path(), p, hp.arch);
    hp.swa_window = static_cast<int>(window);
    hp.swa_layers.assign(hp.n_layer, 0);
    const std::string pattern_key = p + "attention.sliding_window_pattern";
    const GgufValue* pat = f.find(pattern_key);
    if ((pat && pat->type == GgufType::array) || !default_period) {
        const std::vector<bool> flags = f.need_flags(pattern_key, hp.n_layer);
        for (int l = 0; l < hp.n_layer; l++) hp.swa_layers[l] = flags[l];
    } else {
        const uint64_t period = pat ? f.need_u64(pattern_key) : *default_period;
        if (period > 4096)
            fail(Exit::bad_model, "{}: '{}' = {} is out of range", f.path(), pattern_key, period);
        for (int l = 0; l < hp.n_layer; l++)
            hp.swa_layers[l] = period == 0 || l % period != period - 1;
    }
}

namespace {

void read_gemma3(const GgufFile& f, Hparams& hp) {
    const std::string p = hp.arch + ".";
    // Gemma 3's published files rely on the period of 6.
    read_window_layers(f, hp, 6);
    hp.rope_base_swa = f.get_positive(p + "rope.freq_base_swa").value_or(10000.0);
    // The query scale is 1/sqrt(query_pre_attn_scalar): the head size, but
    // for the 27B model, whose scalar is width / heads (5376 / 32 = 168
    // against heads of 128). Files may state it.
    if (auto s = f.get_positive(p + "attention.scale")) {
        hp.attn_scale = static_cast<float>(*s);
    } else if (hp.n_layer == 62 && hp.n_embd == 5376 && hp.n_head == 32) {
        hp.attn_scale = 1.0f / std::sqrt(static_cast<float>(hp.n_embd / hp.n_head));
    }
}

} // namespace

extern const Family kGemma3;
const Family kGemma3{.name = "gemma3",
                     .rope_neox = true,
                     .qkv_bias = false,
                     .qk_norm = true,
                     .post_norms = true,
                     .gelu_ffn = true,
                     .embed_scale = true,
                     .read_hparams = read_gemma3};

} // namespace kvrun
