// The newer engine features on the CUDA backend, each against its CPU twin
// (skipped with a MESSAGE without a GPU, like tests/cuda/test_cuda.cpp's
// part 2):
// - rotated keys (--k-rotate): the Hadamard kernel against gl::hadamard_rows
//   bit for bit, and a rotated 4-bit ring that wraps, CUDA against CPU;
// - chat eviction in place (KvCache::drop moves and re-rotates rows on the
//   host): the device mirror picks the moved rows up, and the logits after
//   the drop match the CPU's, plain and with rotated keys;
// - speculative decoding: drafts verified in one batch on the GPU (the batch
//   attends at once there, Forward::eval_verify) give the greedy answer that
//   plain GPU decoding gives, through a ring that wraps, for the lookup
//   drafter and a draft model whose own cache lives on the GPU and is rolled
//   back there.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "draft_model.h"
#include "forward.h"
#include "ggml-like/backend.h"
#include "ggml-like/cuda/cuda_backend.h"
#include "ggml-like/hadamard.h"
#include "kv_cache.h"
#include "loader.h"
#include "ngram_lookup.h"
#include "sampler.h"
#include "session.h"
#include "speculative.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace kvrun;

namespace {

std::unique_ptr<LoadedModel> gpu_test_model(const char* name) {
    std::string why;
    if (!gl::cuda_available(&why)) {
        MESSAGE("CUDA tests skipped: ", why);
        return nullptr;
    }
    const fs::path mp = kvtest::shared(std::string("models/") + name);
    if (!fs::exists(mp)) {
        MESSAGE("skipped: no ", mp.string());
        return nullptr;
    }
    return LoadedModel::load(mp.string());
}

// Logits of random tokens through a ring of 48 slots that wraps: 16-token
// batches while they fit, single tokens after.
std::vector<float> ring_logits(const LoadedModel& lm, gl::Backend& be, gl::Type t, int rotate,
                               int n_steps) {
    const Hparams& hp = lm.model.hp;
    KvCache kv(KvCacheConfig::for_model(hp, 48, 4, t, t, rotate));
    Forward f(lm.model, kv, Placement::all(be, hp.n_layer), 16);
    std::mt19937 rng(11);
    std::vector<float> all;
    for (int step = 0; step < n_steps; step++) {
        const int nb = kv.n_past() + 16 <= kv.n_ctx() ? 16 : 1;
        std::vector<int32_t> toks(nb);
        for (auto& tk : toks) tk = static_cast<int32_t>(rng() % hp.n_vocab);
        const float* r = f.eval(toks.data(), nb, false);
        all.insert(all.end(), r, r + hp.n_vocab);
    }
    return all;
}

double worst_diff(const std::vector<float>& a, const std::vector<float>& b) {
    double worst = 0;
    for (size_t i = 0; i < a.size(); i++)
        worst = std::max(worst, static_cast<double>(std::abs(a[i] - b[i])));
    return worst;
}

// A greedy answer on `be` after the stories prompt, on a ring of n_ctx slots.
std::vector<int32_t> greedy_answer(const LoadedModel& lm, gl::Backend& be, int n_ctx, int n_predict,
                                   Speculator* spec) {
    const Hparams& hp = lm.model.hp;
    Session s(lm, KvCacheConfig::for_model(hp, n_ctx, 4, gl::Type::F16, gl::Type::F16),
              Placement::all(be, hp.n_layer), 32);
    SamplerParams sp;
    sp.temp = 0;
    Sampler sampler(sp, hp.n_vocab);
    const std::vector<int32_t> prompt = lm.tokenizer.encode(
        "Once upon a time, there was a little girl named Lily. She", true, true);
    for (int32_t t : prompt) sampler.accept(t);
    s.eval(prompt);
    GenerateParams gp;
    gp.n_predict = n_predict;
    gp.ignore_eos = true;
    gp.speculate = spec;
    return s.generate(gp, sampler, {}).tokens;
}

int first_difference(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
    const size_t n = std::min(a.size(), b.size());
    for (size_t i = 0; i < n; i++)
        if (a[i] != b[i]) return static_cast<int>(i);
    return a.size() == b.size() ? -1 : static_cast<int>(n);
}

} // namespace

