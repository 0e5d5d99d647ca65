#include "engine.h"

#include <utility>

#include <fmt/format.h>

namespace kvrun::serve {

Ticket::Taken Ticket::take(std::chrono::milliseconds wait) {
    std::unique_lock lk(m_);
    cv_.wait_for(lk, wait, [&] {
        return !text_.empty() || !logprobs_.empty() || (result_ && !result_taken_);
    });
    Taken t;
    t.text = std::move(text_);
    text_.clear();
    t.logprobs = std::move(logprobs_);
    logprobs_.clear();
    if (result_ && !result_taken_) {
        t.result = *result_;
        result_taken_ = true;
    }
    return t;
}

Engine::Engine(const LoadedModel& lm, const KvCacheConfig& cfg, Placement placement, int max_batch,
               int parallel, bool share_prefixes, uint64_t cache_budget, size_t max_waiting)
    : sched_(lm, cfg, std::move(placement), max_batch, parallel, share_prefixes, cache_budget),
      limit_(static_cast<size_t>(parallel) + max_waiting) {
    sched_.set_on_text([this](size_t index, const std::string& text) {
        const auto it = live_.find(index);
        if (it == live_.end()) return;
        Ticket& t = *it->second;
        {
            std::lock_guard lk(t.m_);
            t.text_ += text;
        }
        t.cv_.notify_all();
    });
    sched_.set_on_logprob([this](size_t index, const TokenLogprob& lp) {
        const auto it = live_.find(index);
        if (it == live_.end()) return;
        std::lock_guard lk(it->second->m_);
        it->second->logprobs_.push_back(lp); // its text follows: that notifies
    });
    stats_.pool_blocks = sched_.pool_blocks();
    stats_.sched = sched_.stats();
    thread_ = std::thread([this] { loop(); });
}

Engine::~Engine() {
    {
        std::lock_guard lk(mu_);
        stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
    end_all("cancelled"); // no request thread waits forever
}

void Engine::close() {
    std::lock_guard lk(mu_);
    closed_ = true;
}

std::string Engine::failure() const {
    std::lock_guard lk(mu_);
    return failure_;
}

void Engine::end_all(const char* why, std::vector<std::shared_ptr<Ticket>> open) {
    {
        std::lock_guard lk(mu_);
        for (auto& [r, t] : inbox_) open.push_back(t);
        inbox_.clear();
        cancels_.clear();
    }
    for (auto& [index, t] : live_) open.push_back(t);
    live_.clear();
    for (const auto& t : open) {
        {
            std::lock_guard lk(t->m_);
            if (t->result_) continue;
            SeqResult r;
            r.index = t->index_;
            r.gen.stop = why;
            t->result_ = std::move(r);
        }
        t->cv_.notify_all();
        std::lock_guard lk(mu_);
        outstanding_--;
    }
}

std::shared_ptr<Ticket> Engine::submit(SeqRequest r) {
    auto t = std::make_shared<Ticket>();
    {
        std::lock_guard lk(mu_);
        if (stop_ || closed_ || !failure_.empty() || outstanding_ >= limit_) return nullptr;
        outstanding_++;
        inbox_.emplace_back(std::move(r), t);
    }
    cv_.notify_all();
    return t;
}

void Engine::cancel(const std::shared_ptr<Ticket>& t) {
    {
        std::lock_guard lk(mu_);
        cancels_.push_back(t);
    }
    cv_.notify_all();
}

void Engine::cancel_all() {
    {
        std::lock_guard lk(mu_);
        for (const auto& [r, t] : inbox_) cancels_.push_back(t);
        cancels_.push_back(nullptr); // every submitted one
    }
    cv_.notify_all();
}

size_t Engine::outstanding() const {
    std::lock_guard lk(mu_);
    return outstanding_;
}

EngineStats Engine::stats() const {
    std::lock_guard lk(stats_mu_);
    return stats_;
}

void Engine::done(SeqResult r) {
    const auto it = live_.find(r.index);
    if (it == live_.end()) return;
    const std::shared_ptr<Ticket> t = it->second;
    live_.erase(it);
    {
        std::lock_guard lk(t->m_);
        t->result_ = std::move(r);
    }
    t->cv_.notify_all();
    std::lock_guard lk(mu_);
    outstanding_--;
}

void Engine::loop() {
    std::unique_lock lk(mu_);
    for (;;) {
        cv_.wait(lk,
                 [&] { return stop_ || !inbox_.empty() || !cancels_.empty() || !sched_.idle(); });
        if (stop_) break;
        auto inbox = std::move(inbox_);
        inbox_.clear();
        auto cancels = std::move(cancels_);
        cancels_.clear();
        lk.unlock();
        try {
            for (auto& [req, t] : inbox) {
                t->index_ = sched_.submit(std::move(req));
                live_[t->index_] = t;
            }
            for (const auto& t : cancels) {
                if (t) {
                    if (t->index_ != SIZE_MAX) sched_.cancel(t->index_);
                } else {
                    for (const auto& [index, lt] : live_) sched_.cancel(index);
                }
            }
            if (!sched_.idle()) sched_.step([this](SeqResult r) { done(std::move(r)); });
        } catch (const std::exception& e) {
            // The scheduler's state is not to be trusted after a throw:
            // every request in hand ends, and the engine takes no more.
            fmt::print(stderr, "kvrun: serve: error: the engine failed: {}\n", e.what());
            {
                std::lock_guard fl(mu_);
                failure_ = e.what();
            }
            std::vector<std::shared_ptr<Ticket>> unsubmitted;
            for (auto& [req, t] : inbox)
                if (t->index_ == SIZE_MAX || !live_.contains(t->index_)) unsubmitted.push_back(t);
            end_all("error", std::move(unsubmitted));
            lk.lock();
            break;
        }
        {
            std::lock_guard sl(stats_mu_);
            stats_.waiting = sched_.waiting();
            stats_.running = sched_.running();
            stats_.held_blocks = sched_.held_blocks();
            stats_.sched = sched_.stats();
        }
        lk.lock();
    }
}

} // namespace kvrun::serve
