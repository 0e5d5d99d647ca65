// A draft model for speculative decoding (src/engine/speculative.h): a smaller
// model with the target's vocabulary proposes the next tokens one at a
// time. It keeps its own cache, holding the same positions as the target's:
// each round it catches up with the tokens the target accepted and takes
// back its own rejected ones (KvCache::checkpoint/rollback), so a draft
// costs one small forward pass per token and never a re-evaluation.
#pragma once

#include <memory>
#include <string>

#include "session.h"
#include "speculative.h"

namespace kvrun {

// Throws Error(usage) when the two vocabularies differ: same size, same
// token text at every id, same special tokens.
void check_same_vocabulary(const LoadedModel& target, const LoadedModel& draft);

class ModelDrafter final : public Drafter {
  public:
    // `cfg`: the draft's cache (the target's context and keep). Greedy
    // targets get the draft's argmax; sampled ones a draw from the draft's
    // distribution under the same temperature, top-k, top-p and min-p (no
    // repetition penalty), recorded for the acceptance rule. Drafting stops
    // early when the draft's most likely token has probability below p_min.
    ModelDrafter(const LoadedModel& lm, const KvCacheConfig& cfg, Placement placement,
                 int max_batch, const SamplerParams& target_sampling, float p_min,
                 std::string name);
    std::string name() const override { return "draft model " + name_; }
    void propose(std::span<const int32_t> context, int max, Draft& out) override;
    double model_seconds() const override { return seconds_; }
    bool samples() const override { return true; }
    // A round steps max - 1 tokens past the context and checkpoints them:
    // they must fit the draft's narrowest ring.
    int max_tokens() const override;
    // Evaluate `context` now (after the prompt), so the first round does not.
    void prepare(std::span<const int32_t> context);
    void set_sampling(const SamplerParams& target_sampling) override;

  private:
    // Make the draft's cache hold context[offset_ ..] and its logits those
    // after the last token.
    void catch_up(std::span<const int32_t> context);

    Session s_;
    Sampler sampler_;
    float p_min_;
    std::string name_;
    // The draft holds context[offset_ ..]: 0 unless it had to start again
    // from a later point (a ring that could not be rewound).
    int64_t offset_ = 0;
    double seconds_ = 0;
};

} // namespace kvrun
