// Partial attention and its log-sum-exp merge (attention.h), the arithmetic
// of the hot/cold KV split (--kv-gpu-window): the keys of a call cut into
// disjoint subsets at arbitrary points -- by slot index, by position (which
// crosses the ring's wrap), sinks apart -- attended separately and merged in
// any order must equal the whole attention.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "ggml-like/attention.h"
#include "ggml-like/cpu/gemm.h"
#include "ggml-like/kernels.h"
#include "attention_problem.h"
#include "ggml-like/cpu/thread_pool.h"

using gl::Type;

namespace {

using Case = kvtest::AttentionCase;
using Problem = kvtest::AttentionProblem;

struct Part {
    std::vector<float> out, lse;
};

Part partial(gl::ThreadPool& pool, Problem& p, const gl::KeySubset& keys) {
    Part r;
    r.out.assign(p.out.size(), NAN);
    r.lse.assign(static_cast<size_t>(p.c.n_tok) * p.c.n_head, NAN);
    gl::AttentionArgs a = p.a;
    a.out = r.out.data();
    gl::attention_partial(pool, a, keys, r.lse.data());
    return r;
}

// Merge parts in the given order; compare with the whole attention.
double merged_error(const Problem& p, const std::vector<float>& want, std::vector<Part> parts,
                    const std::vector<int>& order) {
    Part acc = parts[order[0]];
    for (size_t i = 1; i < order.size(); i++) {
        const Part& o = parts[order[i]];
        gl::attention_merge(p.c.n_tok, p.c.n_head, p.c.head_dim, acc.out.data(), acc.lse.data(),
                            o.out.data(), o.lse.data());
    }
    return kvtest::max_abs_diff(acc.out, want);
}

const Case kCases[] = {
    // n_tok heads kv hd n_ctx sink past   K          V
    {1, 4, 2, 8, 32, 4, 20, Type::F32, Type::F32},      // ring not yet full
    {1, 6, 2, 7, 40, 4, 137, Type::F16, Type::F16},     // wrapped many times, GQA 3:1, odd head_dim
    {5, 6, 2, 7, 40, 4, 38, Type::F16, Type::F32},      // batch crossing the wrap
    {3, 4, 4, 5, 24, 0, 61, Type::BF16, Type::F16},     // no sinks (sliding-window model)
    {1, 64, 32, 3, 48, 4, 300, Type::Q8_0, Type::Q4_0}, // odd head_dim 3 inside quantized blocks
    {7, 8, 2, 48, 64, 4, 9, Type::Q8_0, Type::Q8_0},    // batch not slid, partly filled
    {4, 4, 1, 33, 50, 2, 199, Type::F32, Type::BF16},   // MQA, odd head_dim 33
};

} // namespace

TEST_CASE("attention split: partials over slot and position subsets merge to the whole") {
    gl::ThreadPool pool(2);
    uint32_t seed = 1;
    for (const Case& c : kCases) {
        CAPTURE(c.n_tok);
        CAPTURE(c.head_dim);
        CAPTURE(c.n_ctx);
        CAPTURE(c.past);
        Problem p(c, seed++);
        gl::attention(pool, p.a);
        const std::vector<float> want = p.out;
        for (float x : want) REQUIRE(std::isfinite(x));

        // The whole set as one "partial" equals attention().
        {
            const Part all = partial(pool, p, gl::KeySubset{});
            double worst = 0;
            for (size_t i = 0; i < want.size(); i++)
                worst = std::max(worst, std::abs(static_cast<double>(all.out[i]) - want[i]));
            CHECK(worst == 0);
            for (float l : all.lse) CHECK(std::isfinite(l));
        }

        // Two parts cut at every slot index: slots [0, k) and [k, n_ctx) + the batch.
        for (int k = 0; k <= c.n_ctx; k++) {
            gl::KeySubset lo, hi;
            lo.slot_end = k;
            lo.with_new = false;
            hi.slot_begin = k;
            const std::vector<Part> parts = {partial(pool, p, lo), partial(pool, p, hi)};
            CAPTURE(k);
            CHECK(merged_error(p, want, parts, {0, 1}) < 1e-5);
            CHECK(merged_error(p, want, parts, {1, 0}) < 1e-5);
        }

        // The hot/cold split by position: sinks, cold [n_sink, pos0 - W), hot
        // [pos0 - W, ...) with the batch. The cold range wraps around the ring.
        const int64_t pos0 = c.past;
        for (int64_t w : {int64_t{0}, int64_t{1}, int64_t{3}, int64_t{c.n_ctx / 2},
                          int64_t{c.n_ctx - c.n_sink - 1}, int64_t{c.n_ctx}}) {
            const int64_t cut = std::max<int64_t>(c.n_sink, pos0 - w);
            gl::KeySubset sinks, cold, hot;
            sinks.pos_end = c.n_sink;
            sinks.with_new = false;
            cold.pos_begin = c.n_sink;
            cold.pos_end = cut;
            cold.with_new = false;
            hot.pos_begin = cut;
            const std::vector<Part> parts = {partial(pool, p, sinks), partial(pool, p, cold),
                                             partial(pool, p, hot)};
            CAPTURE(w);
            for (const std::vector<int>& order :
                 std::vector<std::vector<int>>{{0, 1, 2}, {2, 1, 0}, {1, 2, 0}, {2, 0, 1}})
                CHECK(merged_error(p, want, parts, order) < 1e-5);
        }

        // Three slot ranges whose middle one straddles the slot of the newest cached token.
        if (c.past > 0) {
            const int64_t newest = pos0 - 1;
            const int s = static_cast<int>(
                newest < c.n_sink ? newest : c.n_sink + (newest - c.n_sink) % (c.n_ctx - c.n_sink));
            const int a = std::max(0, s - 2), b = std::min(c.n_ctx, s + 3);
            gl::KeySubset r0, r1, r2;
            r0.slot_end = a;
            r0.with_new = false;
            r1.slot_begin = a;
            r1.slot_end = b;
            r1.with_new = false;
            r2.slot_begin = b;
            const std::vector<Part> parts = {partial(pool, p, r0), partial(pool, p, r1),
                                             partial(pool, p, r2)};
            CHECK(merged_error(p, want, parts, {0, 1, 2}) < 1e-5);
            CHECK(merged_error(p, want, parts, {2, 0, 1}) < 1e-5);
        }
    }
}

