// The seam between model code and where the arithmetic runs. Model code
// (src/engine/forward.cpp) calls only these operations; a backend is picked once at
// start-up. The CPU backend is the reference; a CUDA backend implements the
// same interface (see ggml-like/cuda/).
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "ggml-like/attention.h"
#include "ggml-like/tensor.h"

namespace gl {

// Memory a backend holds on its device. A CPU backend holds none: its buffers
// are ordinary host memory (the process's RSS).
struct MemoryUse {
    bool device = false;          // false: every figure below is 0
    uint64_t weights = 0;         // device copies of weight matrices
    uint64_t weights_mapped = 0;  // host weights the device reads in place (integrated GPUs)
    uint64_t kv = 0;              // device KV rows (the mirrored, hot part of each ring)
    uint64_t scratch = 0;         // activations, attention partials
    uint64_t free = 0, total = 0; // the whole device's memory now
};

class Backend {
  public:
    virtual ~Backend() = default;
    virtual std::string name() const = 0;
    virtual int n_threads() const = 0;
    // Thread-pool hand-offs so far (CPU backend); 0 where that means nothing.
    virtual uint64_t handoffs() const { return 0; }

    // Scratch for the largest operation planned (called once, before eval).
    virtual void reserve(size_t matmul_scratch_bytes, int64_t attention_scratch_floats) = 0;

    // y[t] = W x[t] for n_tok rows.
    virtual void matmul(const Tensor& w, const float* x, int64_t n_tok, float* y) = 0;
    // The same for n_tok rows gathered from a batch of batch_tok tokens (the
    // tokens a mixture of experts sends to one expert): the product is taken
    // by the path the whole batch would take, so that a prompt's precision
    // does not depend on how its tokens were routed.
    virtual void matmul_part(const Tensor& w, const float* x, int64_t n_tok, int64_t batch_tok,
                             float* y) {
        (void)batch_tok;
        matmul(w, x, n_tok, y);
    }
    // One token's products with several matrices (a mixture of experts'
    // generated token): each job's y = W x, the same bits as matmul(W, x, 1,
    // y). The CPU backend runs them as one parallel loop.
    virtual void matmul_group(const MatvecJob* jobs, int n_jobs) {
        for (int j = 0; j < n_jobs; j++) matmul(*jobs[j].w, jobs[j].x, 1, jobs[j].y);
    }
    // `rows` rows of n: out = rmsnorm(x) * w.
    virtual void rmsnorm(const float* x, const float* w, int64_t n, int64_t rows, float eps,
                         float* out) = 0;
    // Rotate `rows` rows of n_heads heads; row r uses cos/sin + r * rope_dims/2.
    virtual void rope(float* x, int64_t rows, int n_heads, int head_dim, int rope_dims,
                      const float* cos, const float* sin, bool neox) = 0;
    // `rows` rows of n floats: each run of `block` elements (a power of two
    // dividing n) rotated by the orthonormal Hadamard transform, in place
    // (gl::hadamard_rows; rotated keys, KvCacheConfig::k_rotate).
    virtual void hadamard_rows(float* x, int64_t rows, int64_t n, int block) = 0;
    // The inverse, R^-1 (gl::hadamard_rows_inverse): attention's output back
    // from rotated values (KvCacheConfig::v_rotate).
    virtual void hadamard_rows_inverse(float* x, int64_t rows, int64_t n, int block) = 0;
    // x += y for `rows` rows of n, then out = rmsnorm(x) * w: a block's
    // residual add and the next block's norm (out may be y). The two ops by
    // default; a device backend may run them as one kernel (a launch less a
    // layer), with the same bits.
    virtual void add_rmsnorm(float* x, const float* y, const float* w, int64_t n, int64_t rows,
                             float eps, float* out) {
        add(x, y, n * rows);
        rmsnorm(x, w, n, rows, eps, out);
    }
    virtual void silu_mul(float* gate, const float* up, int64_t n) = 0;
    // gate[i] = gelu(gate[i]) * up[i], GELU by its tanh approximation
    // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) (Gemma's gated FFN).
    virtual void gelu_mul(float* gate, const float* up, int64_t n) = 0;
    virtual void add(float* y, const float* x, int64_t n) = 0;
    // The gated delta rule over n tokens of one sequence (Gated DeltaNet,
    // cpu/delta_net.h): host pointers, the state updated in place. Here on
    // the calling thread; the CPU backend splits the value heads over its
    // threads.
    virtual void gated_delta_rule(float* state, const float* qkv, int64_t stride, const float* g,
                                  const float* beta, int64_t n, int n_v_heads, int n_k_heads,
                                  int d_k, int d_v, float* out);
    // Convert `rows` rows of n floats to type t (a KV cache type), packed.
    virtual void convert_rows(Type t, const float* x, int64_t n, int64_t rows, void* dst) = 0;
    // Attention scratch is the backend's own (a.scratch is ignored).
    virtual void attention(const AttentionArgs& a) = 0;
    // Whether attention() reads head-major slots (AttentionArgs::k_head_bytes, v_slot_bytes).
    virtual bool head_major_kv() const { return false; }
    // Whether attention() reads the host KV ring as it is at the call, so that
    // a row written between two calls of one step is seen by the second
    // (Forward::eval_verify attends token by token then). A device mirror
    // that syncs per step does not.
    virtual bool reads_host_kv() const { return true; }
    // Whether every output of a token is independent of its batch and the thread
    // count (make_cpu_backend's batch_invariant, --deterministic).
    virtual bool batch_invariant() const { return false; }
    // While on, matmul gives every row of a batch the bits a one-token batch
    // gives it (Forward::eval_verify: speculative verification must not change
    // a greedy answer). Off, short batches may take faster batched kernels.
    virtual void set_rows_exact(bool on) { (void)on; }

