#include "scheduler.h"

#include <algorithm>
#include <cmath>
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
// (0: no limit) or memory hold, at least one; `rings` says how many.
std::shared_ptr<KvPool> make_pool(const KvCacheConfig& cfg, int parallel, uint64_t budget,
                                  double& rings) {
    const uint64_t per = KvCache::ring_bytes_for(cfg) + KvCache::state_bytes_for(cfg);
    rings = parallel;
    if (budget > 0)
        rings = std::clamp(static_cast<double>(budget) /
                               static_cast<double>(std::max<uint64_t>(per, 1)),
                           1.0, rings);
    for (;; rings = std::max(1.0, rings / 2)) {
        try {
            const KvPool::Blocks ring = KvPool::ring_blocks(cfg);
            KvPool::Blocks b{};
            for (int k = 0; k < KvPool::kKinds; k++)
                b[k] = std::max(ring[k], static_cast<int>(rings * ring[k]));
            return std::make_shared<KvPool>(cfg, b);
        } catch (const Error& e) {
            if (e.code() != Exit::out_of_memory || rings <= 1.0) throw;
        } catch (const std::bad_alloc&) {
            if (rings <= 1.0) throw;
        }
    }
}
} // namespace

Scheduler::Scheduler(const LoadedModel& lm, const KvCacheConfig& cfg, Placement placement,
                     int max_batch, int parallel, bool share_prefixes, uint64_t cache_budget)
    : lm_(lm), cfg_(cfg), max_batch_(max_batch), parallel_(std::max(1, parallel)),
      cache_budget_(cache_budget), pool_(make_pool(cfg, parallel_, cache_budget_, pool_rings_)),
      home_(cfg, pool_), fwd_(lm.model, home_, std::move(placement), max_batch),
      share_prefixes_(share_prefixes) {
    slots_.reserve(static_cast<size_t>(parallel_));
    slots_.push_back(Slot{nullptr, &home_, {}, false});
    stats_.cache_bytes = KvCache::ring_bytes_for(cfg) + KvCache::state_bytes_for(cfg);
    stats_.state_bytes = KvCache::state_bytes_for(cfg);
    stats_.pool_bytes = pool_->bytes();
    stats_.pool_rings = pool_rings_;
    stats_.memory_capped = pool_rings_ < parallel_;
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
    s.prompt_done = 0;
    if (!share_prefixes_) return;
    const std::vector<int32_t>& prompt = s.req.prompt;
    const int64_t m = own.kv->attach_prefix(prompt);
    own.tokens.assign(prompt.begin(), prompt.begin() + m);
    s.prompt_done = static_cast<size_t>(m);
}

bool Scheduler::room_to_start(size_t prompt_tokens) const {
    // Blocks for its prompt and first token, and one to grow for each
    // running sequence (fewer preemptions right after a start).
    const KvPool::Blocks need =
        KvPool::blocks_for_tokens(cfg_, static_cast<int64_t>(prompt_tokens) + 1);
    for (int k = 0; k < KvPool::kKinds; k++)
        if (pool_->blocks(k) > 0 &&
            pool_->free_blocks(k) < need[k] + static_cast<int64_t>(live_.size()))
            return false;
    return true;
}

void Scheduler::preempt(Sequence& v) {
    v.kv().clear();
    v.slot->tokens.clear();
    v.slot->busy = false;
    v.slot = nullptr;
    v.paused = true;
    v.attached = false;
    v.prompt_done = 0;
    v.pending = -1;
    v.replay = 0; // every token it took is fed again
    stats_.preempted++;
}

bool Scheduler::make_room(Sequence& s, int n) {
    while (!s.kv().reserve(s.kv().n_past(), n)) {
        // The youngest running sequence (the last to join) gives way. Alone,
        // a sequence always has room: the pool holds a whole ring.
        Sequence* youngest = nullptr;
        for (auto& o : live_)
            if (!o->done && !o->paused && o->attached) youngest = o.get(); // (others hold none)
        KV_ASSERT(youngest && (youngest != &s || live_.size() > 1));
        preempt(*youngest);
        if (youngest == &s) return false;
    }
    return true;
}

void Scheduler::publish(Sequence& s) {
    if (share_prefixes_) s.kv().publish_prefix(s.slot->tokens);
}

void Scheduler::advance(Sequence& s, float* logits) {
    if (s.replay < s.taken.size()) {
        s.pending = s.taken[s.replay++];
        return;
    }
    sample(s, logits);
}

