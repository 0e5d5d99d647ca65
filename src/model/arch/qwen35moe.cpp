// Qwen 3.5 / 3.6 MoE (Qwen3.5-35B-A3B): Qwen 3.5's hybrid layers
// (arch/qwen35.cpp), each followed by a mixture of experts with a shared
// expert behind a sigmoid gate (arch/experts.cpp).
#include "arch/family.h"

namespace kvrun {

extern const Family kQwen35Moe;
const Family kQwen35Moe{.name = "qwen35moe",
                        .rope_neox = true,
                        .qk_norm = true,
                        .ffn_norm_is_post_attention = true,
                        .experts = true,
                        .read_hparams = read_qwen35_hparams};

} // namespace kvrun
