// A gl::Backend that hands every call to an inner backend. Test doubles
// derive from it and override only the calls they watch or change (counting
// matmuls, moving buffers to a fake device), so a virtual added to gl::Backend
// reaches the real backend through every double without each one repeating
// the whole interface. It must override every virtual of gl::Backend: one left
// out would silently take the base default (head_major_kv() false, no-op
// tracking) instead of the inner backend's answer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "ggml-like/backend.h"

namespace kvtest {

class ForwardingBackend : public gl::Backend {
  public:
    explicit ForwardingBackend(std::unique_ptr<gl::Backend> inner) : inner_(std::move(inner)) {}

    gl::Backend& inner() { return *inner_; }
    const gl::Backend& inner() const { return *inner_; }

    std::string name() const override { return inner_->name(); }
    int n_threads() const override { return inner_->n_threads(); }
    uint64_t handoffs() const override { return inner_->handoffs(); }
    void reserve(size_t matmul_scratch_bytes, int64_t attention_scratch_floats) override {
        inner_->reserve(matmul_scratch_bytes, attention_scratch_floats);
    }

    void matmul(const gl::Tensor& w, const float* x, int64_t n_tok, float* y) override {
        inner_->matmul(w, x, n_tok, y);
    }
    void matmul_part(const gl::Tensor& w, const float* x, int64_t n_tok, int64_t batch_tok,
                     float* y) override {
        inner_->matmul_part(w, x, n_tok, batch_tok, y);
    }
    void matmul_group(const gl::MatvecJob* jobs, int n_jobs) override {
        inner_->matmul_group(jobs, n_jobs);
    }
    void rmsnorm(const float* x, const float* w, int64_t n, int64_t rows, float eps,
                 float* out) override {
        inner_->rmsnorm(x, w, n, rows, eps, out);
    }
    void rope(float* x, int64_t rows, int n_heads, int head_dim, int rope_dims, const float* cos,
              const float* sin, bool neox) override {
        inner_->rope(x, rows, n_heads, head_dim, rope_dims, cos, sin, neox);
    }
    void hadamard_rows(float* x, int64_t rows, int64_t n, int block) override {
        inner_->hadamard_rows(x, rows, n, block);
    }
    void hadamard_rows_inverse(float* x, int64_t rows, int64_t n, int block) override {
        inner_->hadamard_rows_inverse(x, rows, n, block);
    }
    void silu_mul(float* gate, const float* up, int64_t n) override {
        inner_->silu_mul(gate, up, n);
    }
    void gelu_mul(float* gate, const float* up, int64_t n) override {
        inner_->gelu_mul(gate, up, n);
    }
    void add(float* y, const float* x, int64_t n) override { inner_->add(y, x, n); }
    void add_rmsnorm(float* x, const float* y, const float* w, int64_t n, int64_t rows, float eps,
                     float* out) override {
        inner_->add_rmsnorm(x, y, w, n, rows, eps, out);
    }
    void convert_rows(gl::Type t, const float* x, int64_t n, int64_t rows, void* dst) override {
        inner_->convert_rows(t, x, n, rows, dst);
    }
    void attention(const gl::AttentionArgs& a) override { inner_->attention(a); }
    bool head_major_kv() const override { return inner_->head_major_kv(); }

    gl::MemoryUse memory_use() const override { return inner_->memory_use(); }

    void track(void* host, size_t bytes) override { inner_->track(host, bytes); }
    void untrack(void* host) override { inner_->untrack(host); }
    void host_wrote(const void* p, size_t bytes) override { inner_->host_wrote(p, bytes); }
    void host_read(const void* p, size_t bytes) override { inner_->host_read(p, bytes); }
    void copy_to_host(const void* src, void* dst, size_t bytes) override {
        inner_->copy_to_host(src, dst, bytes);
    }
    void begin_step(int n_tok) override { inner_->begin_step(n_tok); }
    bool end_step() override { return inner_->end_step(); }

  private:
    std::unique_ptr<gl::Backend> inner_;
};

} // namespace kvtest
