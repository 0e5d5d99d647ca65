// The forward pass: token ids at consecutive positions -> logits, reading and
// extending the KV cache. All buffers are sized once for the largest batch, so
// evaluating a token allocates nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "expert_routing.h"
#include "ggml-like/backend.h"
#include "kv_cache.h"
#include "model.h"
#include "op_profile.h"

namespace kvrun {

// Which backend runs each layer and the output head (final norm + output
// matrix). Every backend takes host pointers (backend.h); a device backend
// may keep the activation buffers on its device between ops (Backend::track),
// so where the residual stream passes from one backend to the next, Forward
// has the first download it (host_read) and tells the next (host_wrote). The
// token embedding lookup, the RoPE angles and the sinks' pre-rotation run on
// the host.
struct Placement {
    std::vector<gl::Backend*> layers; // [n_layer]
    // [n_layer] The backend that runs a mixture-of-experts layer's routed
    // experts: the layer's own, unless experts_on() keeps them on the host.
    // The router and the shared expert run on the layer's backend.
    std::vector<gl::Backend*> experts;
    gl::Backend* head = nullptr;

    // Everything on one backend.
    static Placement all(gl::Backend& be, int n_layer);
    // Layers 0 .. n_first - 1 on `first` (-ngl), the rest on `rest`; the head
    // runs on `first` only when it holds every layer.
    static Placement split(gl::Backend& first, gl::Backend& rest, int n_first, int n_layer);
    // The routed experts of layers 0 .. n - 1 on `host` (--n-cpu-moe N,
    // --cpu-moe): their weights stay in host memory, and a layer's
    // activations cross to the host and back around them.
    Placement& experts_on(gl::Backend& host, int n);
    // The distinct backends, in order of first use.
    std::vector<gl::Backend*> distinct() const;
};

class Forward {
  public:
    Forward(const Model& m, KvCache& kv, gl::Backend& be, int max_batch);
    Forward(const Model& m, KvCache& kv, Placement placement, int max_batch);
    ~Forward();
    Forward(const Forward&) = delete;
    Forward& operator=(const Forward&) = delete;

    int max_batch() const { return max_batch_; }
    const Placement& placement() const { return place_; }
    // Evaluate n (<= max_batch) tokens at positions kv.n_past() .. + n - 1.
    // Returns logits: n rows of n_vocab if all_logits, else the last row only.
    const float* eval(const int32_t* tokens, int n, bool all_logits);
    // The same with the logits of rows first .. n - 1 only (first < n): the
    // output matrix, a large part of a batch's work where the vocabulary is
    // large, skips the rows no one reads (perplexity scores a chunk's second
    // half).
    const float* eval_rows(const int32_t* tokens, int n, int first);
    // One generated (sampled) token: as eval(&token, 1, false), but its
    // attention may take the faster half-precision products
    // (gl::AttentionArgs::half_ok), which prompt tokens never do.
    const float* eval_generated(int32_t token);
    // Speculative verification: n (<= kMaxVerify) generated or drafted
    // tokens, all rows of logits. Each row is bit for bit the row n
    // successive eval_generated calls would give, so that verifying a draft
    // never changes a greedy answer: the matrices give each token its
    // one-token bits (Backend::set_rows_exact for the pass) and, on a backend
    // that attends the host ring (Backend::reads_host_kv), each token attends
    // on its own, after the one before it is written. Elsewhere (CUDA) the
    // batch attends at once: the same tokens within the precision of the
    // batched kernels.
    const float* eval_verify(const int32_t* tokens, int n);
    static constexpr int kMaxVerify = 15;
    // Prompt tokens on another cache than the one this Forward was made with
    // (kvrun batch: one Forward, a cache per sequence), set up by adopt().
    const float* eval(KvCache& kv, const int32_t* tokens, int n, bool all_logits);
    // A cache for eval(kv, ...) and eval_generated(seqs): this Forward's
    // config (types, rotations, n_ctx), laid out as its backends read it.
    void adopt(KvCache& kv) const;
    // Several sequences in one pass (kvrun batch): one generated token each,
    // at its own cache's n_past(), every row's logits in order. The
    // matrices read their weights once for all rows and give each row its
    // one-token bits (rows exact, as eval_verify: packed weights' GEMM, else
    // the one-token dot products), and each sequence attends its own cache,
    // so a row's logits are bit for bit those eval_generated gives the
    // sequence alone, whatever else is in the pass. At most max_batch
    // sequences; their caches distinct.
    struct SeqToken {
        KvCache* kv;
        int32_t token;
    };
    const float* eval_generated(std::span<const SeqToken> seqs);
    // Taking back tokens through recurrent layers (Qwen 3.5): a state cannot
    // be rewound, so while a KV checkpoint is open each recurrent layer logs
    // the inputs of its recurrence (the q|k|v rows before the conv, the write
    // strengths and decays) for the positions after it; once
    // KvCache::rollback has put the states back to the checkpoint,
    // replay_recurrent(k) steps them through its first k positions again:
    // the conv and the delta rule, not the projections. The same per-token
    // arithmetic as the pass that logged them, so the states are bit for bit
    // those of a cache that evaluated only the kept tokens.
    void replay_recurrent(int k);
    // Time every op of the following evals into `p` (null: stop). Only
    // meaningful where every backend is the CPU one (see op_profile.h).
    void set_profile(OpProfile* p) { profile_ = p; }

