// Turns a row of logits into the next token: repetition penalty, then
// temperature, top-k, top-p, min-p, and a draw from a seeded generator
// (greedy argmax when temperature is 0). The same seed gives the same tokens.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "constraint.h"

namespace kvrun {

struct SamplerParams {
    float temp = 0.8f;           // 0 = greedy
    int top_k = 40;              // 0 = off
    float top_p = 0.95f;         // 1 = off
    float min_p = 0.05f;         // 0 = off
    float repeat_penalty = 1.0f; // 1 = off
    int repeat_last_n = 64;
    // OpenAI's penalties over the tokens sample() has chosen (the answer so
    // far, not the prompt): each one's logit less presence_penalty, and
    // frequency_penalty times its count (0 = off; negative ones favour
    // repetition).
    float presence_penalty = 0.0f, frequency_penalty = 0.0f;
    // Added to a token's logit before anything else (-100 bans it, +100
    // all but forces it); ids checked against the vocabulary by the caller.
    std::vector<std::pair<int32_t, float>> logit_bias;
    uint64_t seed = 0;
    // Set: every answer is a sentence of this grammar. Tokens it does not
    // allow are out before top-k and the rest (exactly: the k best allowed
    // ones), and the answer can end only where the grammar does.
    std::shared_ptr<const OutputGrammar> grammar;
};

// The tokens a draw chooses among and their weights (each the token's
// probability before top-p and min-p cut the tail: divide by `total` for the
// distribution drawn from), most likely first. Valid until the sampler's next
// call.
struct Candidates {
    std::span<const std::pair<float, int32_t>> c;
    double total = 1;
    double prob(int32_t token) const; // 0 for a token not among them
};

class Sampler {
  public:
    Sampler(const SamplerParams& p, int n_vocab);
    const SamplerParams& params() const { return p_; }
    bool greedy() const { return p_.temp <= 0.0f; }
    // `logits` is modified (penalties, scaling). Records the chosen token.
    int32_t sample(float* logits);
    void accept(int32_t token); // remember a token for the repetition penalty (prompt tokens too)
    void reset();
    // With a grammar: the answer so far is a whole sentence of it, and
    // nothing may follow (the answer is over), or it is not (yet).
    bool grammar_done() const { return grammar_ && grammar_->done(); }
    bool grammar_incomplete() const { return grammar_ && !grammar_->complete(); }
    void restart_grammar() { // a new answer (a chat's next turn)
        if (grammar_) grammar_->reset();
    }

    // sample() in parts, for speculative decoding's acceptance test
    // (src/engine/speculative.h): the distribution it would draw from (penalties,
    // temperature, top-k, min-p, top-p; greedy: the argmax alone), a draw
    // from candidates, and the generator's next uniform number in [0, 1).
    // sample(l) is accept(draw(candidates(l))), or the argmax when greedy.
    Candidates candidates(float* logits);
    int32_t draw(const Candidates& d);
    double uniform();

    // What sample() changes (the generator and the recent tokens), to take a
    // speculative draw back.
    struct State {
        uint64_t rng[4];
        std::deque<int32_t> recent;
        std::unordered_map<int32_t, int> sampled;
    };
    State state() const;
    void restore(const State& s);

  private:
    uint64_t next_u64();
    void adjust(float* logits); // bias and penalties
    Candidates cut(size_t n);   // softmax over cand_[0, n), then min-p and top-p
    Candidates constrained(float* logits);
    // cand_ = the `want` most likely tokens the grammar allows, best first,
    // walking the logits in order; false when that would mean checking a
    // large part of the vocabulary (the caller masks it instead).
    bool best_allowed(const float* logits, size_t want);

    SamplerParams p_;
    int n_vocab_;
    uint64_t state_[4]; // xoshiro256** — specified exactly, so runs repeat on any platform
    std::deque<int32_t> recent_;
    std::unordered_map<int32_t, int> sampled_;    // sample()'s choices and their counts (penalties)
    std::vector<std::pair<float, int32_t>> cand_; // reused, no per-token allocation after the first
    std::vector<std::pair<float, int32_t>> order_; // best_allowed()'s partly sorted logits
    std::optional<GrammarConstraint> grammar_;
};

int32_t argmax(const float* logits, int n);

} // namespace kvrun
