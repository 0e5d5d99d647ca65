#include "cli/quant_recipe.h"

#include <strings.h>

#include <string>

#include "ggml-like/kernels.h"
#include "tensor_names.h"

namespace kvrun::cli {

namespace {

constexpr QuantRecipe kRecipes[] = {
    {"F16", gl::Type::F16, gl::Type::F16, gl::Type::F16, 1},
    {"Q8_0", gl::Type::Q8_0, gl::Type::Q8_0, gl::Type::Q8_0, 7},
    {"Q4_0", gl::Type::Q4_0, gl::Type::Q6_K, gl::Type::Q4_0, 2},
    {"Q4_K_M", gl::Type::Q4_K, gl::Type::Q6_K, gl::Type::Q6_K, 15},
    {"Q6_K", gl::Type::Q6_K, gl::Type::Q6_K, gl::Type::Q6_K, 18},
};

// Layers whose attn_v and ffn_down get more bits: the first and last eighth,
// and every third layer in between.
bool more_bits_layer(int i, int n) {
    return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

// A type whose block fits rows of n elements, for tensors the recipe's type cannot hold.
gl::Type fitting(gl::Type want, int64_t n) {
    if (gl::row_size_ok(want, n)) return want;
    const gl::Type fallback =
        want == gl::Type::Q6_K || want == gl::Type::Q8_0 ? gl::Type::Q8_0 : gl::Type::Q5_0;
    return gl::row_size_ok(fallback, n) ? fallback : gl::Type::F16;
}

} // namespace

const QuantRecipe* find_quant_recipe(std::string_view name) {
    for (const QuantRecipe& r : kRecipes)
        if (name.size() == std::string_view(r.name).size() &&
            strncasecmp(name.data(), r.name, name.size()) == 0)
            return &r;
    return nullptr;
}

const char* quant_recipe_names() {
    return "F16, Q8_0, Q4_0, Q4_K_M, Q6_K";
}

gl::Type recipe_type(const QuantRecipe& r, std::string_view name, int64_t n0, int n_layer) {
    namespace tn = tensor_names;
    const std::string s(name);
    if (tn::is_layer_tensor(s, tn::ffn_gate_inp)) return gl::Type::F32;
    const int l = tn::layer_of(s).value_or(-1);
    const bool important =
        l >= 0 &&
        (tn::is_layer_tensor(s, tn::attn_v) || tn::is_layer_tensor(s, tn::attn_qkv) ||
         tn::is_layer_tensor(s, tn::ffn_down) || tn::is_layer_tensor(s, tn::ffn_down_exps));
    const gl::Type want = name == tn::output                         ? r.output
                          : important && more_bits_layer(l, n_layer) ? r.important
                                                                     : r.base;
    return fitting(want, n0);
}

} // namespace kvrun::cli
