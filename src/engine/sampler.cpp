#include "sampler.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>

#include "error.h"

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
    if (p_.grammar) grammar_.emplace(p_.grammar);
    reset();
}

void Sampler::reset() {
    uint64_t s = p_.seed;
    for (auto& w : state_) w = splitmix64(s);
    recent_.clear();
    sampled_.clear();
    restart_grammar();
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
    if (grammar_) grammar_->accept(tok);
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

void Sampler::adjust(float* logits) {
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
}

namespace {
bool by_logit(const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
}
} // namespace

Candidates Sampler::candidates(float* logits) {
    adjust(logits);
    if (grammar_) return constrained(logits);
    cand_.clear();
    if (greedy()) {
        cand_.emplace_back(1.0f, argmax(logits, n_vocab_));
        return {cand_, 1.0};
    }
    for (int i = 0; i < n_vocab_; i++) cand_.emplace_back(logits[i] / p_.temp, i);
    size_t n = cand_.size();
    if (p_.top_k > 0 && static_cast<size_t>(p_.top_k) < n) {
        std::partial_sort(cand_.begin(), cand_.begin() + p_.top_k, cand_.end(), by_logit);
        n = p_.top_k;
    } else {
        std::sort(cand_.begin(), cand_.end(), by_logit);
    }
    return cut(n);
}

bool Sampler::best_allowed(const float* logits, size_t want) {
    cand_.clear();
    order_.clear();
    for (int i = 0; i < n_vocab_; i++) order_.emplace_back(logits[i], i);
    const size_t n = order_.size();
    size_t sorted = 0, upto = std::min(n, std::max<size_t>(4 * want, 64));
    while (true) {
        // [0, sorted) holds the best tokens in order already; sort on from there.
        std::partial_sort(order_.begin() + sorted, order_.begin() + upto, order_.end(), by_logit);
        for (; sorted < upto; sorted++)
            if (grammar_->allows(order_[sorted].second)) {
                cand_.push_back(order_[sorted]);
                if (cand_.size() == want) return true;
            }
        if (upto == n) return true; // fewer allowed than wanted: all of them
        if (upto * 8 > n / 4) return false;
        upto *= 8;
    }
}

// With a grammar the distribution is that of the allowed tokens alone: the
// k best allowed ones go through temperature, softmax, min-p and top-p as
// the k best would without one. Most tokens chosen are allowed (a model
// that has seen the format mostly follows it), so the check walks the
// logits best first and stops after k allowed ones; the whole vocabulary is
// masked only when allowed tokens are rare, or without top-k.
Candidates Sampler::constrained(float* logits) {
    auto none_allowed = [&] {
        fail(Exit::error, "{}: no token of the vocabulary can continue the grammar here",
             grammar_->spec().source);
    };
    if (greedy()) {
        int32_t best = argmax(logits, n_vocab_);
        if (!grammar_->allows(best)) {
            if (best_allowed(logits, 1) && !cand_.empty()) {
                best = cand_[0].second;
            } else {
                if (grammar_->mask(logits) == 0) none_allowed();
                best = argmax(logits, n_vocab_);
            }
        }
        cand_.assign(1, {1.0f, best});
        return {cand_, 1.0};
    }
    const size_t k = p_.top_k > 0 ? static_cast<size_t>(p_.top_k) : 0;
    if (k == 0 || !best_allowed(logits, k)) {
        if (grammar_->mask(logits) == 0) none_allowed();
        cand_.clear();
        for (int i = 0; i < n_vocab_; i++)
            if (logits[i] != -std::numeric_limits<float>::infinity())
                cand_.emplace_back(logits[i], i);
        const size_t n = k > 0 ? std::min(k, cand_.size()) : cand_.size();
        std::partial_sort(cand_.begin(), cand_.begin() + n, cand_.end(), by_logit);
        cand_.resize(n);
    }
    if (cand_.empty()) none_allowed();
    for (auto& c : cand_) c.first /= p_.temp;
    return cut(cand_.size());
}

Candidates Sampler::cut(size_t n) {
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
