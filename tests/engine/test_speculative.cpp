// Speculative decoding (src/engine/speculative.h): exact by construction. Greedy
// answers, and sampled ones with lookup drafts, are the tokens plain
// decoding gives; rejected drafts leave the ring exactly as a cache that
// never saw them (rows and positions, across the wrap, sinks and sliding
// windows included); the rejection rule for sampled draft-model drafts
// keeps the target's distribution (a chi-square test that catches a broken
// rule).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <unistd.h>

#include "cache_compare.h"
#include "draft_length.h"
#include "draft_model.h"
#include "forward.h"
#include "loader.h"
#include "ngram_lookup.h"
#include "random_model.h"
#include "session.h"
#include "speculative.h"
#include "test_util.h"

using namespace kvrun;
using kvtest::random_model;
using kvtest::Shape;

namespace {

using ModelFile = kvtest::RandomModelFile;


// Proposes the true continuation (known from a plain run), with each token
// wrong with probability p_wrong: rounds accept and reject at every offset.
class OracleDrafter final : public Drafter {
  public:
    OracleDrafter(std::vector<int32_t> truth, int n_vocab, double p_wrong, uint32_t seed)
        : truth_(std::move(truth)), n_vocab_(n_vocab), p_wrong_(p_wrong), rng_(seed) {}
    std::string name() const override { return "oracle"; }
    void propose(std::span<const int32_t> context, int max, Draft& out) override {
        out.tokens.clear();
        out.q.clear();
        std::uniform_real_distribution<double> u(0, 1);
        for (int i = 0; i < max; i++) {
            const size_t at = context.size() + i;
            int32_t t = at < truth_.size() ? truth_[at] : static_cast<int32_t>(rng_() % n_vocab_);
            if (u(rng_) < p_wrong_)
                t = static_cast<int32_t>((t + 1 + rng_() % (n_vocab_ - 1)) % n_vocab_);
            out.tokens.push_back(t);
        }
    }

