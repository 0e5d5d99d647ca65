#include "bench_matrices.h"

#include <algorithm>
#include <chrono>
#include <random>
#include <vector>

#include "ggml-like/cpu/ops.h"
#include "ggml-like/cpu/thread_pool.h"
#include "sum_bytes.h"

namespace kvrun::lab {

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

} // namespace

MatrixTimes bench_matrices(const Model& m, int threads, int reps) {
    std::vector<const gl::Tensor*> mats;
    for (const LayerWeights& L : m.layers)
        for (const gl::Tensor* w : L.token_matrices(m.hp.n_expert_used)) mats.push_back(w);
    mats.push_back(&m.output);

    MatrixTimes t;
    int64_t max_in = 0, max_out = 0;
    size_t scratch_bytes = 0;
    for (const gl::Tensor* w : mats) {
        t.bytes += static_cast<double>(w->bytes());
        max_in = std::max(max_in, w->ne0);
        max_out = std::max(max_out, w->ne1);
        scratch_bytes =
            std::max(scratch_bytes, gl::ops::matmul_scratch_bytes(w->type, w->ne0, 1, threads));
    }
    std::mt19937 rng(11);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> x(static_cast<size_t>(max_in)), y(static_cast<size_t>(max_out));
    for (float& v : x) v = u(rng);
    std::vector<uint64_t> scratch(scratch_bytes / sizeof(uint64_t) + 1);

    gl::ThreadPool pool(threads);
    std::vector<uint64_t> sums(static_cast<size_t>(threads), 0);
    // The same loop as ops::matmul's: kRowChunk-row units, the same cost, so
    // the pool hands each thread the same rows; each reads them in one stream
    // with sum_bytes (a vector load a line: 64-bit words, 8
    // loads a line, read 10% slower here).
    auto read = [&](const gl::Tensor& w) {
        const int64_t units = (w.ne1 + gl::ops::kRowChunk - 1) / gl::ops::kRowChunk;
        pool.parallel_for(
            units,
            [&](int64_t b, int64_t e, int ith) {
                // The bytes matmul reads: the packed copy where there is one.
                const auto* base = static_cast<const uint8_t*>(w.packed ? w.packed : w.data);
                const uint8_t* p = base + b * gl::ops::kRowChunk * w.row_bytes;
                const uint8_t* end = base + std::min(w.ne1, e * gl::ops::kRowChunk) * w.row_bytes;
                sums[static_cast<size_t>(ith)] += sum_bytes(p, end - p);
            },
            w.ne1 * w.ne0);
    };
    auto read_pass = [&] {
        for (const gl::Tensor* w : mats) read(*w);
    };
    auto matmul_pass = [&] {
        for (const gl::Tensor* w : mats)
            gl::ops::matmul(pool, *w, x.data(), 1, y.data(), scratch.data());
    };
    read_pass(); // warm-up: pages touched, threads started
    matmul_pass();
    for (int r = 0; r < reps; r++) {
        auto t0 = Clock::now();
        read_pass();
        t.read_ms += ms_since(t0);
        t0 = Clock::now();
        matmul_pass();
        t.matmul_ms += ms_since(t0);
    }
    t.read_ms /= reps;
    t.matmul_ms /= reps;
    uint64_t sink = 0;
    for (uint64_t s : sums) sink += s;
    volatile uint64_t keep = sink; // the reads must happen
    (void)keep;
    return t;
}

} // namespace kvrun::lab
