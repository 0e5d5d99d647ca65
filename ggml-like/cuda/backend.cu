// The CUDA backend (gl::Backend on a CUDA device): construction, the ops,
// Forward's step begin/end, and the entry points of cuda_backend.h. The class
// is declared in backend_impl.h and implemented over several files by concern;
// docs/cuda.md ("Design") describes where the data lives and why.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <stdexcept>
#include <string>

#include "ggml-like/cuda/backend_impl.h"
#include "ggml-like/cuda/dequant.h"
#include "ggml-like/cuda/kernels.h"

namespace gl {

namespace cuda_impl {

[[noreturn]] void throw_cuda(cudaError_t e, const char* what, const char* file, int line) {
    throw std::runtime_error(std::string("CUDA error: ") + cudaGetErrorString(e) + " in " + what +
                             " (" + file + ":" + std::to_string(line) + ")");
}

CudaBackend::CudaBackend(int device, const CudaOptions& opt)
    : dev_(device), window_(opt.kv_gpu_window) {
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
    if (const char* f = std::getenv("KVRUN_CUDA_FUSED")) fused_ = f[0] == '1';
    if (const char* d = std::getenv("KVRUN_CUDA_DEBUG"))
        debug_ = d[0] == '1' ? 1 : d[0] == '2' ? 2 : 0;
    if (debug_) {
        GL_CUDA(cudaEventCreate(&ev_launch_));
        GL_CUDA(cudaEventCreate(&ev_done_));
    }
    // Tests: treat the N-th recorded graph as failed (the fallback path).
    if (const char* f = std::getenv("KVRUN_CUDA_GRAPHS_TEST_FAIL"))
        fail_at_ = std::strtoull(f, nullptr, 10);
    coh_ = std::make_unique<Coherence>(twins_);
}

CudaBackend::~CudaBackend() {
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
                     ull(st_.updates), ull(st_.instantiations), ull(st_.partial), ull(st_.uploads),
                     st_.up_bytes / 1048576.0, ull(st_.downloads), st_.down_bytes / 1048576.0);
    if (debug_ && st_.eager_decode > 0)
        std::fprintf(stderr, "kvrun: CUDA: an eager decode step takes %.0f us on the host\n",
                     st_.eager_ns / 1e3 / static_cast<double>(st_.eager_decode));
    if (debug_ && st_.graph_steps_timed > 0) {
        const double n = static_cast<double>(st_.graph_steps_timed);
        std::fprintf(stderr,
                     "kvrun: CUDA: a graph decode step: %.0f us recording on the host, %.0f us "
                     "running on the GPU\n",
                     st_.record_ns / 1e3 / n, st_.graph_gpu_ms * 1e3 / n);
    }
    if (debug_ >= 2) {
        const char* kinds[] = {"matmul", "attention", "copy to host", "other"};
        std::fprintf(stderr, "kvrun: CUDA: ops waited for one by one, per decode step:");
        const double n = static_cast<double>(std::max<uint64_t>(1, st_.eager_decode));
        for (int k = 0; k < static_cast<int>(OpKind::count); k++)
            std::fprintf(stderr, " %s %.0f us%s", kinds[k], st_.op_ns[k] / 1e3 / n,
                         k + 1 < static_cast<int>(OpKind::count) ? "," : "\n");
    }
    if (ev_launch_) cudaEventDestroy(ev_launch_);
    if (ev_done_) cudaEventDestroy(ev_done_);
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

std::string CudaBackend::name() const {
    return "cuda:" + std::to_string(dev_) + " (" + prop_.name + ", sm_" +
           std::to_string(prop_.major) + std::to_string(prop_.minor) +
           (zero_copy_ ? ", zero-copy weights" : "") +
           (window_ > 0 ? ", KV window " + std::to_string(window_) : "") +
           (graphs_ ? ", graphs" : "") + ")";
}

void CudaBackend::matmul(const Tensor& w, const float* x, int64_t n_tok, float* y) {
    if (!cuda::matmul_supported(w.type))
        throw std::runtime_error(
            std::string("CUDA backend: no matmul kernel for weight type ") + type_name(w.type) +
            " (supported: f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 iq4_nl q2_K..q6_K)");
    if (n_tok <= 0 || w.ne1 <= 0) return;
    op(OpKind::matmul, [&] {
        const size_t xb = sizeof(float) * static_cast<size_t>(n_tok * w.ne0);
        const size_t yb = sizeof(float) * static_cast<size_t>(n_tok * w.ne1);
        const size_t wbytes =
            static_cast<size_t>(w.ne1 - 1) * w.row_bytes + row_size(w.type, w.ne0);
        const void* dw = weight(w.data, wbytes);
        const auto* dx = static_cast<const float*>(in(x, xb, kX));
        const Out o = out(y, yb, kY);
        cuda::matmul(w.type, dw, w.row_bytes, w.ne0, w.ne1, dx, n_tok, static_cast<float*>(o.dev),
                     s_);
        GL_CUDA(cudaGetLastError());
        finish({o});
    });
}

void CudaBackend::rmsnorm(const float* x, const float* w, int64_t n, int64_t rows, float eps,
                          float* o) {
    if (n <= 0 || rows <= 0) return;
    op(OpKind::other, [&] {
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

void CudaBackend::add_rmsnorm(float* x, const float* y, const float* w, int64_t n, int64_t rows,
                              float eps, float* o) {
    if (!fused_) return Backend::add_rmsnorm(x, y, w, n, rows, eps, o);
    if (n <= 0 || rows <= 0) return;
    op(OpKind::other, [&] {
        const size_t xb = sizeof(float) * static_cast<size_t>(n * rows),
                     wb = sizeof(float) * static_cast<size_t>(n);
        const auto* dw = static_cast<const float*>(in_step_ ? weight(w, wb) : in(w, wb, kW));
        // y in before o's out(), both through scratch kY where untracked: o
        // may be y, and the kernel reads each y[i] before the same thread
        // writes out[i].
        const auto* dy = static_cast<const float*>(in(y, xb, kY));
        const Out rx = inout(x, xb, kX);
        const Out ro = out(o, xb, kY);
        cuda::add_rmsnorm(static_cast<float*>(rx.dev), dy, dw, n, rows, eps,
                          static_cast<float*>(ro.dev), s_);
        GL_CUDA(cudaGetLastError());
        finish({rx, ro});
    });
}

void CudaBackend::rope(float* x, int64_t rows, int n_heads, int head_dim, int rope_dims,
                       const float* cos, const float* sin, bool neox) {
    if (rows <= 0 || n_heads <= 0 || rope_dims < 2) return;
    op(OpKind::other, [&] {
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

void CudaBackend::hadamard(float* x, int64_t rows, int64_t n, int block, bool inverse) {
    if (rows <= 0 || n <= 0 || block <= 1) return;
    op(OpKind::other, [&] {
        const size_t xb = sizeof(float) * static_cast<size_t>(rows * n);
        const Out r = inout(x, xb, kX);
        cuda::hadamard_rows(static_cast<float*>(r.dev), rows * n / block, block, inverse, s_);
        GL_CUDA(cudaGetLastError());
        finish({r});
    });
}

void CudaBackend::hadamard_rows(float* x, int64_t rows, int64_t n, int block) {
    hadamard(x, rows, n, block, false);
}

void CudaBackend::hadamard_rows_inverse(float* x, int64_t rows, int64_t n, int block) {
    hadamard(x, rows, n, block, true);
}

void CudaBackend::convert_rows(Type t, const float* x, int64_t n, int64_t rows, void* dst) {
    if (!cuda::convert_supported(t))
        throw std::runtime_error(std::string("CUDA backend: cannot convert rows to ") +
                                 type_name(t) + " (supported: f32 f16 bf16 q8_0 q4_0)");
    if (n <= 0 || rows <= 0) return;
    op(OpKind::other, [&] {
        const size_t xb = sizeof(float) * static_cast<size_t>(n * rows);
        const size_t db = row_size(t, n) * static_cast<size_t>(rows);
        const auto* dx = static_cast<const float*>(in(x, xb, kX));
        const Out r = out(dst, db, kY);
        cuda::convert_rows(t, dx, n, rows, r.dev, s_);
        GL_CUDA(cudaGetLastError());
        finish({r});
    });
}

void CudaBackend::attention(const AttentionArgs& a) {
    for (Type t : {a.k_type, a.v_type})
        if (!cuda::kv_type_ok(t))
            throw std::runtime_error(std::string("CUDA backend: attention over a ") + type_name(t) +
                                     " KV cache is not supported (use " + kv_type_names() + ")");
    if (a.k_head_bytes || a.v_slot_bytes)
        throw std::runtime_error("CUDA backend: head-major KV slots are not supported (the "
                                 "cache must use the row layout)");
    if (a.n_tok <= 0) return;
    if (a.n_head_kv <= 0 || a.n_head % a.n_head_kv != 0 || a.head_dim <= 0)
        throw std::runtime_error("CUDA backend: attention needs n_head a multiple of n_head_kv");
    op(OpKind::attention, [&] { attend(a); });
}

MemoryUse CudaBackend::memory_use() const {
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

void CudaBackend::begin_step(int n_tok) {
    step_lost_ = false;
    in_step_ = true;
    step_tokens_ = n_tok;
    step_graph_ = false;
    graph_timed_ = false;
    st_.steps++;
    if (debug_) step_t0_ = std::chrono::steady_clock::now();
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

bool CudaBackend::end_step() {
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
        // The KV mirrors' tags say which rows were uploaded, but the uploads
        // were in the lost recording: every row (and its position tag) is
        // unknown until the step, redone, uploads it again.
        for (auto& [host, m] : mirrors_) std::fill(m.pos.begin(), m.pos.end(), kRowUnknown);
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
        if (debug_) st_.eager_ns += ns_since(step_t0_);
    }
    if (graph_timed_) {
        float ms = 0;
        if (cudaEventElapsedTime(&ms, ev_launch_, ev_done_) == cudaSuccess) {
            st_.graph_gpu_ms += ms;
            st_.graph_steps_timed++;
        }
        cudaGetLastError();
        graph_timed_ = false;
    }
    return true;
}

void CudaBackend::binary(float* y, const float* x, int64_t n, Binary which) {
    if (n <= 0) return;
    op(OpKind::other, [&] {
        const size_t nb = sizeof(float) * static_cast<size_t>(n);
        const auto* dx = static_cast<const float*>(in(x, nb, kX));
        const Out r = inout(y, nb, kY);
        auto* dy = static_cast<float*>(r.dev);
        switch (which) {
        case Binary::silu_mul:
            cuda::silu_mul(dy, dx, n, s_);
            break;
        case Binary::gelu_mul:
            cuda::gelu_mul(dy, dx, n, s_);
            break;
        case Binary::add:
            cuda::add(dy, dx, n, s_);
            break;
        }
        GL_CUDA(cudaGetLastError());
        finish({r});
    });
}

} // namespace cuda_impl

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
    return std::make_unique<cuda_impl::CudaBackend>(device, opt);
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