TEST_CASE("cuda rotated keys: the Hadamard kernel and its inverse are gl::hadamard_rows(_inverse) "
          "bit for bit") {
    std::string why;
    if (!gl::cuda_available(&why)) {
        MESSAGE("CUDA tests skipped: ", why);
        return;
    }
    auto cuda = gl::make_cuda_backend(0);
    std::mt19937 rng(17);
    std::normal_distribution<float> d(0.0f, 3.0f);
    for (int block = 2; block <= gl::kHadamardMaxBlock; block *= 2)
        for (int64_t rows : {1, 3, 17})
            for (int64_t per : {1, 3}) {
                CAPTURE(block);
                CAPTURE(rows);
                const int64_t n = per * block;
                std::vector<float> x(static_cast<size_t>(rows * n));
                for (float& v : x) v = d(rng);
                std::vector<float> host = x, dev = x, ref = x;
                gl::hadamard_rows(host.data(), rows, n, block);
                cuda->hadamard_rows(dev.data(), rows, n, block);
                gl::hadamard_rows_reference(ref.data(), rows, n, block);
                CHECK(std::memcmp(host.data(), dev.data(), sizeof(float) * x.size()) == 0);
                CHECK(worst_diff(dev, ref) < 1e-4);
                // The inverse (rotated values' output), bit for bit too, and back to x.
                gl::hadamard_rows_inverse(host.data(), rows, n, block);
                cuda->hadamard_rows_inverse(dev.data(), rows, n, block);
                CHECK(std::memcmp(host.data(), dev.data(), sizeof(float) * x.size()) == 0);
                CHECK(worst_diff(dev, x) < 1e-4);
            }
}

TEST_CASE("cuda rotated keys: a rotated 4-bit ring that wraps matches the CPU backend") {
    for (const char* name : {"stories260K.gguf", "synthetic/tiny-Q4_0.gguf"}) {
        auto lm = gpu_test_model(name);
        if (!lm) continue;
        const int rot = gl::hadamard_block(lm->model.hp.head_dim);
        REQUIRE(rot > 1);
        auto cuda = gl::make_cuda_backend(0);
        auto cpu = gl::make_cpu_backend(2);
        for (gl::Type t : {gl::Type::Q8_0, gl::Type::Q4_0}) {
            const auto g0 = ring_logits(*lm, *cuda, t, 0, 60),
                       c0 = ring_logits(*lm, *cpu, t, 0, 60);
            const auto g1 = ring_logits(*lm, *cuda, t, rot, 60),
                       c1 = ring_logits(*lm, *cpu, t, rot, 60);
            const double plain = worst_diff(g0, c0), rotated = worst_diff(g1, c1);
            MESSAGE(std::string(name), " ", std::string(gl::type_name(t)),
                    " keys: max |cuda - cpu| ", plain, " plain, ", rotated,
                    " rotated in blocks of ", rot);
            // The rotated ring is as close to the CPU as the plain one: the
            // kernel rotates exactly as the host does, so what differs is
            // only what the plain ring has too (sums in other orders, a
            // 4-bit rounding that falls the other way).
            CHECK(rotated <= std::max(0.05, 2 * plain));
            // And rotation changed the cache (the keys are not stored plain).
            CHECK(worst_diff(g0, g1) > 0);
        }
    }
}

