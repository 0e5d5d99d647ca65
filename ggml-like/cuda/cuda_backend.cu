// gl::Backend on a CUDA device. The seam (backend.h) hands every operation
// HOST pointers; this backend decides where the bytes really live.
//
// NOTE: the device-resident activations, the CUDA graphs and the pinned
// staging described below compile for sm_87/sm_90 and their logic is tested
// on the CPU (tests/test_coherence.cpp), but they have NOT run on a GPU yet:
// scripts/gpu-check.sh runs the CUDA tests and compares KVRUN_CUDA_GRAPHS=0
// with the default.
//
// Where the data lives:
//   * Weights (Tensor::data, pointers into the mmapped GGUF) are uploaded to
//     device memory once, on first use, and cached by host pointer. Each
//     lookup re-checks a cheap fingerprint (size + bytes at the start, middle
//     and end) so a different tensor later allocated at a freed address is
//     not mistaken for the cached one. Under memory pressure the least
//     recently used entries are evicted (and re-uploaded when needed again).
//     Inside a Forward step the RMSNorm weights are cached the same way.
//   * On integrated GPUs (Jetson: CPU and GPU share DRAM) a device copy would
//     double the weights' memory for nothing. There, when the device can use
//     host pointers for registered memory, the mmapped pages are pinned and
//     mapped with cudaHostRegister(Mapped | ReadOnly -- the mapping is
//     read-only, and without ReadOnly the driver would try to pin writable
//     pages and fail) and kernels read them in place. Pages shared by two
//     tensors are registered once: registrations are tracked as disjoint
//     page intervals. If registration fails the tensor is copied instead.
//     KVRUN_CUDA_ZERO_COPY=1 forces this path on a discrete GPU (slow: every
//     read crosses PCIe -- for testing), =0 disables it.
//   * Activations: Forward registers its buffers (Backend::track) and each
//     gets a device twin; gl::Coherence (coherence.h) knows, per byte range,
//     whether the host or the device copy is newer. An op reads a twin that
//     is current without any upload and writes its output to the twin, which
//     is not downloaded: a decode step uploads the embedding row, its cos/sin
//     and position (Forward's host_wrote) and downloads only the logits
//     (host_read), or the residual stream where -ngl hands the layers to the
//     CPU. No op waits for the GPU. The new K/V rows reach the host ring by
//     copy_to_host: an async copy into pinned staging, copied on into the
//     ring after the step's final wait. Pointers in no tracked buffer (the
//     kernel tests call the ops directly) are copied in, and out with a wait,
//     at each op as before.
//   * Pinned staging: every host->device copy goes through one page-locked
//     buffer (8 MiB, doubled after a step that ran out of it), so copies are
//     truly async and may sit in a CUDA graph; it is recycled at each wait.
//   * The KV ring: the host KvCache stays the source of truth. The backend
//     keeps a device mirror per ring (keyed by the host K pointer) and, at
//     each attention call, compares every slot's position tag (slot_pos) and
//     an 8-byte sample of its K and V rows with what the mirror holds; slots
//     that differ are re-uploaded (coalesced into runs), and the position
//     tags that changed. A decode step thus moves one new row per layer, and
//     clear/truncate/prompt-cache restores are picked up without any hook.
//     The batch's own new K/V rows are read from their twins.
//   * Hot/cold KV (CudaOptions::kv_gpu_window = W > 0, --kv-gpu-window): the
//     mirror holds only the sinks and the W newest positions, as a small ring
//     of n_sink + W rows (sync_mirror). The GPU attends those and the batch's
//     own keys and returns its output with the log-sum-exp of its scores; the
//     older ("cold") positions are attended meanwhile on the CPU, straight
//     from the host ring, by gl::attention_partial, and the two are merged by
//     gl::attention_merge. Device KV memory is then (n_sink + W) rows per
//     layer whatever n_ctx is; each step costs a CPU pass over the cold part
//     and a wait for the queries in each layer (so no graphs with a window).
//     The host ring itself is not pinned: the GPU never reads the cold part,
//     and the hot rows it does upload go through the pinned staging buffer.
//   * -ngl N (partial offload): Forward's Placement sends the first N layers
//     here and the others to a CPU backend; at the crossing Forward asks for
//     the residual stream (host_read) and the CPU layers work on the host.
//
// CUDA graphs (decode steps, n_tok == 1; KVRUN_CUDA_GRAPHS=0 turns them off):
// from the second decode step on, Forward's begin_step starts a stream
// capture; every op of the step is recorded instead of launched (uploads come
// from pinned staging, written at record time, so the per-token inputs --
// embedding row, position, cos/sin, slot tags, new ring rows -- are data of
// the recorded copies). The first host_read ends the capture; the graph
// replaces last step's executable graph's parameters (cudaGraphExecUpdate;
// same shape every step) or is instantiated anew, and is launched. Anything
// a graph cannot hold (an allocation, a wait, a copy from pageable memory)
// ends the capture early and the rest of the step runs eagerly. If capture,
// update, instantiation or launch fails, the recorded work is lost: the
// backend says so on stderr once, turns graphs off, and end_step returns
// false, so Forward does the step again, eagerly. KVRUN_CUDA_DEBUG=1 prints
// counts (steps, graph launches, updates, uploads, downloads) at exit.
//
// What a later stage could still change in the interface:
//   * Weights: Backend::upload_weights(const Tensor*) at load time (or a
//     per-tensor placement: device / host-mapped) instead of lazy caching.
//   * KV cache: ownership of the ring by the backend (KvCache asks the
//     backend for its storage), so the device ring is the truth and the host
//     copy (and the per-step slot comparison) disappears; with a hot/cold
//     split the host would then keep only the cold part.
//   * Token ids and positions in device buffers read by an embedding kernel,
//     so a graph could be replayed without re-recording.
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <iterator>
#include <map>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "ggml-like/cuda/coherence.h"
#include "ggml-like/cuda/dequant.h"
#include "ggml-like/cuda/kernels.h"
#include "ggml-like/cuda/cuda_backend.h"
#include "ggml-like/cpu/thread_pool.h"