  private:
    std::vector<int32_t> truth_;
    int n_vocab_;
    double p_wrong_;
    std::mt19937 rng_;
};

struct Generated {
    std::vector<int32_t> tokens; // everything the session holds after the run
    std::vector<int32_t> answer; // the answer
    std::vector<float> logits;   // the session's last logits
    std::string stop;
    std::vector<int32_t> next_draws; // what the sampler draws next, twice (its state after the run)
};

std::vector<int32_t> prompt_tokens(const LoadedModel& lm, int n) {
    std::vector<int32_t> p =
        lm.tokenizer.encode("Once upon a time, there was a little", true, true);
    std::mt19937 rng(5);
    while (static_cast<int>(p.size()) < n)
        p.push_back(static_cast<int32_t>(rng() % lm.model.hp.n_vocab));
    p.resize(n);
    return p;
}

// Generate after `prompt` on a ring of n_ctx slots (it slides), with or
// without speculation.
Generated generate(const LoadedModel& lm, const std::vector<int32_t>& prompt, int n_ctx,
                   const SamplerParams& sp, GenerateParams gp, Speculator* spec, gl::Backend& be) {
    Session s(lm, KvCacheConfig::for_model(lm.model.hp, n_ctx, 4, gl::Type::F16, gl::Type::F16),
              Placement::all(be, lm.model.hp.n_layer), 32);
    Sampler sampler(sp, lm.model.hp.n_vocab);
    for (int32_t t : prompt) sampler.accept(t);
    s.eval(prompt);
    gp.speculate = spec;
    const GenerateResult r = s.generate(gp, sampler, {});
    Generated g;
    g.tokens = s.tokens();
    g.answer = r.tokens;
    g.stop = r.stop;
    g.logits.assign(s.logits(), s.logits() + lm.model.hp.n_vocab);
    std::vector<float> copy = g.logits;
    g.next_draws.push_back(sampler.sample(copy.data()));
    copy = g.logits;
    g.next_draws.push_back(sampler.sample(copy.data()));
    return g;
}

void check_same(const Generated& want, const Generated& got) {
    CHECK(got.answer == want.answer);
    CHECK(got.tokens == want.tokens);
    CHECK(got.stop == want.stop);
    CHECK(std::memcmp(got.logits.data(), want.logits.data(), sizeof(float) * want.logits.size()) ==
          0);
    CHECK(got.next_draws == want.next_draws);
}

SamplerParams greedy() {
    SamplerParams p;
    p.temp = 0;
    return p;
}

SamplerParams sampled(uint64_t seed) {
    SamplerParams p;
    p.temp = 0.9f;
    p.top_k = 20;
    p.top_p = 0.95f;
    p.repeat_penalty = 1.1f;
    p.seed = seed;
    return p;
}

// Plain vs the oracle, lookup and (optionally) a draft model, for each draft
// length: identical tokens, cache, logits and sampler state.
void check_exact(const LoadedModel& lm, const LoadedModel* draft, const SamplerParams& sp,
                 int n_ctx, int n_predict, const std::string& what) {
    CAPTURE(what);
    auto be = gl::make_cpu_backend(2);
    const std::vector<int32_t> prompt = prompt_tokens(lm, 12);
    GenerateParams gp;
    gp.n_predict = n_predict;
    gp.ignore_eos = true;
    const Generated want = generate(lm, prompt, n_ctx, sp, gp, nullptr, *be);
    REQUIRE(static_cast<int>(want.answer.size()) == n_predict);
    for (int max : {1, 3, 7, 14}) {
        CAPTURE(max);
        SpeculativeParams p;
        p.draft_max = max;
        p.timed = false; // a round every time, whatever the clock says
        {
            Speculator spec(
                std::make_unique<OracleDrafter>(want.tokens, lm.model.hp.n_vocab, 0.15, 7 + max),
                p);
            check_same(want, generate(lm, prompt, n_ctx, sp, gp, &spec, *be));
            const SpeculativeStats& st = spec.stats();
            CHECK(st.rounds > 0);
            CHECK(st.accepted > 0);
            CHECK(st.accepted < st.drafted); // rejections happened, and were rolled back
        }
        {
            Speculator spec(std::make_unique<LookupDrafter>(NgramLookup{}), p);
            check_same(want, generate(lm, prompt, n_ctx, sp, gp, &spec, *be));
        }
        if (draft) {
            KvCacheConfig dc =
                KvCacheConfig::for_model(draft->model.hp, n_ctx, 4, gl::Type::F16, gl::Type::F16);
            auto drafter = std::make_unique<ModelDrafter>(
                *draft, dc, Placement::all(*be, draft->model.hp.n_layer), 32, sp, 0.0f, "draft");
            Speculator spec(std::move(drafter), p);
            check_same(want, generate(lm, prompt, n_ctx, sp, gp, &spec, *be));
            CHECK(spec.stats().drafted > 0);
        }
    }
}

} // namespace

TEST_CASE(
    "speculative: greedy answers are plain decoding's, through a ring that wraps many times") {
    // stories260K drafting for itself, and an oracle that is wrong 15% of the time.
    auto stories = LoadedModel::load(kvtest::shared("models/stories260K.gguf"));
    check_exact(*stories, stories.get(), greedy(), 64, 300, "stories260K, -c 64");
    // Q4_0 drafting for Q8_0 of the same random weights.
    auto q8 = LoadedModel::load(kvtest::shared("models/synthetic/tiny-Q8_0.gguf"));
    auto q4 = LoadedModel::load(kvtest::shared("models/synthetic/tiny-Q4_0.gguf"));
    check_exact(*q8, q4.get(), greedy(), 64, 160, "tiny Q8_0 with its Q4_0 draft, -c 64");
    auto qwen2 = LoadedModel::load(kvtest::shared("models/synthetic/tiny-qwen2-Q8_0.gguf"));
    check_exact(*qwen2, nullptr, greedy(), 48, 120, "qwen2, -c 48");
    auto phi3 = LoadedModel::load(kvtest::shared("models/families/tiny-phi3-Q4_K_M.gguf"));
    check_exact(*phi3, nullptr, greedy(), 48, 120, "phi3, -c 48");
    // Sliding-window layers: rings of 8 slots, checkpointed and rolled back.
    ModelFile gemma({"gemma3", 128, 4, 1, 96, 6, gl::Type::Q8_0});
    check_exact(*gemma.lm, gemma.lm.get(), greedy(), 40, 150, "gemma3, window 8, -c 40");
    // Recurrent layers: their states go back to the checkpoint and are
    // stepped through the kept tokens again; the model drafts for itself too.
    auto qwen35 = LoadedModel::load(kvtest::shared("models/next/tiny-qwen35-Q4_K_M.gguf"));
    check_exact(*qwen35, qwen35.get(), greedy(), 40, 100, "qwen35, -c 40");
}

