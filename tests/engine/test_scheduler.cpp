// The scheduler (src/engine/scheduler.h, kvrun batch): many sequences at
// once, each answer byte-identical to the one a lone session gives with the
// same settings, whatever else is in the pass, when it joined and how its
// prompt was chunked. Mixed requests: prompts longer than a batch, greedy
// and seeded sampling, stop strings, lengths from 1 token to past -c (the
// window slides), -n -1 (ends at a full context); families with sliding
// windows (Gemma 3), shared KV layers (Gemma 4) and recurrent states (Qwen
// 3.5), and the real SmolLM2 and Gemma 3.
#include <doctest/doctest.h>

#include <map>
#include <random>
#include <string>

#include "loader.h"
#include "random_model.h"
#include "scheduler.h"
#include "session.h"
#include "test_util.h"

using namespace kvrun;

namespace {

struct Lone {
    GenerateResult gen;
    std::string text;
};

// What one session alone answers (kvrun -p's loop: the prompt in batches of
// max_batch, then Session::generate; -n -1 ends at a full context).
Lone lone(const LoadedModel& lm, const KvCacheConfig& cfg, gl::Backend& be, int max_batch,
          const SeqRequest& r) {
    Session s(lm, cfg, Placement::all(be, lm.model.hp.n_layer), max_batch);
    Sampler sampler(r.sampling, lm.model.hp.n_vocab);
    for (int32_t t : r.prompt) sampler.accept(t);
    s.eval(r.prompt);
    GenerateHooks h;
    Lone out;
    h.on_text = [&](const std::string& t) { out.text += t; };
    if (r.gen.n_predict < 0) h.on_full = [] { return "context full"; };
    out.gen = s.generate(r.gen, sampler, h);
    return out;
}

std::vector<SeqRequest> mixed_requests(const LoadedModel& lm, int count, int n_ctx, uint32_t seed) {
    std::mt19937 rng(seed);
    const char* texts[] = {"Once upon a time", "The little dog",   "Lily wanted to",
                           "One day, a",       "Tom and Sue went", "The sun was"};
    // Half the prompts start with one shared "system prompt" (a quarter of
    // -c; from -c 96 on, a whole block of 32 with BOS).
    std::vector<int32_t> system;
    for (int j = 0; j < (n_ctx >= 96 ? 36 : n_ctx / 4); j++)
        system.push_back(static_cast<int32_t>(rng() % lm.model.hp.n_vocab));
    std::vector<SeqRequest> out;
    for (int i = 0; i < count; i++) {
        SeqRequest r;
        r.prompt = lm.tokenizer.encode(texts[rng() % 6], true, true);
        const int at = lm.tokenizer.vocab().add_bos ? 1 : 0; // after BOS
        if (rng() % 2 == 0) r.prompt.insert(r.prompt.begin() + at, system.begin(), system.end());
        // Some prompts longer than a batch: random tokens after the text.
        const int extra = rng() % 3 == 0 ? static_cast<int>(rng() % (n_ctx / 2)) : 0;
        for (int j = 0; j < extra; j++)
            r.prompt.push_back(static_cast<int32_t>(rng() % lm.model.hp.n_vocab));
        const int kind = static_cast<int>(rng() % 6);
        r.gen.n_predict = kind == 0 ? 1 : kind == 1 ? -1 : static_cast<int64_t>(rng() % 60 + 2);
        if (kind == 2) r.gen.n_predict = n_ctx; // past -c: the window slides
        r.gen.ignore_eos = rng() % 2 == 0;
        if (rng() % 4 == 0) r.gen.stop = {"."};
        if (rng() % 2 == 0) {
            r.sampling.temp = 0.8f;
            r.sampling.top_k = 40;
            r.sampling.seed = rng();
        } else {
            r.sampling.temp = 0;
        }
        out.push_back(std::move(r));
    }
    return out;
}

// Shared prefixes (`share`) are evaluated in other batches than a lone
// run's prompt: bit for bit the same only on the batch-invariant backend.
enum class Mode { plain, shared_deterministic };

// budget_rings > 0: a pool of that many whole rings' bytes (fewer than
// `parallel`: sequences preempted for want of blocks).
void check_against_lone(const LoadedModel& lm, int count, int n_ctx, int max_batch, int parallel,
                        const std::string& what, Mode mode = Mode::plain, double budget_rings = 0) {
    CAPTURE(what);
    const bool shared = mode == Mode::shared_deterministic;
    CAPTURE(shared);
    auto be = gl::make_cpu_backend(2, shared);
    const KvCacheConfig cfg =
        KvCacheConfig::for_model(lm.model.hp, n_ctx, 4, gl::Type::F16, gl::Type::F16);
    std::vector<SeqRequest> reqs = mixed_requests(lm, count, n_ctx, 11);
    if (budget_rings > 0) // long answers, so that sequences outgrow the pool
        for (SeqRequest& r : reqs) r.gen.n_predict = std::max<int64_t>(r.gen.n_predict, 40);
    const uint64_t budget = static_cast<uint64_t>(
        budget_rings * (KvCache::ring_bytes_for(cfg) + KvCache::state_bytes_for(cfg)));
    Scheduler sched(lm, cfg, Placement::all(*be, lm.model.hp.n_layer), max_batch, parallel, shared,
                    budget);
    std::vector<SeqResult> got(reqs.size());
    std::vector<size_t> order;
    sched.run(reqs, [&](SeqResult r) {
        order.push_back(r.index);
        got[r.index] = std::move(r);
    });
    REQUIRE(order.size() == reqs.size());
    for (size_t i = 0; i < reqs.size(); i++) {
        CAPTURE(i);
        const Lone want = lone(lm, cfg, *be, max_batch, reqs[i]);
        CHECK(got[i].gen.tokens == want.gen.tokens);
        CHECK(got[i].gen.stop == want.gen.stop);
        CHECK(got[i].gen.generated == want.gen.generated);
        CHECK(got[i].text == want.text);
    }
    const SchedulerStats& st = sched.stats();
    int64_t cached = 0;
    for (const SeqResult& r : got) cached += r.cached;
    CHECK(cached == st.reused);
    // Recurrent states are reused only where a cache holds exactly a prefix,
    // sliding windows only from a cache that has not moved past it.
    const bool reusable = lm.model.hp.recurrent_layers.empty() && lm.model.hp.swa_window == 0;
    if (shared && reusable) CHECK(st.reused > 0);
    if (!shared) CHECK(st.reused == 0);
    if (budget_rings == 0) CHECK(st.peak_running == std::min(parallel, count));
    // Every prompt token counted once, evaluated or found, whatever was
    // evaluated again after a preemption.
    int64_t prompt_total = 0;
    for (const SeqRequest& r : reqs) prompt_total += static_cast<int64_t>(r.prompt.size());
    CHECK(st.prompt_tokens + st.reused == prompt_total);
    if (budget_rings > 0) CHECK(st.preempted > 0);
    if (budget_rings > 0) CHECK(st.recomputed > 0);
    if (budget_rings == 0) CHECK(st.preempted == 0);
    // Sequences shared passes: fewer passes than tokens generated.
    CHECK(st.passes < st.generated);
    // They finished out of order (joined and left between steps).
    CHECK(!std::is_sorted(order.begin(), order.end()));
}

} // namespace

