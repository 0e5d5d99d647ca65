// --deterministic: a batch-invariant CPU backend gives every token the same
// logits, bit for bit, however the prompt was batched, on however many
// threads, and whether the earlier positions were evaluated in the same call,
// an earlier one, or kept in the cache and evaluated after a truncation (as a
// reused prompt cache or a chat's history is) — on models of each family and
// every KV cache type, through a window that slides.
#include <doctest/doctest.h>

#include <cstring>
#include <random>

#include "forward.h"
#include "ggml-like/cpu/gemm.h"
#include "loader.h"
#include "random_model.h"
#include "test_util.h"

using namespace kvrun;
using kvtest::random_model;
using kvtest::Shape;

namespace {

constexpr int kCtx = 64, kKeep = 4, kPrompt = 60, kTotal = 110;

struct Run {
    int threads = 2;
    int batch = kPrompt; // prompt tokens per eval
    int restart_at =
        -1; // truncate the cache to this many tokens after the prompt and redo the rest
    bool invariant = true;
};

// Logits of every position: the prompt's rows, then one generated token at a
// time (eval_generated) until the window has slid well past n_ctx.
std::vector<float> logits_of(const Model& m, gl::Type kv_type, const std::vector<int32_t>& toks,
                             const Run& r) {
    auto be = gl::make_cpu_backend(r.threads, r.invariant);
    KvCache kv(KvCacheConfig::for_model(m.hp, kCtx, kKeep, kv_type, kv_type));
    Forward fwd(m, kv, *be, kPrompt);
    const size_t nv = static_cast<size_t>(m.hp.n_vocab);
    std::vector<float> out(nv * kTotal);
    auto prompt = [&](int from) {
        for (int i = from; i < kPrompt;) {
            const int n = std::min(r.batch, kPrompt - i);
            const float* rows = fwd.eval(&toks[i], n, true);
            std::memcpy(out.data() + i * nv, rows, sizeof(float) * nv * n);
            i += n;
        }
    };
    prompt(0);
    if (r.restart_at >= 0) {
        // A wrapped sliding-window ring keeps too little to go back far.
        if (!kv.truncate(r.restart_at)) return {};
        prompt(r.restart_at);
    }
    for (int i = kPrompt; i < kTotal; i++)
        std::memcpy(out.data() + i * nv, fwd.eval_generated(toks[i]), sizeof(float) * nv);
    return out;
}

// The first position whose logits differ from `want`'s in any bit, or -1.
int first_difference(const std::vector<float>& want, const std::vector<float>& got, size_t nv) {
    for (int i = 0; i < kTotal; i++)
        if (std::memcmp(want.data() + i * nv, got.data() + i * nv, sizeof(float) * nv) != 0)
            return i;
    return -1;
}

void check_invariance(const Model& m, const std::string& model, gl::Type kv_type) {
    std::vector<int32_t> toks(kTotal);
    std::mt19937 rng(11);
    for (auto& t : toks) t = static_cast<int32_t>(rng() % 512);
    const size_t nv = static_cast<size_t>(m.hp.n_vocab);
    const std::string what = model + ", " + gl::type_name(kv_type) + " KV";
    const std::vector<float> want = logits_of(m, kv_type, toks, {});
    const Run runs[] = {
        {2, 16, -1, true}, {2, 7, -1, true},       {2, 1, -1, true}, {1, kPrompt, -1, true},
        {3, 16, -1, true}, {2, kPrompt, 23, true}, {3, 5, 41, true}, {2, 16, kPrompt - 1, true},
    };
    for (const Run& r : runs) {
        CAPTURE(what);
        CAPTURE(r.threads);
        CAPTURE(r.batch);
        CAPTURE(r.restart_at);
        const std::vector<float> got = logits_of(m, kv_type, toks, r);
        if (got.empty()) {
            // Only the far restarts may be refused, and any restart where a
            // recurrent state (Qwen 3.5) holds the positions after it.
            CHECK((r.restart_at < kPrompt - 1 || !m.hp.recurrent_layers.empty()));
            continue;
        }
        CHECK(first_difference(want, got, nv) == -1);
    }
    // What the mode is for: the default path is free to differ (tiled
    // prompt matmuls, split decode attention, half-precision products).
    const int d = first_difference(logits_of(m, kv_type, toks, {2, kPrompt, -1, false}),
                                   logits_of(m, kv_type, toks, {2, 1, -1, false}), nv);
    MESSAGE(what, ": default mode, -b ", kPrompt, " vs -b 1: first differing position ", d);
}

void check_invariance(const Shape& s, gl::Type kv_type) {
    const std::vector<uint8_t> bytes = random_model(s, 4321);
    GgufFile f = GgufFile::parse(bytes.data(), bytes.size(), "random");
    Model m = Model::load(f);
    check_invariance(m, std::string(s.arch) + " " + gl::type_name(s.wtype) + " weights", kv_type);
}

} // namespace

TEST_CASE("deterministic: logits are bit-identical whatever the batching, threads or cache reuse") {
    for (gl::Type kv :
         {gl::Type::F16, gl::Type::F32, gl::Type::BF16, gl::Type::Q8_0, gl::Type::Q4_0}) {
        check_invariance({"llama", 128, 4, 2, 96, 2, gl::Type::Q8_0}, kv);
    }
    check_invariance({"qwen2", 128, 8, 2, 96, 2, gl::Type::Q4_0}, gl::Type::F16);
    check_invariance({"phi3", 128, 4, 4, 96, 2, gl::Type::F16}, gl::Type::F16);
    // Sliding-window layers with their own small rings (wrapped many times).
    check_invariance({"gemma3", 128, 4, 1, 96, 6, gl::Type::Q8_0}, gl::Type::F16);
    check_invariance({"gemma3", 128, 4, 1, 96, 6, gl::Type::Q8_0}, gl::Type::Q8_0);
    // Gemma 4: window layers with heads of their own size (rings of 8, wrapped
    // many times), the last two layers reading layers 2 and 3's slots, V = K.
    const auto g4 = LoadedModel::load(kvtest::shared("models/next/tiny-gemma4-Q4_K_M.gguf"));
    for (gl::Type kv : {gl::Type::F16, gl::Type::Q8_0})
        check_invariance(g4->model, "tiny-gemma4", kv);
    // Qwen 3.5: six Gated DeltaNet layers carrying their state, two gated
    // attention layers.
    const auto q35 = LoadedModel::load(kvtest::shared("models/next/tiny-qwen35-Q4_K_M.gguf"));
    check_invariance(q35->model, "tiny-qwen35", gl::Type::F16);
    // Mixtures of experts: a batch's tokens share experts (each expert's
    // rows multiplied once for all its tokens), one at a time they do not.
    for (const char* moe : {"tiny-qwen3moe", "tiny-qwen35moe"}) {
        const auto lm =
            LoadedModel::load(kvtest::shared(std::string("models/next/") + moe + "-Q4_K_M.gguf"));
        check_invariance(lm->model, moe, gl::Type::F16);
    }
}
