// The CUDA backend's class, shared by the files that implement it. Internal:
// included only by ggml-like/cuda/*.cu; everyone else uses cuda_backend.h.
// One class split over files by concern (docs/cuda.md, "Design"):
//   backend.cu     construction, the ops, Forward's steps, the entry points
//   activations.cu device twins of Forward's buffers (coherence.h), op
//                  inputs and outputs
//   graphs.cu      pinned staging, waits, CUDA graph capture and update
//   weights.cu     device memory with LRU eviction, the weight cache
//                  (fingerprints), zero-copy registration
//   kv_mirror.cu   attention: the device KV mirror and the hot/cold split
// The class lives in a named namespace (not an anonymous one) so that its
// members defined in one file link from the others.
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "ggml-like/cuda/coherence.h"
#include "ggml-like/cuda/cuda_backend.h"
#include "ggml-like/cpu/thread_pool.h"

namespace gl::cuda_impl {

[[noreturn]] void throw_cuda(cudaError_t e, const char* what, const char* file, int line);

#define GL_CUDA(call)                                                                              \
    do {                                                                                           \
        const cudaError_t e_ = (call);                                                             \
        if (e_ != cudaSuccess) ::gl::cuda_impl::throw_cuda(e_, #call, __FILE__, __LINE__);         \
    } while (0)

// Hash step shared by the weight fingerprint (weights.cu) and the KV row
// sample (kv_mirror.cu).
inline uint64_t mix(uint64_t h, uint64_t v) {
    h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    return h;
}

class CudaBackend final : public Backend {
  public:
    // ---- backend.cu ----
    CudaBackend(int device, const CudaOptions& opt);
    ~CudaBackend() override;
    std::string name() const override;
    int n_threads() const override { return 1; }

    // Device buffers grow on demand; nothing to plan ahead.
    void reserve(size_t, int64_t) override {}

    void matmul(const Tensor& w, const float* x, int64_t n_tok, float* y) override;
    void rmsnorm(const float* x, const float* w, int64_t n, int64_t rows, float eps,
                 float* o) override;
    // One kernel with KVRUN_CUDA_FUSED=1, else the two ops (the default until
    // a device run has checked it: tests/cuda/test_cuda.cpp).
    void add_rmsnorm(float* x, const float* y, const float* w, int64_t n, int64_t rows, float eps,
                     float* o) override;
    void rope(float* x, int64_t rows, int n_heads, int head_dim, int rope_dims, const float* cos,
              const float* sin, bool neox) override;
    void hadamard_rows(float* x, int64_t rows, int64_t n, int block) override;
    void hadamard_rows_inverse(float* x, int64_t rows, int64_t n, int block) override;
    void silu_mul(float* gate, const float* up, int64_t n) override {
        binary(gate, up, n, Binary::silu_mul);
    }
    void gelu_mul(float* gate, const float* up, int64_t n) override {
        binary(gate, up, n, Binary::gelu_mul);
    }
    void add(float* y, const float* x, int64_t n) override { binary(y, x, n, Binary::add); }
    void convert_rows(Type t, const float* x, int64_t n, int64_t rows, void* dst) override;
    void attention(const AttentionArgs& a) override;
    // The mirror syncs from the host ring per call, but rows the step writes
    // land there only at its end (copy_to_host).
    bool reads_host_kv() const override { return false; }
    MemoryUse memory_use() const override;
    void begin_step(int n_tok) override;
    bool end_step() override;

    // ---- activations.cu: device-resident activations (backend.h, coherence.h) ----
    void track(void* host, size_t bytes) override;
    void untrack(void* host) override { coh_->untrack(host); }
    void host_wrote(const void* p, size_t bytes) override { coh_->host_wrote(p, bytes); }
    void host_read(const void* p, size_t bytes) override;
    void copy_to_host(const void* src, void* dst, size_t bytes) override;

  private:
    static unsigned long long ull(uint64_t v) { return static_cast<unsigned long long>(v); }
    // hadamard_rows and its inverse: one kernel, the sign flip before or after.
    void hadamard(float* x, int64_t rows, int64_t n, int block, bool inverse);

    // ---- one operation: eager, or recorded into the step's graph ----------------------

    // KVRUN_CUDA_DEBUG's timings.
    static uint64_t ns_since(std::chrono::steady_clock::time_point t0) {
        return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                         std::chrono::steady_clock::now() - t0)
                                         .count());
    }

