#include "draft_model.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "error.h"

namespace kvrun {

void check_same_vocabulary(const LoadedModel& target, const LoadedModel& draft) {
    const Vocab& a = target.tokenizer.vocab();
    const Vocab& b = draft.tokenizer.vocab();
    if (target.model.hp.n_vocab != draft.model.hp.n_vocab || a.tokens.size() != b.tokens.size())
        fail(Exit::usage,
             "the draft model's vocabulary has {} tokens, the model's {}: a draft must share the "
             "model's vocabulary",
             draft.model.hp.n_vocab, target.model.hp.n_vocab);
    for (size_t i = 0; i < a.tokens.size(); i++)
        if (a.tokens[i] != b.tokens[i])
            fail(Exit::usage,
                 "the draft model's token {} is {:?}, the model's {:?}: a draft must share the "
                 "model's vocabulary",
                 i, b.tokens[i], a.tokens[i]);
    if (a.bos != b.bos || a.eos != b.eos || a.eot != b.eot)
        fail(Exit::usage,
             "the draft model's special tokens (bos {}, eos {}) differ from the model's (bos {}, "
             "eos {})",
             b.bos, b.eos, a.bos, a.eos);
}

namespace {
SamplerParams draft_sampling(SamplerParams p) {
    p.repeat_penalty = 1.0f; // q needs no history; any q keeps the target's distribution
    p.seed ^= 0x6472616674ull;
    return p;
}

// The softmax probability of the most likely token.
float top_probability(const float* logits, int n) {
    const float mx = *std::max_element(logits, logits + n);
    double sum = 0;
    for (int i = 0; i < n; i++) sum += std::exp(static_cast<double>(logits[i] - mx));
    return static_cast<float>(1.0 / sum);
}
} // namespace

ModelDrafter::ModelDrafter(const LoadedModel& lm, const KvCacheConfig& cfg, Placement placement,
                           int max_batch, const SamplerParams& target_sampling, float p_min,
                           std::string name)
    : s_(lm, cfg, std::move(placement), max_batch),
      sampler_(draft_sampling(target_sampling), lm.model.hp.n_vocab), p_min_(p_min),
      name_(std::move(name)) {}

void ModelDrafter::set_sampling(const SamplerParams& target_sampling) {
    sampler_ = Sampler(draft_sampling(target_sampling), s_.model().model.hp.n_vocab);
}

void ModelDrafter::prepare(std::span<const int32_t> context) {
    const auto t0 = std::chrono::steady_clock::now();
    catch_up(context);
    seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void ModelDrafter::catch_up(std::span<const int32_t> context) {
    std::span<const int32_t> want = context.subspan(std::min<size_t>(offset_, context.size()));
    const std::vector<int32_t>& held = s_.tokens();
    size_t m = common_prefix(held, want);
    if (m == want.size() && m > 0) m--; // evaluate the last token again: its logits start the draft
    if (m < held.size()) {
        // The draft's own rejected tokens come back through the checkpoint;
        // anything else (a chat turn evicted, a history edited) by truncation.
        const int64_t keep = static_cast<int64_t>(m);
        if (s_.can_take_back(keep)) {
            s_.take_back(keep, nullptr);
        } else if (!s_.rewind(keep)) {
            // The ring overwrote what it would need: start again from the
            // last half window of the context.
            s_.clear();
            const size_t tail =
                std::min<size_t>(context.size(), static_cast<size_t>(s_.n_ctx() / 2));
            offset_ = static_cast<int64_t>(context.size() - tail);
            want = context.subspan(static_cast<size_t>(offset_));
            m = 0;
        }
    }
    s_.eval(want.subspan(m));
}

int ModelDrafter::max_tokens() const {
    return static_cast<int>(std::min<int64_t>(s_.cache().min_window() + 1, Forward::kMaxVerify));
}

void ModelDrafter::propose(std::span<const int32_t> context, int max, Draft& out) {
    const auto t0 = std::chrono::steady_clock::now();
    out.tokens.clear();
    out.q.clear();
    max = std::min(max, max_tokens());
    catch_up(context);
    const int n_vocab = s_.model().model.hp.n_vocab;
    const bool sampled = !sampler_.greedy();
    // The draft's steps after the context may be taken back next round.
    s_.checkpoint(std::max(0, max - 1));
    for (int i = 0; i < max; i++) {
        float* logits = s_.logits();
        int32_t d;
        if (sampled) {
            const Candidates c = sampler_.candidates(logits);
            if (c.c.front().first / c.total < p_min_) break;
            d = sampler_.draw(c);
            out.q.emplace_back();
            for (const auto& [w, t] : c.c)
                out.q.back().emplace_back(static_cast<float>(w / c.total), t);
        } else {
            d = argmax(logits, n_vocab);
            if (p_min_ > 0 && top_probability(logits, n_vocab) < p_min_) break;
        }
        out.tokens.push_back(d);
        if (i + 1 < max) s_.step(d);
    }
    seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

} // namespace kvrun