TEST_CASE("attention split: an empty subset gives -inf and zeros, and merges as nothing") {
    gl::ThreadPool pool(1);
    Problem p({2, 4, 2, 8, 16, 2, 30, Type::F16, Type::F16}, 99);
    gl::KeySubset none;
    none.slot_end = 0;
    none.with_new = false;
    const Part empty = partial(pool, p, none);
    for (float l : empty.lse) CHECK(l == -std::numeric_limits<float>::infinity());
    for (float x : empty.out) CHECK(x == 0.0f);
    gl::attention(pool, p.a);
    const std::vector<float> want = p.out;
    const Part all = partial(pool, p, gl::KeySubset{});
    CHECK(merged_error(p, want, {empty, all}, {0, 1}) == 0);
    CHECK(merged_error(p, want, {empty, all}, {1, 0}) == 0);
    // A position window past every key is empty too.
    gl::KeySubset later;
    later.pos_begin = std::numeric_limits<int64_t>::max() - 1;
    const Part none2 = partial(pool, p, later);
    for (float l : none2.lse) CHECK(l == -std::numeric_limits<float>::infinity());
}

TEST_CASE("attention: key splits over many threads equal one thread") {
    // With fewer (token, head group) items than threads the ring is cut
    // into slot ranges attended in parallel and merged (attend_all). Rings
    // long enough to split, wrapped with sinks or not yet full, decode and
    // small batches, GQA and MQA, every float cache type; also a partial
    // call (a subset of keys with its log-sum-exp), which splits the subset.
    const Case cases[] = {
        {1, 32, 4, 64, 4096, 4, 9000, Type::F16, Type::F16},  // TinyLlama shape, wrapped
        {1, 14, 2, 64, 2048, 4, 1500, Type::F32, Type::BF16}, // Qwen2.5-0.5B-like, not full
        {2, 8, 1, 33, 2048, 0, 5000, Type::BF16, Type::F16},  // MQA, no sinks, 2 tokens
        {1, 6, 2, 7, 300, 4, 100, Type::F16, Type::F16},      // too short to split
        {1, 8, 1, 64, 2048, 4, 0, Type::F16, Type::F16},      // empty ring: only the new key
        {1, 8, 1, 64, 4096, 0, 300, Type::F16, Type::F16},    // 7% full: splits by filled slots
    };
    uint32_t seed = 4242;
    gl::ThreadPool one(1), many(7);
    for (const Case& c : cases) {
        INFO("n_tok ", c.n_tok, " heads ", c.n_head, "/", c.n_head_kv, " hd ", c.head_dim,
             " n_ctx ", c.n_ctx, " past ", c.past);
        Problem p1(c, seed), p7(c, seed);
        seed++;
        p7.scratch.resize(gl::attention_scratch_floats(7, c.n_ctx, c.n_tok,
                                                       c.n_head_kv * c.head_dim, c.head_dim));
        p7.a.scratch = p7.scratch.data();
        gl::attention(one, p1.a);
        gl::attention(many, p7.a);
        CHECK(kvtest::max_abs_diff(p7.out, p1.out) < 1e-5);
        // A subset (positions from the middle on), with its lse.
        gl::KeySubset keys;
        keys.pos_begin = c.past / 3;
        const Part w1 = partial(one, p1, keys), w7 = partial(many, p7, keys);
        CHECK(kvtest::max_abs_diff(w7.out, w1.out) < 1e-5);
        CHECK(kvtest::max_abs_diff(w7.lse, w1.lse) < 1e-4);
    }
}

