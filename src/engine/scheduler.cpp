#include "scheduler.h"

#include <algorithm>
#include <chrono>

#include "error.h"

namespace kvrun {

namespace {
double seconds_since(std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}
} // namespace

Scheduler::Sequence::Sequence(size_t i, SeqRequest r, Slot* s, const LoadedModel& lm)
    : index(i), req(std::move(r)), slot(s), sampler(req.sampling, lm.model.hp.n_vocab),
      answer(std::make_unique<Answer>(lm.tokenizer, req.gen)) {}

namespace {
// The pool: `parallel` sequences' whole rings, or as many as `budget` bytes
// (0: no limit) or memory hold, at least one; `parallel` becomes that many.
std::shared_ptr<KvPool> make_pool(const KvCacheConfig& cfg, int& parallel, uint64_t budget,
                                  bool& capped) {
    const uint64_t per = KvCache::ring_bytes_for(cfg) + KvCache::state_bytes_for(cfg);
    int n = parallel;
    if (budget > 0)
        n = static_cast<int>(std::clamp<uint64_t>(budget / std::max<uint64_t>(per, 1), 1, n));
    for (;; n = std::max(1, n / 2)) {
        try {
            KvPool::Blocks b = KvPool::ring_blocks(cfg);
            for (int& k : b) k *= n;
            auto pool = std::make_shared<KvPool>(cfg, b);
            capped = n < parallel;
            parallel = n;
            return pool;
        } catch (const Error& e) {
            if (e.code() != Exit::out_of_memory || n == 1) throw;
        } catch (const std::bad_alloc&) {
            if (n == 1) throw;
        }
    }
}
} // namespace

Scheduler::Scheduler(const LoadedModel& lm, const KvCacheConfig& cfg, Placement placement,
                     int max_batch, int parallel, bool share_prefixes, uint64_t cache_budget)
    : lm_(lm), cfg_(cfg), max_batch_(max_batch), parallel_(std::max(1, parallel)),
      cache_budget_(cache_budget), pool_(make_pool(cfg, parallel_, cache_budget_, memory_capped_)),
      home_(cfg, pool_), fwd_(lm.model, home_, std::move(placement), max_batch),
      share_prefixes_(share_prefixes) {
    slots_.reserve(static_cast<size_t>(parallel_));
    slots_.push_back(Slot{nullptr, &home_, {}, false});
    stats_.cache_bytes = KvCache::ring_bytes_for(cfg) + KvCache::state_bytes_for(cfg);
    stats_.state_bytes = KvCache::state_bytes_for(cfg);
    stats_.pool_bytes = pool_->bytes();
    stats_.memory_capped = memory_capped_;
}

Scheduler::Slot* Scheduler::take_slot() {
    for (Slot& s : slots_)
        if (!s.busy) {
            s.busy = true;
            return &s;
        }
    if (slots_.size() >= static_cast<size_t>(parallel_)) return nullptr;
    auto c = std::make_unique<KvCache>(cfg_, pool_);
    fwd_.adopt(*c);
    KvCache* kv = c.get();
    slots_.push_back(Slot{std::move(c), kv, {}, true});
    return &slots_.back();
}

void Scheduler::note_token(Slot& slot, int32_t token) {
    // Blocks are indexed only before a ring wraps (KvCache::publish_prefix).
    if (slot.tokens.size() < static_cast<size_t>(cfg_.n_ctx)) slot.tokens.push_back(token);
}

void Scheduler::start_from_prefix(Sequence& s) {
    Slot& own = *s.slot;
    own.kv->clear(); // its blocks back to the pool (indexed ones stay findable)
    own.tokens.clear();
    if (!share_prefixes_) return;
    const std::vector<int32_t>& prompt = s.req.prompt;
    const int64_t m = own.kv->attach_prefix(prompt);
    own.tokens.assign(prompt.begin(), prompt.begin() + m);
    s.prompt_done = static_cast<size_t>(m);
    s.cached = m;
}

void Scheduler::reserve(Sequence& s, int n) {
    // The pool holds `parallel` whole rings, and a sequence never holds more
    // than its rings' blocks: a block is always there (evicting indexed
    // prefixes nobody holds, least recently used first).
    if (!s.kv().reserve(s.kv().n_past(), n))
        fail(Exit::error, "internal: the KV pool has no free block (a bug: please report it)");
}

void Scheduler::publish(Sequence& s) {
    if (share_prefixes_) s.kv().publish_prefix(s.slot->tokens);
}

void Scheduler::end(Sequence& s, const char* why) {
    if (why) s.answer->result().stop = why;
    release(s, s.answer->finish());
    s.done = true;
}

void Scheduler::release(Sequence& s, const std::string& text) {
    if (text.empty()) return;
    s.text += text;
    if (on_text_) on_text_(s.index, text);
}

void Scheduler::sample(Sequence& s, float* logits) {
    const GenerateParams& p = s.req.gen;
    GenerateResult& r = s.answer->result();
    if (p.n_predict >= 0 && r.generated >= p.n_predict) return end(s, "length");
    check_finite_logits(logits, lm_.model.hp.n_vocab);
    const int32_t id = s.sampler.sample(logits);
    std::string text;
    const Answer::Took took = s.answer->take(id, text);
    release(s, text);
    stats_.generated += took == Answer::Took::end_token ? 0 : 1;
    if (took != Answer::Took::token) return end(s, nullptr); // its stop reason is set
    if (p.n_predict >= 0 && r.generated >= p.n_predict) return end(s, "length");
    // -n -1 asks for the whole answer: it ends at a full context rather
    // than sliding on (Session::generate's on_full in kvrun -p).
    if (p.n_predict < 0 && s.kv().n_past() >= s.kv().n_ctx()) return end(s, "context full");
    s.pending = id;
}

void Scheduler::prompt_chunk(Sequence& s) {
    const std::vector<int32_t>& prompt = s.req.prompt;
    if (!s.started) {
        s.started = true;
        for (int32_t t : prompt) s.sampler.accept(t);
        start_from_prefix(s);
        stats_.reused += s.cached;
    }
    const int n = static_cast<int>(std::min<size_t>(max_batch_, prompt.size() - s.prompt_done));
    const auto t0 = std::chrono::steady_clock::now();
    reserve(s, n);
    const float* logits = fwd_.eval(s.kv(), prompt.data() + s.prompt_done, n, false);
    stats_.prompt_s += seconds_since(t0);
    for (int i = 0; i < n; i++) note_token(*s.slot, prompt[s.prompt_done + static_cast<size_t>(i)]);
    publish(s);
    s.prompt_done += static_cast<size_t>(n);
    stats_.prompt_tokens += n;
    // Forward's logits are overwritten by the next pass: the first token now.
    if (s.prompt_done == prompt.size()) sample(s, const_cast<float*>(logits));
}

size_t Scheduler::submit(SeqRequest r) {
    KV_ASSERT(!r.prompt.empty() && static_cast<int64_t>(r.prompt.size()) < cfg_.n_ctx);
    queue_.emplace_back(next_index_, std::move(r));
    return next_index_++;
}

void Scheduler::cancel(size_t index) {
    cancelled_.push_back(index);
}

void Scheduler::run(std::vector<SeqRequest> requests, const std::function<void(SeqResult)>& on_done,
                    const std::function<bool()>& should_stop) {
    KV_ASSERT(idle()); // its indices start after what was submitted before
    const size_t first = next_index_;
    for (SeqRequest& r : requests) submit(std::move(r));
    while (!idle()) {
        if (should_stop && should_stop()) interrupt();
        step([&](SeqResult r) {
            r.index -= first;
            on_done(std::move(r));
        });
    }
}

void Scheduler::step(const std::function<void(SeqResult)>& on_done) {
    if (interrupt_) queue_.clear();
    // Cancelled: queued ones answered now, running ones end this step.
    for (size_t index : cancelled_) {
        for (auto it = queue_.begin(); it != queue_.end(); ++it)
            if (it->first == index) {
                GenerateResult r;
                r.stop = "cancelled";
                on_done(SeqResult{index, std::move(r), "",
                                  static_cast<int64_t>(it->second.prompt.size()), 0});
                queue_.erase(it);
                break;
            }
        for (auto& s : live_)
            if (s->index == index && !s->done) end(*s, "cancelled");
    }
    cancelled_.clear();
    // Join: as many as there are caches for.
    while (!interrupt_ && !queue_.empty() && live_.size() < static_cast<size_t>(parallel_)) {
        Slot* slot = take_slot();
        if (!slot) break; // every cache is busy
        live_.push_back(std::make_unique<Sequence>(queue_.front().first,
                                                   std::move(queue_.front().second), slot, lm_));
        queue_.pop_front();
    }
    stats_.peak_running = std::max(stats_.peak_running, static_cast<int>(live_.size()));

    // Every running sequence's next token, per_pass rows a pass.
    const size_t n_vocab = static_cast<size_t>(lm_.model.hp.n_vocab);
    const int per_pass = max_batch_;
    gen_.clear();
    for (auto& s : live_)
        if (!s->done && s->pending >= 0) gen_.push_back(s.get());
    if (!gen_.empty()) stats_.steps++;
    for (size_t i = 0; i < gen_.size(); i += per_pass) {
        const size_t m = std::min<size_t>(per_pass, gen_.size() - i);
        rows_.clear();
        for (size_t j = 0; j < m; j++)
            rows_.push_back({gen_[i + j]->slot->kv, gen_[i + j]->pending});
        const auto t0 = std::chrono::steady_clock::now();
        for (size_t j = 0; j < m; j++) reserve(*gen_[i + j], 1);
        auto* logits = const_cast<float*>(fwd_.eval_generated(rows_));
        for (size_t j = 0; j < m; j++) {
            note_token(*gen_[i + j]->slot, gen_[i + j]->pending);
            publish(*gen_[i + j]);
        }
        stats_.decode_s += seconds_since(t0);
        stats_.passes++;
        stats_.decoded += static_cast<int64_t>(m);
        for (size_t j = 0; j < m; j++) {
            gen_[i + j]->pending = -1;
            sample(*gen_[i + j], logits + j * n_vocab);
        }
    }
    // One prompt chunk: the oldest sequence still reading its prompt.
    for (auto& s : live_)
        if (!s->done && s->prompt_done < s->req.prompt.size()) {
            prompt_chunk(*s);
            break;
        }
    if (interrupt_)
        for (auto& s : live_)
            if (!s->done) end(*s, "interrupted");
    // Leave: report, and give the cache to the next.
    for (auto it = live_.begin(); it != live_.end();) {
        Sequence& s = **it;
        if (!s.done) {
            ++it;
            continue;
        }
        s.kv().clear(); // its blocks back (indexed ones stay findable until needed)
        s.slot->busy = false;
        on_done(SeqResult{s.index, std::move(s.answer->result()), std::move(s.text),
                          static_cast<int64_t>(s.req.prompt.size()), s.cached});
        it = live_.erase(it);
    }
    stats_.peak_block_bytes = pool_->peak_held_bytes();
    if (idle()) interrupt_ = false;
}

} // namespace kvrun
