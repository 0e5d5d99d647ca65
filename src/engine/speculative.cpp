#include "speculative.h"

#include <algorithm>
#include <chrono>

#include "error.h"
#include "forward.h"
#include "session.h"

namespace kvrun {

namespace {
double seconds_since(std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}
} // namespace

void LookupDrafter::propose(std::span<const int32_t> context, int max, Draft& out) {
    out.q.clear();
    lookup_.draft(context, max, out.tokens);
}

Speculator::Speculator(std::unique_ptr<Drafter> drafter, const SpeculativeParams& p)
    : drafter_(std::move(drafter)), p_(p) {
    KV_ASSERT(drafter_ && p_.draft_max >= 1 && p_.draft_max < Forward::kMaxVerify);
    p_.draft_min = std::clamp(p_.draft_min, 1, p_.draft_max);
}

void Speculator::plain_step_took(double seconds) {
    if (length_) length_->after_plain_step(seconds);
}

int32_t accept_or_resample(Sampler& sampler, const Candidates& p,
                           std::span<const std::pair<float, int32_t>> q, int32_t d,
                           std::vector<std::pair<float, int32_t>>& residual) {
    // q by token, for lookups while p is walked (either may cover the whole
    // vocabulary when top-k and top-p are off).
    residual.assign(q.begin(), q.end());
    auto by_token = [](const auto& a, const auto& b) { return a.second < b.second; };
    std::sort(residual.begin(), residual.end(), by_token);
    auto q_of = [&](int32_t t) -> double {
        auto it = std::lower_bound(residual.begin(), residual.end(),
                                   std::pair<float, int32_t>(0.0f, t), by_token);
        return it != residual.end() && it->second == t ? it->first : 0.0;
    };
    const double pd = p.prob(d), qd = q_of(d);
    const double u = sampler.uniform();
    if (qd > 0 && u * qd < pd) { // u < p(d) / q(d)
        sampler.accept(d);
        return d;
    }
    std::vector<std::pair<float, int32_t>> rest;
    rest.reserve(p.c.size());
    double total = 0;
    for (const auto& [w, t] : p.c) {
        const double r = w / p.total - q_of(t);
        if (r > 0) {
            rest.emplace_back(static_cast<float>(r), t);
            total += static_cast<float>(r);
        }
    }
    // p <= q everywhere only when p == q up to rounding, and then d was accepted
    // with probability 1 - rounding: draw from p itself.
    const int32_t tok = rest.empty() ? sampler.draw(p) : sampler.draw(Candidates{rest, total});
    sampler.accept(tok);
    return tok;
}

void Speculator::set_sampling(const SamplerParams& p) {
    drafter_->set_sampling(p);
    length_.reset(); // made again at the next round, for the new mode
}

bool Speculator::round(Session& target, Sampler& sampler, int32_t pending, int limit,
                       std::vector<SpeculatedToken>& out) {
    const auto t0 = std::chrono::steady_clock::now();
    // Drafts verified as the target's own draws leave the answer as it is,
    // however many there are: then the length may follow the clock.
    const bool rejection = drafter_->samples() && !sampler.greedy();
    if (!length_)
        length_ = std::make_unique<DraftLength>(p_.draft_min, p_.draft_max, p_.timed && !rejection);
    const int want = length_->next(std::min(limit, drafter_->max_tokens()));
    if (want < p_.draft_min) return false;
    const std::vector<int32_t>& held = target.tokens();
    context_.assign(held.begin(), held.end());
    context_.push_back(pending);
    drafter_->propose(context_, want, draft_);
    const int k = static_cast<int>(std::min<size_t>(draft_.tokens.size(), want));
    if (k < p_.draft_min) {
        length_->after_empty_draft(seconds_since(t0));
        return false;
    }

    const int64_t pos0 = static_cast<int64_t>(held.size());
    batch_.assign(1, pending);
    batch_.insert(batch_.end(), draft_.tokens.begin(), draft_.tokens.begin() + k);
    float* rows = target.verify(batch_);
    const size_t n_vocab = static_cast<size_t>(target.model().model.hp.n_vocab);
    KV_ASSERT(!rejection || draft_.q.size() >= static_cast<size_t>(k));
    int accepted = 0;
    for (int j = 0; j <= k; j++) {
        SpeculatedToken e;
        e.pos = pos0 + 1 + j;
        e.logits = rows + j * n_vocab;
        e.sampler_state = sampler.state();
        if (j < k && rejection)
            e.token = accept_or_resample(sampler, sampler.candidates(e.logits), draft_.q[j],
                                         draft_.tokens[j], residual_);
        else
            e.token = sampler.sample(e.logits);
        e.evaluated = j < k && e.token == draft_.tokens[j];
        out.push_back(std::move(e));
        if (!out.back().evaluated) break;
        accepted++;
    }
    // The cache keeps pending and the accepted drafts; the last token out is
    // the target's own, drawn from row `accepted`, not evaluated yet.
    target.take_back(pos0 + 1 + accepted, rows + accepted * n_vocab);
    stats_.rounds++;
    stats_.drafted += k;
    stats_.accepted += accepted;
    stats_.draft_s = drafter_->model_seconds();
    length_->after_round(
        k, accepted, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    return true;
}

} // namespace kvrun
