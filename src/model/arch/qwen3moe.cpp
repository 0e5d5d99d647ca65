// Qwen 3 MoE (Qwen3-30B-A3B, Qwen3-235B-A22B): Qwen 3's attention, and every
// FFN a mixture of experts without a shared one (arch/experts.cpp).
#include "arch/family.h"

namespace kvrun {

extern const Family kQwen3Moe;
const Family kQwen3Moe{
    .name = "qwen3moe", .rope_neox = true, .qkv_bias = false, .qk_norm = true, .experts = true};

} // namespace kvrun
