// The CPU backend: gl::ops and gl::attention over a thread pool.
#include <cstdlib>
#include <vector>

#include "ggml-like/backend.h"
#include "ggml-like/cpu/gemm.h"
#include "ggml-like/cpu/delta_net.h"
#include "ggml-like/cpu/ops.h"
#include "ggml-like/hadamard.h"
#include "ggml-like/kernels.h"
#include "ggml-like/cpu/thread_pool.h"

namespace gl {

namespace {

class CpuBackend final : public Backend {
  public:
    CpuBackend(int n_threads, bool batch_invariant, bool precise)
        : pool_(n_threads), batch_invariant_(batch_invariant), precise_(precise) {}

    std::string name() const override {
        return std::string("cpu/") + cpu::isa_name() +
               (batch_invariant_ ? " (deterministic)" : "") + (precise_ ? " (precise)" : "");
    }
    int n_threads() const override { return pool_.size(); }
    uint64_t handoffs() const override { return pool_.handoffs(); }

    void reserve(size_t matmul_bytes, int64_t att_floats) override {
        if (matmul_bytes > matmul_scratch_.size()) matmul_scratch_.resize(matmul_bytes);
        if (att_floats > static_cast<int64_t>(att_scratch_.size())) att_scratch_.resize(att_floats);
    }

    void matmul(const Tensor& w, const float* x, int64_t n_tok, float* y) override {
        ops::matmul(pool_, w, x, n_tok, y, matmul_scratch_.data(),
                    matmul_paths());
    }
    void matmul_part(const Tensor& w, const float* x, int64_t n_tok, int64_t batch_tok,
                     float* y) override {
        ops::MatmulPaths paths = matmul_paths();
        paths.batch_tokens = batch_tok;
        ops::matmul(pool_, w, x, n_tok, y, matmul_scratch_.data(), paths);
    }

    void matmul_group(const MatvecJob* jobs, int n_jobs) override {
        ops::matvec_group(pool_, jobs, n_jobs, group_, matmul_scratch_.data(), matmul_paths());
    }

    void rmsnorm(const float* x, const float* w, int64_t n, int64_t rows, float eps,
                 float* out) override {
        pool_.parallel_for(
            rows,
            [&](int64_t b, int64_t e, int) {
                for (int64_t r = b; r < e; r++) ops::rmsnorm(x + r * n, w, n, eps, out + r * n);
            },
            rows * n);
    }

    void rope(float* x, int64_t rows, int n_heads, int head_dim, int rope_dims, const float* cos,
              const float* sin, bool neox) override {
        const int64_t half = rope_dims / 2, stride = static_cast<int64_t>(n_heads) * head_dim;
        for (int64_t r = 0; r < rows; r++)
            ops::rope(x + r * stride, n_heads, head_dim, rope_dims, cos + r * half, sin + r * half,
                      neox);
    }

    void hadamard_rows(float* x, int64_t rows, int64_t n, int block) override {
        gl::hadamard_rows(x, rows, n, block);
    }
    void hadamard_rows_inverse(float* x, int64_t rows, int64_t n, int block) override {
        gl::hadamard_rows_inverse(x, rows, n, block);
    }

    void silu_mul(float* gate, const float* up, int64_t n) override {
        pool_.parallel_for(
            n, [&](int64_t b, int64_t e, int) { ops::silu_mul(gate + b, up + b, e - b); }, n * 8);
    }
    void gelu_mul(float* gate, const float* up, int64_t n) override {
        pool_.parallel_for(
            n, [&](int64_t b, int64_t e, int) { ops::gelu_mul(gate + b, up + b, e - b); }, n * 8);
    }

    void add(float* y, const float* x, int64_t n) override { ops::add(y, x, n); }

    void convert_rows(Type t, const float* x, int64_t n, int64_t rows, void* dst) override {
        const size_t rb = row_size(t, n);
        for (int64_t r = 0; r < rows; r++)
            cpu::quantize_row(t, x + r * n, static_cast<uint8_t*>(dst) + r * rb, n);
    }

    // Key tiles serve the tuned kernels; the batch-invariant attention reads rows.
    bool head_major_kv() const override { return !batch_invariant_; }
    bool batch_invariant() const override { return batch_invariant_; }
    void set_rows_exact(bool on) override { rows_exact_ = on; }
    void attention(const AttentionArgs& a) override {
        AttentionArgs args = a;
        args.scratch = att_scratch_.data();
        args.batch_invariant = batch_invariant_;
        gl::attention(pool_, args);
    }

    void gated_delta_rule(float* state, const float* qkv, int64_t stride, const float* g,
                          const float* beta, int64_t n, int n_v_heads, int n_k_heads, int d_k,
                          int d_v, float* out) override {
        // Each value head on one thread, its tokens in order.
        pool_.parallel_for(
            n_v_heads,
            [&](int64_t b, int64_t e, int) {
                cpu::gated_delta_rule(state, qkv, stride, g, beta, n, n_v_heads, n_k_heads, d_k,
                                      d_v, out, static_cast<int>(b), static_cast<int>(e));
            },
            n * n_v_heads * static_cast<int64_t>(d_k) * d_v * 4);
    }

  private:
    // --deterministic keeps every batch of plain rows on the dot products a
    // single token takes: the integer GEMM is batch-invariant too, but
    // single tokens through it decode 2.2-3.9x slower than the dot products
    // (AMD EPYC, docs/performance.md, "--deterministic"), while prompts on
    // the dot products cost about 4x: decoding is where users wait. Packed
    // weights take their GEMM in every mode but --precise: it is
    // batch-invariant and fast for one token and for many.
    ops::MatmulPaths matmul_paths() const {
        return {.tiles = !batch_invariant_,
                .int8 = !precise_ && !batch_invariant_,
                .rows_exact = rows_exact_,
                .packed = !precise_};
    }

    ThreadPool pool_;
    // --deterministic: no batch-dependent matmul path and
    // AttentionArgs::batch_invariant, so that no result depends on the batch
    // or the thread count.
    bool batch_invariant_ = false;
    // --precise: prompts keep F32 activations (no integer GEMM).
    bool precise_ = false;
    // Backend::set_rows_exact.
    bool rows_exact_ = false;
    std::vector<uint8_t> matmul_scratch_;
    ops::MatvecGroupScratch group_; // matmul_group's, kept between tokens
    std::vector<float> att_scratch_;
};

} // namespace

std::unique_ptr<Backend> make_cpu_backend(int n_threads, bool batch_invariant, bool precise) {
    // OpenBLAS loads here, before the pool's threads start: its load sets an
    // environment variable (openblas.h), which no other thread may read then.
    gemm::load_blas();
    return std::make_unique<CpuBackend>(n_threads, batch_invariant, precise);
}

} // namespace gl
