#include "sampler.h"

#include <algorithm>
#include <cmath>
#include <iterator>

namespace kvrun {

int32_t argmax(const float* logits, int n) {
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (logits[i] > logits[best]) best = i;
    return best;
}

namespace {
uint64_t splitmix64(uint64_t& x) {
    uint64_t z = (x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
uint64_t rotl(uint64_t x, int k) {
    return (x << k) | (x >> (64 - k));
}
} // namespace

Sampler::Sampler(const SamplerParams& p, int n_vocab) : p_(p), n_vocab_(n_vocab) {
    cand_.reserve(n_vocab);
    reset();
}

void Sampler::reset() {
    uint64_t s = p_.seed;
    for (auto& w : state_) w = splitmix64(s);
    recent_.clear();
    sampled_.clear();
}

uint64_t Sampler::next_u64() {
    const uint64_t result = rotl(state_[1] * 5, 7) * 9;
    const uint64_t t = state_[1] << 17;
    state_[2] ^= state_[0];
    state_[3] ^= state_[1];
    state_[1] ^= state_[2];
    state_[0] ^= state_[3];
    state_[2] ^= t;
    state_[3] = rotl(state_[3], 45);
    return result;
}

double Sampler::uniform() {
    return static_cast<double>(next_u64() >> 11) * 0x1.0p-53;
}

void Sampler::accept(int32_t token) {
    if (p_.repeat_last_n <= 0) return;
    recent_.push_back(token);
    if (static_cast<int>(recent_.size()) > p_.repeat_last_n) recent_.pop_front();
}

double Candidates::prob(int32_t token) const {
    for (const auto& [w, t] : c)
        if (t == token) return w / total;
    return 0;
}

Sampler::State Sampler::state() const {
    State s;
    std::copy(std::begin(state_), std::end(state_), s.rng);
    s.recent = recent_;
    s.sampled = sampled_;
    return s;
}

void Sampler::restore(const State& s) {
    std::copy(std::begin(s.rng), std::end(s.rng), state_);
    recent_ = s.recent;
    sampled_ = s.sampled;
}

int32_t Sampler::sample(float* logits) {
    const Candidates d = candidates(logits);
    const int32_t tok = greedy() ? d.c[0].second : draw(d);
    accept(tok);
    if (p_.presence_penalty != 0.0f || p_.frequency_penalty != 0.0f) sampled_[tok]++;
    return tok;
}

int32_t Sampler::draw(const Candidates& d) {
    double r = uniform() * d.total;
    for (const auto& [w, t] : d.c) {
        r -= w;
        if (r < 0) return t;
    }
    return d.c.back().second;
}

Candidates Sampler::candidates(float* logits) {
    for (const auto& [t, bias] : p_.logit_bias) logits[t] += bias;
    if (p_.presence_penalty != 0.0f || p_.frequency_penalty != 0.0f)
        for (const auto& [t, count] : sampled_)
            logits[t] -= p_.presence_penalty + p_.frequency_penalty * static_cast<float>(count);
    if (p_.repeat_penalty != 1.0f) {
        // Penalize each distinct recent token once (CTRL-style: shrink positive
        // logits, grow negative ones).
        for (size_t i = 0; i < recent_.size(); i++) {
            const int32_t t = recent_[i];
            if (std::find(recent_.begin(), recent_.begin() + i, t) != recent_.begin() + i) continue;
            float& l = logits[t];
            l = l > 0 ? l / p_.repeat_penalty : l * p_.repeat_penalty;
        }
    }
    cand_.clear();
    if (greedy()) {
        cand_.emplace_back(1.0f, argmax(logits, n_vocab_));
        return {cand_, 1.0};
    }
    for (int i = 0; i < n_vocab_; i++) cand_.emplace_back(logits[i] / p_.temp, i);
    auto by_logit = [](const auto& a, const auto& b) {
        return a.first > b.first || (a.first == b.first && a.second < b.second);
    };
    size_t n = cand_.size();
    if (p_.top_k > 0 && static_cast<size_t>(p_.top_k) < n) {
        std::partial_sort(cand_.begin(), cand_.begin() + p_.top_k, cand_.end(), by_logit);
        n = p_.top_k;
    } else {
        std::sort(cand_.begin(), cand_.end(), by_logit);
    }
    // softmax over the survivors (sorted, best first)
    const float mx = cand_[0].first;
    double sum = 0;
    for (size_t i = 0; i < n; i++) {
        cand_[i].first = std::exp(cand_[i].first - mx);
        sum += cand_[i].first;
    }
    for (size_t i = 0; i < n; i++) cand_[i].first = static_cast<float>(cand_[i].first / sum);
    if (p_.min_p > 0.0f) { // drop tokens less likely than min_p × the best one
        const float cut = p_.min_p * cand_[0].first;
        size_t keep = 1;
        while (keep < n && cand_[keep].first >= cut) keep++;
        n = keep;
    }
    if (p_.top_p < 1.0f) { // smallest prefix whose mass reaches top_p
        double cum = 0;
        size_t keep = 0;
        while (keep < n) {
            cum += cand_[keep++].first;
            if (cum >= p_.top_p) break;
        }
        n = keep;
    }
    double total = 0;
    for (size_t i = 0; i < n; i++) total += cand_[i].first;
    return {std::span<const std::pair<float, int32_t>>(cand_.data(), n), total};
}

} // namespace kvrun
