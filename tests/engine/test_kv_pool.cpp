// The block pool (src/engine/kv_pool.h) under sequences that come and go:
// each sequence's slots read back exactly what a plain per-sequence array
// of its positions holds, whether its blocks were its own, attached from
// the prefix index (a running sequence's or one left behind), copied on
// write when its ring wrapped over a shared block, or evicted and made
// again; the pool's reference counts and free blocks agree with the
// sequences' tables after every step.
#include <doctest/doctest.h>

#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "kv_cache.h"
#include "kv_pool.h"

using namespace kvrun;

namespace {

// The K (or V) row of layer l at position p of a sequence: a function of
// every token up to p, as a model's would be, so sequences with the same
// prefix have the same rows there.
std::vector<uint8_t> row_of(const std::vector<int32_t>& tokens, int64_t p, int l, bool v,
                            size_t bytes) {
    uint64_t h = 1469598103934665603ull ^ (static_cast<uint64_t>(l) * 2 + v);
    for (int64_t i = 0; i <= p; i++) h = (h ^ static_cast<uint32_t>(tokens[i])) * 1099511628211ull;
    std::vector<uint8_t> r(bytes);
    for (size_t i = 0; i < bytes; i++) {
        h = h * 6364136223846793005ull + 1442695040888963407ull;
        r[i] = static_cast<uint8_t>(h >> 56);
    }
    return r;
}

struct Seq {
    std::unique_ptr<KvCache> kv;
    std::vector<int32_t> tokens; // every position's token so far (more may be appended)
    int64_t end = 0;             // leaves at this many positions
};

} // namespace

TEST_CASE("kv pool: sequences sharing prefix blocks read what plain per-sequence arrays hold "
          "through arrivals, evictions, copies on write and sliding") {
    for (const int variant : {0, 1, 2}) {
        const bool head_major = variant == 1;
        CAPTURE(variant);
        // 96 slots (3 blocks) a sequence; 8 blocks for at most 2 at once:
        // prefixes left behind are evicted for new sequences' blocks.
        // Variant 2: layer 1 a sliding-window layer of 40 slots (2 blocks of
        // their own kind, 5 in all), as Gemma 3's: a prefix is shared while
        // within 40 tokens, and a window ring wraps long before the global one.
        KvCacheConfig cfg{2, 2, 8, 96, 4, gl::Type::F16, gl::Type::F16};
        if (variant == 2) {
            cfg.swa_window = 40;
            cfg.swa_layers = {0, 1};
        }
        auto pool = std::make_shared<KvPool>(cfg, KvPool::Blocks{8, variant == 2 ? 5 : 0});
        pool->set_head_major(head_major);
        std::mt19937 rng(7);
        // Three "system prompts" of 40-75 tokens from a small alphabet.
        std::vector<std::vector<int32_t>> systems;
        for (int i = 0; i < 3; i++) {
            std::vector<int32_t> s(40 + rng() % 36);
            for (int32_t& t : s) t = static_cast<int32_t>(rng() % 5);
            systems.push_back(s);
        }
        std::vector<Seq> live;
        int64_t attached = 0, wrapped = 0, started = 0;
        for (int step = 0; step < 400; step++) {
            if (live.size() < 2 && rng() % 3 == 0) { // a new sequence
                Seq s;
                s.kv = std::make_unique<KvCache>(cfg, pool);
                s.tokens = systems[rng() % 3];
                const int tail = 1 + static_cast<int>(rng() % 20);
                for (int i = 0; i < tail; i++) s.tokens.push_back(static_cast<int32_t>(rng() % 5));
                s.end = static_cast<int64_t>(s.tokens.size()) + 1 + rng() % 120; // may pass 96
                const int64_t m = s.kv->attach_prefix(s.tokens);
                CHECK(m < static_cast<int64_t>(s.tokens.size()));
                CHECK(s.kv->n_past() == m);
                attached += m;
                started++;
                live.push_back(std::move(s));
            }
            // Each sequence's next batch of 1-20 positions.
            for (Seq& s : live) {
                KvCache& kv = *s.kv;
                const int64_t p0 = kv.n_past();
                const int n = static_cast<int>(std::min<int64_t>(1 + rng() % 20, s.end - p0));
                while (static_cast<int64_t>(s.tokens.size()) < p0 + n)
                    s.tokens.push_back(static_cast<int32_t>(rng() % 5));
                REQUIRE(kv.reserve(p0, n));
                for (int l = 0; l < cfg.n_layer; l++) {
                    const size_t rk = kv.row_bytes_k(l), rv = kv.row_bytes_v(l);
                    std::vector<uint8_t> k, v;
                    for (int i = 0; i < n; i++) {
                        const auto kr = row_of(s.tokens, p0 + i, l, false, rk);
                        const auto vr = row_of(s.tokens, p0 + i, l, true, rv);
                        k.insert(k.end(), kr.begin(), kr.end());
                        v.insert(v.end(), vr.begin(), vr.end());
                    }
                    kv.write(l, p0, n, k.data(), v.data());
                }
                kv.commit(p0, n);
                wrapped += p0 + n > cfg.n_ctx;
                kv.publish_prefix(s.tokens);
            }
            // Every sequence's slots hold its own positions' rows.
            for (const Seq& s : live) {
                const KvCache& kv = *s.kv;
                for (int l = 0; l < cfg.n_layer; l++) {
                    const size_t rk = kv.row_bytes_k(l), rv = kv.row_bytes_v(l);
                    std::vector<uint8_t> kv_row; // its K row, then its V row
                    int wrong = 0;
                    for (int sl = 0; sl < kv.slots(l); sl++) {
                        const int64_t p = kv.slot_pos(l)[sl];
                        if (p < 0) continue;
                        kv.save_slots(l, p, 1, kv_row);
                        std::vector<uint8_t> want = row_of(s.tokens, p, l, false, rk);
                        const std::vector<uint8_t> v = row_of(s.tokens, p, l, true, rv);
                        want.insert(want.end(), v.begin(), v.end());
                        wrong += kv_row != want;
                    }
                    CHECK(wrong == 0);
                }
            }
            // The pool's counts are the tables'.
            for (int kind = 0; kind < KvPool::kKinds; kind++) {
                int64_t refs = 0, held = 0, tables = 0;
                for (int32_t b = 0; b < pool->blocks(kind); b++) {
                    refs += pool->refs(kind, b);
                    held += pool->refs(kind, b) > 0;
                }
                for (const Seq& s : live) tables += s.kv->held_blocks(kind);
                CHECK(refs == tables);
                CHECK(held == pool->held_blocks(kind));
                CHECK(pool->free_blocks(kind) == pool->blocks(kind) - held);
            }
            // Leave at the end.
            for (size_t i = 0; i < live.size();)
                if (live[i].kv->n_past() >= live[i].end) {
                    live[i].kv->clear();
                    CHECK(live[i].kv->held_blocks(0) == 0);
                    live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
                } else {
                    i++;
                }
        }
        CHECK(started > 10);
        CHECK(attached > 0); // prefixes were found
        CHECK(wrapped > 0);  // rings slid over their (possibly shared) first block
        live.clear();
        CHECK(pool->held_blocks(0) == 0);
        CHECK(pool->held_blocks(1) == 0);
        CHECK(pool->prefixes() > 0);
    }
}