    // What an op is, for KVRUN_CUDA_DEBUG=2's time per kind.
    enum class OpKind { matmul, attention, copy, other, count };

    // Runs an op's body. While recording, an exception means the recording
    // is unusable: it is abandoned and the step reported lost (end_step), so
    // Forward does it again eagerly.
    template <class F> void op(OpKind kind, F&& body) {
        if (step_lost_) return;
        begin_op();
        if (!capturing_) {
            if (debug_ < 2) {
                body();
                return;
            }
            // Each op waited for: host time and the GPU's, per kind.
            const auto t0 = std::chrono::steady_clock::now();
            body();
            GL_CUDA(cudaStreamSynchronize(s_));
            st_.op_ns[static_cast<int>(kind)] += ns_since(t0);
            return;
        }
        try {
            body();
        } catch (const std::exception& e) {
            abandon_capture(e.what());
        }
    }

    struct Out {
        void* dev = nullptr;
        void* host = nullptr;
        size_t bytes = 0;
        bool tracked = false;
    };

    // ---- activations.cu ----
    const void* in(const void* host, size_t bytes, int id);
    Out out(void* host, size_t bytes, int id);
    Out inout(void* host, size_t bytes, int id);
    void finish(std::initializer_list<Out> outs);

    // ---- graphs.cu: staging, waits, graphs ----
    void h2d(void* dev, const void* host, size_t bytes);
    uint8_t* stage(size_t bytes);
    bool grow_staging(size_t bytes);
    void sync();
    static bool graphs_enabled(const char* env) { return !(env && env[0] == '0'); }
    void end_capture(bool partial);
    void lose(const std::string& why);
    void abandon_capture(const std::string& why);
    void graphs_off(const std::string& why);

    void note_upload(size_t bytes) {
        st_.uploads++;
        st_.up_bytes += bytes;
    }
    void note_download(size_t bytes) {
        st_.downloads++;
        st_.down_bytes += bytes;
    }

    // ---- kv_mirror.cu: attention ----
    void attend(const AttentionArgs& a);

    // ---- device memory (weights.cu) ----

    enum BufId { kX, kY, kW, kQU, kPos, kSlotPos, kKNew, kVNew, kSink, kPartial, kLse, kNumBufs };
    struct DevBuf {
        void* p = nullptr;
        size_t cap = 0;
    };

    void begin_op() {
        GL_CUDA(cudaSetDevice(dev_));
        ++tick_;
    }
    void* alloc(size_t bytes, const char* what);
    void* buf(int id, size_t bytes);
    bool evict_one();

    // ---- backend.cu: silu_mul and add ----
    enum class Binary { silu_mul, gelu_mul, add };
    void binary(float* y, const float* x, int64_t n, Binary which);

    // The activations' twins (coherence.h) live in ordinary device memory
    // (activations.cu).
    class Twins final : public TwinDevice {
      public:
        explicit Twins(CudaBackend& b) : b_(b) {}
        void* alloc(size_t bytes) override;
        void free(void* dev) override;
        void upload(void* dev, const void* host, size_t bytes) override;
        void download(void* host, const void* dev, size_t bytes) override;

      private:
        CudaBackend& b_;
    };

    // ---- weights.cu ----

    struct WeightEntry {
        void* dev = nullptr;
        size_t bytes = 0;
        uint64_t fp = 0;
        uint64_t last_use = 0;
        bool mapped = false; // zero-copy: dev is the registered host pointer
    };

    const void* weight(const void* host, size_t bytes);
    bool map_host(const void* host, size_t bytes);

    // ---- kv_mirror.cu ----

    struct KvMirror {
        const void* host_v = nullptr;
        int n_ctx = 0;  // the host ring's slots
        int window = 0; // hot/cold: window_ (rows = sinks + window); 0: the whole ring
        int rows = 0;   // device rows
        size_t rk = 0, rv = 0;
        Type tk = Type::F32, tv = Type::F32;
        void* k = nullptr;
        void* v = nullptr;
        int64_t* dpos = nullptr;      // [rows] on the device: pos, uploaded where it changes
        std::vector<int64_t> pos;     // [rows] position each device row holds, -1 = nothing valid,
                                      // kRowUnknown = not known (after a lost step)
        std::vector<uint64_t> sample; // row_sample() of the host rows uploaded there
        uint64_t last_use = 0;
    };

