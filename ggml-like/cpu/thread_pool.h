// A fixed pool of worker threads that run one parallel loop at a time.
//
// Generation calls parallel_for ~10 times per layer per token, so the hand-off
// must be cheap: workers spin briefly on an epoch counter before sleeping
// (C++20 atomic wait, a futex on Linux), and the caller thread works too.
// No allocation happens per call.
//
// A loop is cut into a few chunks per thread, one contiguous block of them
// per thread; each thread runs its own block's chunks in order, then takes
// the last chunks of blocks not yet done, and the loop ends when every chunk
// is done, not when every thread has checked in. On a busy machine (a
// compiler or a browser on the other core) a descheduled worker then costs
// its share of the work, which the running threads take over, instead of a
// scheduler time slice at every loop: with one thread-per-loop hand-offs
// generation fell to a ninth of its speed while one compile job ran beside
// it (with a busy loop on the other core: 24.6 tok/s here, 23.8 with chunks
// claimed from one shared counter).
#pragma once

#include <atomic>
#include <csignal>
#include <cstdint>
#include <thread>
#include <vector>

namespace gl {

// SIGINT and SIGTERM blocked in this thread while it lives: threads started
// meanwhile (the pool's workers, a library's) inherit the mask, so a stop
// signal is handled by the thread that polls for it, never by a worker.
class StopSignalsBlocked {
  public:
    StopSignalsBlocked();
    ~StopSignalsBlocked();
    StopSignalsBlocked(const StopSignalsBlocked&) = delete;
    StopSignalsBlocked& operator=(const StopSignalsBlocked&) = delete;

  private:
    sigset_t before_;
};

class ThreadPool {
  public:
    explicit ThreadPool(int n_threads);
    ~ThreadPool();
    ThreadPool(const ThreadPool&) = delete;
    ThreadPool& operator=(const ThreadPool&) = delete;

    int size() const { return n_threads_; }
    // Hand-offs to the workers so far (calls of run_chunks() that woke them);
    // the benchmark multiplies it by the measured cost of one.
    uint64_t handoffs() const { return handoffs_; }

    // Calls fn(ctx, chunk, ith) for every chunk in [0, n_chunks), each once,
    // on whichever thread claims it (ith: that thread's index, 0 = the
    // caller; no two calls with the same ith run at once, so ith can pick
    // per-thread scratch), and returns when all are done. At most kMaxChunks.
    using ChunkTask = void (*)(void* ctx, int64_t chunk, int ith);
    static constexpr int64_t kMaxChunks = 0xffff;
    void run_chunks(int64_t n_chunks, ChunkTask fn, void* ctx);

    // Convenience: split [0, n) into contiguous ranges, kChunksPerThread per
    // thread, and call f(begin, end, ith) for each. A thread may get several
    // ranges, in any order.
    static constexpr int64_t kChunksPerThread = 4;
    // `cost` estimates the whole loop's work (multiply-adds or bytes): below
    // kInlineCost the caller runs it alone, since waking the other threads
    // costs more than the loop (and much more when the machine is busy).
    static constexpr int64_t kInlineCost = 1 << 18;
    template <typename F> void parallel_for(int64_t n, F&& f, int64_t cost = INT64_MAX) {
        if (cost < kInlineCost || n_threads_ == 1 || n == 1) {
            if (n > 0) f(int64_t{0}, n, 0);
            return;
        }
        const int64_t want = kChunksPerThread * n_threads_;
        struct Ctx {
            F* f;
            int64_t n, chunks;
        } c{&f, n, n < want ? n : want};
        run_chunks(
            c.chunks,
            [](void* p, int64_t k, int ith) {
                auto* c = static_cast<Ctx*>(p);
                (*c->f)(c->n * k / c->chunks, c->n * (k + 1) / c->chunks, ith);
            },
            &c);
    }

    // Physical cores of this machine (the default for -t).
    static int physical_cores();

  private:
    void worker(int ith);
    // Claims and runs chunks of the current loop until none are left.
    void work_chunks(int ith);
    // The next chunk for thread ith (see blocks_), or -1 when none is left.
    int64_t claim(int ith);

    int n_threads_;
    uint64_t handoffs_ = 0; // touched only by the calling thread
    std::vector<std::thread> threads_;
    // Read only by a thread that has claimed a chunk of the loop they belong
    // to: the loop cannot end, and the caller cannot overwrite them, before
    // that chunk is done.
    ChunkTask task_ = nullptr;
    void* ctx_ = nullptr;
    // The current loop's chunks, one contiguous block per thread: block t's
    // next chunk in bits 0..31, its end in 32..63 (each loop stores fresh
    // values, released after task_, ctx_, n_chunks_ and done_). A thread
    // takes its own block's chunks from the front, in order, so it streams
    // through consecutive memory (its prefetches run on into its own next
    // chunk); once that is empty it takes other blocks' last chunks. With
    // chunks claimed in turn from one counter, each thread jumped to a new
    // region at every chunk and TinyLlama Q4_0 generated 45 instead of 49
    // tok/s. Claims are compare-and-swaps on the block's word, each word on a
    // cache line of its own: with the words side by side, every claim took
    // the line from the other thread.
    struct alignas(64) Block {
        std::atomic<uint64_t> word{0};
    };
    std::vector<Block> blocks_;
    std::atomic<int64_t> n_chunks_{0};
    // Chunks of the current loop finished, added once per thread and loop
    // (not per chunk) and on a line of its own, like the epoch.
    alignas(64) std::atomic<int64_t> done_{0};
    alignas(64) std::atomic<uint64_t> epoch_{0}; // bumped to wake sleeping workers
    std::atomic<bool> stop_{false};
};

} // namespace gl
