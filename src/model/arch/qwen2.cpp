// Qwen 2 / 2.5: the llama layout plus biases on the Q, K and V projections,
// and RoPE on halves (NeoX style: the converter leaves Q and K unpermuted).
#include "arch/family.h"

namespace kvrun {

extern const Family kQwen2;
const Family kQwen2{.name = "qwen2", .rope_neox = true, .qkv_bias = true};

} // namespace kvrun
