// What a run will need in memory, decided before anything is allocated, so
// `-c auto` never picks a cache that cannot fit and a request that cannot fit
// fails with advice (Exit::out_of_memory) instead of being OOM-killed.
//
// Available memory is MemAvailable (page cache is reclaimable; MemFree is not
// the number that matters, doubly so on Jetson's shared memory) minus the part
// of the weights not yet resident (mmapped pages still to be faulted in).
// KVRUN_MEM_AVAILABLE=<bytes> overrides MemAvailable (tests, containers).
#pragma once

#include <cstdint>
#include <string>

#include "gguf.h"
#include "model.h"

namespace kvrun {

uint64_t mem_available_bytes();
// Bytes of [p, p + n) currently resident (mincore); 0 if unknown.
uint64_t resident_bytes(const void* p, uint64_t n);

struct MemoryPlan {
    uint64_t mem_available = 0;
    uint64_t weights = 0;          // tensor bytes in the file
    uint64_t weights_resident = 0; // already in RAM (page cache of the mapping)
    uint64_t scratch = 0;          // activations, logits, attention scratch (estimate)
    uint64_t kv_per_token = 0;
    uint64_t kv = 0;               // at n_ctx
    int64_t n_ctx = 0;
    int64_t max_ctx_that_fits = 0; // largest context whose cache fits
    bool fits() const { return n_ctx <= max_ctx_that_fits; }
};

MemoryPlan plan_memory(const GgufFile& f, const Hparams& hp, int64_t n_ctx, gl::Type tk, gl::Type tv, int batch,
                       int threads);

// One-line advice for a plan that does not fit: what would.
std::string memory_advice(const MemoryPlan& p, const Hparams& hp, int64_t n_prompt);

} // namespace kvrun
