// `kvrun-lab roofline`: this machine's read roof and the thread pool's
// hand-off cost, the two figures a generated token's speed is judged against
// (scripts/bench.sh divides kvrun bench's bytes per token by the first).
#pragma once

#include <cstddef>

#include "ggml-like/cpu/thread_pool.h"

namespace kvrun::lab {

// Read bandwidth, bytes/s, of `bytes` (far larger than the caches) read by
// the pool's threads, each its own contiguous part: the best of several
// reads (see roofline.cpp).
double measure_read_bandwidth(gl::ThreadPool& pool, size_t bytes);

// One hand-off to the pool's workers and back (an empty parallel region),
// microseconds: the synchronisation each parallel loop of a token pays.
double measure_handoff_us(gl::ThreadPool& pool);

} // namespace kvrun::lab
