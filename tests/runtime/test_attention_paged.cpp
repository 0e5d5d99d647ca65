// Paged slots (gl::AttentionArgs::slot_block): a ring whose blocks lie
// anywhere in a pool, in any order, between blocks of other sequences, is
// attended bit for bit as the same ring with its blocks in order (a lone
// cache's pool). That is what keeps a `kvrun batch` sequence's answer a lone
// run's whatever blocks the shared pool gave it.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "attention_problem.h"
#include "ggml-like/attention.h"
#include "ggml-like/cpu/thread_pool.h"
#include "ggml-like/kernels.h"
#include "ggml-like/kv_layout.h"

using gl::Type;

namespace {

constexpr int kBlock = 32;

// A problem's slots copied into a pool of `pool_blocks` blocks, slot s of
// the ring at pool slot table[s / kBlock] * kBlock + s % kBlock, in rows or
// head-major (keys in tiles over the pool's slots); every other byte of the
// pool is garbage that turns any read of it into a wrong output.
struct PagedSlots {
    std::vector<uint8_t> k, v;
    std::vector<int32_t> table;
    gl::AttentionArgs a;

    PagedSlots(const kvtest::AttentionProblem& p, std::vector<int32_t> tbl, int pool_blocks,
               bool head_major, bool in_order)
        : table(std::move(tbl)), a(p.a) {
        const kvtest::AttentionCase& c = p.c;
        const int n_pool = pool_blocks * kBlock;
        const size_t rk = p.a.k_row_bytes, rv = p.a.v_row_bytes;
        const size_t ek = gl::type_info(c.tk).type_size, ev = gl::type_info(c.tv).type_size;
        k.assign(rk * n_pool, 0xff); // NaN in every float type
        v.assign(rv * n_pool, 0xff);
        for (int s = 0; s < c.n_ctx; s++) {
            const int64_t ps = int64_t{table[s / kBlock]} * kBlock + s % kBlock;
            const uint8_t* kr = p.ks.data() + s * rk;
            const uint8_t* vr = p.vs.data() + s * rv;
            if (!head_major) {
                std::memcpy(k.data() + ps * rk, kr, rk);
                std::memcpy(v.data() + ps * rv, vr, rv);
                continue;
            }
            for (int h = 0; h < c.n_head_kv; h++) {
                std::memcpy(v.data() + (h * int64_t{n_pool} + ps) * c.head_dim * ev,
                            vr + h * c.head_dim * ev, c.head_dim * ev);
                for (int d = 0; d < c.head_dim; d++)
                    std::memcpy(k.data() + h * n_pool * c.head_dim * ek +
                                    gl::key_tile_index(ps, d, c.head_dim, n_pool) * ek,
                                kr + (h * c.head_dim + d) * ek, ek);
            }
        }
        a.k_slots = k.data();
        a.v_slots = v.data();
        a.pool_slots = n_pool;
        a.block_slots = kBlock;
        a.slot_block = in_order ? nullptr : table.data();
        if (head_major) {
            a.k_head_bytes = static_cast<size_t>(c.head_dim) * ek * n_pool;
            a.v_slot_bytes = static_cast<size_t>(c.head_dim) * ev;
            a.v_head_bytes = a.v_slot_bytes * n_pool;
        }
    }
};

struct Out {
    std::vector<float> out, lse;
};

Out attend(gl::ThreadPool& pool, const kvtest::AttentionProblem& p, gl::AttentionArgs a,
           const gl::KeySubset* keys) {
    Out r;
    r.out.assign(p.out.size(), NAN);
    r.lse.assign(static_cast<size_t>(p.c.n_tok) * p.c.n_head, NAN);
    std::vector<float> scratch(p.scratch.size() + 64 * 1024); // room for the splits
    a.scratch = scratch.data();
    a.out = r.out.data();
    if (keys)
        gl::attention_partial(pool, a, *keys, r.lse.data());
    else
        gl::attention(pool, a);
    return r;
}

} // namespace