TEST_CASE("cuda kv drop: rows moved in place on the host reach the device mirror") {
    auto lm = gpu_test_model("stories260K.gguf");
    if (!lm) return;
    const Hparams& hp = lm->model.hp;
    std::mt19937 rng(23);
    std::vector<int32_t> held(60), next(4);
    for (auto& t : held) t = static_cast<int32_t>(rng() % hp.n_vocab);
    for (auto& t : next) t = static_cast<int32_t>(rng() % hp.n_vocab);
    // 60 tokens on a 96-slot ring, drop [10, 35), then 4 more: logits of
    // all 4 rows, with the drop and (to show the drop mattered) without.
    auto after_drop = [&](gl::Backend& be, gl::Type t, int rotate, bool drop) {
        KvCache kv(KvCacheConfig::for_model(hp, 96, 4, t, t, rotate));
        Forward f(lm->model, kv, Placement::all(be, hp.n_layer), 16);
        for (size_t i = 0; i < held.size(); i += 16) {
            const int n = static_cast<int>(std::min<size_t>(16, held.size() - i));
            f.eval(held.data() + i, n, false);
        }
        if (drop) REQUIRE(kv.drop(10, 35, lm->model));
        const float* r = f.eval(next.data(), static_cast<int>(next.size()), true);
        return std::vector<float>(r, r + next.size() * hp.n_vocab);
    };
    auto cuda = gl::make_cuda_backend(0);
    auto cpu = gl::make_cpu_backend(2);
    const int rot = gl::hadamard_block(hp.head_dim);
    for (gl::Type t : {gl::Type::F16, gl::Type::Q8_0})
        for (int rotate : {0, rot}) {
            const auto g = after_drop(*cuda, t, rotate, true),
                       c = after_drop(*cpu, t, rotate, true);
            const double worst = worst_diff(g, c);
            MESSAGE(std::string(gl::type_name(t)), rotate ? " rotated" : "",
                    ": max |cuda - cpu| after a drop ", worst);
            CHECK(worst < 0.05);
            // A mirror that kept the rows from before the drop would be
            // this far off: the no-drop logits differ from the dropped ones.
            CHECK(worst_diff(after_drop(*cuda, t, rotate, false), g) > 10 * worst);
        }
}

TEST_CASE("cuda speculative: drafts verified on the GPU give plain GPU decoding's greedy answer") {
    auto lm = gpu_test_model("stories260K.gguf");
    if (!lm) return;
    auto cuda = gl::make_cuda_backend(0);
    const int n_layer = lm->model.hp.n_layer;
    // -c 64 and 300 tokens: the ring wraps several times.
    const std::vector<int32_t> want = greedy_answer(*lm, *cuda, 64, 300, nullptr);
    REQUIRE(want.size() == 300);
    for (int max : {3, 7, 14}) {
        CAPTURE(max);
        SpeculativeParams p;
        p.draft_max = max;
        p.timed = false; // a round every time
        {
            Speculator spec(std::make_unique<LookupDrafter>(NgramLookup{}), p);
            const auto got = greedy_answer(*lm, *cuda, 64, 300, &spec);
            const SpeculativeStats& st = spec.stats();
            MESSAGE("--lookup, draft-max ", max, ": first difference at ",
                    first_difference(want, got), " (-1: none); ", st.accepted, " of ", st.drafted,
                    " drafts kept");
            CHECK(got == want);
            CHECK(st.drafted > 0);
        }
        {
            SamplerParams greedy;
            greedy.temp = 0;
            KvCacheConfig dc =
                KvCacheConfig::for_model(lm->model.hp, 64, 4, gl::Type::F16, gl::Type::F16);
            auto drafter = std::make_unique<ModelDrafter>(*lm, dc, Placement::all(*cuda, n_layer),
                                                          32, greedy, 0.0f, "draft");
            Speculator spec(std::move(drafter), p);
            const auto got = greedy_answer(*lm, *cuda, 64, 300, &spec);
            const SpeculativeStats& st = spec.stats();
            MESSAGE("--draft-model (itself, on the GPU), draft-max ", max, ": first difference at ",
                    first_difference(want, got), "; ", st.accepted, " of ", st.drafted,
                    " drafts kept");
            CHECK(got == want);
            // The draft is the target itself: nearly every draft is kept.
            CHECK(st.accepted * 10 >= st.drafted * 9);
        }
    }
}