void Scheduler::end(Sequence& s, const char* why) {
    if (why) s.answer->result().stop = why;
    release(s, s.answer->finish());
    s.done = true;
    if (s.slot) { // its blocks back now: a later pass of the step may need them
        s.kv().clear();
        s.slot->busy = false;
        s.slot = nullptr;
    }
}

void Scheduler::release(Sequence& s, const std::string& text) {
    if (text.empty()) return;
    s.text += text;
    if (on_text_) on_text_(s.index, text);
}

TokenLogprob token_logprob(std::span<const float> logits, int32_t token, int top) {
    const float mx = *std::max_element(logits.begin(), logits.end());
    double sum = 0;
    for (float l : logits) sum += std::exp(static_cast<double>(l - mx));
    const auto lse = static_cast<float>(mx + std::log(sum));
    TokenLogprob t;
    t.token = token;
    t.logprob = logits[token] - lse;
    // The best `top` in one pass: a min-heap of at most 20 (higher logit
    // first, then the lower id), no vocabulary-sized scratch.
    const auto k = static_cast<size_t>(std::clamp(top, 0, 20));
    if (k == 0) return t;
    auto better = [](const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
        return a.first > b.first || (a.first == b.first && a.second < b.second);
    };
    std::vector<std::pair<float, int32_t>> heap; // heap.front(): the worst kept
    heap.reserve(k + 1);
    for (size_t i = 0; i < logits.size(); i++) {
        const std::pair<float, int32_t> c{logits[i], static_cast<int32_t>(i)};
        if (heap.size() == k && !better(c, heap.front())) continue;
        heap.push_back(c);
        std::push_heap(heap.begin(), heap.end(), better);
        if (heap.size() > k) {
            std::pop_heap(heap.begin(), heap.end(), better);
            heap.pop_back();
        }
    }
    std::sort_heap(heap.begin(), heap.end(), better);
    for (const auto& [l, id] : heap) t.top.emplace_back(id, l - lse);
    return t;
}

void Scheduler::sample(Sequence& s, float* logits) {
    const GenerateParams& p = s.req.gen;
    GenerateResult& r = s.answer->result();
    if (p.n_predict >= 0 && r.generated >= p.n_predict) return end(s, "length");
    const int n_vocab = lm_.model.hp.n_vocab;
    check_finite_logits(logits, n_vocab);
    const bool logprobs = s.req.logprobs >= 0 && on_logprob_;
    if (logprobs) raw_logits_.assign(logits, logits + n_vocab); // the sampler changes them
    const int32_t id = s.sampler.sample(logits);
    std::string text;
    const Answer::Took took = s.answer->take(id, text);
    if (logprobs && took != Answer::Took::end_token)
        on_logprob_(s.index, token_logprob(raw_logits_, id, s.req.logprobs));
    release(s, text);
    stats_.generated += took == Answer::Took::end_token ? 0 : 1;
    if (took != Answer::Took::token) return end(s, nullptr); // its stop reason is set
    if (s.sampler.grammar_done()) return end(s, "grammar");
    if (p.n_predict >= 0 && r.generated >= p.n_predict) return end(s, "length");
    // -n -1 asks for the whole answer: it ends at a full context rather
    // than sliding on (Session::generate's on_full in kvrun -p).
    if (p.n_predict < 0 && s.kv().n_past() >= s.kv().n_ctx()) return end(s, "context full");
    s.pending = id;
    s.taken.push_back(id);
    s.replay = s.taken.size();
}

void Scheduler::prompt_chunk(Sequence& s) {
    const std::vector<int32_t>& prompt = s.req.prompt;
    if (!s.started) {
        s.started = true;
        for (int32_t t : prompt) s.sampler.accept(t);
    }
    if (!s.attached) {
        s.attached = true;
        start_from_prefix(s);
        // Found: what it never evaluated itself (after a preemption, what it
        // evaluated before counts once, as evaluated).
        if (s.prompt_done > s.prompt_seen) {
            const auto found = static_cast<int64_t>(s.prompt_done - s.prompt_seen);
            s.cached += found;
            stats_.reused += found;
            s.prompt_seen = s.prompt_done;
        }
    }
    const int n = static_cast<int>(std::min<size_t>(max_batch_, prompt.size() - s.prompt_done));
    const auto t0 = std::chrono::steady_clock::now();
    if (!make_room(s, n)) return; // paused: it starts again later
    const float* logits = fwd_.eval(s.kv(), prompt.data() + s.prompt_done, n, false);
    stats_.prompt_s += seconds_since(t0);
    for (int i = 0; i < n; i++) note_token(*s.slot, prompt[s.prompt_done + static_cast<size_t>(i)]);
    publish(s);
    const size_t end = s.prompt_done + static_cast<size_t>(n);
    const size_t fresh = end > s.prompt_seen ? end - std::max(s.prompt_seen, s.prompt_done) : 0;
    stats_.prompt_tokens += static_cast<int64_t>(fresh);
    stats_.recomputed += n - static_cast<int64_t>(fresh);
    s.prompt_seen = std::max(s.prompt_seen, end);
    s.prompt_done = end;
    // Forward's logits are overwritten by the next pass: the first token now.
    if (s.prompt_done == prompt.size()) advance(s, const_cast<float*>(logits));
}

