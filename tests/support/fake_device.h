// A fake device for the device-residency tests, on the CPU: FakeDevice is
// device memory that is plain host memory (counting its transfers), and
// FakeDeviceBackend runs the CPU backend's kernels on twins of tracked
// buffers kept in it by a gl::Coherence table, the way the CUDA backend keeps
// activations on the GPU. Used by test_coherence (Forward's hooks) and
// test_backend_ops (each op on device-resident buffers).
#pragma once

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "forwarding_backend.h"
#include "ggml-like/backend.h"
#include "ggml-like/cuda/coherence.h"

namespace kvtest {

// Device memory is plain host memory, poisoned with 0xff (NaN) when allocated.
class FakeDevice final : public gl::TwinDevice {
  public:
    int uploads = 0, downloads = 0, allocs = 0, frees = 0;
    size_t up_bytes = 0, down_bytes = 0;
    size_t room = SIZE_MAX; // bytes the device may still allocate

    void* alloc(size_t bytes) override {
        if (bytes > room) return nullptr;
        room -= bytes;
        allocs++;
        auto* p = new uint8_t[bytes];
        std::memset(p, 0xff, bytes);
        return p;
    }
    void free(void* dev) override {
        frees++;
        delete[] static_cast<uint8_t*>(dev);
    }
    void upload(void* dev, const void* host, size_t bytes) override {
        uploads++;
        up_bytes += bytes;
        std::memcpy(dev, host, bytes);
    }
    void download(void* host, const void* dev, size_t bytes) override {
        downloads++;
        down_bytes += bytes;
        std::memcpy(host, dev, bytes);
    }
    void reset_counts() { uploads = downloads = 0, up_bytes = down_bytes = 0; }
};

// Runs the CPU kernels on device twins kept by a Coherence table: what an op
// writes to a tracked buffer stays in the twin, and the host copy is
// poisoned, until the caller asks for it (host_read). Rows given to
// copy_to_host land only at the next host_read or end_step. Pointers in no
// tracked buffer go to the CPU backend as they are.
class FakeDeviceBackend final : public ForwardingBackend {
  public:
    explicit FakeDeviceBackend(int threads)
        : ForwardingBackend(gl::make_cpu_backend(threads)), coh_(dev_) {}
    FakeDevice& device() { return dev_; }
    gl::Coherence& table() { return coh_; }
    int host_reads = 0, steps = 0, matmuls = 0;
    bool lose_next_step = false; // end_step reports the step's work lost (once)

    std::string name() const override { return "fake device"; }
    // reserve, n_threads and head_major_kv are the CPU's (its attention reads
    // the CPU's cache layout); handoffs and memory_use too, unused by tests.

