#include "ggml-like/cpu/thread_pool.h"

#include <pthread.h>

#include <cstdlib>
#include <fstream>
#include <set>
#include <string>

#if defined(__x86_64__)
#include <immintrin.h>
#define GL_PAUSE() _mm_pause()
#elif defined(__aarch64__)
#define GL_PAUSE() asm volatile("yield")
#else
#define GL_PAUSE() ((void)0)
#endif

namespace gl {

namespace {
// Spin this many iterations before sleeping: long enough to bridge the gap
// between two matmuls of one token, short enough not to burn a core when idle.
constexpr int kSpinIters = 20000;
} // namespace

ThreadPool::ThreadPool(int n_threads)
    : n_threads_(n_threads < 1 ? 1 : n_threads), blocks_(static_cast<size_t>(n_threads_)) {
    threads_.reserve(n_threads_ - 1);
    const StopSignalsBlocked for_the_workers; // inherited: they never take a stop signal
    for (int i = 1; i < n_threads_; i++) threads_.emplace_back([this, i] { worker(i); });
}

StopSignalsBlocked::StopSignalsBlocked() {
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop, &before_);
}

StopSignalsBlocked::~StopSignalsBlocked() {
    pthread_sigmask(SIG_SETMASK, &before_, nullptr);
}

ThreadPool::~ThreadPool() {
    stop_.store(true);
    epoch_.fetch_add(1);
    epoch_.notify_all();
    for (auto& t : threads_) t.join();
}

void ThreadPool::run_chunks(int64_t n_chunks, ChunkTask fn, void* ctx) {
    if (n_chunks <= 0) return;
    if (n_threads_ == 1 || n_chunks == 1) {
        for (int64_t k = 0; k < n_chunks; k++) fn(ctx, k, 0);
        return;
    }
    if (n_chunks > kMaxChunks)
        std::abort(); // callers size their chunks (parallel_for: a few per thread)
    handoffs_++;
    task_ = fn;
    ctx_ = ctx;
    done_.store(0, std::memory_order_relaxed);
    n_chunks_.store(n_chunks, std::memory_order_relaxed);
    // Release: a thread whose claim reads one of these values (or a later
    // one of the same loop) sees task_, ctx_, n_chunks_ and done_ above.
    // A worker still looking for work of the previous loop finds its blocks
    // empty, or claims a chunk of this one and runs this task.
    for (int t = 0; t < n_threads_; t++) {
        const auto b = static_cast<uint64_t>(n_chunks * t / n_threads_);
        const auto e = static_cast<uint64_t>(n_chunks * (t + 1) / n_threads_);
        blocks_[t].word.store(b | e << 32, std::memory_order_release);
    }
    epoch_.fetch_add(1, std::memory_order_release);
    epoch_.notify_all();
    work_chunks(0);
    // Spin briefly (the others usually finish together with us), then sleep on
    // the counter: yielding in a loop would starve a descheduled worker on a
    // busy machine.
    int64_t done;
    for (int spin = 0; (done = done_.load(std::memory_order_acquire)) != n_chunks; spin++) {
        if (spin < kSpinIters)
            GL_PAUSE();
        else
            done_.wait(done, std::memory_order_acquire);
    }
}

int64_t ThreadPool::claim(int ith) {
    for (int i = 0; i < n_threads_; i++) {
        const bool own = i == 0;
        std::atomic<uint64_t>& w = blocks_[(ith + i) % n_threads_].word;
        uint64_t cur = w.load(std::memory_order_acquire);
        for (;;) {
            const uint64_t front = cur & 0xffffffffu, end = cur >> 32;
            if (front >= end) break;
            const uint64_t next = own ? (front + 1) | end << 32 : front | (end - 1) << 32;
            if (w.compare_exchange_weak(cur, next, std::memory_order_acq_rel,
                                        std::memory_order_acquire))
                return static_cast<int64_t>(own ? front : end - 1);
        }
    }
    return -1;
}

void ThreadPool::work_chunks(int ith) {
    int64_t ran = 0, n = 0;
    for (int64_t k; (k = claim(ith)) >= 0; ran++) {
        if (ran == 0) n = n_chunks_.load(std::memory_order_relaxed);
        task_(ctx_, k, ith);
    }
    // Once, when this thread finds no chunk left: the loop cannot end before.
    if (ran > 0 && done_.fetch_add(ran, std::memory_order_acq_rel) + ran == n) done_.notify_one();
}

void ThreadPool::worker(int ith) {
    uint64_t seen = 0;
    for (;;) {
        uint64_t e;
        int spin = 0;
        while ((e = epoch_.load(std::memory_order_acquire)) == seen) {
            if (spin++ < kSpinIters)
                GL_PAUSE();
            else
                epoch_.wait(seen, std::memory_order_acquire);
        }
        seen = e;
        if (stop_.load()) return;
        work_chunks(ith);
    }
}

int ThreadPool::physical_cores() {
    // Count distinct (package, core) pairs; SMT siblings share one.
    std::set<std::string> cores;
    for (int cpu = 0; cpu < 4096; cpu++) {
        std::string base = "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/";
        std::ifstream pkg(base + "physical_package_id"), core(base + "core_id");
        if (!pkg || !core) {
            if (cpu > 0) break;
            continue;
        }
        std::string p, c;
        pkg >> p;
        core >> c;
        cores.insert(p + ":" + c);
    }
    if (!cores.empty()) return static_cast<int>(cores.size());
    unsigned hw = std::thread::hardware_concurrency();
    return hw ? static_cast<int>(hw) : 1;
}

} // namespace gl
