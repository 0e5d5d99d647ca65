// Qwen 3: the Qwen 2 layout without the Q/K/V biases, with an RMS norm over
// each head of Q and of K before RoPE, and a head size of its own
// (attention.key_length: the Q projection may be wider than the model).
#include "arch/family.h"

namespace kvrun {

extern const Family kQwen3;
const Family kQwen3{.name = "qwen3", .rope_neox = true, .qkv_bias = false, .qk_norm = true};

} // namespace kvrun