    void matmul(const gl::Tensor& w, const float* x, int64_t n_tok, float* y) override {
        matmuls++;
        inner().matmul(w, in(x, 4 * n_tok * w.ne0), n_tok, out(y, 4 * n_tok * w.ne1));
    }
    void matmul_part(const gl::Tensor& w, const float* x, int64_t n_tok, int64_t batch_tok,
                     float* y) override {
        matmuls++;
        inner().matmul_part(w, in(x, 4 * n_tok * w.ne0), n_tok, batch_tok,
                            out(y, 4 * n_tok * w.ne1));
    }
    void matmul_group(const gl::MatvecJob* jobs, int n_jobs) override {
        matmuls += n_jobs;
        std::vector<gl::MatvecJob> twins(jobs, jobs + n_jobs);
        for (gl::MatvecJob& j : twins) {
            j.x = in(j.x, 4 * j.w->ne0);
            j.y = out(j.y, 4 * j.w->ne1);
        }
        inner().matmul_group(twins.data(), n_jobs);
    }
    void rmsnorm(const float* x, const float* w, int64_t n, int64_t rows, float eps,
                 float* o) override {
        inner().rmsnorm(in(x, 4 * n * rows), w, n, rows, eps, out(o, 4 * n * rows));
    }
    void rope(float* x, int64_t rows, int n_heads, int head_dim, int rope_dims, const float* cos,
              const float* sin, bool neox) override {
        const size_t cb = 4 * rows * (rope_dims / 2);
        const float* c = in(cos, cb);
        const float* s = in(sin, cb);
        inner().rope(inout(x, 4 * rows * n_heads * head_dim), rows, n_heads, head_dim, rope_dims, c,
                     s, neox);
    }
    void hadamard_rows(float* x, int64_t rows, int64_t n, int block) override {
        inner().hadamard_rows(inout(x, 4 * rows * n), rows, n, block);
    }
    void hadamard_rows_inverse(float* x, int64_t rows, int64_t n, int block) override {
        inner().hadamard_rows_inverse(inout(x, 4 * rows * n), rows, n, block);
    }
    void silu_mul(float* gate, const float* up, int64_t n) override {
        const float* u = in(up, 4 * n);
        inner().silu_mul(inout(gate, 4 * n), u, n);
    }
    void gelu_mul(float* gate, const float* up, int64_t n) override {
        const float* u = in(up, 4 * n);
        inner().gelu_mul(inout(gate, 4 * n), u, n);
    }
    void add(float* y, const float* x, int64_t n) override {
        const float* xx = in(x, 4 * n);
        inner().add(inout(y, 4 * n), xx, n);
    }
    void add_rmsnorm(float* x, const float* y, const float* w, int64_t n, int64_t rows, float eps,
                     float* o) override {
        const float* yy = in(y, 4 * n * rows); // before out(): o may be y
        float* xx = inout(x, 4 * n * rows);
        inner().add_rmsnorm(xx, yy, w, n, rows, eps, out(o, 4 * n * rows));
    }
    void convert_rows(gl::Type t, const float* x, int64_t n, int64_t rows, void* dst) override {
        const float* xx = in(x, 4 * n * rows);
        inner().convert_rows(t, xx, n, rows, out(dst, gl::row_size(t, n) * rows));
    }
    void attention(const gl::AttentionArgs& a) override {
        gl::AttentionArgs d = a;
        const size_t qb = 4 * static_cast<size_t>(a.n_tok) * a.n_head * a.head_dim;
        d.q = in(a.q, qb);
        if (a.q_unrot) d.q_unrot = in(a.q_unrot, qb);
        d.pos = in(a.pos, 8 * a.n_tok);
        d.k_new = in(a.k_new, a.k_row_bytes * a.n_tok);
        d.v_new = in(a.v_new, a.v_row_bytes * a.n_tok);
        d.out = out(a.out, qb);
        inner().attention(d);
    }

    void track(void* host, size_t bytes) override { coh_.track(host, bytes); }
    void untrack(void* host) override { coh_.untrack(host); }
    void host_wrote(const void* p, size_t bytes) override { coh_.host_wrote(p, bytes); }
    void host_read(const void* p, size_t bytes) override {
        host_reads++;
        coh_.host_read(p, bytes);
        if (!lose_next_step) flush(); // a lost step's rows never land
    }
    void copy_to_host(const void* src, void* dst, size_t bytes) override {
        const void* d = coh_.device_in(src, bytes);
        REQUIRE(d); // Forward's K/V rows are tracked
        pending_.push_back({std::vector<uint8_t>(static_cast<const uint8_t*>(d),
                                                 static_cast<const uint8_t*>(d) + bytes),
                            dst});
    }
    void begin_step(int) override { steps++; }
    bool end_step() override {
        if (lose_next_step) {
            // Nothing of the step happened: no rows land, and the device copies
            // are garbage; the table must not trust them.
            lose_next_step = false;
            pending_.clear();
            coh_.forget_device();
            return false;
        }
        flush();
        return true;
    }

  private:
    template <class T> const T* in(const T* p, size_t bytes) {
        const void* d = coh_.device_in(p, bytes);
        return d ? static_cast<const T*>(d) : p;
    }
    template <class T> T* out(T* p, size_t bytes) {
        void* d = coh_.device_out(p, bytes);
        if (!d) return p;
        std::memset(static_cast<void*>(p), 0xff, bytes); // the host copy is stale: make it NaN
        return static_cast<T*>(d);
    }
    template <class T> T* inout(T* p, size_t bytes) {
        in(p, bytes);
        return out(p, bytes);
    }
    void flush() {
        for (auto& [bytes, dst] : pending_) std::memcpy(dst, bytes.data(), bytes.size());
        pending_.clear();
    }

    FakeDevice dev_;
    gl::Coherence coh_;
    struct Pending {
        std::vector<uint8_t> bytes;
        void* dst;
    };
    std::vector<Pending> pending_;
};

} // namespace kvtest