// G1 (hostile-inputs-2026-12b): a draft whose sliding-window rings are
// narrower than a round once aborted in KvCache::checkpoint. A round now
// drafts at most what the draft's narrowest ring can take back.
TEST_CASE("speculative: a draft model with narrow sliding windows caps its rounds, for every "
          "window 2..16 and draft length 1..14") {
    auto stories = LoadedModel::load(kvtest::shared("models/stories260K.gguf"));
    auto be = gl::make_cpu_backend(2);
    const std::vector<int32_t> prompt = prompt_tokens(*stories, 6);
    GenerateParams gp;
    gp.n_predict = 48;
    gp.ignore_eos = true;
    const Generated want = generate(*stories, prompt, 64, greedy(), gp, nullptr, *be);
    for (int window = 2; window <= 16; window++) {
        CAPTURE(window);
        ModelFile draft({"gemma3", 64, 4, 1, 96, 3, gl::Type::F32}, 99, window);
        for (int max = 1; max <= 14; max++) {
            CAPTURE(max);
            SpeculativeParams p;
            p.draft_max = max;
            p.timed = false;
            KvCacheConfig dc =
                KvCacheConfig::for_model(draft.lm->model.hp, 64, 4, gl::Type::F16, gl::Type::F16);
            auto drafter = std::make_unique<ModelDrafter>(
                *draft.lm, dc, Placement::all(*be, draft.lm->model.hp.n_layer), 32, greedy(), 0.0f,
                "draft");
            CHECK(drafter->max_tokens() == std::min(window + 1, Forward::kMaxVerify));
            Speculator spec(std::move(drafter), p);
            check_same(want, generate(*stories, prompt, 64, greedy(), gp, &spec, *be));
            CHECK(spec.stats().rounds > 0);
            CHECK(spec.stats().drafted <= spec.stats().rounds * std::min(max, window + 1));
        }
    }
}

TEST_CASE("speculative: sampled answers with lookup or oracle drafts are plain decoding's with the "
          "same seed") {
    auto stories = LoadedModel::load(kvtest::shared("models/stories260K.gguf"));
    check_exact(*stories, nullptr, sampled(42), 64, 300, "stories260K sampled, -c 64");
    ModelFile gemma({"gemma3", 128, 4, 1, 96, 6, gl::Type::Q8_0});
    check_exact(*gemma.lm, nullptr, sampled(3), 40, 120, "gemma3 sampled");
    auto qwen35 = LoadedModel::load(kvtest::shared("models/next/tiny-qwen35-Q4_K_M.gguf"));
    check_exact(*qwen35, nullptr, sampled(5), 40, 80, "qwen35 sampled");
}

TEST_CASE(
    "speculative: an answer that ends inside a round leaves the session as plain decoding does") {
    auto lm = LoadedModel::load(kvtest::shared("models/stories260K.gguf"));
    auto be = gl::make_cpu_backend(2);
    const std::vector<int32_t> prompt = prompt_tokens(*lm, 12);
    for (const SamplerParams& sp : {greedy(), sampled(9)}) {
        GenerateParams open;
        open.n_predict = 200;
        open.ignore_eos = true;
        const Generated full = generate(*lm, prompt, 64, sp, open, nullptr, *be);
        // End at a length, at an end token and at a stop string that fall
        // inside the oracle's long accepted runs.
        for (int cut : {37, 101, 150}) {
            CAPTURE(cut);
            GenerateParams gps[3];
            gps[0].n_predict = cut;
            gps[1].n_predict = 200;
            gps[1].end_ids = {full.answer[cut]};
            gps[2].n_predict = 200;
            gps[2].stop = {lm->tokenizer.piece(full.answer[cut])};
            REQUIRE(!gps[2].stop[0].empty());
            for (GenerateParams& gp : gps) {
                gp.ignore_eos = true;
                const Generated want = generate(*lm, prompt, 64, sp, gp, nullptr, *be);
                SpeculativeParams p;
                p.draft_max = 14;
                p.timed = false;
                Speculator spec(
                    std::make_unique<OracleDrafter>(full.tokens, lm->model.hp.n_vocab, 0.02, cut),
                    p);
                check_same(want, generate(*lm, prompt, 64, sp, gp, &spec, *be));
            }
        }
    }
}