TEST_CASE("attention paged: a ring's blocks anywhere in a pool give the bits of the same blocks "
          "in order") {
    struct Case {
        kvtest::AttentionCase c;
        bool head_major;
    };
    const Case cases[] = {
        // n_tok heads kv hd n_ctx sink past K V
        {{1, 8, 2, 64, 100, 4, 70, Type::F16, Type::F16}, true},   // ring part full, 4 blocks
        {{1, 8, 2, 64, 96, 4, 500, Type::F16, Type::F16}, true},   // wrapped: sinks past the slide
        {{3, 6, 2, 32, 128, 4, 130, Type::F32, Type::F32}, true},  // a batch crossing the wrap
        {{20, 4, 2, 64, 160, 4, 90, Type::F16, Type::F16}, true},  // a prompt batch
        {{1, 8, 2, 64, 100, 4, 77, Type::F16, Type::F16}, false},  // rows
        {{2, 4, 4, 32, 64, 0, 200, Type::BF16, Type::F16}, false}, // no sinks, wrapped
        {{1, 8, 2, 64, 100, 4, 90, Type::Q8_0, Type::F16}, false}, // one head at a time
        {{4, 8, 4, 32, 96, 4, 300, Type::Q4_0, Type::Q8_0}, false},
    };
    std::mt19937 rng(5);
    for (const Case& cs : cases) {
        const kvtest::AttentionCase& c = cs.c;
        CAPTURE(c.n_tok);
        CAPTURE(c.n_ctx);
        CAPTURE(c.past);
        CAPTURE(gl::type_name(c.tk));
        CAPTURE(cs.head_major);
        kvtest::AttentionProblem p(c, 11);
        const int blocks = (c.n_ctx + kBlock - 1) / kBlock;
        std::vector<int32_t> in_order(blocks);
        std::iota(in_order.begin(), in_order.end(), 0);
        // The same blocks shuffled among three more (another sequence's).
        std::vector<int32_t> all(blocks + 3);
        std::iota(all.begin(), all.end(), 0);
        std::shuffle(all.begin(), all.end(), rng);
        const std::vector<int32_t> shuffled(all.begin(), all.begin() + blocks);
        const PagedSlots lone(p, in_order, blocks, cs.head_major, true);
        const PagedSlots paged(p, shuffled, blocks + 3, cs.head_major, false);
        for (int threads : {1, 2}) {
            CAPTURE(threads);
            gl::ThreadPool pool(threads);
            const Out want = attend(pool, p, lone.a, nullptr);
            // The lone layout reads the problem's keys (the plain ring, no blocks).
            const Out plain = attend(pool, p, p.a, nullptr);
            CHECK(kvtest::max_abs_diff(want.out, plain.out) < 1e-4);
            const Out got = attend(pool, p, paged.a, nullptr);
            CHECK(std::memcmp(got.out.data(), want.out.data(), sizeof(float) * want.out.size()) ==
                  0);
            // A subset of the slots (the hot/cold split's CPU part).
            gl::KeySubset keys;
            keys.slot_begin = 5;
            keys.slot_end = c.n_ctx - 9;
            const Out want_part = attend(pool, p, lone.a, &keys);
            const Out got_part = attend(pool, p, paged.a, &keys);
            CHECK(std::memcmp(got_part.out.data(), want_part.out.data(),
                              sizeof(float) * want_part.out.size()) == 0);
            CHECK(std::memcmp(got_part.lse.data(), want_part.lse.data(),
                              sizeof(float) * want_part.lse.size()) == 0);
            // --deterministic reads rows.
            if (!cs.head_major) {
                gl::AttentionArgs lone_in = lone.a, paged_in = paged.a;
                lone_in.batch_invariant = paged_in.batch_invariant = true;
                const Out w = attend(pool, p, lone_in, nullptr);
                const Out g = attend(pool, p, paged_in, nullptr);
                CHECK(kvtest::max_abs_diff(w.out, plain.out) < 1e-4);
                CHECK(std::memcmp(g.out.data(), w.out.data(), sizeof(float) * w.out.size()) == 0);
            }
        }
    }
}
