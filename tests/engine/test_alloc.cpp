// Generating a token allocates nothing: every buffer is sized up front.
// Checked with a counting global operator new over the decode loop.
#include <doctest/doctest.h>

#include <atomic>
#include <cstdlib>
#include <new>

#include "forward.h"
#include "sampler.h"
#include "loader.h"
#include "test_util.h"

// Under AddressSanitizer the runtime owns operator new/delete (memory from its
// new must not reach our free), so the counting replacement is only compiled
// in plain builds; the sanitizer build skips this test.
#if defined(__SANITIZE_ADDRESS__)
#define KVRUN_COUNTING_NEW 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KVRUN_COUNTING_NEW 0
#endif
#endif
#ifndef KVRUN_COUNTING_NEW
#define KVRUN_COUNTING_NEW 1
#endif

namespace {
std::atomic<bool> g_counting{false};
std::atomic<long> g_allocations{0};
} // namespace

#if KVRUN_COUNTING_NEW
void* operator new(std::size_t n) {
    if (g_counting.load(std::memory_order_relaxed)) g_allocations.fetch_add(1, std::memory_order_relaxed);
    if (void* p = std::malloc(n ? n : 1)) return p;
    throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return operator new(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
#endif

using namespace kvrun;

TEST_CASE("decode: zero heap allocations per generated token") {
    if (!KVRUN_COUNTING_NEW) {
        MESSAGE("skipped: the counting allocator is not used under AddressSanitizer");
        return;
    }
    for (const char* model : {"models/stories260K.gguf", "models/synthetic/tiny-Q4_K_M.gguf"}) {
        auto lm = LoadedModel::load(kvtest::shared(model));
        const Hparams& hp = lm->model.hp;
        // -c 48: the loop below slides the window too
        KvCache kv({hp.n_layer, hp.n_head_kv, hp.head_dim, 48, 4, gl::Type::F16, gl::Type::F16});
        auto be = gl::make_cpu_backend(2);
        Forward fwd(lm->model, kv, *be, 16);
        SamplerParams sp;
        sp.seed = 1;
        Sampler sampler(sp, hp.n_vocab);
        std::vector<float> row(hp.n_vocab);
        const std::vector<int32_t> prompt = lm->tokenizer.encode("Once upon a time", true, true);
        const float* logits = fwd.eval(prompt.data(), static_cast<int>(prompt.size()), false);
        int32_t tok = 0;
        for (int warm = 0; warm < 2; warm++) { // first calls may size lazily
            std::copy(logits, logits + hp.n_vocab, row.begin());
            tok = sampler.sample(row.data());
            logits = fwd.eval(&tok, 1, false);
        }
        g_allocations = 0;
        g_counting = true;
        for (int i = 0; i < 64; i++) {
            std::copy(logits, logits + hp.n_vocab, row.begin());
            tok = sampler.sample(row.data());
            logits = fwd.eval(&tok, 1, false);
        }
        g_counting = false;
        INFO(std::string(model));
        CHECK(g_allocations.load() == 0);
        CHECK(kv.n_past() > 48); // the ring wrapped during the counted loop
    }
}