TEST_CASE("speculative rollback: after every round the cache equals one that evaluated only the "
          "kept tokens") {
    struct Case {
        Shape shape;
        gl::Type kv;
        bool deterministic;
        const char* file = nullptr; // a model of ../shared instead of the random shape
    };
    const Case cases[] = {
        {{"llama", 128, 4, 2, 96, 2, gl::Type::Q8_0}, gl::Type::F16, false},  // head-major slots
        {{"llama", 128, 4, 2, 96, 2, gl::Type::Q8_0}, gl::Type::Q4_0, false}, // block rows
        {{"llama", 128, 4, 2, 96, 2, gl::Type::Q8_0}, gl::Type::F16, true}, // --deterministic rows
        {{"gemma3", 128, 4, 1, 96, 6, gl::Type::Q8_0}, gl::Type::Q8_0, false}, // windows of 8
        // Gemma 4: windows of 8 with heads of 32, two layers reading others' slots.
        {{}, gl::Type::F16, false, "models/next/tiny-gemma4-Q4_K_M.gguf"},
        {{}, gl::Type::Q8_0, false, "models/next/tiny-gemma4-Q4_K_M.gguf"},
        // Qwen 3.5: recurrent states beside the attention layers' ring.
        {{}, gl::Type::F16, false, "models/next/tiny-qwen35-Q4_K_M.gguf"},
        {{}, gl::Type::Q8_0, true, "models/next/tiny-qwen35-Q4_K_M.gguf"},
    };
    for (const Case& c : cases) {
        CAPTURE(c.file ? c.file : c.shape.arch);
        CAPTURE(std::string(gl::type_name(c.kv)));
        CAPTURE(c.deterministic);
        std::unique_ptr<ModelFile> mf;
        std::unique_ptr<LoadedModel> shared_model;
        if (c.file)
            shared_model = LoadedModel::load(kvtest::shared(c.file));
        else
            mf = std::make_unique<ModelFile>(c.shape);
        const LoadedModel& lm = c.file ? *shared_model : *mf->lm;
        const int nv = lm.model.hp.n_vocab;
        auto be = gl::make_cpu_backend(2, c.deterministic);
        const KvCacheConfig cfg = KvCacheConfig::for_model(lm.model.hp, 32, 4, c.kv, c.kv);
        Session spec(lm, cfg, Placement::all(*be, lm.model.hp.n_layer), 16);
        Session ref(lm, cfg, Placement::all(*be, lm.model.hp.n_layer), 16);
        std::mt19937 rng(17);
        std::vector<int32_t> seq(400);
        for (auto& t : seq) t = static_cast<int32_t>(rng() % nv);
        spec.eval(std::span<const int32_t>(seq).first(10));
        ref.eval(std::span<const int32_t>(seq).first(10));
        int64_t n = 10;
        int rounds = 0, rolled_back_over_wrap = 0;
        while (n < 360) {
            const int k =
                1 + static_cast<int>(rng() % 7); // a batch of k + 1 <= 8 fits the window of 8
            const int kept = static_cast<int>(rng() % (k + 1)); // drafts accepted
            std::vector<int32_t> batch(seq.begin() + n, seq.begin() + n + 1 + kept);
            while (static_cast<int>(batch.size()) < k + 1)
                batch.push_back(static_cast<int32_t>(rng() % nv));
            float* rows = spec.verify(batch);
            // Each kept row is the row plain decoding computes, bit for bit.
            for (int j = 0; j <= kept; j++) {
                ref.step(batch[j]);
                REQUIRE(std::memcmp(rows + static_cast<size_t>(j) * nv, ref.logits(),
                                    sizeof(float) * nv) == 0);
            }
            if (n + k + 1 > cfg.n_ctx && kept < k) rolled_back_over_wrap++;
            spec.take_back(n + 1 + kept, rows + static_cast<size_t>(kept) * nv);
            n += 1 + kept;
            rounds++;
            REQUIRE(spec.tokens() == ref.tokens());
            // Every ring and recurrent state: the same bytes.
            kvtest::require_same_cache(spec.cache(), ref.cache());
        }
        CHECK(rounds > 50);
        CHECK(rolled_back_over_wrap > 20);
        // And what follows is the same: one more token on each.
        spec.step(seq[n]);
        ref.step(seq[n]);
        CHECK(std::memcmp(spec.logits(), ref.logits(), sizeof(float) * nv) == 0);
    }
}

