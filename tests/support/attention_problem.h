// A random attention problem shared by the attention tests: a ring of n_ctx
// slots after `past` tokens (position -> slot as in kv_cache.h, the first
// n_sink kept), random K/V rows in the cache types, random queries, and the
// AttentionArgs over them (scratch for 2 threads).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "ggml-like/attention.h"
#include "ggml-like/kernels.h"
#include "test_util.h"

namespace kvtest {

struct AttentionCase {
    int n_tok, n_head, n_head_kv, head_dim, n_ctx, n_sink;
    int64_t past; // tokens already in the ring
    gl::Type tk, tv;
};

struct AttentionProblem {
    AttentionCase c;
    std::vector<float> q, qu, sink_k, out, scratch;
    std::vector<uint8_t> ks, vs, kn, vn;
    std::vector<int64_t> slot_pos, pos;
    gl::AttentionArgs a;

    AttentionProblem(const AttentionCase& cs, uint32_t seed) : c(cs) {
        const int kvd = c.n_head_kv * c.head_dim;
        auto rows = [&](gl::Type t, int n, uint32_t s) {
            const size_t rb = gl::row_size(t, kvd);
            std::vector<uint8_t> r(rb * static_cast<size_t>(n));
            const std::vector<float> f = random_floats(static_cast<size_t>(n) * kvd, s);
            for (int i = 0; i < n; i++)
                gl::ref::quantize_row(t, f.data() + static_cast<size_t>(i) * kvd, r.data() + i * rb,
                                      kvd);
            return r;
        };
        const size_t qn = static_cast<size_t>(c.n_tok) * c.n_head * c.head_dim;
        q = random_floats(qn, seed);
        qu = random_floats(qn, seed + 1);
        sink_k = random_floats(static_cast<size_t>(std::max(c.n_sink, 1)) * kvd, seed + 2);
        out.assign(qn, NAN);
        ks = rows(c.tk, c.n_ctx, seed + 3);
        vs = rows(c.tv, c.n_ctx, seed + 4);
        kn = rows(c.tk, c.n_tok, seed + 5);
        vn = rows(c.tv, c.n_tok, seed + 6);
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
        scratch.resize(gl::attention_scratch_floats(2, c.n_ctx, c.n_tok, kvd, c.head_dim));
        a.scratch = scratch.data();
    }
    // Not copyable: `a` points into the vectors.
    AttentionProblem(const AttentionProblem&) = delete;
    AttentionProblem& operator=(const AttentionProblem&) = delete;
};

// A problem's slots copied head-major, as KvCache::set_head_major stores
// them (keys as key tiles, values [kv head][slot][head_dim]), with p.a
// pointed at the copies.
struct HeadMajorSlots {
    std::vector<uint8_t> k, v;
    explicit HeadMajorSlots(AttentionProblem& p) {
        const AttentionCase& c = p.c;
        auto to_heads = [&](const std::vector<uint8_t>& r, gl::Type t, bool tiles) {
            const size_t e = gl::type_info(t).type_size, hb = e * c.head_dim, rb = hb * c.n_head_kv;
            std::vector<uint8_t> h(r.size());
            for (int s = 0; s < c.n_ctx; s++)
                for (int kv = 0; kv < c.n_head_kv; kv++)
                    for (int d = 0; d < c.head_dim; d++) {
                        const int64_t i = tiles ? gl::key_tile_index(s, d, c.head_dim, c.n_ctx)
                                                : static_cast<int64_t>(s) * c.head_dim + d;
                        std::memcpy(h.data() + kv * c.n_ctx * hb + i * e,
                                    r.data() + s * rb + kv * hb + d * e, e);
                    }
            return h;
        };
        k = to_heads(p.ks, c.tk, true);
        v = to_heads(p.vs, c.tv, false);
        p.a.k_slots = k.data();
        p.a.v_slots = v.data();
        p.a.k_head_bytes = gl::row_size(c.tk, c.head_dim) * c.n_ctx;
        p.a.v_slot_bytes = gl::row_size(c.tv, c.head_dim);
        p.a.v_head_bytes = p.a.v_slot_bytes * c.n_ctx;
    }
};

// Largest |got[i] - want[i]|; a NaN in got counts as 1e30 (an output never
// written, when got started as NaN).
inline double max_abs_diff(const std::vector<float>& got, const std::vector<float>& want) {
    double worst = 0;
    for (size_t i = 0; i < want.size(); i++)
        worst = std::max(
            worst, std::isnan(got[i]) ? 1e30 : std::abs(static_cast<double>(got[i]) - want[i]));
    return worst;
}

} // namespace kvtest
