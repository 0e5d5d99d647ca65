// The server's sampling fields (src/engine/sampler.h): logit_bias, and
// OpenAI's presence and frequency penalties over the recent tokens, against
// the formula written out here on hand-made logits.
#include <doctest/doctest.h>

#include <vector>

#include "sampler.h"

using namespace kvrun;

namespace {

// The logits candidates() leaves after its penalties (greedy: it only
// applies them and takes the argmax).
std::vector<float> penalised(const SamplerParams& p, const std::vector<int32_t>& recent,
                             std::vector<float> logits) {
    Sampler s(p, static_cast<int>(logits.size()));
    for (int32_t t : recent) s.accept(t);
    (void)s.candidates(logits.data());
    return logits;
}

} // namespace

TEST_CASE("sampler: presence and frequency penalties and logit bias follow OpenAI's formula") {
    SamplerParams p;
    p.temp = 0;
    p.presence_penalty = 0.5f;
    p.frequency_penalty = 0.25f;
    p.logit_bias = {{4, -100.0f}, {1, 2.0f}};
    const std::vector<float> base = {1.0f, 2.0f, 3.0f, -1.0f, 9.0f, 0.5f, 0.0f};
    // Token 2 three times, token 3 once, token 6 twice; 0 and 5 never.
    const std::vector<int32_t> recent = {2, 3, 2, 6, 2, 6};
    const std::vector<float> got = penalised(p, recent, base);
    std::vector<float> want = base;
    want[1] += 2.0f;
    want[4] += -100.0f;
    want[2] -= 0.5f + 0.25f * 3;
    want[3] -= 0.5f + 0.25f * 1;
    want[6] -= 0.5f + 0.25f * 2;
    for (size_t i = 0; i < base.size(); i++) CHECK(got[i] == doctest::Approx(want[i]));

    // The bias decides a greedy draw: token 4 (the best logit) is banned.
    Sampler s(p, static_cast<int>(base.size()));
    std::vector<float> l = base;
    CHECK(s.sample(l.data()) == 1);

    // Only the last repeat_last_n tokens count.
    p.logit_bias.clear();
    p.repeat_last_n = 2; // the window holds {2, 6}
    const std::vector<float> windowed = penalised(p, recent, base);
    CHECK(windowed[3] == doctest::Approx(base[3]));
    CHECK(windowed[2] == doctest::Approx(base[2] - 0.75f));
    CHECK(windowed[6] == doctest::Approx(base[6] - 0.75f));

    // Negative penalties favour repetition; zero leaves the logits alone.
    p.presence_penalty = -1.0f;
    p.frequency_penalty = 0.0f;
    CHECK(penalised(p, recent, base)[2] == doctest::Approx(base[2] + 1.0f));
    p.presence_penalty = 0.0f;
    CHECK(penalised(p, recent, base) == base);
}
