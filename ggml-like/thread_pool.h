// A fixed pool of worker threads that run one parallel loop at a time.
//
// Generation calls parallel_for ~10 times per layer per token, so the hand-off
// must be cheap: workers spin briefly on an epoch counter before sleeping
// (C++20 atomic wait, a futex on Linux), and the caller thread works too.
// No allocation happens per call.
#pragma once

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

namespace gl {

class ThreadPool {
  public:
    explicit ThreadPool(int n_threads);
    ~ThreadPool();
    ThreadPool(const ThreadPool&) = delete;
    ThreadPool& operator=(const ThreadPool&) = delete;

    int size() const { return n_threads_; }
    // Hand-offs to the workers so far (calls of run() that woke them); the
    // benchmark multiplies it by the measured cost of one.
    uint64_t handoffs() const { return handoffs_; }

    // Calls fn(ctx, thread_index, n_threads) once on each of the n threads
    // (the caller is thread 0) and returns when all are done.
    using Task = void (*)(void* ctx, int ith, int nth);
    void run(Task fn, void* ctx);

    // Convenience: split [0, n) into contiguous chunks, one per thread.
    // `cost` estimates the whole loop's work (multiply-adds or bytes): below
    // kInlineCost the caller runs it alone, since waking the other threads
    // costs more than the loop (and much more when the machine is busy).
    static constexpr int64_t kInlineCost = 1 << 18;
    template <typename F> void parallel_for(int64_t n, F&& f, int64_t cost = INT64_MAX) {
        if (cost < kInlineCost || n_threads_ == 1 || n == 1) {
            if (n > 0) f(int64_t{0}, n, 0);
            return;
        }
        struct Ctx { F* f; int64_t n; } c{&f, n};
        run([](void* p, int ith, int nth) {
                auto* c = static_cast<Ctx*>(p);
                int64_t per = (c->n + nth - 1) / nth;
                int64_t b = per * ith, e = b + per < c->n ? b + per : c->n;
                if (b < e) (*c->f)(b, e, ith);
            }, &c);
    }

    // Physical cores of this machine (the default for -t).
    static int physical_cores();

  private:
    void worker(int ith);

    int n_threads_;
    uint64_t handoffs_ = 0; // touched only by the calling thread
    std::vector<std::thread> threads_;
    Task task_ = nullptr;
    void* ctx_ = nullptr;
    std::atomic<uint64_t> epoch_{0};
    std::atomic<int> pending_{0};
    std::atomic<bool> stop_{false};
};

} // namespace gl
