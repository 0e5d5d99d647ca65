// Speculative decoding: a drafter proposes the next few tokens, the target
// model evaluates them in one batch (Session::verify, one read of its
// weights for all of them), and an acceptance rule keeps the longest prefix
// the target itself would have produced, plus one token of its own. Where
// plain generation reads the whole model once per token, a round reads it
// once per accepted run.
//
// Exact by construction:
//   - the verification rows are bit for bit those plain decoding computes
//     (Forward::eval_verify), and each row is sampled with the target's own
//     sampler in order, so a greedy answer is byte-identical to plain
//     decoding's, and so is a sampled one with prompt lookup drafts (a draft
//     is accepted exactly when it equals the token the target draws);
//   - a draft model's sampled drafts go through the rejection rule that
//     keeps the target's distribution: draft d drawn from q is accepted with
//     probability min(1, p(d) / q(d)), else a token is drawn from the
//     normalised max(0, p - q) and the round ends;
//   - rejected tokens leave both rings as they were (KvCache::checkpoint and
//     rollback), across the wrap and with the sinks pinned.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "draft_length.h"
#include "ngram_lookup.h"
#include "sampler.h"

namespace kvrun {

class Session;

// What a drafter proposes: tokens, and for sampled draft-model drafts the
// distribution each was drawn from ((probability, token) pairs). Without
// them a draft is accepted exactly when the target draws the same token.
struct Draft {
    std::vector<int32_t> tokens;
    std::vector<std::vector<std::pair<float, int32_t>>> q;
};

class Drafter {
  public:
    virtual ~Drafter() = default;
    virtual std::string name() const = 0; // "lookup", "draft model NAME"
    // Up to `max` tokens to follow `context` (every token the target has
    // evaluated and, last, the one it evaluates next).
    virtual void propose(std::span<const int32_t> context, int max, Draft& out) = 0;
    // Seconds this drafter spent evaluating a model (0 for lookup).
    virtual double model_seconds() const { return 0; }
    // Whether a sampled target gets drafts drawn from a distribution (Draft::q),
    // checked by the rejection rule; otherwise a draft is accepted exactly
    // when the target draws it.
    virtual bool samples() const { return false; }
    // The most tokens one round may draft: a draft model's sliding-window
    // rings can take back (checkpoint) no more steps than they hold.
    virtual int max_tokens() const { return 1 << 30; }
    // The target's sampling changed (the chat REPL's /set parameter): a
    // drafter that samples follows it.
    virtual void set_sampling(const SamplerParams&) {}
};

class LookupDrafter final : public Drafter {
  public:
    explicit LookupDrafter(NgramLookup lookup) : lookup_(lookup) {}
    std::string name() const override { return "lookup"; }
    void propose(std::span<const int32_t> context, int max, Draft& out) override;

  private:
    NgramLookup lookup_;
};

struct SpeculativeParams {
    int draft_max = 8; // tokens per round at most (<= Forward::kMaxVerify - 1)
    int draft_min = 1; // fewer drafted than this: a plain step instead
    // Weigh rounds against plain steps by the clock where the answer allows
    // (draft_length.h); tests turn it off to draft every round.
    bool timed = true;
};

struct SpeculativeStats {
    int64_t rounds = 0;   // verification batches
    int64_t drafted = 0;  // draft tokens verified
    int64_t accepted = 0; // of those, the ones kept
    double draft_s = 0;   // time the draft model took
    double acceptance() const { return drafted > 0 ? static_cast<double>(accepted) / drafted : 0; }
};

// A token a round produced, waiting for Session::generate to take it.
struct SpeculatedToken {
    int32_t token = 0;
    int64_t pos = 0;              // its position (the tokens before it)
    bool evaluated = false;       // in the target's cache already (an accepted draft)
    float* logits = nullptr;      // the row it was sampled from (the logits after pos - 1)
    Sampler::State sampler_state; // the sampler before this token was drawn
};

class Speculator {
  public:
    Speculator(std::unique_ptr<Drafter> drafter, const SpeculativeParams& p);
    const Drafter& drafter() const { return *drafter_; }
    const SpeculativeStats& stats() const { return stats_; }
    void reset_stats() { stats_ = {}; }

    // One round after `pending`, a token the target sampled and has not
    // evaluated: draft up to min(the adaptive length, limit) tokens, verify
    // pending and the drafts in one batch, keep the accepted ones in the
    // cache and append them to `out`, then the token the target drew after
    // them (not evaluated). False (nothing done) when fewer than draft_min
    // tokens were drafted: the caller evaluates `pending` as usual.
    bool round(Session& target, Sampler& sampler, int32_t pending, int limit,
               std::vector<SpeculatedToken>& out);
    // The caller evaluated a token without a round (round() said no): how
    // long it took, for the draft length's comparison (draft_length.h).
    void plain_step_took(double seconds);
    // The target's sampling changed: the drafter follows, and the draft
    // length starts again (greedy and sampled targets time rounds differently).
    void set_sampling(const SamplerParams& p);

  private:
    std::unique_ptr<Drafter> drafter_;
    SpeculativeParams p_;
    SpeculativeStats stats_;
    std::unique_ptr<DraftLength> length_; // made at the first round, when the sampler is known
    Draft draft_;
    std::vector<int32_t> context_, batch_;
    std::vector<std::pair<float, int32_t>> residual_;
};

// The acceptance rule for one draft token d drawn from q against the
// target's candidates p: accept with probability min(1, p(d) / q(d)) (one
// uniform from the sampler). On rejection returns a token drawn from the
// normalised max(0, p - q) instead (`residual` is scratch). Returns d when
// accepted. Records the returned token in the sampler (Sampler::accept).
int32_t accept_or_resample(Sampler& sampler, const Candidates& p,
                           std::span<const std::pair<float, int32_t>> q, int32_t d,
                           std::vector<std::pair<float, int32_t>>& residual);

} // namespace kvrun
