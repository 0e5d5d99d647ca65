// Turns a row of logits into the next token: repetition penalty, then
// temperature, top-k, top-p, min-p, and a draw from a seeded generator
// (greedy argmax when temperature is 0). The same seed gives the same tokens.
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

namespace kvrun {

struct SamplerParams {
    float temp = 0.8f;        // 0 = greedy
    int top_k = 40;           // 0 = off
    float top_p = 0.95f;      // 1 = off
    float min_p = 0.05f;      // 0 = off
    float repeat_penalty = 1.0f; // 1 = off
    int repeat_last_n = 64;
    uint64_t seed = 0;
};

class Sampler {
  public:
    Sampler(const SamplerParams& p, int n_vocab);
    // `logits` is modified (penalties, scaling). Records the chosen token.
    int32_t sample(float* logits);
    void accept(int32_t token); // remember a token for the repetition penalty (prompt tokens too)
    void reset();

  private:
    uint64_t next_u64();
    double uniform(); // [0, 1)

    SamplerParams p_;
    int n_vocab_;
    uint64_t state_[4]; // xoshiro256** — specified exactly, so runs repeat on any platform
    std::deque<int32_t> recent_;
    std::vector<std::pair<float, int32_t>> cand_; // reused, no per-token allocation after the first
};

int32_t argmax(const float* logits, int n);

} // namespace kvrun
