// The forward pass: token ids at consecutive positions -> logits, reading and
// extending the KV cache. All buffers are sized once for the largest batch, so
// evaluating a token allocates nothing.
#pragma once

#include <cstdint>
#include <vector>

#include "ggml-like/backend.h"
#include "kv_cache.h"
#include "model.h"

namespace kvrun {

class Forward {
  public:
    Forward(const Model& m, KvCache& kv, gl::Backend& be, int max_batch);

    int max_batch() const { return max_batch_; }
    // Evaluate n (<= max_batch) tokens at positions kv.n_past() .. + n - 1.
    // Returns logits: n rows of n_vocab if all_logits, else the last row only.
    const float* eval(const int32_t* tokens, int n, bool all_logits);

  private:
    void layer(int l, int n, int64_t pos0);

    const Model& m_;
    KvCache& kv_;
    gl::Backend& be_;
    int max_batch_;
    // Activations, row-major per token:
    std::vector<float> x_;        // [B][n_embd] residual stream
    std::vector<float> xb_;       // [B][n_embd] normed input / attention projection out
    std::vector<float> q_;        // [B][q_dim] rotated queries
    std::vector<float> q_unrot_;  // [B][q_dim] queries before RoPE (slid-window sinks)
    std::vector<float> k_, v_;    // [B][kv_dim]
    std::vector<uint8_t> kc_, vc_; // [B] rows in the cache types
    std::vector<float> att_;      // [B][q_dim]
    std::vector<float> hb_, hb2_; // [B][n_ff]
    std::vector<float> cos_, sin_; // [B][rope_dims/2]
    std::vector<float> sink_cos_, sin_sink_; // [rope_dims/2]
    std::vector<int64_t> pos_;    // [B]
    std::vector<float> logits_;   // [B or 1][n_vocab]
};

} // namespace kvrun
