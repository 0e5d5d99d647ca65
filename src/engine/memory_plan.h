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
#include "system_memory.h"

namespace kvrun {

struct MemoryPlan {
    uint64_t mem_available = 0;
    uint64_t weights = 0;          // tensor bytes in the file
    uint64_t weights_resident = 0; // already in RAM (page cache of the mapping)
    uint64_t scratch = 0;          // activations, logits, attention scratch (estimate)
    uint64_t kv_per_token = 0;
    uint64_t kv = 0;               // at n_ctx (the sum over layers of their rings)
    uint64_t kv_free = 0;          // what is left for the cache
    int64_t n_ctx = 0;
    int64_t max_ctx_that_fits = 0; // largest context whose cache fits
    bool fits() const { return n_ctx <= max_ctx_that_fits; }
};

MemoryPlan plan_memory(const GgufFile& f, const Hparams& hp, int64_t n_ctx, gl::Type tk, gl::Type tv, int batch,
                       int threads);

// kvrun batch: its caches (one per sequence at once) take at most half the
// memory available, the rest left to weights still to be read in, the
// activations and the system; how many caches of `per_sequence` bytes fit.
inline uint64_t batch_cache_budget(uint64_t mem_available) { return mem_available / 2; }
inline uint64_t batch_sequences_that_fit(uint64_t mem_available, uint64_t per_sequence) {
    return per_sequence > 0 ? batch_cache_budget(mem_available) / per_sequence : 0;
}

// One-line advice for a plan that does not fit: what would.
std::string memory_advice(const MemoryPlan& p, const Hparams& hp, int64_t n_prompt);

// What goes where with layers on a GPU (-ngl, --kv-gpu-window), from the
// file's metadata alone (kvrun info). The CUDA backend copies the weight
// matrices it multiplies: those of the offloaded layers, plus the output
// matrix when every layer is offloaded (the head follows the last layer);
// the token embedding is looked up on the host, and norms and biases travel
// with each call. Its KV mirror holds, per offloaded layer, the whole ring or
// with a window only the sinks and the newest W positions. The host ring
// always holds every slot of every layer (it is the source of truth, and the
// cold part is attended from there).
struct GpuPlan {
    int n_layer = 0, n_gpu_layers = 0;
    // A mixture of experts: the first n_cpu_moe layers keep their experts in
    // host memory and run them on the CPU (--n-cpu-moe; --cpu-moe: every
    // layer), their attention, router, shared expert and KV on the GPU.
    int n_cpu_moe = 0;
    uint64_t experts_gpu = 0, experts_host = 0; // of weights_gpu / weights_host
    bool head_on_gpu = false;
    int64_t n_ctx = 0, keep = 0, kv_window = 0; // kv_window 0: the whole ring on the GPU
    int64_t gpu_slots = 0;                      // KV rows per offloaded layer on the GPU
    uint64_t weights_gpu = 0;                   // matrices copied to the device
    uint64_t weights_host = 0; // the rest of the tensor bytes, used from the mapping
    uint64_t kv_gpu = 0;       // per offloaded layer min(its slots, gpu_slots) × (K + V row bytes)
    uint64_t kv_host = 0;      // the host rings: KvCache::ring_bytes_for
    uint64_t kv_cold = 0;      // of kv_host, the offloaded layers' slots attended on the CPU
    uint64_t scratch_gpu = 0;  // device activations and attention partials (estimate)
    uint64_t gpu_total() const { return weights_gpu + kv_gpu + scratch_gpu; }
};

GpuPlan plan_gpu(const GgufFile& f, const Hparams& hp, int64_t n_ctx, int64_t keep, gl::Type tk,
                 gl::Type tv, int n_gpu_layers, int64_t kv_window, int batch, int n_cpu_moe = 0);

// -ngl auto (--fit): the plan that fills `device_free` bytes best. Every
// layer's attention and KV first, with every expert on the host; then, for a
// mixture of experts, as many layers' experts as fit, the last layers'
// first (the first n_cpu_moe stay on the host, as --n-cpu-moe says). For a
// dense model, or when not even that fits, as many layers as fit from the
// first (a mixture's with all their experts on the host). n_gpu_layers 0
// when none does.
GpuPlan fit_gpu(const GgufFile& f, const Hparams& hp, int64_t n_ctx, int64_t keep, gl::Type tk,
                gl::Type tv, int64_t kv_window, int batch, uint64_t device_free);

} // namespace kvrun