TEST_CASE("scheduler: 32 mixed requests, 5 at a time, answer as lone sessions do (stories260K)") {
    auto lm = LoadedModel::load(kvtest::shared("models/stories260K.gguf"));
    check_against_lone(*lm, 32, 96, 16, 5, "stories260K");
    // More at once than a pass takes (max_batch 16): two passes a step, the
    // first of 16 rows, where F32 weights would take the tiles (other bits
    // than a lone token's) were the rows not kept exact.
    check_against_lone(*lm, 24, 96, 16, 20, "stories260K, 20 at once");
    // Passes of 20 rows on K-quants (the integer GEMM's batches were the
    // rows not kept exact) and on packed Q8_0 (its GEMM, which one token
    // takes too).
    auto gemma4 = LoadedModel::load(kvtest::shared("models/next/tiny-gemma4-Q4_K_M.gguf"));
    check_against_lone(*gemma4, 24, 64, 32, 20, "gemma4, 20 at once");
    kvtest::RandomModelFile gemma3({"gemma3", 128, 4, 1, 96, 6, gl::Type::Q8_0});
    check_against_lone(*gemma3.lm, 24, 64, 32, 20, "gemma3 Q8_0, 20 at once");
}

TEST_CASE("scheduler: prompts start from the longest prefix a cache holds (its own, one left "
          "behind, a running sequence's); on the batch-invariant backend bit for bit a lone "
          "run's") {
    auto lm = LoadedModel::load(kvtest::shared("models/stories260K.gguf"));
    check_against_lone(*lm, 32, 96, 16, 5, "stories260K", Mode::shared_deterministic);
    kvtest::RandomModelFile gemma3({"gemma3", 128, 4, 1, 96, 6, gl::Type::Q8_0});
    check_against_lone(*gemma3.lm, 16, 64, 8, 6, "gemma3, windows of 8",
                       Mode::shared_deterministic);
    auto gemma4 = LoadedModel::load(kvtest::shared("models/next/tiny-gemma4-Q4_K_M.gguf"));
    check_against_lone(*gemma4, 14, 64, 8, 6, "gemma4", Mode::shared_deterministic);
    auto qwen35 = LoadedModel::load(kvtest::shared("models/next/tiny-qwen35-Q4_K_M.gguf"));
    check_against_lone(*qwen35, 14, 64, 8, 6, "qwen35", Mode::shared_deterministic);
    if (kvtest::have_real_model("smollm2-135m-Q4_1.gguf")) {
        auto smol = LoadedModel::load(kvtest::real_model("smollm2-135m-Q4_1.gguf"));
        check_against_lone(*smol, 10, 96, 32, 4, "smollm2", Mode::shared_deterministic);
    }
}

