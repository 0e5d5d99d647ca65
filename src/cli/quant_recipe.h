// The per-tensor type choice of the quantization recipes people download
// (Q4_K_M mixes types per tensor): `kvrun quantize` re-encodes a file by
// it, `kvrun synth` writes random weights by it.
#pragma once

#include <cstdint>
#include <string_view>

#include "ggml-like/tensor.h"

namespace kvrun::cli {

struct QuantRecipe {
    const char* name;
    gl::Type base;
    gl::Type output;    // output.weight
    gl::Type important; // attn_v, a fused attn_qkv, ffn_down in the "more bits" layers
    uint32_t file_type; // general.file_type as other tools number it
};

// F16, Q8_0, Q4_0, Q4_K_M, Q6_K (case-insensitive); null for anything else.
const QuantRecipe* find_quant_recipe(std::string_view name);
// "F16, Q8_0, Q4_0, Q4_K_M, Q6_K".
const char* quant_recipe_names();

// The type a recipe gives tensor `name` of rows of n0 elements (2-D or more)
// in a file of n_layer layers. A mixture's router (ffn_gate_inp) stays F32,
// as the reference's quantizer leaves it; rows a type's block cannot hold
// fall back to one whose block fits.
gl::Type recipe_type(const QuantRecipe& r, std::string_view name, int64_t n0, int n_layer);

} // namespace kvrun::cli
