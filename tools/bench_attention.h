// `kvrun-lab attention`: where a decode step's attention time goes at a
// given depth, for one model's shape and cache types, on the CPU.
#pragma once

#include <vector>

#include "ggml-like/types.h"
#include "model.h"

namespace kvrun::lab {

// Milliseconds per token (all layers), mean over repetitions.
struct AttentionTimes {
    // Each layer's attention right after that layer's weight matrices were
    // read, as in generation: the ring comes from DRAM.
    double from_dram = 0;
    // The first layer's ring again and again with nothing in between: it
    // stays in the caches, so this is the arithmetic's time.
    double from_cache = 0;
    // A plain read of the same K/V bytes, after the same weights: the
    // memory's time.
    double read_only = 0;
    double ring_bytes = 0; // K/V bytes one token reads
};

// Times gl::attention for one generated token after `depth` tokens, over a
// ring of random K/V laid out as the CPU backend keeps it (KvCache,
// head-major for float types), with the model's own weight matrices
// streamed between layers.
AttentionTimes bench_attention(const Model& m, gl::Type tk, gl::Type tv, int depth, int threads,
                               int reps);

} // namespace kvrun::lab