TEST_CASE("attention: head-major slots (keys in tiles) give the output of rows") {
    // KvCache::set_head_major stores keys as key tiles per KV head and values
    // [kv head][slot][head_dim]; the args describe it with head and slot
    // strides. The values are the same; the scores are summed in another
    // order (dot_tile), so within float rounding of the row layout. Rings of
    // whole and partial last tiles; subsets that start and end mid-tile.
    const Case cases[] = {
        {1, 32, 4, 64, 4096, 4, 9000, Type::F16, Type::F16},  // TinyLlama shape, wrapped
        {1, 6, 2, 7, 40, 4, 137, Type::F16, Type::F16},       // odd head_dim, GQA 3:1
        {5, 6, 2, 7, 40, 4, 38, Type::F16, Type::F32},        // batch crossing the wrap
        {3, 4, 4, 5, 24, 0, 61, Type::BF16, Type::F16},       // no sinks
        {4, 4, 1, 33, 50, 2, 199, Type::F32, Type::BF16},     // MQA, odd head_dim 33
        {1, 14, 2, 64, 2048, 4, 1500, Type::F32, Type::BF16}, // not full, splits
        {2, 18, 1, 16, 37, 3, 90, Type::F16,
         Type::F16}, // 18 heads to one KV head: sub-groups 8, 8, 2
    };
    uint32_t seed = 777;
    for (int threads : {1, 7}) {
        gl::ThreadPool pool(threads);
        for (const Case& c : cases) {
            INFO("threads ", threads, " n_tok ", c.n_tok, " heads ", c.n_head, "/", c.n_head_kv,
                 " hd ", c.head_dim, " n_ctx ", c.n_ctx);
            Problem rows(c, seed), heads(c, seed);
            seed++;
            for (Problem* p : {&rows, &heads}) {
                p->scratch.resize(gl::attention_scratch_floats(
                    threads, c.n_ctx, c.n_tok, c.n_head_kv * c.head_dim, c.head_dim));
                p->a.scratch = p->scratch.data();
            }
            const kvtest::HeadMajorSlots hm(heads);
            gl::attention(pool, rows.a);
            gl::attention(pool, heads.a);
            CHECK(kvtest::max_abs_diff(heads.out, rows.out) < 1e-5);
            // And partial calls over subsets, with their lse: by position
            // (crossing the wrap), and by slot from mid-tile to mid-tile.
            gl::KeySubset by_pos, by_slot;
            by_pos.pos_begin = c.past / 3;
            by_slot.slot_begin = 5;
            by_slot.slot_end = c.n_ctx - 3;
            for (const gl::KeySubset& keys : {by_pos, by_slot}) {
                const Part pr = partial(pool, rows, keys), ph = partial(pool, heads, keys);
                CHECK(kvtest::max_abs_diff(ph.out, pr.out) < 1e-5);
                CHECK(kvtest::max_abs_diff(ph.lse, pr.lse) < 1e-5);
            }
        }
    }
}

TEST_CASE("attention: prompt batches on AMX tiles match the F32 path") {
    // F16 caches, head-major, batches of 16+ tokens that do not slide: the
    // AMX path (hi/lo bf16 products, exact to ~2^-16) against the grouped
    // F32 path of the same problem. Token runs that end mid-item, GQA groups
    // of 1 to 9 heads, head sizes 32 to 128, an empty ring, a ring whose
    // last key tile is short.
    if (!gl::gemm::amx_enabled()) {
        MESSAGE("no AMX here: the tile path is not used");
        return;
    }
    const Case cases[] = {
        {37, 32, 4, 64, 512, 4, 100, Type::F16, Type::F16}, // TinyLlama shape
        {16, 6, 2, 32, 64, 4, 0, Type::F16, Type::F16},     // empty ring, GQA 3:1
        {130, 4, 4, 128, 300, 0, 57, Type::F16, Type::F16}, // MHA: 128 tokens an item
        {20, 14, 2, 64, 40, 4, 17, Type::F16, Type::F16},   // short last tile (40 slots)
        {50, 9, 1, 96, 200, 4, 33, Type::F16, Type::F16},   // 9 heads a group, 14 tokens an item
    };
    uint32_t seed = 4242;
    for (int threads : {1, 3}) {
        gl::ThreadPool pool(threads);
        for (const Case& c : cases) {
            INFO("threads ", threads, " n_tok ", c.n_tok, " heads ", c.n_head, "/", c.n_head_kv,
                 " hd ", c.head_dim, " n_ctx ", c.n_ctx, " past ", c.past);
            Problem f32(c, seed), tiles(c, seed);
            seed++;
            const kvtest::HeadMajorSlots h1(f32), h2(tiles);
            for (Problem* p : {&f32, &tiles}) {
                p->scratch.resize(gl::attention_scratch_floats(
                    threads, c.n_ctx, c.n_tok, c.n_head_kv * c.head_dim, c.head_dim));
                p->a.scratch = p->scratch.data();
            }
            gl::gemm::force_off(true);
            gl::attention(pool, f32.a);
            gl::gemm::force_off(false);
            gl::attention(pool, tiles.a);
            const double diff = kvtest::max_abs_diff(tiles.out, f32.out);
            MESSAGE("max |diff| ", diff);
            CHECK(diff < 2e-4);
            CHECK(diff > 0); // bit-identical would mean the tile path did not run
        }
    }
}
