// Per-layer KV rings (Gemma 3): sliding-window layers hold min(window, n_ctx)
// slots and no sinks, global layers n_ctx slots with sinks. Their sizes
// against the formula, what truncation may keep, and prompt-cache files
// whose small rings have wrapped.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <unistd.h>

#include "forward.h"
#include "prompt_cache.h"
#include "random_model.h"

using namespace kvrun;

namespace {

// 6 layers, every third global (the pattern random_model gives gemma3).
KvCacheConfig six_layers(int n_ctx, int window, gl::Type t = gl::Type::F16) {
    KvCacheConfig c{6, 2, 16, n_ctx, 4, t, t};
    c.swa_window = window;
    c.swa_layers = {1, 1, 0, 1, 1, 0};
    return c;
}

} // namespace

TEST_CASE("kv layers: slots and bytes per layer kind against the formula") {
    const size_t row = 2 * 2 * 16 * sizeof(uint16_t); // K + V, 2 heads of 16, f16
    SUBCASE("context larger than the window") {
        KvCache kv(six_layers(48, 8));
        for (int l = 0; l < 6; l++) CHECK(kv.slots(l) == (l % 3 == 2 ? 48 : 8));
        CHECK(kv.ring_bytes() == (2 * 48 + 4 * 8) * row);
        CHECK(KvCache::bytes_per_token(kv.config()) == 6 * row);
        CHECK(KvCache::bytes_at_depth(kv.config(), 5) == 6 * 5 * row);
        CHECK(KvCache::bytes_at_depth(kv.config(), 20) == (2 * 20 + 4 * 8) * row);
        gl::AttentionArgs swa, global;
        kv.attention_slots(0, swa);
        kv.attention_slots(2, global);
        CHECK(swa.n_ctx == 8);
        CHECK(swa.n_sink == 0);
        CHECK(swa.window == 8);
        CHECK(swa.sink_k == nullptr);
        CHECK(global.n_ctx == 48);
        CHECK(global.n_sink == 4);
        CHECK(global.window == 44);
    }
    SUBCASE(
        "context smaller than the window: every ring holds n_ctx, sinks only on global layers") {
        KvCache kv(six_layers(6, 8));
        for (int l = 0; l < 6; l++) CHECK(kv.slots(l) == 6);
        CHECK(kv.ring_bytes() == 6 * 6 * row);
        CHECK(kv.config().keep_of(0) == 0);
        CHECK(kv.config().keep_of(2) == 4);
    }
    SUBCASE("max_ctx_for_bytes inverts ring_bytes_for, below and above the window") {
        for (int n : {2, 7, 8, 9, 48, 1000, 32768}) {
            const KvCacheConfig c = six_layers(n, 8);
            CHECK(KvCache::max_ctx_for_bytes(c, KvCache::ring_bytes_for(c)) == n);
            CHECK(KvCache::max_ctx_for_bytes(c, KvCache::ring_bytes_for(c) - 1) == n - 1);
        }
    }
}

TEST_CASE("kv layers: truncation keeps what a query at the new end attends") {
    KvCache kv(six_layers(48, 8));
    kv.commit(0, 20); // positions only: truncate() looks at nothing else
    // The small rings hold 12 .. 19; a query at 19 sees 12 .. 19.
    CHECK(kv.slot_pos(0)[kv.slot_of(0, 12)] == 12);
    CHECK(kv.truncate(19));
    CHECK(kv.n_past() == 19);
    CHECK(kv.slot_pos(0)[kv.slot_of(0, 19)] == -1);
    // A query at 15 would need 8 .. 14, of which 8 .. 11 are overwritten.
    CHECK_FALSE(kv.truncate(15));
    CHECK(kv.n_past() == 19);
    // Uniform rings: any point before the first wrap.
    KvCache flat({6, 2, 16, 48, 4, gl::Type::F16, gl::Type::F16});
    flat.commit(0, 30);
    CHECK(flat.truncate(3));
    flat.commit(3, 60); // wraps: 63 tokens in 48 slots
    CHECK(flat.truncate(62));
    CHECK_FALSE(flat.truncate(40));
}

TEST_CASE("kv layers: prompt-cache files of wrapped sliding-window rings") {
    const std::vector<uint8_t> bytes =
        kvtest::random_model({"gemma3", 64, 4, 2, 96, 6, gl::Type::F32}, 5);
    GgufFile f = GgufFile::parse(bytes.data(), bytes.size(), "gemma3");
    Model m = Model::load(f);
    auto be = gl::make_cpu_backend(2);
    const KvCacheConfig cfg = KvCacheConfig::for_model(m.hp, 64, 4, gl::Type::F32, gl::Type::F32);
    std::vector<int32_t> toks(40);
    std::mt19937 rng(3);
    for (auto& t : toks) t = static_cast<int32_t>(rng() % 512);
    const std::string path = "kv_layers_" + std::to_string(::getpid()) + ".kvpc";

    // 30 tokens saved: the 8-slot rings have wrapped three times.
    {
        KvCache kv(cfg);
        Forward fwd(m, kv, *be, 16);
        fwd.eval(toks.data(), 16, false);
        fwd.eval(toks.data() + 16, 14, false);
        save_prompt_cache(path, 1, kv, std::vector<int32_t>(toks.begin(), toks.begin() + 30));
    }
    // Logits of a prompt evaluated in full against one resumed from the file.
    auto last_logits = [&](const std::vector<int32_t>& prompt, bool from_file,
                           PromptCacheLoad* how) {
        KvCache kv(cfg);
        Forward fwd(m, kv, *be, 16);
        int64_t done = 0;
        if (from_file) {
            *how = load_prompt_cache(path, 1, kv, prompt, m);
            if (!how->ok) return std::vector<float>();
            done = how->reused;
        }
        const float* row = nullptr;
        for (int64_t i = done; i < static_cast<int64_t>(prompt.size());) {
            const int n =
                static_cast<int>(std::min<int64_t>(16, static_cast<int64_t>(prompt.size()) - i));
            row = fwd.eval(prompt.data() + i, n, false);
            i += n;
        }
        return std::vector<float>(row, row + m.hp.n_vocab);
    };
    auto max_diff = [](const std::vector<float>& a, const std::vector<float>& b) {
        double d = 0;
        for (size_t i = 0; i < a.size(); i++)
            d = std::max(d, std::abs(static_cast<double>(a[i]) - b[i]));
        return d;
    };
    SUBCASE("a longer prompt resumes after all 30 tokens") {
        PromptCacheLoad how;
        const std::vector<float> got = last_logits(toks, true, &how);
        REQUIRE(how.ok);
        CHECK(how.reused == 30);
        CHECK(max_diff(got, last_logits(toks, false, nullptr)) < 1e-4);
    }
    SUBCASE("parting one token back is still within every ring") {
        std::vector<int32_t> p(toks.begin(), toks.begin() + 29);
        p.push_back((toks[29] + 1) % 512);
        p.push_back(toks[30]);
        PromptCacheLoad how;
        const std::vector<float> got = last_logits(p, true, &how);
        REQUIRE(how.ok);
        CHECK(how.reused == 29);
        CHECK(max_diff(got, last_logits(p, false, nullptr)) < 1e-4);
    }
    SUBCASE("parting further back than the window is refused, with the reason") {
        std::vector<int32_t> p(toks.begin(), toks.begin() + 20);
        p.push_back((toks[20] + 1) % 512);
        PromptCacheLoad how;
        last_logits(p, true, &how);
        CHECK_FALSE(how.ok);
        CHECK(how.why.find("sliding-window") != std::string::npos);
    }
    std::remove(path.c_str());
}