namespace {

// The first token drawn with a draft of one token from q, against the
// target p, `n` times: counts per token. `rule` is the acceptance rule.
template <class Rule>
std::vector<int> first_token_counts(const std::vector<float>& target_logits,
                                    const std::vector<float>& q, int n, Rule&& rule) {
    const int v = static_cast<int>(target_logits.size());
    SamplerParams sp;
    sp.temp = 1.0f;
    sp.top_k = 0;
    sp.top_p = 1.0f;
    sp.min_p = 0.0f;
    sp.seed = 1234;
    Sampler sampler(sp, v);
    std::mt19937_64 draft_rng(99);
    std::discrete_distribution<int> from_q(q.begin(), q.end());
    std::vector<std::pair<float, int32_t>> qd;
    for (int i = 0; i < v; i++) qd.emplace_back(q[i], i);
    std::vector<std::pair<float, int32_t>> scratch;
    std::vector<int> counts(v);
    std::vector<float> logits;
    for (int i = 0; i < n; i++) {
        logits = target_logits;
        const int32_t d = from_q(draft_rng);
        counts[rule(sampler, sampler.candidates(logits.data()), qd, d, scratch)]++;
    }
    return counts;
}

double chi_square(const std::vector<int>& counts, const std::vector<double>& p, int n) {
    double x = 0;
    for (size_t i = 0; i < counts.size(); i++) {
        const double e = p[i] * n;
        x += (counts[i] - e) * (counts[i] - e) / e;
    }
    return x;
}

} // namespace

TEST_CASE("speculative sampling: the rejection rule keeps the target's distribution (chi-square)") {
    // A vocabulary of 6; the draft likes what the target does not.
    const std::vector<float> logits = {1.2f, 0.3f, -0.5f, 2.0f, 0.0f, -1.0f};
    const std::vector<float> q = {0.05f, 0.40f, 0.25f, 0.05f, 0.15f, 0.10f};
    std::vector<double> p(logits.size());
    double z = 0;
    for (size_t i = 0; i < p.size(); i++) z += p[i] = std::exp(logits[i]);
    for (double& x : p) x /= z;
    const int n = 200000;
    // 5 degrees of freedom: P(chi2 > 20.5) = 0.001.
    constexpr double kCritical = 20.5;
    const std::vector<int> good = first_token_counts(logits, q, n, accept_or_resample);
    const double x_good = chi_square(good, p, n);
    MESSAGE("chi-square, min(1, p/q) then max(0, p - q): ", x_good);
    CHECK(x_good < kCritical);
    // The same with the resample drawn from p instead of the residual: the
    // tokens the draft favours come out too often.
    const std::vector<int> bad = first_token_counts(
        logits, q, n, [](Sampler& s, const Candidates& pc, auto qd, int32_t d, auto&) {
            double qv = 0;
            for (const auto& [w, t] : qd)
                if (t == d) qv = w;
            if (s.uniform() * qv < pc.prob(d)) return d;
            return s.draw(pc);
        });
    const double x_bad = chi_square(bad, p, n);
    MESSAGE("chi-square, resampling from p: ", x_bad);
    CHECK(x_bad > 10 * kCritical);
    // And accepting every draft gives q.
    const std::vector<int> all = first_token_counts(
        logits, q, n, [](Sampler&, const Candidates&, auto, int32_t d, auto&) { return d; });
    CHECK(chi_square(all, p, n) > 10 * kCritical);
}

TEST_CASE("ngram lookup: the latest match of the longest suffix, continued") {
    NgramLookup look;
    std::vector<int32_t> out;
    // "1 2 3 4 5 ... 1 2 3" -> 4 5 (the 3-gram 1 2 3 matches at 0).
    look.draft(std::vector<int32_t>{1, 2, 3, 4, 5, 9, 9, 1, 2, 3}, 2, out);
    CHECK(out == std::vector<int32_t>{4, 5});
    // The latest of two matches wins.
    look.draft(std::vector<int32_t>{7, 8, 1, 7, 8, 2, 7, 8}, 3, out);
    CHECK(out == std::vector<int32_t>{2, 7, 8});
    // A longer match beats a more recent shorter one.
    look.draft(std::vector<int32_t>{5, 6, 7, 1, 9, 6, 7, 2, 5, 6, 7}, 1, out);
    CHECK(out == std::vector<int32_t>{1});
    // No earlier occurrence: nothing.
    look.draft(std::vector<int32_t>{1, 2, 3, 4}, 4, out);
    CHECK(out.empty());
    // ngram_min 2: a single repeated token is not a match.
    NgramLookup two;
    two.ngram_min = 2;
    two.draft(std::vector<int32_t>{4, 1, 2, 3, 4}, 4, out);
    CHECK(out.empty());
    // Beyond the horizon: not searched.
    NgramLookup near;
    near.horizon = 4;
    near.draft(std::vector<int32_t>{1, 2, 3, 0, 0, 0, 0, 1, 2}, 2, out);
    CHECK(out.empty());
}