  private:
    // What a batch is: prompt tokens, one generated token (its attention may
    // take the half-precision products), or a verification batch.
    enum class Pass { prompt, generated, verify };
    // Logits of rows first .. n - 1.
    const float* run(const int32_t* tokens, int n, int first, Pass pass);
    // run() over segs_ (set by the caller).
    const float* run_segments(const int32_t* tokens, int n, int first, Pass pass);
    // Embedding, layers and head of one batch (no commit): may run twice
    // when a backend lost a recorded step (Backend::end_step).
    void step(const int32_t* tokens, int n, int first, Pass pass);
    void layer(int l, int n, Pass pass);
    void attention_block(int l, int n, Pass pass);
    // Pass::verify on a host-ring backend: token by token, each as
    // eval_generated attends it, the slots it writes staged in view of the next.
    void attend_each(KvCache& kv, gl::AttentionArgs a, int l, int n, int64_t pos0, bool any_slid);
    void ffn_block(int l, int n);
    // A mixture-of-experts FFN (forward_experts.cpp): route each token, run
    // each chosen expert once over the tokens sent to it, add the weighted
    // outputs (and the gated shared expert) to the residual stream.
    void experts_block(int l, int n);
    // be runs the layer (and its shared expert), eb its routed experts.
    void experts_one_token(gl::Backend& be, gl::Backend& eb, const LayerWeights& L);
    void experts_batch(gl::Backend& be, gl::Backend& eb, const LayerWeights& L, int n);
    // One expert's SwiGLU over `rows` rows of an n_batch-token batch, into
    // `out` (host memory once it returns).
    void swiglu(gl::Backend& be, const gl::Tensor& gate, const gl::Tensor& up,
                const gl::Tensor& down, const float* x, int rows, int n_batch, int width,
                float* out);
    // Backend `eb` wrote these host bytes of the FFN buffers: every other
    // backend's device twins are older now (routed experts on the host).
    void experts_wrote(gl::Backend& be, gl::Backend& eb, size_t hidden_floats, size_t out_floats);
    // Gemma 4: every layer's per-layer input rows of the batch (pli_), once
    // per step; and one layer's use of them, x_ += norm(proj(gelu(gate x_) * pli)).
    void per_layer_inputs(gl::Backend& be, const int32_t* tokens, int n);
    void per_layer_input_block(int l, int n);
    // Qwen 3.5's Gated DeltaNet layer: x_ += out(norm(delta rule(conv(qkv))) * silu(z)),
    // carrying the layer's state in the cache (KvCache::conv_state, ssm_state).
    void recurrent_block(int l, int n);
    // be's op, timed into profile_ (when set) as `op`, with w's bytes.
    void matmul(gl::Backend& be, Op op, const gl::Tensor& w, const float* x, int n, float* y);
    // The same for n of a batch's n_batch tokens (Backend::matmul_part).
    void matmul_part(gl::Backend& be, Op op, const gl::Tensor& w, const float* x, int n,
                     int n_batch, float* y);
    // out = rmsnorm(x) * w for `rows` rows of n_embd; x_ += xb_ for n rows
    // (timed as norms, other).
    void rmsnorm(gl::Backend& be, const float* x, const std::vector<float>& w, int rows,
                 float* out);
    // x_ += xb_ for n rows, through `post` first when it is not empty (the
    // block's output norm, gemma3).
    void add_residual(gl::Backend& be, int n, const std::vector<float>& post);
    // The same add left for the next block's norm (a layer's attention or
    // recurrent block, before its FFN): norm_residual then adds and norms in
    // one Backend::add_rmsnorm. Without a pending add it is rmsnorm(x_).
    void defer_residual(gl::Backend& be, int n, const std::vector<float>& post);
    void norm_residual(gl::Backend& be, const std::vector<float>& w, int n, float* out);
    // The residual stream x_ (n rows) moves from backend `from` to `to`.
    void cross(gl::Backend* from, gl::Backend* to, int n);
    // The activation buffers, registered with every backend (Backend::track).
    std::vector<std::pair<void*, size_t>> buffers();
    void track_all();
    void untrack_all();
    // Tell every backend the host wrote [p, p + bytes).
    void wrote(const void* p, size_t bytes);

