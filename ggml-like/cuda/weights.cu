// The CUDA backend's device memory and weights: allocation that evicts the
// least recently used cached weights and KV mirrors under memory pressure, the
// per-op scratch buffers, the weight cache keyed by host pointer and checked by
// fingerprint, and zero-copy registration of the mmapped weights on integrated
// GPUs. Together because the cache and the allocator decide what stays on the
// device; docs/cuda.md ("Design": Weights, Zero-copy) says why.
#include <cstdint>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "ggml-like/cuda/backend_impl.h"

namespace gl::cuda_impl {

namespace {

uint64_t hash_bytes(const uint8_t* p, size_t n, uint64_t h) {
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

// Size plus up to 64 bytes at the start, the middle and the end.
uint64_t fingerprint(const void* data, size_t n) {
    const auto* p = static_cast<const uint8_t*>(data);
    uint64_t h = mix(0xcbf29ce484222325ull, n);
    const size_t k = n < 64 ? n : 64;
    h = hash_bytes(p, k, h);
    h = hash_bytes(p + (n - k) / 2, k, h);
    return hash_bytes(p + n - k, k, h);
}

} // namespace

// ---- device memory -------------------------------------------------------------

// cudaMalloc, evicting least recently used cache entries (never those of
// the current op) until it fits.
void* CudaBackend::alloc(size_t bytes, const char* what) {
    end_capture(true);
    for (;;) {
        void* p = nullptr;
        const cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
        if (e == cudaSuccess) return p;
        if (e != cudaErrorMemoryAllocation) throw_cuda(e, "cudaMalloc", __FILE__, __LINE__);
        cudaGetLastError();
        if (!evict_one())
            throw std::runtime_error("CUDA out of memory: " + std::to_string(bytes >> 20) +
                                     " MiB for " + what + " on " + prop_.name);
    }
}

void* CudaBackend::buf(int id, size_t bytes) {
    DevBuf& b = bufs_[id];
    if (bytes > b.cap) {
        sync();
        cudaFree(b.p);
        b.p = nullptr;
        b.cap = 0;
        const size_t want = (bytes + (bytes >> 2) + 255) / 256 * 256; // headroom: grow rarely
        b.p = alloc(want, "scratch");
        b.cap = want;
    }
    return b.p;
}

bool CudaBackend::evict_one() {
    uint64_t oldest = tick_;
    const void* wkey = nullptr;
    const void* mkey = nullptr;
    for (auto& [k, w] : weights_)
        if (!w.mapped && w.last_use < oldest) {
            oldest = w.last_use;
            wkey = k;
            mkey = nullptr;
        }
    for (auto& [k, m] : mirrors_)
        if (m.last_use < oldest) {
            oldest = m.last_use;
            mkey = k;
            wkey = nullptr;
        }
    if (!wkey && !mkey) return false;
    sync();
    if (wkey) {
        cudaFree(weights_[wkey].dev);
        weights_.erase(wkey);
    } else {
        free_mirror(mirrors_[mkey]);
        mirrors_.erase(mkey);
    }
    return true;
}

// ---- weights ---------------------------------------------------------------------

const void* CudaBackend::weight(const void* host, size_t bytes) {
    const uint64_t fp = fingerprint(host, bytes);
    auto it = weights_.find(host);
    if (it != weights_.end()) {
        if (it->second.bytes == bytes && it->second.fp == fp) {
            it->second.last_use = tick_;
            return it->second.dev;
        }
        sync();
        if (!it->second.mapped) cudaFree(it->second.dev);
        weights_.erase(it);
    }
    end_capture(true); // a synchronous copy, or a registration: not in a graph
    WeightEntry e;
    e.bytes = bytes;
    e.fp = fp;
    e.last_use = tick_;
    // The kernels read blocks with 16-bit loads (dequant.h): a tensor at an
    // odd file offset (a GGUF may declare general.alignment 1) is copied.
    if (zero_copy_ && reinterpret_cast<uintptr_t>(host) % 16 == 0 && map_host(host, bytes)) {
        e.dev = const_cast<void*>(
            host); // canUseHostPointerForRegisteredMem: same address on the device
        e.mapped = true;
    } else {
        e.dev = alloc(bytes, "weights");
        const cudaError_t c = cudaMemcpy(e.dev, host, bytes, cudaMemcpyHostToDevice);
        if (c != cudaSuccess) {
            cudaFree(e.dev);
            throw_cuda(c, "cudaMemcpy(weights)", __FILE__, __LINE__);
        }
    }
    weights_[host] = e;
    return e.dev;
}

// Pin and map the pages of [host, host + bytes) that are not yet
// registered. Registered ranges are disjoint page intervals, so tensors
// sharing a page are fine.
bool CudaBackend::map_host(const void* host, size_t bytes) {
    const uintptr_t page = 4096;
    const uintptr_t a = reinterpret_cast<uintptr_t>(host) / page * page;
    const uintptr_t b = (reinterpret_cast<uintptr_t>(host) + bytes + page - 1) / page * page;
    std::vector<std::pair<uintptr_t, uintptr_t>> gaps;
    uintptr_t cur = a;
    auto it = registered_.upper_bound(cur); // first interval starting after cur
    if (it != registered_.begin()) {
        const auto prev = std::prev(it);
        if (prev->second > cur) cur = prev->second; // cur lies inside an earlier interval
    }
    while (cur < b) {
        if (it == registered_.end() || it->first >= b) {
            gaps.emplace_back(cur, b);
            break;
        }
        if (it->first > cur) gaps.emplace_back(cur, it->first);
        if (it->second > cur) cur = it->second;
        ++it;
    }
    const unsigned flags =
        cudaHostRegisterMapped | (register_read_only_ ? cudaHostRegisterReadOnly : 0u);
    for (auto [g0, g1] : gaps) {
        const cudaError_t e = cudaHostRegister(reinterpret_cast<void*>(g0), g1 - g0, flags);
        if (e != cudaSuccess) {
            cudaGetLastError();
            return false; // pages registered so far stay registered (harmless); the tensor is
                          // copied
        }
        registered_[g0] = g1;
    }
    return true;
}

} // namespace gl::cuda_impl