TEST_CASE("draft length: longer while drafts are kept, paused while rounds lose to plain steps") {
    DraftLength untimed(1, 10, false);
    CHECK(untimed.next(99) == 5);
    untimed.after_round(5, 5, 1.0);
    CHECK(untimed.next(99) == 7);
    untimed.after_round(7, 2, 1.0);
    CHECK(untimed.next(99) == 6);
    CHECK(untimed.next(3) == 3); // the caller's limit
    for (int i = 0; i < 20; i++)
        untimed.after_round(6, 0, 100.0); // slow rounds do not matter untimed
    CHECK(untimed.next(99) == 1);

    DraftLength timed(1, 10, true);
    CHECK(timed.next(99) == 0); // a plain step first, to know what one costs
    timed.after_plain_step(0.010);
    CHECK(timed.next(99) == 5);
    // A round of 6 tokens in 20 ms beats 10 ms a token: go on.
    timed.after_round(5, 5, 0.020);
    CHECK(!timed.paused());
    CHECK(timed.next(99) == 7);
    // Rounds of 1 token in 30 ms lose: once the recent average says so,
    // pause 4 tokens, then probe; a losing probe pauses 8.
    int losing = 0;
    while (!timed.paused() && losing < 20) {
        const int n = timed.next(99);
        REQUIRE(n > 0);
        timed.after_round(n, 0, 0.030);
        losing++;
    }
    CHECK(timed.paused());
    CHECK(losing > 1); // one bad round among good ones is not enough
    for (int i = 0; i < 4; i++) CHECK(timed.next(99) == 0);
    const int probe = timed.next(99);
    CHECK(probe > 0);
    timed.after_round(probe, 0, 0.030);
    int paused = 0;
    while (timed.next(99) == 0 && paused < 100) paused++;
    CHECK(paused == 8);
    // A winning probe ends the pauses.
    timed.after_round(1, 1, 0.001);
    CHECK(!timed.paused());
    // Every 64 rounds a plain step again, to keep the comparison current.
    DraftLength recheck(1, 4, true);
    recheck.after_plain_step(0.010);
    for (int i = 0; i < 64; i++) {
        REQUIRE(recheck.next(99) > 0);
        recheck.after_round(4, 4, 0.001);
    }
    CHECK(recheck.next(99) == 0);
    recheck.after_plain_step(0.010);
    CHECK(recheck.next(99) > 0);
}

// Through the command line: --lookup on Qwen 3.5 prints what plain decoding
// prints (its recurrent states are stepped back through replays).
TEST_CASE("speculative: --lookup on a model with recurrent layers answers as plain decoding") {
    const std::string m = kvtest::shared("models/next/tiny-qwen35-Q4_K_M.gguf");
    const std::vector<std::string> base = {"-m", m,        "-p",  "1 2 3 1 2 4 1 2 5 1 2",
                                           "-n", "64",     "--temp", "0",
                                           "--ignore-eos"};
    const auto plain = kvtest::run_kvrun(base);
    REQUIRE(plain.status == 0);
    std::vector<std::string> args = base;
    args.insert(args.end(), {"--lookup", "6"});
    const auto spec = kvtest::run_kvrun(args);
    CHECK(spec.status == 0);
    CHECK(spec.out == plain.out);
    // Some drafts were rejected, so states were stepped back ("lookup: A/B drafts accepted").
    const size_t at = spec.err.find("lookup: ");
    REQUIRE(at != std::string::npos);
    int accepted = 0, drafted = 0;
    REQUIRE(std::sscanf(spec.err.c_str() + at, "lookup: %d/%d", &accepted, &drafted) == 2);
    CHECK(accepted < drafted);
}