TEST_CASE("kv pool: a prefix N sequences share is stored once; a full pool gives no block") {
    const KvCacheConfig cfg{1, 1, 16, 128, 4, gl::Type::F32, gl::Type::F32};
    auto pool = std::make_shared<KvPool>(cfg, KvPool::Blocks{8, 0});
    std::vector<int32_t> prompt(100);
    for (int i = 0; i < 100; i++) prompt[i] = i;
    std::vector<std::unique_ptr<KvCache>> seqs;
    std::vector<uint8_t> rows(100 * 64 * 2, 1);
    for (int i = 0; i < 4; i++) {
        auto kv = std::make_unique<KvCache>(cfg, pool);
        const int64_t m = kv->attach_prefix(prompt);
        CHECK(m == (i == 0 ? 0 : 96)); // 3 whole blocks of the 99 before the last token
        const int n = 100 - static_cast<int>(m);
        REQUIRE(kv->reserve(m, n));
        kv->write(0, m, n, rows.data(), rows.data());
        kv->commit(m, n);
        kv->publish_prefix(prompt);
        seqs.push_back(std::move(kv));
    }
    // 4 blocks for the first (3 whole, 1 partial), 1 each for the others' last 4 tokens.
    CHECK(pool->held_blocks(0) == 4 + 3);
    CHECK(pool->refs(0, 0) == 4);
    // A prompt that leaves the prefix 16 tokens into block 2: blocks 0 and 1
    // shared, block 2 a copy of the indexed one (its first 16 positions).
    std::vector<int32_t> other(prompt.begin(), prompt.begin() + 80);
    for (int i = 0; i < 10; i++) other.push_back(1000 + i);
    auto part = std::make_unique<KvCache>(cfg, pool);
    CHECK(part->attach_prefix(other) == 80);
    CHECK(pool->refs(0, 0) == 5);
    CHECK(pool->refs(0, 2) == 4); // not held: copied
    CHECK(pool->held_blocks(0) == 8);
    std::vector<uint8_t> row(2 * 64);
    part->save_slots(0, 79, 1, row);
    CHECK(row == std::vector<uint8_t>(2 * 64, 1));
    part->clear();
    auto more = std::make_unique<KvCache>(cfg, pool);
    CHECK(more->reserve(0, 32)); // the last free block
    more->commit(0, 32);
    CHECK_FALSE(more->reserve(32, 1)); // none left, nothing to evict: a plain false
    seqs.clear();                      // the three prefix blocks stay indexed
    more->clear();
    auto again = std::make_unique<KvCache>(cfg, pool);
    CHECK(again->attach_prefix(prompt) == 96);
}
