// Phi-3 and Phi-4-mini: the llama layout with Q, K and V fused into one
// attn_qkv matrix and the FFN's gate and up halves fused into ffn_up (both
// bound as row views, model.cpp), NeoX RoPE over rope.dimension_count dims of
// each head (Phi-4-mini rotates 3/4), and, in the 128k variants, LongRoPE:
// per-frequency divisors rope_factors_short / rope_factors_long (the long
// ones for contexts past rope.scaling.original_context_length) and
// rope.scaling.attn_factor on the rotated dims (Model::rope).
#include "arch/family.h"
#include "model.h"

namespace kvrun {

namespace {
// Some Phi-3 files declare attention.sliding_window (2047 for
// Phi-3-mini-4k); the reference engine disables Phi's sliding window and
// attends to the whole context (llama.cpp PR 13676), and so does kvrun.
void read_phi3(const GgufFile&, Hparams& hp) {
    hp.sliding_window = 0;
}
} // namespace

extern const Family kPhi3;
const Family kPhi3{.name = "phi3", .rope_neox = true, .qkv_bias = false, .read_hparams = read_phi3};

} // namespace kvrun
