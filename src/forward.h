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

// Which backend runs each layer and the output head (final norm + output
// matrix). Every backend takes host pointers (backend.h), so consecutive
// layers may run on different backends with no copies: the residual stream
// flows one way, layer 0 .. n_layer - 1, then the head. The token embedding
// lookup and the sinks' pre-rotation run on the host.
struct Placement {
    std::vector<gl::Backend*> layers; // [n_layer]
    gl::Backend* head = nullptr;

    // Everything on one backend.
    static Placement all(gl::Backend& be, int n_layer);
    // Layers 0 .. n_first - 1 on `first` (-ngl), the rest on `rest`; the head
    // runs on `first` only when it holds every layer.
    static Placement split(gl::Backend& first, gl::Backend& rest, int n_first, int n_layer);
    // The distinct backends, in order of first use.
    std::vector<gl::Backend*> distinct() const;
};

class Forward {
  public:
    Forward(const Model& m, KvCache& kv, gl::Backend& be, int max_batch);
    Forward(const Model& m, KvCache& kv, Placement placement, int max_batch);

    int max_batch() const { return max_batch_; }
    const Placement& placement() const { return place_; }
    // Evaluate n (<= max_batch) tokens at positions kv.n_past() .. + n - 1.
    // Returns logits: n rows of n_vocab if all_logits, else the last row only.
    const float* eval(const int32_t* tokens, int n, bool all_logits);

  private:
    void layer(int l, int n, int64_t pos0);

    const Model& m_;
    KvCache& kv_;
    Placement place_;
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