    const Model& m_;
    // The cache this Forward was made with (its config is every cache's);
    // a pass reads and writes each segment's own (Segment::kv).
    KvCache* home_;
    // A pass's sequences: rows row0 .. row0 + n - 1 of the batch are
    // positions pos0 .. of kv's sequence. One for every single-sequence pass.
    struct Segment {
        KvCache* kv;
        int row0, n;
        int64_t pos0;
    };
    std::vector<Segment> segs_;
    std::vector<int32_t> seq_tokens_;
    struct RowsExact;
    Placement place_;
    std::vector<gl::Backend*> backends_; // place_.distinct()
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
    std::vector<float> cos_swa_, sin_swa_; // the same for sliding-window layers with their own base
    std::vector<int64_t> pos_;    // [B]
    std::vector<float> logits_;   // [B or 1][n_vocab]
    std::vector<int64_t> staged_pos_; // attend_each: a ring's slot positions with the batch's written ones
    // Gemma 4's per-layer inputs: [n_layer][B][P] rows, the projection's
    // [B][n_layer * P] (twice: before and after its norm), a gate's [B][P].
    std::vector<float> pli_, pl_proj_, pl_normed_, pl_gate_;
    std::vector<float> ones_; // [max head size]: the weight of a weightless norm (V)
    // Qwen 3.5: gated attention's [B][2 q_dim] projection and [B][q_dim]
    // gates; the DeltaNet layers' q|k|v rows before and after the conv
    // [B][conv_dim], z and the heads' outputs [B][d_inner], beta and decay [B][n_v].
    std::vector<float> qg_, gate_;
    std::vector<float> ssm_qkv_, ssm_conv_, ssm_z_, ssm_o_, ssm_o2_, ssm_beta_, ssm_g_;
    // replay_recurrent's log, per recurrent layer: [checkpointed positions]
    // rows of q|k|v, beta, decay (grown to the largest checkpoint once).
    struct RecurrentLog {
        std::vector<float> qkv, beta, g;
    };
    std::vector<RecurrentLog> recurrent_log_; // [n_layer]
    void log_recurrent_inputs(int l, int64_t at, int n, size_t row0); // the batch's rows row0...
    // Layers that read another layer's slots (Gemma 4's shared KV) see them as
    // the source saw them: the source keeps the batch's K/V rows and what its
    // write overwrote, and puts the overwritten rows back for each reader but
    // the last (which leaves the batch written, as the source would have).
    struct SharedKv {
        int source = -1, last_reader = -1;
        std::vector<uint8_t> k_new, v_new;     // [B] the batch's rows in the cache types
        std::vector<std::vector<uint8_t>> overwritten; // per segment: KvCache::save_slots
    };
    std::vector<SharedKv> shared_kv_;
    // Mixture of experts: the router's [B][n_expert] logits, the routing, one
    // expert's gathered input rows and output rows [B][n_embd], and the
    // block's output [B][n_embd] as it is summed.
    std::vector<float> router_, expert_in_, expert_out_, experts_sum_;
    ExpertRouting routing_;
    // experts_one_token's: the routed experts, their weights, the products.
    std::vector<int> picked_;
    std::vector<float> picked_weight_;
    std::vector<gl::MatvecJob> group_jobs_;
    SharedKv* shared_of(int source);
    OpProfile* profile_ = nullptr;
    const float* residual_pending_ = nullptr; // defer_residual's rows (xb_ or hb2_)
};

} // namespace kvrun
