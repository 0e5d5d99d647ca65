#include "bench_attention.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <random>

#include "ggml-like/attention.h"
#include "ggml-like/kernels.h"
#include "ggml-like/cpu/thread_pool.h"
#include "kv_cache.h"
#include "read_stream.h"

namespace kvrun::lab {

namespace {

using Clock = std::chrono::steady_clock;

struct Span {
    const uint8_t* p;
    size_t bytes;
};

// Reads the spans on all threads, cut into pieces the threads share; returns
// the sum so that the reads cannot be dropped.
uint64_t read_spans(gl::ThreadPool& pool, const std::vector<Span>& spans,
                    std::vector<Span>& pieces) {
    constexpr size_t kPiece = size_t{256} << 10;
    pieces.clear();
    for (const Span& s : spans)
        for (size_t o = 0; o < s.bytes; o += kPiece)
            pieces.push_back({s.p + o, std::min(kPiece, s.bytes - o)});
    std::vector<uint64_t> sums(pool.size(), 0);
    pool.parallel_for(static_cast<int64_t>(pieces.size()), [&](int64_t b, int64_t e, int ith) {
        for (int64_t i = b; i < e; i++) {
            const auto* w = reinterpret_cast<const uint64_t*>(pieces[i].p);
            sums[ith] += sum_stream<2048>(w, w + pieces[i].bytes / sizeof(uint64_t));
        }
    });
    return std::accumulate(sums.begin(), sums.end(), uint64_t{0});
}

double ms_since(Clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

} // namespace

AttentionTimes bench_attention(const Model& m, gl::Type tk, gl::Type tv, int depth, int threads,
                               int reps) {
    const Hparams& hp = m.hp;
    const int kvd = hp.kv_dim(), hd = hp.head_dim;
    KvCache kv({hp.n_layer, hp.n_head_kv, hd, std::max(depth + 1, 32), 4, tk, tv});
    kv.set_head_major(true); // as the CPU backend asks (a no-op for block types)

    // Random rows in the cache types, written as a prompt would write them.
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    auto random_rows = [&](gl::Type t, int n, std::vector<uint8_t>& dst) {
        std::vector<float> f(static_cast<size_t>(kvd));
        dst.resize(gl::row_size(t, kvd) * n);
        for (int i = 0; i < n; i++) {
            for (float& x : f) x = u(rng);
            gl::cpu::quantize_row(t, f.data(), dst.data() + i * gl::row_size(t, kvd), kvd);
        }
    };
    std::vector<uint8_t> k_rows, v_rows;
    for (int p0 = 0; p0 < depth; p0 += 256) {
        const int n = std::min(256, depth - p0);
        for (int l = 0; l < hp.n_layer; l++) {
            random_rows(tk, n, k_rows);
            random_rows(tv, n, v_rows);
            kv.write(l, p0, n, k_rows.data(), v_rows.data());
        }
        kv.commit(p0, n);
    }
    std::vector<uint8_t> k_new, v_new;
    random_rows(tk, 1, k_new);
    random_rows(tv, 1, v_new);
    std::vector<float> q(static_cast<size_t>(hp.q_dim())), out(q.size());
    for (float& x : q) x = u(rng);
    std::vector<float> scratch(gl::attention_scratch_floats(threads, kv.n_ctx(), 1, kvd, hd));
    const int64_t pos = depth;

    auto args = [&](int l) {
        gl::AttentionArgs a;
        a.n_tok = 1;
        a.n_head = hp.n_head;
        a.n_head_kv = hp.n_head_kv;
        a.head_dim = hd;
        a.scale = 1.0f / std::sqrt(static_cast<float>(hd));
        a.q = q.data();
        a.pos = &pos;
        kv.attention_slots(l, a);
        a.k_new = k_new.data();
        a.v_new = v_new.data();
        a.out = out.data();
        a.scratch = scratch.data();
        a.half_ok = true; // a generated token's step
        return a;
    };
    // What one token reads per layer: its weight matrices, and the slots of
    // the `depth` cached tokens (each KV head's run when head-major).
    std::vector<std::vector<Span>> weights(hp.n_layer), ring(hp.n_layer);
    AttentionTimes t;
    for (int l = 0; l < hp.n_layer; l++) {
        const LayerWeights& L = m.layers[l];
        for (const gl::Tensor* w : L.token_matrices(hp.n_expert_used))
            weights[l].push_back({static_cast<const uint8_t*>(w->data), w->bytes()});
        auto add = [&](const void* p, size_t bytes) {
            ring[l].push_back({static_cast<const uint8_t*>(p), bytes});
            t.ring_bytes += static_cast<double>(bytes);
        };
        const auto* k = static_cast<const uint8_t*>(kv.k_slots(l));
        const auto* v = static_cast<const uint8_t*>(kv.v_slots(l));
        if (kv.head_major()) {
            const size_t ke = gl::type_info(tk).type_size;
            const size_t k_bytes = std::min(
                kv.head_bytes_k(l), static_cast<size_t>((depth + gl::kKeyTile - 1) / gl::kKeyTile) *
                                       gl::kKeyTile * hd * ke);
            for (int h = 0; h < hp.n_head_kv; h++) {
                add(k + h * kv.head_bytes_k(l), k_bytes);
                add(v + h * kv.head_bytes_v(l), depth * kv.slot_bytes_v(l));
            }
        } else {
            add(k, depth * kv.row_bytes_k(l));
            add(v, depth * kv.row_bytes_v(l));
        }
    }

    gl::ThreadPool pool(threads);
    std::vector<Span> pieces;
    uint64_t sink = 0;
    gl::attention(pool, args(0)); // warm-up
    for (int r = 0; r < reps; r++) {
        for (int l = 0; l < hp.n_layer; l++) {
            sink += read_spans(pool, weights[l], pieces);
            const auto t0 = Clock::now();
            gl::attention(pool, args(l));
            t.from_dram += ms_since(t0);
        }
        for (int l = 0; l < hp.n_layer; l++) {
            sink += read_spans(pool, weights[l], pieces);
            const auto t0 = Clock::now();
            sink += read_spans(pool, ring[l], pieces);
            t.read_only += ms_since(t0);
        }
        const gl::AttentionArgs a0 = args(0);
        const auto t0 = Clock::now();
        for (int l = 0; l < hp.n_layer; l++) gl::attention(pool, a0);
        t.from_cache += ms_since(t0);
    }
    t.from_dram /= reps;
    t.read_only /= reps;
    t.from_cache /= reps;
    volatile uint64_t keep = sink; // the reads must happen
    (void)keep;
    return t;
}

} // namespace kvrun::lab
