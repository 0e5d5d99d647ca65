// Partial attention and its log-sum-exp merge (attention.h), the arithmetic
// of the hot/cold KV split (--kv-gpu-window): the keys of a call cut into
// disjoint subsets at arbitrary points -- by slot index, by position (which
// crosses the ring's wrap), sinks apart -- attended separately and merged in
// any order must equal the whole attention.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "ggml-like/attention.h"
#include "ggml-like/quants.h"
#include "ggml-like/thread_pool.h"

using gl::Type;

namespace {

struct Case {
    int n_tok, n_head, n_head_kv, head_dim, n_ctx, n_sink;
    int64_t past; // tokens already in the ring
    Type tk, tv;
};

// A ring of n_ctx slots after `past` tokens (position -> slot as in
// kv_cache.h), random K/V rows in the cache types, random queries.
struct Problem {
    Case c;
    std::vector<float> q, qu, sink_k, out;
    std::vector<uint8_t> ks, vs, kn, vn;
    std::vector<int64_t> slot_pos, pos;
    gl::AttentionArgs a;
    std::vector<float> scratch;

    Problem(const Case& cs, uint32_t seed) : c(cs) {
        std::mt19937 rng(seed);
        std::normal_distribution<float> nd(0.0f, 1.0f);
        auto floats = [&](size_t n) {
            std::vector<float> v(n);
            for (float& x : v) x = nd(rng);
            return v;
        };
        const int kvd = c.n_head_kv * c.head_dim;
        auto rows = [&](Type t, int n) {
            const size_t rb = gl::row_size(t, kvd);
            std::vector<uint8_t> r(rb * n);
            const std::vector<float> f = floats(static_cast<size_t>(n) * kvd);
            for (int i = 0; i < n; i++)
                gl::ref::quantize_row(t, f.data() + static_cast<size_t>(i) * kvd, r.data() + i * rb,
                                      kvd);
            return r;
        };
        const size_t qn = static_cast<size_t>(c.n_tok) * c.n_head * c.head_dim;
        q = floats(qn);
        qu = floats(qn);
        sink_k = floats(static_cast<size_t>(std::max(c.n_sink, 1)) * kvd);
        out.assign(qn, NAN);
        ks = rows(c.tk, c.n_ctx);
        vs = rows(c.tv, c.n_ctx);
        kn = rows(c.tk, c.n_tok);
        vn = rows(c.tv, c.n_tok);
        const int64_t window = c.n_ctx - c.n_sink;
        slot_pos.assign(c.n_ctx, -1);
        for (int64_t p = 0; p < c.past; p++)
            slot_pos[p < c.n_sink ? p : c.n_sink + (p - c.n_sink) % window] = p;
        for (int i = 0; i < c.n_tok; i++) pos.push_back(c.past + i);

        a.n_tok = c.n_tok;
        a.n_head = c.n_head;
        a.n_head_kv = c.n_head_kv;
        a.head_dim = c.head_dim;
        a.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
        a.q = q.data();
        a.q_unrot = c.past + c.n_tok - 1 >= c.n_ctx ? qu.data() : nullptr;
        a.pos = pos.data();
        a.k_type = c.tk;
        a.v_type = c.tv;
        a.k_row_bytes = gl::row_size(c.tk, kvd);
        a.v_row_bytes = gl::row_size(c.tv, kvd);
        a.n_ctx = c.n_ctx;
        a.k_slots = ks.data();
        a.v_slots = vs.data();
        a.slot_pos = slot_pos.data();
        a.k_new = kn.data();
        a.v_new = vn.data();
        a.n_sink = c.n_sink;
        a.window = window;
        a.sink_k = sink_k.data();
        a.out = out.data();
        scratch.resize(gl::attention_scratch_floats(2, c.n_ctx, c.n_tok, kvd));
        a.scratch = scratch.data();
    }
};

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
    double worst = 0;
    for (size_t i = 0; i < want.size(); i++)
        worst = std::max(worst, std::isnan(acc.out[i])
                                    ? 1e30
                                    : std::abs(static_cast<double>(acc.out[i]) - want[i]));
    return worst;
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
    };
    uint32_t seed = 4242;
    gl::ThreadPool one(1), many(7);
    for (const Case& c : cases) {
        INFO("n_tok ", c.n_tok, " heads ", c.n_head, "/", c.n_head_kv, " hd ", c.head_dim,
             " n_ctx ", c.n_ctx, " past ", c.past);
        Problem p1(c, seed), p7(c, seed);
        seed++;
        p7.scratch.resize(
            gl::attention_scratch_floats(7, c.n_ctx, c.n_tok, c.n_head_kv * c.head_dim));
        p7.a.scratch = p7.scratch.data();
        gl::attention(one, p1.a);
        gl::attention(many, p7.a);
        double worst = 0;
        for (size_t i = 0; i < p1.out.size(); i++)
            worst = std::max(worst, std::isnan(p7.out[i])
                                        ? 1e30
                                        : std::abs(static_cast<double>(p7.out[i]) - p1.out[i]));
        CHECK(worst < 1e-5);
        // A subset (positions from the middle on), with its lse.
        gl::KeySubset keys;
        keys.pos_begin = c.past / 3;
        const Part w1 = partial(one, p1, keys), w7 = partial(many, p7, keys);
        double worst_out = 0, worst_lse = 0;
        for (size_t i = 0; i < w1.out.size(); i++)
            worst_out =
                std::max(worst_out, std::isnan(w7.out[i])
                                        ? 1e30
                                        : std::abs(static_cast<double>(w7.out[i]) - w1.out[i]));
        for (size_t i = 0; i < w1.lse.size(); i++)
            worst_lse =
                std::max(worst_lse, std::isnan(w7.lse[i])
                                        ? 1e30
                                        : std::abs(static_cast<double>(w7.lse[i]) - w1.lse[i]));
        CHECK(worst_out < 1e-5);
        CHECK(worst_lse < 1e-4);
    }
}