    // Neither a position nor -1: the row and its device tag are uploaded anew.
    static constexpr int64_t kRowUnknown = -2;
    static void free_mirror(KvMirror& m);
    KvMirror& mirror(const AttentionArgs& a, int window, int64_t cut);
    void sync_mirror(KvMirror& m, const AttentionArgs& a, int64_t cut);

    // ---- state ----

    // Pinned staging for host<->device copies (grows after a step that ran
    // out of it, up to kStagingMax).
    static constexpr size_t kStagingStart = size_t{8} << 20, kStagingMax = size_t{256} << 20;
    struct Staging {
        uint8_t* p = nullptr;
        size_t cap = 0, used = 0;
    };
    // A device->host copy into staging, to be copied on to dst after a sync.
    struct Pending {
        const uint8_t* src;
        void* dst;
        size_t bytes;
    };
    struct Stats {
        uint64_t steps = 0, captures = 0, eager_decode = 0, launches = 0, updates = 0,
                 instantiations = 0, partial = 0, uploads = 0, downloads = 0, up_bytes = 0,
                 down_bytes = 0;
        // KVRUN_CUDA_DEBUG: host time of whole decode steps (eager, and
        // graph steps up to their launch) and the GPU time of the launched
        // graphs; =2: time of each kind of op, each waited for.
        uint64_t eager_ns = 0, record_ns = 0, graph_steps_timed = 0;
        double graph_gpu_ms = 0;
        uint64_t op_ns[static_cast<int>(OpKind::count)] = {};
    };

    int dev_;
    cudaDeviceProp prop_{};
    cudaStream_t s_ = nullptr;
    bool zero_copy_ = false, register_read_only_ = false;
    uint64_t tick_ = 0;
    std::array<DevBuf, kNumBufs> bufs_{};
    std::unordered_map<const void*, WeightEntry> weights_;
    std::unordered_map<const void*, KvMirror> mirrors_;
    std::vector<int64_t> want_, from_; // sync_mirror: per device row, position and host slot
    // Hot/cold KV (CudaOptions::kv_gpu_window): the CPU side of attention.
    int window_ = 0;
    std::unique_ptr<ThreadPool> cpu_pool_;
    std::vector<float> cpu_scratch_, cold_out_, cold_lse_, hot_lse_;
    std::map<uintptr_t, uintptr_t>
        registered_; // page intervals [first, second) pinned by cudaHostRegister
    // Device-resident activations (coherence.h).
    Twins twins_{*this};
    std::unique_ptr<Coherence> coh_;
    bool destroying_ = false;
    Staging stage_;
    bool stage_overflow_ = false, stage_failed_ = false;
    std::vector<Pending> pending_;
    // Steps and graphs: a decode step (one token) is recorded by stream
    // capture from the second one on (the first allocates what the shapes
    // need), its graph updated in place and launched at the first host_read.
    bool in_step_ = false, step_lost_ = false, step_graph_ = false;
    // KVRUN_CUDA_DEBUG step timing: the step's start, and events around a
    // graph's launch (graph_timed_: both recorded this step).
    std::chrono::steady_clock::time_point step_t0_{};
    cudaEvent_t ev_launch_ = nullptr, ev_done_ = nullptr;
    bool graph_timed_ = false;
    int step_tokens_ = 0;
    uint64_t warm_ = 0; // decode steps run eagerly so far
    bool graphs_ = false, graphs_off_later_ = false, capturing_ = false;
    int debug_ = 0; // KVRUN_CUDA_DEBUG: 1 counts and step times, 2 also per-op times
    bool fused_ = false; // KVRUN_CUDA_FUSED=1: add_rmsnorm as one kernel
    cudaGraphExec_t exec_ = nullptr;
    uint64_t fail_at_ = 0;
    Stats st_;
};

} // namespace gl::cuda_impl
