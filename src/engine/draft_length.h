// How many tokens a speculative round drafts (speculative.h). Verifying a
// draft is not free: each drafted token costs the target its own dot
// products and attention (only the weight reads are shared), and a draft
// model its own forward pass. So the length follows what the drafts earn:
//   - longer by 2 after a round that kept every draft, shorter by 1 after
//     one that did not (the text is more or less predictable right now);
//   - when timed (the answer does not depend on the drafting: greedy, or
//     drafts accepted only as the target's own draws), rounds are compared
//     with plain steps: tokens per second over the recent rounds against
//     one over a recent plain step. Losing rounds pause the drafting for 4
//     tokens, then 8, ... up to 64, between probes; a plain step every 64
//     rounds keeps the comparison current.
// Untimed (a draft model's sampled drafts, whose acceptance draws from the
// sampler: the length must not depend on the clock, or a seed would not
// give the same answer twice), only the first rule applies.
#pragma once

namespace kvrun {

class DraftLength {
  public:
    DraftLength(int min, int max, bool timed);
    // The drafts to ask for now, at most `limit`; 0: a plain step instead.
    int next(int limit);
    // A round that drafted `drafted` tokens, kept `accepted` and took
    // `seconds` (drafting, verifying, sampling).
    void after_round(int drafted, int accepted, double seconds);
    // Drafting that proposed too little (`seconds` spent, a plain step
    // follows): a round that gained nothing and cost the drafting.
    void after_empty_draft(double seconds);
    // A plain step (one token) that took `seconds`.
    void after_plain_step(double seconds);
    int length() const { return length_; }
    bool paused() const { return pause_left_ > 0; }

  private:
    // A round (or an empty draft and its plain step) gave `tokens` in `seconds`.
    void judge(int tokens, double seconds);

    int min_, max_;
    bool timed_;
    int length_;
    double step_s_ = -1;                    // a plain step, recent average (-1: none yet)
    double round_tokens_ = 0, round_s_ = 0; // recent rounds: tokens out and seconds, averaged
    int rounds_since_step_ = 0;
    int pause_left_ = 0, pause_ = 4;
};

} // namespace kvrun