namespace gl {

namespace {

[[noreturn]] void throw_cuda(cudaError_t e, const char* what, const char* file, int line) {
    throw std::runtime_error(std::string("CUDA error: ") + cudaGetErrorString(e) + " in " + what +
                             " (" + file + ":" + std::to_string(line) + ")");
}

#define GL_CUDA(call)                                                                              \
    do {                                                                                           \
        const cudaError_t e_ = (call);                                                             \
        if (e_ != cudaSuccess) throw_cuda(e_, #call, __FILE__, __LINE__);                          \
    } while (0)

uint64_t mix(uint64_t h, uint64_t v) {
    h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    return h;
}

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

uint64_t row_sample(const uint8_t* k, size_t kb, const uint8_t* v, size_t vb) {
    uint64_t a = 0, b = 0;
    std::memcpy(&a, k, kb < 8 ? kb : 8);
    std::memcpy(&b, v, vb < 8 ? vb : 8);
    return mix(mix(0x51ed270b27e3f1a5ull, a), b);
}

class CudaBackend final : public Backend {
  public:
    CudaBackend(int device, const CudaOptions& opt) : dev_(device), window_(opt.kv_gpu_window) {
        if (window_ < 0) throw std::runtime_error("CUDA backend: negative KV GPU window");
        if (window_ > 0)
            cpu_pool_ = std::make_unique<ThreadPool>(opt.cpu_threads > 0 ? opt.cpu_threads : 1);
        int n = 0;
        GL_CUDA(cudaGetDeviceCount(&n));
        if (device < 0 || device >= n)
            throw std::runtime_error("CUDA device " + std::to_string(device) + " does not exist (" +
                                     std::to_string(n) + " found)");
        GL_CUDA(cudaSetDevice(dev_));
        GL_CUDA(cudaGetDeviceProperties(&prop_, dev_));
        std::string why;
        if (!cuda::kernels_loadable(&why)) throw std::runtime_error(why);
        GL_CUDA(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking));
        zero_copy_ = prop_.integrated && prop_.canUseHostPointerForRegisteredMem;
        if (const char* z = std::getenv("KVRUN_CUDA_ZERO_COPY"))
            zero_copy_ = z[0] == '1' && prop_.canUseHostPointerForRegisteredMem;
        int ro = 0;
        if (cudaDeviceGetAttribute(&ro, cudaDevAttrHostRegisterReadOnlySupported, dev_) !=
            cudaSuccess) {
            cudaGetLastError();
            ro = 0;
        }
        register_read_only_ = ro != 0;
        // Graphs record whole decode steps; the hot/cold split waits for the
        // GPU in the middle of each layer, so it keeps eager launches.
        graphs_ = graphs_enabled(std::getenv("KVRUN_CUDA_GRAPHS")) && window_ == 0;
        if (const char* d = std::getenv("KVRUN_CUDA_DEBUG")) debug_ = d[0] == '1';
        // Tests: treat the N-th recorded graph as failed (the fallback path).
        if (const char* f = std::getenv("KVRUN_CUDA_GRAPHS_TEST_FAIL"))
            fail_at_ = std::strtoull(f, nullptr, 10);
        coh_ = std::make_unique<Coherence>(twins_);
    }

    ~CudaBackend() override {
        cudaSetDevice(dev_);
        if (capturing_) {
            cudaGraph_t g = nullptr;
            cudaStreamEndCapture(s_, &g);
            if (g) cudaGraphDestroy(g);
        }
        if (s_) cudaStreamSynchronize(s_);
        cudaGetLastError();
        if (debug_)
            std::fprintf(stderr,
                         "kvrun: CUDA %s: %llu steps, %llu decode steps eager, %llu graph launches "
                         "(%llu updated, %llu instantiated, %llu partial), %llu uploads (%.1f "
                         "MiB), %llu downloads (%.1f MiB)\n",
                         prop_.name, ull(st_.steps), ull(st_.eager_decode), ull(st_.launches),
                         ull(st_.updates), ull(st_.instantiations), ull(st_.partial),
                         ull(st_.uploads), st_.up_bytes / 1048576.0, ull(st_.downloads),
                         st_.down_bytes / 1048576.0);
        destroying_ = true;
        coh_.reset(); // frees the twins (Twins::free) while the stream exists
        if (exec_) cudaGraphExecDestroy(exec_);
        if (stage_.p) cudaFreeHost(stage_.p);
        for (auto& b : bufs_) cudaFree(b.p);
        for (auto& [k, w] : weights_)
            if (!w.mapped) cudaFree(w.dev);
        for (auto& [k, m] : mirrors_) free_mirror(m);
        for (auto& [a, e] : registered_) cudaHostUnregister(reinterpret_cast<void*>(a));
        if (s_) cudaStreamDestroy(s_);
    }

    std::string name() const override {
        return "cuda:" + std::to_string(dev_) + " (" + prop_.name + ", sm_" +
               std::to_string(prop_.major) + std::to_string(prop_.minor) +
               (zero_copy_ ? ", zero-copy weights" : "") +
               (window_ > 0 ? ", KV window " + std::to_string(window_) : "") +
               (graphs_ ? ", graphs" : "") + ")";
    }
    int n_threads() const override { return 1; }

    // Device buffers grow on demand; nothing to plan ahead.
    void reserve(size_t, int64_t) override {}

    void matmul(const Tensor& w, const float* x, int64_t n_tok, float* y) override {
        if (!cuda::matmul_supported(w.type))
            throw std::runtime_error(
                std::string("CUDA backend: no matmul kernel for weight type ") + type_name(w.type) +
                " (supported: f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 iq4_nl q2_K..q6_K)");
        if (n_tok <= 0 || w.ne1 <= 0) return;
        op([&] {
            const size_t xb = sizeof(float) * static_cast<size_t>(n_tok * w.ne0);
            const size_t yb = sizeof(float) * static_cast<size_t>(n_tok * w.ne1);
            const size_t wbytes =
                static_cast<size_t>(w.ne1 - 1) * w.row_bytes + row_size(w.type, w.ne0);
            const void* dw = weight(w.data, wbytes);
            const auto* dx = static_cast<const float*>(in(x, xb, kX));
            const Out o = out(y, yb, kY);
            cuda::matmul(w.type, dw, w.row_bytes, w.ne0, w.ne1, dx, n_tok,
                         static_cast<float*>(o.dev), s_);
            GL_CUDA(cudaGetLastError());
            finish({o});
        });
    }

    void rmsnorm(const float* x, const float* w, int64_t n, int64_t rows, float eps,
                 float* o) override {
        if (n <= 0 || rows <= 0) return;
        op([&] {
            const size_t xb = sizeof(float) * static_cast<size_t>(n * rows),
                         wb = sizeof(float) * static_cast<size_t>(n);
            // In a Forward step the norm weight is model data: cached like a
            // matrix. Called directly (tests), it is read as it is now.
            const auto* dw = static_cast<const float*>(in_step_ ? weight(w, wb) : in(w, wb, kW));
            const auto* dx = static_cast<const float*>(in(x, xb, kX));
            const Out r = out(o, xb, kY);
            cuda::rmsnorm(dx, dw, n, rows, eps, static_cast<float*>(r.dev), s_);
            GL_CUDA(cudaGetLastError());
            finish({r});
        });
    }

    void rope(float* x, int64_t rows, int n_heads, int head_dim, int rope_dims, const float* cos,
              const float* sin, bool neox) override {
        if (rows <= 0 || n_heads <= 0 || rope_dims < 2) return;
        op([&] {
            const size_t xb = sizeof(float) * static_cast<size_t>(rows * n_heads * head_dim);
            const size_t cb = sizeof(float) * static_cast<size_t>(rows * (rope_dims / 2));
            const auto* dc = static_cast<const float*>(in(cos, cb, kW));
            const auto* ds = static_cast<const float*>(in(sin, cb, kY));
            const Out r = inout(x, xb, kX);
            cuda::rope(static_cast<float*>(r.dev), rows, n_heads, head_dim, rope_dims, dc, ds, neox,
                       s_);
            GL_CUDA(cudaGetLastError());
            finish({r});
        });
    }

    void silu_mul(float* gate, const float* up, int64_t n) override { binary(gate, up, n, true); }
    void add(float* y, const float* x, int64_t n) override { binary(y, x, n, false); }

    void convert_rows(Type t, const float* x, int64_t n, int64_t rows, void* dst) override {
        if (!cuda::convert_supported(t))
            throw std::runtime_error(std::string("CUDA backend: cannot convert rows to ") +
                                     type_name(t) + " (supported: f32 f16 bf16 q8_0 q4_0)");
        if (n <= 0 || rows <= 0) return;
        op([&] {
            const size_t xb = sizeof(float) * static_cast<size_t>(n * rows);
            const size_t db = row_size(t, n) * static_cast<size_t>(rows);
            const auto* dx = static_cast<const float*>(in(x, xb, kX));
            const Out r = out(dst, db, kY);
            cuda::convert_rows(t, dx, n, rows, r.dev, s_);
            GL_CUDA(cudaGetLastError());
            finish({r});
        });
    }

    void attention(const AttentionArgs& a) override {
        for (Type t : {a.k_type, a.v_type})
            if (!cuda::kv_type_ok(t))
                throw std::runtime_error(
                    std::string("CUDA backend: attention over a ") + type_name(t) +
                    " KV cache is not supported (use f32, f16, bf16, q8_0 or q4_0)");
        if (a.k_head_bytes || a.v_slot_bytes)
            throw std::runtime_error("CUDA backend: head-major KV slots are not supported (the "
                                     "cache must use the row layout)");
        if (a.n_tok <= 0) return;
        if (a.n_head_kv <= 0 || a.n_head % a.n_head_kv != 0 || a.head_dim <= 0)
            throw std::runtime_error(
                "CUDA backend: attention needs n_head a multiple of n_head_kv");
        op([&] { attend(a); });
    }

    MemoryUse memory_use() const override {
        MemoryUse u;
        u.device = true;
        for (const auto& [k, w] : weights_) (w.mapped ? u.weights_mapped : u.weights) += w.bytes;
        for (const auto& [k, m] : mirrors_) {
            u.kv += static_cast<uint64_t>(m.rows) * (m.rk + m.rv);
            u.scratch += static_cast<uint64_t>(m.rows) * sizeof(int64_t); // position tags
        }
        for (const DevBuf& b : bufs_) u.scratch += b.cap;
        if (coh_) u.scratch += coh_->tracked_bytes(); // the activations' device twins
        cuda_memory_info(dev_, &u.free, &u.total);
        return u;
    }

    // ---- device-resident activations (backend.h, coherence.h) ---------------------------

    void track(void* host, size_t bytes) override {
        if (!coh_->track(host, bytes) && debug_)
            std::fprintf(stderr,
                         "kvrun: CUDA: no device room for a %zu-byte activation buffer; "
                         "it is copied at each op\n",
                         bytes);
    }
    void untrack(void* host) override { coh_->untrack(host); }
    void host_wrote(const void* p, size_t bytes) override { coh_->host_wrote(p, bytes); }

    void host_read(const void* p, size_t bytes) override {
        if (step_lost_) return; // the step is done again; nothing here is used
        begin_op();
        end_capture(false);
        if (step_lost_) return;
        coh_->host_read(p, bytes);
        sync();
    }

    void copy_to_host(const void* src, void* dst, size_t bytes) override {
        if (bytes == 0) return;
        op([&] {
            if (coh_->device_dirty(src, bytes)) {
                // On the device only: into the pinned staging buffer now, on
                // to dst at the next sync().
                if (const void* d = coh_->device_in(src, bytes)) {
                    if (uint8_t* st = stage(bytes)) {
                        GL_CUDA(cudaMemcpyAsync(st, d, bytes, cudaMemcpyDeviceToHost, s_));
                        pending_.push_back({st, dst, bytes});
                        note_download(bytes);
                        return;
                    }
                }
                end_capture(true);
                if (step_lost_) return;
                coh_->host_read(src, bytes);
                sync();
            } else if (!pending_.empty()) {
                sync(); // an earlier pending copy must not land over this one
            }
            std::memcpy(dst, src, bytes);
        });
    }

    void begin_step(int n_tok) override {
        step_lost_ = false;
        in_step_ = true;
        step_tokens_ = n_tok;
        step_graph_ = false;
        st_.steps++;
        if (!graphs_ || n_tok != 1 || warm_ < 1) return;
        GL_CUDA(cudaSetDevice(dev_));
        if (!stage_.p && !grow_staging(kStagingStart)) {
            graphs_off("no pinned staging buffer");
            return;
        }
        const cudaError_t e = cudaStreamBeginCapture(s_, cudaStreamCaptureModeRelaxed);
        if (e != cudaSuccess) {
            cudaGetLastError();
            graphs_off(std::string("cudaStreamBeginCapture: ") + cudaGetErrorString(e));
            return;
        }
        capturing_ = true;
        step_graph_ = true;
    }

    bool end_step() override {
        in_step_ = false;
        if (!step_lost_) {
            begin_op();
            end_capture(false);
        }
        if (step_lost_) {
            // The recorded work never ran: no pending row is valid and the
            // device copies are not what the table thinks.
            cudaStreamSynchronize(s_);
            cudaGetLastError();
            pending_.clear();
            stage_.used = 0;
            coh_->forget_device();
            step_lost_ = false;
            return false;
        }
        sync();
        if (stage_overflow_) { // next time, stage everything
            stage_overflow_ = false;
            grow_staging(stage_.cap * 2);
        }
        if (step_tokens_ == 1 && !step_graph_) {
            warm_++;
            st_.eager_decode++;
        }
        return true;
    }

  private:
    static unsigned long long ull(uint64_t v) { return static_cast<unsigned long long>(v); }

    // ---- one operation: eager, or recorded into the step's graph ----------------------

    // Runs an op's body. While recording, an exception means the recording
    // is unusable: it is abandoned and the step reported lost (end_step), so
    // Forward does it again eagerly.
    template <class F> void op(F&& body) {
        if (step_lost_) return;
        begin_op();
        if (!capturing_) {
            body();
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

    // An op input: the device twin of a tracked buffer (uploading what the
    // host has newer), else a copy in scratch buffer `id`.
    const void* in(const void* host, size_t bytes, int id) {
        if (const void* d = coh_->device_in(host, bytes)) return d;
        if (coh_->device_dirty(host, bytes)) { // overlaps a twin but is not inside one
            end_capture(true);
            coh_->host_read(host, bytes);
            sync();
        }
        void* d = buf(id, bytes);
        h2d(d, host, bytes);
        return d;
    }
    // An op output: the twin (now newer than the host copy), else scratch
    // `id`, downloaded by finish().
    Out out(void* host, size_t bytes, int id) {
        if (void* d = coh_->device_out(host, bytes)) return {d, host, bytes, true};
        return {buf(id, bytes), host, bytes, false};
    }
    Out inout(void* host, size_t bytes, int id) {
        if (void* d = coh_->device_inout(host, bytes)) return {d, host, bytes, true};
        void* d = const_cast<void*>(in(host, bytes, id));
        return {d, host, bytes, false};
    }
    // After the kernels: untracked outputs come back now (and wait).
    void finish(std::initializer_list<Out> outs) {
        bool any = false;
        for (const Out& o : outs)
            if (!o.tracked) {
                if (!any) end_capture(true);
                any = true;
                GL_CUDA(cudaMemcpyAsync(o.host, o.dev, o.bytes, cudaMemcpyDeviceToHost, s_));
                note_download(o.bytes);
            }
        if (!any) return;
        sync();
        for (const Out& o : outs)
            if (!o.tracked) coh_->host_wrote(o.host, o.bytes); // in case it overlaps a twin
    }

    // Host -> device, through the pinned staging buffer when it has room (an
    // async copy, and the only kind a graph may record), else straight from
    // pageable memory (ends a recording first).
    void h2d(void* dev, const void* host, size_t bytes) {
        if (bytes == 0) return;
        note_upload(bytes);
        if (uint8_t* st = stage(bytes)) {
            std::memcpy(st, host, bytes);
            GL_CUDA(cudaMemcpyAsync(dev, st, bytes, cudaMemcpyHostToDevice, s_));
            return;
        }
        end_capture(true);
        GL_CUDA(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, s_));
    }

    // `bytes` of the pinned staging buffer, valid until the next sync(); null
    // when there is none or it is full (noted, so it grows after the step).
    uint8_t* stage(size_t bytes) {
        if (!stage_.p && !capturing_) grow_staging(kStagingStart);
        const size_t at = (stage_.used + 255) / 256 * 256;
        if (!stage_.p || at + bytes > stage_.cap) {
            if (stage_.p) stage_overflow_ = true;
            return nullptr;
        }
        stage_.used = at + bytes;
        return stage_.p + at;
    }

    bool grow_staging(size_t bytes) {
        if (capturing_ || stage_failed_ || bytes > kStagingMax) return false;
        if (stage_.p) {
            sync();
            cudaFreeHost(stage_.p);
            stage_ = {};
        }
        void* p = nullptr;
        if (cudaHostAlloc(&p, bytes, cudaHostAllocDefault) != cudaSuccess) {
            cudaGetLastError();
            stage_failed_ = true; // pageable copies from now on (and no graphs)
            return false;
        }
        stage_.p = static_cast<uint8_t*>(p);
        stage_.cap = bytes;
        stage_.used = 0;
        return true;
    }

    // Wait for the stream; then the pending device->host copies land and
    // the staging buffer is free again.
    void sync() {
        end_capture(true);
        GL_CUDA(cudaStreamSynchronize(s_));
        if (!step_lost_) // a lost recording never filled its staging
            for (const Pending& p : pending_) std::memcpy(p.dst, p.src, p.bytes);
        pending_.clear();
        stage_.used = 0;
    }

    // ---- CUDA graphs ---------------------------------------------------------------

    static bool graphs_enabled(const char* env) { return !(env && env[0] == '0'); }

    // Stop recording and launch what was recorded (all of the step, or with
    // `partial` the part before something a graph cannot hold: a wait, an
    // allocation, a pageable copy; the rest of the step then runs eagerly).
    void end_capture(bool partial) {
        if (!capturing_) return;
        capturing_ = false;
        cudaGraph_t g = nullptr;
        cudaError_t e = cudaStreamEndCapture(s_, &g);
        if (e != cudaSuccess || !g) {
            if (g) cudaGraphDestroy(g);
            lose(std::string("cudaStreamEndCapture: ") + cudaGetErrorString(e));
            return;
        }
        if (++st_.captures == fail_at_) {
            cudaGraphDestroy(g);
            lose("KVRUN_CUDA_GRAPHS_TEST_FAIL=" + std::to_string(fail_at_));
            return;
        }
        if (partial && ++st_.partial > 3) graphs_off_later_ = true;
        // Same shape as last step's graph (the usual case): update its
        // parameters in place; otherwise instantiate anew.
        if (exec_) {
            cudaGraphExecUpdateResultInfo info{};
            if (cudaGraphExecUpdate(exec_, g, &info) == cudaSuccess) {
                st_.updates++;
            } else {
                cudaGetLastError();
                cudaGraphExecDestroy(exec_);
                exec_ = nullptr;
            }
        }
        if (!exec_) {
            e = cudaGraphInstantiate(&exec_, g, 0);
            if (e != cudaSuccess) {
                exec_ = nullptr;
                cudaGraphDestroy(g);
                lose(std::string("cudaGraphInstantiate: ") + cudaGetErrorString(e));
                return;
            }
            st_.instantiations++;
        }
        cudaGraphDestroy(g);
        e = cudaGraphLaunch(exec_, s_);
        if (e != cudaSuccess) {
            lose(std::string("cudaGraphLaunch: ") + cudaGetErrorString(e));
            return;
        }
        st_.launches++;
        if (graphs_off_later_) graphs_off("the decode step keeps breaking out of its graph");
    }

    // A recording failed: its work is gone. The step is reported lost
    // (end_step) and done again by Forward with eager launches from now on.
    void lose(const std::string& why) {
        cudaGetLastError();
        step_lost_ = true;
        graphs_off(why);
    }

    void abandon_capture(const std::string& why) {
        if (capturing_) {
            capturing_ = false;
            cudaGraph_t g = nullptr;
            cudaStreamEndCapture(s_, &g);
            if (g) cudaGraphDestroy(g);
        }
        lose(why);
    }

    void graphs_off(const std::string& why) {
        if (!graphs_) return;
        graphs_ = false;
        std::fprintf(stderr, "kvrun: CUDA graphs off (%s); decoding with eager launches\n",
                     why.c_str());
        if (exec_) {
            cudaGraphExecDestroy(exec_);
            exec_ = nullptr;
        }
    }

    void note_upload(size_t bytes) {
        st_.uploads++;
        st_.up_bytes += bytes;
    }
    void note_download(size_t bytes) {
        st_.downloads++;
        st_.down_bytes += bytes;
    }

    // ---- attention -----------------------------------------------------------------

    void attend(const AttentionArgs& a) {
        const int64_t kvd = static_cast<int64_t>(a.n_head_kv) * a.head_dim;
        const size_t qb = sizeof(float) * static_cast<size_t>(a.n_tok) * a.n_head * a.head_dim;
        const int64_t n_q = static_cast<int64_t>(a.n_tok) * a.n_head;
        // pos is written by the host (Forward's host_wrote): its host copy is current.
        int64_t max_pos = 0;
        for (int i = 0; i < a.n_tok; i++) max_pos = a.pos[i] > max_pos ? a.pos[i] : max_pos;
        const bool any_slid = max_pos >= a.n_ctx;
        const bool use_unrot = any_slid && a.q_unrot != nullptr;
        const bool use_sinks = any_slid && a.n_sink > 0 && a.sink_k != nullptr;
        const bool have_ring = a.n_ctx > 0 && a.k_slots && a.v_slots;
        // Hot/cold: the device mirrors the sinks and the positions >= cut (the
        // newest window_ before this batch); older ones are attended here on
        // the CPU. Batches are consecutive, so pos[0] is the first new position.
        // A ring no longer than the window is mirrored whole.
        const int hot_window = window_ > 0 && window_ < a.window ? window_ : 0;
        const int64_t cut = a.pos[0] - hot_window;
        const bool split = have_ring && hot_window > 0 && cut > a.n_sink;
        const int n_dev = !have_ring ? 0 : hot_window > 0 ? a.n_sink + hot_window : a.n_ctx;

        if (split) {
            // The CPU part reads the queries on the host: bring them down now,
            // before the GPU part is queued, so the two then overlap.
            end_capture(true);
            coh_->host_read(a.q, qb);
            if (use_unrot) coh_->host_read(a.q_unrot, qb);
            sync();
        }

        // Scratch first (allocation may evict cached entries not used by this op).
        auto* dpart = static_cast<float*>(
            buf(kPartial, sizeof(float) * cuda::attention_partial_floats(a.n_tok, a.n_head,
                                                                         a.head_dim, n_dev)));
        float* dlse = split ? static_cast<float*>(buf(kLse, sizeof(float) * n_q)) : nullptr;
        int64_t* dslot = nullptr;
        const void* dks = nullptr;
        const void* dvs = nullptr;
        if (have_ring) {
            KvMirror& m = mirror(a, hot_window, cut);
            dks = m.k;
            dvs = m.v;
            dslot = m.dpos;
        } else {
            dslot = static_cast<int64_t*>(buf(kSlotPos, sizeof(int64_t)));
            GL_CUDA(cudaMemsetAsync(dslot, 0xff, sizeof(int64_t), s_)); // -1: no cached keys
        }
        const auto* dq = static_cast<const float*>(in(a.q, qb, kX));
        const auto* dqu = use_unrot ? static_cast<const float*>(in(a.q_unrot, qb, kQU)) : nullptr;
        const auto* dpos = static_cast<const int64_t*>(in(a.pos, sizeof(int64_t) * a.n_tok, kPos));
        const void* dkn = in(a.k_new, a.k_row_bytes * a.n_tok, kKNew);
        const void* dvn = in(a.v_new, a.v_row_bytes * a.n_tok, kVNew);
        const auto* dsink =
            use_sinks
                ? static_cast<const float*>(in(a.sink_k, sizeof(float) * a.n_sink * kvd, kSink))
                : nullptr;
        const Out o = out(a.out, qb, kY);

        cuda::DevAttention d;
        d.n_tok = a.n_tok;
        d.n_head = a.n_head;
        d.n_head_kv = a.n_head_kv;
        d.head_dim = a.head_dim;
        d.scale = a.scale;
        d.q = dq;
        d.q_unrot = dqu;
        d.pos = dpos;
        d.k_type = a.k_type;
        d.v_type = a.v_type;
        d.k_row_bytes = a.k_row_bytes;
        d.v_row_bytes = a.v_row_bytes;
        d.n_ctx = a.n_ctx;
        d.n_slots = n_dev;
        d.k_slots = dks;
        d.v_slots = dvs;
        d.slot_pos = dslot;
        d.k_new = dkn;
        d.v_new = dvn;
        d.n_sink = a.n_sink;
        d.window = a.window;
        d.sink_k = dsink;
        d.out = static_cast<float*>(o.dev);
        d.lse = dlse;
        cuda::attention(d, dpart, s_);
        GL_CUDA(cudaGetLastError());
        if (!split) {
            finish({o});
            return;
        }
        // The cold partial on the CPU, from the host ring, while the GPU works
        // (before any copy back: into pageable memory those wait for the GPU).
        cold_out_.resize(static_cast<size_t>(n_q) * a.head_dim);
        cold_lse_.resize(static_cast<size_t>(n_q));
        const int64_t sc =
            attention_scratch_floats(cpu_pool_->size(), a.n_ctx, a.n_tok, static_cast<int>(kvd),
                                     a.head_dim);
        if (static_cast<int64_t>(cpu_scratch_.size()) < sc) cpu_scratch_.resize(sc);
        AttentionArgs c = a;
        c.out = cold_out_.data();
        c.scratch = cpu_scratch_.data();
        KeySubset cold;
        cold.pos_begin = a.n_sink;
        cold.pos_end = cut;
        cold.with_new = false;
        attention_partial(*cpu_pool_, c, cold, cold_lse_.data());
        hot_lse_.resize(static_cast<size_t>(n_q));
        GL_CUDA(cudaMemcpyAsync(a.out, o.dev, qb, cudaMemcpyDeviceToHost, s_));
        GL_CUDA(cudaMemcpyAsync(hot_lse_.data(), dlse, sizeof(float) * n_q, cudaMemcpyDeviceToHost,
                                s_));
        note_download(qb + sizeof(float) * n_q);
        sync();
        attention_merge(a.n_tok, a.n_head, a.head_dim, a.out, hot_lse_.data(), cold_out_.data(),
                        cold_lse_.data());
        coh_->host_wrote(a.out, qb); // the merged result is on the host only
    }

    // ---- device memory -------------------------------------------------------------

    enum BufId { kX, kY, kW, kQU, kPos, kSlotPos, kKNew, kVNew, kSink, kPartial, kLse, kNumBufs };
    struct DevBuf {
        void* p = nullptr;
        size_t cap = 0;
    };

    void begin_op() {
        GL_CUDA(cudaSetDevice(dev_));
        ++tick_;
    }

    // cudaMalloc, evicting least recently used cache entries (never those of
    // the current op) until it fits.
    void* alloc(size_t bytes, const char* what) {
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

    void* buf(int id, size_t bytes) {
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

    bool evict_one() {
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

    // The activations' twins (coherence.h) live in ordinary device memory.
    class Twins final : public TwinDevice {
      public:
        explicit Twins(CudaBackend& b) : b_(b) {}
        void* alloc(size_t bytes) override {
            try {
                return b_.alloc(bytes, "activations");
            } catch (const std::exception&) {
                return nullptr; // the buffer stays untracked: copied at each op
            }
        }
        void free(void* dev) override {
            if (!b_.destroying_) b_.sync();
            cudaFree(dev);
        }
        void upload(void* dev, const void* host, size_t bytes) override {
            b_.h2d(dev, host, bytes);
        }
        void download(void* host, const void* dev, size_t bytes) override {
            b_.note_download(bytes);
            GL_CUDA(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, b_.s_));
        }

      private:
        CudaBackend& b_;
    };

    // ---- weights ---------------------------------------------------------------------

    struct WeightEntry {
        void* dev = nullptr;
        size_t bytes = 0;
        uint64_t fp = 0;
        uint64_t last_use = 0;
        bool mapped = false; // zero-copy: dev is the registered host pointer
    };

    const void* weight(const void* host, size_t bytes) {
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
        if (zero_copy_ && map_host(host, bytes)) {
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
    bool map_host(const void* host, size_t bytes) {
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

    // ---- KV mirrors --------------------------------------------------------------------

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
        std::vector<int64_t> pos;     // [rows] position each device row holds, -1 = nothing valid
        std::vector<uint64_t> sample; // row_sample() of the host rows uploaded there
        uint64_t last_use = 0;
    };

    static void free_mirror(KvMirror& m) {
        cudaFree(m.k);
        cudaFree(m.v);
        cudaFree(m.dpos);
    }

    KvMirror& mirror(const AttentionArgs& a, int window, int64_t cut) {
        const int rows = window > 0 ? a.n_sink + window : a.n_ctx;
        auto it = mirrors_.find(a.k_slots);
        if (it != mirrors_.end()) {
            KvMirror& m = it->second;
            if (m.host_v != a.v_slots || m.n_ctx != a.n_ctx || m.window != window ||
                m.rows != rows || m.rk != a.k_row_bytes || m.rv != a.v_row_bytes ||
                m.tk != a.k_type || m.tv != a.v_type) {
                sync();
                free_mirror(m);
                mirrors_.erase(it);
                it = mirrors_.end();
            }
        }
        if (it == mirrors_.end()) {
            KvMirror m;
            m.host_v = a.v_slots;
            m.n_ctx = a.n_ctx;
            m.window = window;
            m.rows = rows;
            m.rk = a.k_row_bytes;
            m.rv = a.v_row_bytes;
            m.tk = a.k_type;
            m.tv = a.v_type;
            m.last_use = tick_;
            m.pos.assign(rows, -1);
            m.sample.assign(rows, 0);
            try {
                m.k = alloc(m.rk * rows, "the KV cache");
                m.v = alloc(m.rv * rows, "the KV cache");
                m.dpos = static_cast<int64_t*>(alloc(sizeof(int64_t) * rows, "the KV cache"));
            } catch (...) {
                free_mirror(m);
                throw;
            }
            GL_CUDA(cudaMemsetAsync(m.dpos, 0xff, sizeof(int64_t) * rows, s_)); // all -1
            it = mirrors_.emplace(a.k_slots, std::move(m)).first;
        }
        KvMirror& m = it->second;
        m.last_use = tick_;
        sync_mirror(m, a, cut);
        return m;
    }

    // Make each device row hold what it should this call, uploading only rows
    // whose position tag or row sample changed (coalesced into runs), and the
    // span of position tags that changed. The whole ring: device row s
    // mirrors host slot s. Hot/cold: a sink keeps its slot; a window position
    // p >= cut (the newest m.window positions) goes to row
    // n_sink + (p - n_sink) mod window -- consecutive positions, distinct
    // rows, so the device part is a small ring of its own; older positions
    // (cold) are not on the device at all.
    void sync_mirror(KvMirror& m, const AttentionArgs& a, int64_t cut) {
        const auto* hk = static_cast<const uint8_t*>(a.k_slots);
        const auto* hv = static_cast<const uint8_t*>(a.v_slots);
        want_.assign(m.rows, -1);
        from_.assign(m.rows, -1);
        for (int s = 0; s < m.n_ctx; s++) {
            const int64_t sp = a.slot_pos ? a.slot_pos[s] : -1;
            if (sp < 0) continue;
            int64_t d;
            if (m.window == 0)
                d = s;
            else if (sp < a.n_sink)
                d = sp;
            else if (sp >= cut)
                d = a.n_sink + (sp - a.n_sink) % m.window;
            else
                continue; // cold
            want_[d] = sp;
            from_[d] = s;
        }
        // The run being gathered: device rows [run_d, +run_n) <- host slots [run_s, +run_n).
        int run_d = 0, run_s = 0, run_n = 0;
        auto flush = [&] {
            if (run_n == 0) return;
            const size_t n = static_cast<size_t>(run_n);
            h2d(static_cast<uint8_t*>(m.k) + run_d * m.rk, hk + run_s * m.rk, n * m.rk);
            h2d(static_cast<uint8_t*>(m.v) + run_d * m.rv, hv + run_s * m.rv, n * m.rv);
            run_n = 0;
        };
        int tag_lo = m.rows, tag_hi = -1; // device rows whose position tag changed
        for (int d = 0; d < m.rows; d++) {
            const int64_t sp = want_[d];
            if (sp < 0) {
                if (m.pos[d] != -1) {
                    m.pos[d] = -1; // hidden from every query: contents do not matter
                    tag_lo = std::min(tag_lo, d);
                    tag_hi = d;
                }
                continue;
            }
            const int s = static_cast<int>(from_[d]);
            const uint64_t smp = row_sample(hk + s * m.rk, m.rk, hv + s * m.rv, m.rv);
            if (m.pos[d] == sp && m.sample[d] == smp) continue;
            if (m.pos[d] != sp) {
                tag_lo = std::min(tag_lo, d);
                tag_hi = d;
            }
            m.pos[d] = sp;
            m.sample[d] = smp;
            if (run_n > 0 && d == run_d + run_n && s == run_s + run_n) {
                run_n++;
                continue;
            }
            flush();
            run_d = d;
            run_s = s;
            run_n = 1;
        }
        flush();
        if (tag_hi >= tag_lo)
            h2d(m.dpos + tag_lo, m.pos.data() + tag_lo,
                sizeof(int64_t) * static_cast<size_t>(tag_hi - tag_lo + 1));
    }

    // ---- element-wise ----------------------------------------------------------------

    void binary(float* y, const float* x, int64_t n, bool silu) {
        if (n <= 0) return;
        op([&] {
            const size_t nb = sizeof(float) * static_cast<size_t>(n);
            const auto* dx = static_cast<const float*>(in(x, nb, kX));
            const Out r = inout(y, nb, kY);
            if (silu)
                cuda::silu_mul(static_cast<float*>(r.dev), dx, n, s_);
            else
                cuda::add(static_cast<float*>(r.dev), dx, n, s_);
            GL_CUDA(cudaGetLastError());
            finish({r});
        });
    }

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
    int step_tokens_ = 0;
    uint64_t warm_ = 0; // decode steps run eagerly so far
    bool graphs_ = false, graphs_off_later_ = false, capturing_ = false, debug_ = false;
    cudaGraphExec_t exec_ = nullptr;
    uint64_t fail_at_ = 0;
    Stats st_;
};

} // namespace

bool cuda_available(std::string* why) {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        cudaGetLastError();
        if (why) {
            if (e == cudaErrorNoDevice)
                *why = "no CUDA device found";
            else if (e == cudaErrorInsufficientDriver)
                *why = "no NVIDIA driver, or one older than this build's CUDA runtime (CUDA " +
                       std::to_string(CUDART_VERSION / 1000) + "." +
                       std::to_string(CUDART_VERSION % 1000 / 10) + ")";
            else
                *why = std::string("CUDA is not usable: ") + cudaGetErrorString(e);
        }
        return false;
    }
    if (n == 0) {
        if (why) *why = "no CUDA device found";
        return false;
    }
    return cuda::kernels_loadable(why);
}

std::unique_ptr<Backend> make_cuda_backend(int device, const CudaOptions& opt) {
    std::string why;
    if (!cuda_available(&why)) throw std::runtime_error("CUDA is not available: " + why);
    return std::make_unique<CudaBackend>(device, opt);
}

bool cuda_memory_info(int device, uint64_t* free_bytes, uint64_t* total_bytes) {
    *free_bytes = *total_bytes = 0;
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || device < 0 || device >= n) {
        cudaGetLastError();
        return false;
    }
    int prev = 0;
    size_t f = 0, t = 0;
    const bool ok = cudaGetDevice(&prev) == cudaSuccess && cudaSetDevice(device) == cudaSuccess &&
                    cudaMemGetInfo(&f, &t) == cudaSuccess;
    cudaSetDevice(prev);
    cudaGetLastError();
    if (!ok) return false;
    *free_bytes = f;
    *total_bytes = t;
    return true;
}

} // namespace gl
