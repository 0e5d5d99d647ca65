// Llama 1/2/3, Mistral, TinyLlama, SmolLM: RMS norms, SwiGLU FFN, RoPE on
// interleaved pairs (the GGUF converter permutes Q and K rows to match), no
// biases. Llama 3's RoPE scaling arrives as the rope_freqs tensor; Mistral's
// sliding window as attention.sliding_window (both read for every family).
#include "arch/family.h"

namespace kvrun {

extern const Family kLlama;
const Family kLlama{.name = "llama", .rope_neox = false, .qkv_bias = false};

} // namespace kvrun
