// Which experts each token of a batch goes to, and with what weight: the
// router's softmax over all experts, the top k taken (ties to the lower
// index), their probabilities renormalised to sum 1 (qwen3moe, qwen35moe).
// The tokens are then grouped by expert, so that each expert's weights are
// read once for all the tokens sent to it.
#pragma once

#include <cstdint>
#include <vector>

namespace kvrun {

struct ExpertRouting {
    int n_expert = 0, k = 0;
    std::vector<int32_t> ids;   // [n_tok][k] chosen experts, most probable first
    std::vector<float> weights; // [n_tok][k] their weights (sum 1 per token)
    // Grouped by expert: the tokens sent to expert e are
    // tokens[offset[e] .. offset[e + 1]), ascending, with their weights.
    std::vector<int32_t> offset; // [n_expert + 1]
    std::vector<int32_t> tokens; // [n_tok * k]
    std::vector<float> token_weights;

    // Room for batches of up to max_tok tokens (nothing allocated after).
    void reserve(int n_expert, int k, int max_tok);
    // Routes n_tok rows of n_expert router logits.
    void route(const float* logits, int n_tok);
    int count(int e) const { return offset[e + 1] - offset[e]; }
};

} // namespace kvrun