// 10 at once: passes of 8 or more rows, which would take the integer GEMM
// (other bits than a lone token's dot products) were they not kept exact.
TEST_CASE("scheduler: sliding windows, shared KV layers and recurrent states answer as lone "
          "sessions do") {
    kvtest::RandomModelFile gemma3({"gemma3", 128, 4, 1, 96, 6, gl::Type::Q8_0});
    check_against_lone(*gemma3.lm, 16, 64, 8, 10, "gemma3, windows of 8");
    auto gemma4 = LoadedModel::load(kvtest::shared("models/next/tiny-gemma4-Q4_K_M.gguf"));
    check_against_lone(*gemma4, 14, 64, 8, 10, "gemma4");
    auto qwen35 = LoadedModel::load(kvtest::shared("models/next/tiny-qwen35-Q4_K_M.gguf"));
    check_against_lone(*qwen35, 14, 64, 8, 10, "qwen35");
}

TEST_CASE("real: scheduler: SmolLM2 and Gemma 3 answer as lone sessions do") {
    // A real: test (release build only): under ASan it took over 4 minutes.
    // 32 mixed requests, 10 at once, in one shared pool (greedy and seeded).
    for (const char* name : {"smollm2-135m-Q4_1.gguf", "gemma3-270m-Q4_K_M.gguf"}) {
        if (!kvtest::have_real_model(name)) continue;
        auto lm = LoadedModel::load(kvtest::real_model(name));
        check_against_lone(*lm, 32, 96, 32, 10, name);
    }
}

TEST_CASE("scheduler: a pool too small for every sequence preempts the youngest and recomputes "
          "it; every answer is still a lone run's") {
    auto lm = LoadedModel::load(kvtest::shared("models/stories260K.gguf"));
    check_against_lone(*lm, 16, 96, 16, 6, "stories260K, 1.5 rings for 6", Mode::plain, 1.5);
    check_against_lone(*lm, 16, 96, 16, 6, "stories260K, shared prefixes",
                       Mode::shared_deterministic, 1.5);
    auto qwen35 = LoadedModel::load(kvtest::shared("models/next/tiny-qwen35-Q4_K_M.gguf"));
    check_against_lone(*qwen35, 12, 64, 8, 6, "qwen35, 1.5 rings for 6", Mode::plain, 1.5);
}

// A server's use: requests submitted while others run, one cancelled while
// queued and one while running, text streamed as it is released.
TEST_CASE("scheduler: submit while running, cancel, stream; the rest answer as lone sessions do") {
    auto lm = LoadedModel::load(kvtest::shared("models/stories260K.gguf"));
    auto be = gl::make_cpu_backend(2);
    const KvCacheConfig cfg =
        KvCacheConfig::for_model(lm->model.hp, 96, 4, gl::Type::F16, gl::Type::F16);
    std::vector<SeqRequest> reqs = mixed_requests(*lm, 8, 96, 5);
    for (SeqRequest& r : reqs) r.gen.n_predict = 40, r.gen.ignore_eos = true, r.gen.stop.clear();
    Scheduler sched(*lm, cfg, Placement::all(*be, lm->model.hp.n_layer), 16, 3, false);
    std::map<size_t, std::string> streamed;
    sched.set_on_text([&](size_t i, const std::string& t) { streamed[i] += t; });
    std::map<size_t, SeqResult> got;
    auto done = [&](SeqResult r) { got[r.index] = std::move(r); };
    for (int i = 0; i < 4; i++) CHECK(sched.submit(reqs[i]) == static_cast<size_t>(i));
    for (int k = 0; k < 10; k++) sched.step(done); // 3 running, 1 queued
    sched.cancel(3);                               // queued
    sched.cancel(1);                               // running
    for (int i = 4; i < 8; i++) sched.submit(reqs[i]);
    while (!sched.idle()) sched.step(done);
    REQUIRE(got.size() == 8);
    CHECK(got[3].gen.stop == "cancelled");
    CHECK(got[3].text.empty());
    CHECK(got[1].gen.stop == "cancelled");
    CHECK(got[1].gen.generated < 40);
    for (size_t i : {0, 2, 4, 5, 6, 7}) {
        CAPTURE(i);
        const Lone want = lone(*lm, cfg, *be, 16, reqs[i]);
        CHECK(got[i].gen.tokens == want.gen.tokens);
        CHECK(got[i].text == want.text);
        CHECK(streamed[i] == got[i].text);
    }
}
