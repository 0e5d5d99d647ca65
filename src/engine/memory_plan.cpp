#include "memory_plan.h"
#include "tensor_names.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "format.h"
#include "kv_cache.h"
#include "ggml-like/types.h"

namespace kvrun {

namespace {
// Kept free for the allocator, the binary, stacks and the rest of the system.
constexpr uint64_t kReserve = 64ull << 20;
} // namespace

MemoryPlan plan_memory(const GgufFile& f, const Hparams& hp, int64_t n_ctx, gl::Type tk,
                       gl::Type tv, int batch, int threads) {
    MemoryPlan p;
    p.mem_available = mem_available_bytes();
    // A mixture's experts stay in the file mapping (LoadedModel::load), and a
    // token reads n_expert_used of n_expert: what they take is page cache,
    // given back under pressure and read again when routed to. Of those not
    // yet resident the plan counts that share; the rest costs no memory.
    uint64_t experts_unread = 0;
    for (const auto& t : f.tensors()) {
        p.weights += t.nbytes;
        const uint64_t resident = resident_bytes(t.data, t.nbytes); // mapped, or moved (GgufFile)
        p.weights_resident += resident;
        if (hp.is_moe() && t.n_dims == 3 && tensor_names::is_experts(t.name))
            experts_unread += (t.nbytes - std::min(resident, t.nbytes)) *
                              static_cast<uint64_t>(hp.n_expert - hp.n_expert_used) /
                              static_cast<uint64_t>(hp.n_expert);
    }
    const KvCacheConfig cache = KvCacheConfig::for_model(hp, static_cast<int>(n_ctx), 0, tk, tv);
    p.kv_per_token = KvCache::bytes_per_token(cache);
    p.n_ctx = n_ctx;
    // The recurrent layers' states (Qwen 3.5) do not grow with n_ctx.
    const uint64_t state = KvCache::state_bytes_for(cache);
    p.kv = KvCache::ring_bytes_for(cache) + state;
    const uint64_t b = static_cast<uint64_t>(std::min<int64_t>(batch, n_ctx));
    // Forward's buffers (see forward.h) plus attention scratch per thread and one logits row.
    p.scratch =
        4 * (b * (2ull * hp.n_embd + 3ull * hp.q_dim() + 2ull * hp.kv_dim() + 2ull * hp.n_ff) +
             static_cast<uint64_t>(threads) * (n_ctx + b + 2 * hp.kv_dim() + 512) + hp.n_vocab) +
        b * 2 * (gl::row_size(tk, hp.kv_dim()) + gl::row_size(tv, hp.kv_dim()));
    if (hp.is_moe()) p.scratch += 4 * b * (static_cast<uint64_t>(hp.n_expert) + 3ull * hp.n_embd);
    const uint64_t unread = p.weights > p.weights_resident ? p.weights - p.weights_resident : 0;
    const uint64_t to_fault = unread - std::min(unread, experts_unread);
    const uint64_t used = to_fault + p.scratch + kReserve + state;
    p.kv_free = p.mem_available > used ? p.mem_available - used : 0;
    p.max_ctx_that_fits = KvCache::max_ctx_for_bytes(cache, p.kv_free);
    return p;
}

GpuPlan plan_gpu(const GgufFile& f, const Hparams& hp, int64_t n_ctx, int64_t keep, gl::Type tk,
                 gl::Type tv, int n_gpu_layers, int64_t kv_window, int batch, int n_cpu_moe) {
    GpuPlan g;
    g.n_layer = hp.n_layer;
    g.n_gpu_layers = std::clamp(n_gpu_layers, 0, hp.n_layer);
    g.n_cpu_moe = hp.is_moe() ? std::clamp(n_cpu_moe, 0, hp.n_layer) : 0;
    g.head_on_gpu = g.n_gpu_layers == hp.n_layer && hp.n_layer > 0;
    g.n_ctx = n_ctx;
    g.keep = std::min<int64_t>(keep, n_ctx - 1);
    const int64_t window = n_ctx - g.keep;
    g.kv_window = kv_window > 0 && kv_window < window ? kv_window : 0;
    g.gpu_slots = g.kv_window > 0 ? g.keep + g.kv_window : n_ctx;
    const bool tied = std::none_of(f.tensors().begin(), f.tensors().end(), [](const GgufTensor& t) {
        return t.name == tensor_names::output;
    });
    for (const GgufTensor& t : f.tensors()) {
        bool on_gpu = false;
        const std::optional<int> layer = tensor_names::layer_of(t.name);
        const bool experts = hp.is_moe() && t.n_dims == 3 && tensor_names::is_experts(t.name);
        if (t.n_dims >= 2 && layer)
            on_gpu = *layer < g.n_gpu_layers && !(experts && *layer < g.n_cpu_moe);
        else if (t.name == tensor_names::output || (tied && t.name == tensor_names::token_embd))
            on_gpu = g.head_on_gpu;
        (on_gpu ? g.weights_gpu : g.weights_host) += t.nbytes;
        if (experts) (on_gpu ? g.experts_gpu : g.experts_host) += t.nbytes;
    }
    // Per layer, as the cache sizes its rings (a sliding-window layer's is
    // smaller): the host holds every layer's; an offloaded layer's device
    // mirror holds its whole ring, or with a window the sinks and newest W.
    const KvCacheConfig cache =
        KvCacheConfig::for_model(hp, static_cast<int>(n_ctx), static_cast<int>(g.keep), tk, tv);
    g.kv_host = KvCache::ring_bytes_for(cache);
    for (int l = 0; l < g.n_gpu_layers; l++) {
        const uint64_t row = cache.slot_bytes(l); // K + V of one slot (0: none of its own)
        const int64_t slots = cache.slots(l), on_gpu = std::min<int64_t>(slots, g.gpu_slots);
        g.kv_gpu += static_cast<uint64_t>(on_gpu) * row;
        g.kv_cold += static_cast<uint64_t>(slots - on_gpu) * row;
    }
    if (g.n_gpu_layers > 0) {
        // The backend's device memory besides weights and KV (ggml-like/cuda/):
        // twins of Forward's activation buffers (forward.h: residual, norm
        // out, q, unrotated q, k, v, attention out, two FFN rows, cos/sin,
        // positions, the K/V rows in the cache types, one logits row), the
        // attention partials (one per 256 keys per query head, grown with a
        // quarter of headroom), the position tags of each offloaded layer's
        // device ring, and small op buffers (biases, sink keys).
        const uint64_t b = static_cast<uint64_t>(std::max(1, std::min<int>(batch, n_ctx)));
        const uint64_t twins = 4 * (b * (2ull * hp.n_embd + 3ull * hp.q_dim() + 2ull * hp.kv_dim() +
                                         2ull * hp.n_ff + hp.rope_dims) +
                                    hp.n_vocab) +
                               8 * b + b * (gl::row_size(tk, hp.kv_dim()) + gl::row_size(tv, hp.kv_dim()));
        const uint64_t splits = (g.gpu_slots + b + 255) / 256;
        const uint64_t partial = 4 * (b * hp.n_head * splits * (hp.head_dim + 2) + b * hp.n_head);
        const uint64_t small = 4 * (static_cast<uint64_t>(hp.q_dim()) + g.keep * hp.kv_dim());
        g.scratch_gpu = twins + partial + partial / 4 + small +
                        8 * static_cast<uint64_t>(g.n_gpu_layers) * g.gpu_slots;
    }
    return g;
}

GpuPlan fit_gpu(const GgufFile& f, const Hparams& hp, int64_t n_ctx, int64_t keep, gl::Type tk,
                gl::Type tv, int64_t kv_window, int batch, uint64_t device_free) {
    auto plan = [&](int layers, int cpu_moe) {
        return plan_gpu(f, hp, n_ctx, keep, tk, tv, layers, kv_window, batch, cpu_moe);
    };
    auto fits = [&](const GpuPlan& g) { return g.gpu_total() <= device_free; };
    const int n = hp.n_layer;
    // Each step adds bytes (a layer's experts, or a whole layer): the first
    // that does not fit ends the search, by halving.
    auto largest = [](int lo, int hi, auto ok) { // the largest x in [lo, hi] with ok(x), or lo - 1
        int best = lo - 1;
        while (lo <= hi) {
            const int mid = lo + (hi - lo) / 2;
            if (ok(mid)) {
                best = mid;
                lo = mid + 1;
            } else {
                hi = mid - 1;
            }
        }
        return best;
    };
    if (hp.is_moe() && fits(plan(n, n))) {
        // Every layer offloaded; the fewest layers' experts left on the host.
        const int on_gpu = largest(0, n, [&](int k) { return fits(plan(n, n - k)); });
        return plan(n, n - on_gpu);
    }
    // Whole layers from the first (a mixture's with their experts on the host).
    const int cpu_moe = hp.is_moe() ? n : 0;
    const int layers = largest(0, n, [&](int k) { return fits(plan(k, cpu_moe)); });
    return plan(std::max(layers, 0), cpu_moe);
}

std::string memory_advice(const MemoryPlan& p, const Hparams& hp, int64_t n_prompt) {
    std::ostringstream s;
    const uint64_t to_fault = p.weights > p.weights_resident ? p.weights - p.weights_resident : 0;
    s << "the KV cache for " << p.n_ctx << " tokens needs " << human_bytes(p.kv) << " but only "
      << human_bytes(p.kv_free) << " is free for it (available " << human_bytes(p.mem_available)
      << ", less " << human_bytes(to_fault) << " of weights still to load and "
      << human_bytes(p.scratch + kReserve) << " of buffers)";
    if (p.max_ctx_that_fits > n_prompt) s << "; -c " << p.max_ctx_that_fits << " would fit";
    // q8_0 K and V: 34 bytes per 32 elements
    const KvCacheConfig q8 = KvCacheConfig::for_model(hp, 0, 0, gl::Type::Q8_0, gl::Type::Q8_0);
    if (hp.kv_dim() % 32 == 0 && KvCache::bytes_per_token(q8) < p.kv_per_token) {
        const int64_t q8_fit = KvCache::max_ctx_for_bytes(q8, p.kv_free);
        s << "; with --ctk q8_0 --ctv q8_0 up to " << q8_fit << " tokens fit";
    }
    return s.str();
}

} // namespace kvrun
