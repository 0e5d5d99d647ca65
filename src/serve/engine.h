// The server's engine: one thread owns the Scheduler (continuous batching,
// shared prefixes, src/engine/scheduler.h) and steps it while there is
// work; request threads hand it requests and take back, through a Ticket,
// the text as it is released and then the result. Nothing else touches the
// scheduler, so it needs no lock of its own.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "scheduler.h"

namespace kvrun::serve {

// One request's channel from the engine thread.
class Ticket {
  public:
    // What arrived: text released since the last take, and the result once
    // the sequence ended (then no more text comes). Waits up to `wait` for
    // either.
    struct Taken {
        std::string text;
        std::vector<TokenLogprob> logprobs; // the tokens' (when the request asked)
        std::optional<SeqResult> result;
    };
    Taken take(std::chrono::milliseconds wait);

  private:
    friend class Engine;
    std::mutex m_;
    std::condition_variable cv_;
    std::string text_;
    std::vector<TokenLogprob> logprobs_;
    std::optional<SeqResult> result_;
    bool result_taken_ = false;
    size_t index_ = SIZE_MAX; // the scheduler's, once submitted
};

struct EngineStats {
    size_t waiting = 0, running = 0; // now
    int held_blocks = 0, pool_blocks = 0;
    SchedulerStats sched;
};

class Engine {
  public:
    // The scheduler's arguments; at most max_waiting requests wait beyond
    // the `parallel` running.
    Engine(const LoadedModel& lm, const KvCacheConfig& cfg, Placement placement, int max_batch,
           int parallel, bool share_prefixes, uint64_t cache_budget, size_t max_waiting);
    ~Engine();
    Engine(const Engine&) = delete;
    Engine& operator=(const Engine&) = delete;

    // Null when the queue is full, the engine is closed or has failed (the
    // caller answers 503, or 500 with failure()).
    std::shared_ptr<Ticket> submit(SeqRequest r);
    // No more submissions (shutdown); what is in hand goes on.
    void close();
    // Why the engine stopped ("" while it works): a step threw (a model that
    // computes NaN, memory). Every request in hand then ended with stop
    // reason "error", and submit() refuses.
    std::string failure() const;
    // Its sequence ends ("cancelled") at the next step and gives its blocks
    // back; the result still comes through the ticket.
    void cancel(const std::shared_ptr<Ticket>& t);
    void cancel_all();
    // Requests submitted and not ended.
    size_t outstanding() const;
    EngineStats stats() const;

  private:
    void loop();
    void done(SeqResult r);
    // Every ticket in hand ends with this stop reason (a step failed, or the
    // engine is going away).
    void end_all(const char* why, std::vector<std::shared_ptr<Ticket>> also = {});

    Scheduler sched_;
    size_t limit_; // parallel + max_waiting
    mutable std::mutex mu_;
    std::condition_variable cv_;
    std::vector<std::pair<SeqRequest, std::shared_ptr<Ticket>>> inbox_;
    std::vector<std::shared_ptr<Ticket>> cancels_;
    size_t outstanding_ = 0;
    bool stop_ = false, closed_ = false;
    std::string failure_;
    // The engine thread's own: submitted tickets by scheduler index.
    std::map<size_t, std::shared_ptr<Ticket>> live_;
    mutable std::mutex stats_mu_;
    EngineStats stats_;
    std::thread thread_; // last: starts once the rest is built
};

} // namespace kvrun::serve