int Scheduler::held_blocks() const {
    int n = 0;
    for (int k = 0; k < KvPool::kKinds; k++) n += pool_->held_blocks(k);
    return n;
}

int Scheduler::pool_blocks() const {
    int n = 0;
    for (int k = 0; k < KvPool::kKinds; k++) n += pool_->blocks(k);
    return n;
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
        for (auto it = paused_.begin(); it != paused_.end(); ++it)
            if ((*it)->index == index) { // reported with the text it had
                end(**it, "cancelled");
                live_.push_back(std::move(*it));
                paused_.erase(it);
                break;
            }
    }
    cancelled_.clear();
    // Join: preempted sequences first, while the pool has blocks for them
    // (a sequence alone always has room: the pool holds a whole ring).
    while (!interrupt_ && (!paused_.empty() || !queue_.empty()) &&
           live_.size() < static_cast<size_t>(parallel_)) {
        const bool resume = !paused_.empty();
        const size_t tokens =
            resume ? paused_.front()->req.prompt.size() + paused_.front()->taken.size()
                   : queue_.front().second.prompt.size();
        if (!live_.empty() && !room_to_start(tokens)) break;
        Slot* slot = take_slot();
        if (!slot) break; // every cache is busy
        if (resume) {
            std::unique_ptr<Sequence> s = std::move(paused_.front());
            paused_.pop_front();
            s->slot = slot;
            s->paused = false;
            live_.push_back(std::move(s));
            continue;
        }
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
        const auto t0 = std::chrono::steady_clock::now();
        pass_.clear();
        for (size_t j = i; j < std::min(gen_.size(), i + per_pass); j++)
            if (!gen_[j]->paused && make_room(*gen_[j], 1)) pass_.push_back(gen_[j]);
        // (A later one's room may have paused an earlier one of the pass.)
        std::erase_if(pass_, [](const Sequence* q) { return q->paused; });
        if (pass_.empty()) continue;
        rows_.clear();
        for (Sequence* q : pass_) rows_.push_back({q->slot->kv, q->pending});
        auto* logits = const_cast<float*>(fwd_.eval_generated(rows_));
        for (Sequence* q : pass_) {
            note_token(*q->slot, q->pending);
            publish(*q);
        }
        stats_.decode_s += seconds_since(t0);
        stats_.passes++;
        stats_.decoded += static_cast<int64_t>(pass_.size());
        for (size_t j = 0; j < pass_.size(); j++) {
            pass_[j]->pending = -1;
            advance(*pass_[j], logits + j * n_vocab);
        }
    }
    // One prompt chunk: the oldest sequence still reading its prompt.
    for (auto& s : live_)
        if (!s->done && !s->paused && s->prompt_done < s->req.prompt.size()) {
            prompt_chunk(*s);
            break;
        }
    if (interrupt_) {
        for (auto& s : live_)
            if (!s->done) end(*s, "interrupted");
        for (auto& s : paused_) {
            end(*s, "interrupted");
            live_.push_back(std::move(s));
        }
        paused_.clear();
    }
    // Leave: report, and give the cache to the next; the preempted wait.
    for (auto it = live_.begin(); it != live_.end();) {
        Sequence& s = **it;
        if (s.paused && !s.done) {
            paused_.push_back(std::move(*it));
            it = live_.erase(it);
            continue;
        }
        if (!s.done) {
            ++it;
            continue;
        }
        if (s.slot) {       // (none for a preempted one cancelled or interrupted)
            s.kv().clear(); // its blocks back (indexed ones stay findable until needed)
            s.slot->busy = false;
        }
        on_done(SeqResult{s.index, std::move(s.answer->result()), std::move(s.text),
                          static_cast<int64_t>(s.req.prompt.size()), s.cached});
        it = live_.erase(it);
    }
    stats_.peak_block_bytes = pool_->peak_held_bytes();
    if (idle()) interrupt_ = false;
}

} // namespace kvrun
