#include "roofline.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <numeric>
#include <vector>

#include "error.h"
#include "read_stream.h"
#include "sum_bytes.h"
#include "system_memory.h"

namespace kvrun::lab {

namespace {
using Clock = std::chrono::steady_clock;
} // namespace

// The best of several reads is kept: 64-bit words with software prefetches
// at several distances, and sum_bytes (a vector load a line, as the kernels
// read). Without prefetching one core cannot keep enough misses in flight
// (measured here: 15 GB/s per core without, 16.5 with 2 KiB ahead; 24 vs
// 31 GB/s on two cores), and the dot kernels do prefetch, so a plain loop
// would understate the roof and overstate the fraction. The buffer is on
// transparent huge pages where Linux allows, as kvrun's weights and KV cache
// are (see LoadedModel::load): on 4 KiB pages this loop read 31.6 instead of
// 34.9 GB/s here.
double measure_read_bandwidth(gl::ThreadPool& pool, size_t bytes) {
    const size_t n = bytes / sizeof(uint64_t);
    const HugeBytes mem = allocate_huge(n * sizeof(uint64_t));
    if (!mem)
        fail(Exit::out_of_memory, "cannot allocate {} MiB to measure the read bandwidth",
             bytes >> 20);
    auto* buf = reinterpret_cast<uint64_t*>(mem.get());
    pool.parallel_for(static_cast<int64_t>(n), [&](int64_t b, int64_t e, int) {
        for (int64_t i = b; i < e; i++) buf[i] = static_cast<uint64_t>(i) * 2654435761u;
    });
    using SumFn = uint64_t (*)(const uint64_t*, const uint64_t*);
    const SumFn variants[] = {
        sum_stream<0>, sum_stream<1024>, sum_stream<2048>, sum_stream<4096>,
        [](const uint64_t* b, const uint64_t* e) { return sum_bytes(b, (e - b) * int64_t{8}); }};
    double best = 0;
    for (SumFn sum : variants)
        for (int rep = 0; rep < 2; rep++) {
            std::vector<uint64_t> sums(pool.size(), 0);
            const uint64_t* src = buf;
            uint64_t* out = sums.data();
            const auto t0 = Clock::now();
            pool.parallel_for(static_cast<int64_t>(n),
                              [src, out, sum](int64_t b, int64_t e, int ith) {
                                  out[ith] += sum(src + b, src + e);
                              });
            const double s = std::chrono::duration<double>(Clock::now() - t0).count();
            volatile uint64_t sink = std::accumulate(sums.begin(), sums.end(), uint64_t{0});
            (void)sink;
            best = std::max(best, static_cast<double>(n * sizeof(uint64_t)) / s);
        }
    return best;
}

double measure_handoff_us(gl::ThreadPool& pool) {
    if (pool.size() == 1) return 0;
    constexpr int kRounds = 20000;
    double best = 1e30;
    for (int rep = 0; rep < 3; rep++) {
        const auto t0 = Clock::now();
        for (int i = 0; i < kRounds; i++)
            pool.run_chunks(
                pool.size(), [](void*, int64_t, int) {}, nullptr);
        best = std::min(best, std::chrono::duration<double, std::micro>(Clock::now() - t0).count() /
                                  kRounds);
    }
    return best;
}

} // namespace kvrun::lab