    virtual MemoryUse memory_use() const { return {}; }

    // ---- device-resident buffers (no-ops on the CPU) ------------------------------------
    // A device backend may keep a tracked host buffer's contents on the device
    // between operations (ggml-like/coherence.h): an op's output there is not
    // copied back until the host asks. The contract for a tracked buffer:
    //   * the host tells the backend after writing it (host_wrote) and before
    //     reading it (host_read: downloads what is newer on the device and
    //     waits for it);
    //   * copy_to_host(src, dst) copies bytes of a tracked buffer to untracked
    //     host memory (the KV ring) by the next host_read or end_step, without
    //     waiting now;
    //   * a step (one Forward::eval) is bracketed by begin_step/end_step. A
    //     backend may record the step's work and launch it later (CUDA
    //     graphs); end_step returns false when that failed and the work was
    //     lost: the caller must redo the step from its host inputs (the
    //     backend then runs it eagerly).
    // Pointers in no tracked buffer keep the plain contract: read and written
    // on the host by the op itself.
    virtual void track(void* host, size_t bytes) {
        (void)host;
        (void)bytes;
    }
    virtual void untrack(void* host) { (void)host; }
    virtual void host_wrote(const void* p, size_t bytes) {
        (void)p;
        (void)bytes;
    }
    virtual void host_read(const void* p, size_t bytes) {
        (void)p;
        (void)bytes;
    }
    virtual void copy_to_host(const void* src, void* dst, size_t bytes) {
        std::memcpy(dst, src, bytes);
    }
    virtual void begin_step(int n_tok) { (void)n_tok; }
    virtual bool end_step() { return true; }
};

// "cpu" or "cuda". Throws std::runtime_error for a device this build lacks.
// batch_invariant (--deterministic): every output of a token is the same
// whatever the batch it was evaluated in and the thread count (dot-product
// matmuls, AttentionArgs::batch_invariant, row-layout KV), at the cost of the
// prompt paths' tiles. precise (--precise): prompt batches skip the integer
// GEMM's 8-bit activations for the F32 ones of AMX or OpenBLAS tiles (where
// neither is there, or with batch_invariant, the dot products: 8-bit too).
std::unique_ptr<Backend> make_cpu_backend(int n_threads, bool batch_invariant = false,
                                          bool precise = false);

} // namespace gl
