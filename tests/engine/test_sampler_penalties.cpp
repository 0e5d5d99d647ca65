// The server's sampling fields (src/engine/sampler.h): logit_bias, and
// OpenAI's presence and frequency penalties over the tokens sampled so far
// (not the prompt's), against the formula written out here on hand-made
// logits; and the log-probabilities it reports (token_logprob, scheduler.h)
// against a full sort.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "sampler.h"
#include "scheduler.h"

using namespace kvrun;

namespace {

// A greedy sampler that has seen `prompt` (accept) and then chosen
// `answer` (sample, each forced by a logit far above the rest).
Sampler primed(const SamplerParams& p, int n_vocab, const std::vector<int32_t>& prompt,
               const std::vector<int32_t>& answer) {
    Sampler s(p, n_vocab);
    for (int32_t t : prompt) s.accept(t);
    for (int32_t t : answer) {
        std::vector<float> l(n_vocab, 0.0f);
        l[t] = 1000.0f;
        REQUIRE(s.sample(l.data()) == t);
    }
    return s;
}

// The logits candidates() leaves after its penalties (greedy: it only
// applies them and takes the argmax).
std::vector<float> penalised(Sampler& s, std::vector<float> logits) {
    (void)s.candidates(logits.data());
    return logits;
}

} // namespace

TEST_CASE("sampler: presence and frequency penalties and logit bias follow OpenAI's formula") {
    SamplerParams p;
    p.temp = 0;
    p.presence_penalty = 0.5f;
    p.frequency_penalty = 0.25f;
    const std::vector<float> base = {1.0f, 2.0f, 3.0f, -1.0f, 9.0f, 0.5f, 0.0f};
    const int n = static_cast<int>(base.size());
    // The prompt holds 0 and 5 (not penalised); the answer so far: token 2
    // three times, 3 once, 6 twice.
    const std::vector<int32_t> prompt = {0, 5, 0};
    const std::vector<int32_t> answer = {2, 3, 2, 6, 2, 6};
    Sampler s = primed(p, n, prompt, answer);
    std::vector<float> want = base;
    want[2] -= 0.5f + 0.25f * 3;
    want[3] -= 0.5f + 0.25f * 1;
    want[6] -= 0.5f + 0.25f * 2;
    const std::vector<float> got = penalised(s, base);
    for (int i = 0; i < n; i++) CHECK(got[i] == doctest::Approx(want[i]));

    // A state taken and restored keeps the counts; reset() forgets them.
    const Sampler::State st = s.state();
    s.reset();
    CHECK(penalised(s, base) == base);
    s.restore(st);
    CHECK(penalised(s, base)[2] == doctest::Approx(want[2]));

    // logit_bias is added first and decides a greedy draw: token 4 (the best
    // logit) is banned, token 1 lifted above the rest.
    p.logit_bias = {{4, -100.0f}, {1, 2.0f}};
    Sampler b = primed(p, n, prompt, answer);
    std::vector<float> l = base;
    CHECK(b.sample(l.data()) == 1);
    CHECK(l[4] == doctest::Approx(base[4] - 100.0f));

    // Negative penalties favour repetition; zero ones leave the logits alone.
    p.logit_bias.clear();
    p.presence_penalty = -1.0f;
    p.frequency_penalty = 0.0f;
    Sampler neg = primed(p, n, prompt, answer);
    CHECK(penalised(neg, base)[2] == doctest::Approx(base[2] + 1.0f));
    p.presence_penalty = 0.0f;
    Sampler off = primed(p, n, prompt, answer);
    CHECK(penalised(off, base) == base);
}

TEST_CASE("token_logprob: the log-softmax and the best alternatives, as a full sort finds them") {
    // Odd sizes, ties among the best, a token outside the top.
    for (const int n : {1, 7, 1001}) {
        std::vector<float> l(static_cast<size_t>(n));
        uint32_t x = 12345;
        for (float& v : l) {
            x = x * 1664525u + 1013904223u;
            v = static_cast<float>((x >> 8) % 50) * 0.25f - 5.0f; // many ties
        }
        double sum = 0;
        for (float v : l) sum += std::exp(static_cast<double>(v));
        const int32_t token = n / 2;
        for (const int top : {0, 3, 20, 40}) {
            CAPTURE(n);
            CAPTURE(top);
            const TokenLogprob t = token_logprob(l, token, top);
            CHECK(t.token == token);
            CHECK(t.logprob == doctest::Approx(l[token] - std::log(sum)).epsilon(1e-5));
            std::vector<int32_t> ids(static_cast<size_t>(n));
            for (int i = 0; i < n; i++) ids[i] = i;
            std::stable_sort(ids.begin(), ids.end(),
                             [&](int32_t a, int32_t b) { return l[a] > l[b]; });
            const size_t k = std::min<size_t>(static_cast<size_t>(std::min(top, 20)), ids.size());
            REQUIRE(t.top.size() == k);
            for (size_t i = 0; i < k; i++) {
                CHECK(t.top[i].first == ids[i]);
                CHECK(t.top[i].second == doctest::Approx(l[ids[i]] - std::log(sum)).epsilon(1e-5));
            }
        }
    }
}
