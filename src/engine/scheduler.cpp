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

Scheduler::Scheduler(const LoadedModel& lm, const KvCacheConfig& cfg, Placement placement,
                     int max_batch, int parallel, bool share_prefixes, uint64_t cache_budget)
    : lm_(lm), cfg_(cfg), home_(cfg), fwd_(lm.model, home_, std::move(placement), max_batch),
      max_batch_(max_batch), parallel_(std::max(1, parallel)), share_prefixes_(share_prefixes),
      cache_budget_(cache_budget) {
    slots_.reserve(static_cast<size_t>(parallel_));
    slots_.push_back(Slot{&home_, {}, false, 0});
    stats_.cache_bytes = KvCache::ring_bytes_for(cfg) + KvCache::state_bytes_for(cfg);
}

namespace {
size_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
    size_t m = 0;
    while (m < a.size() && m < b.size() && a[m] == b[m]) m++;
    return m;
}
} // namespace

Scheduler::Slot* Scheduler::take_slot(const std::vector<int32_t>& prompt) {
    Slot* best = nullptr;
    size_t best_prefix = 0;
    for (Slot& s : slots_) {
        if (s.busy) continue;
        const size_t m = share_prefixes_ ? common_prefix(s.tokens, prompt) : 0;
        if (!best || m > best_prefix || (m == best_prefix && s.last_used < best->last_used))
            best = &s, best_prefix = m;
    }
    if ((!best || best_prefix == 0) && slots_.size() < static_cast<size_t>(parallel_)) {
        // Out of memory for one more cache: as many at once as there are,
        // the rest wait their turn (never an abort mid-run).
        std::unique_ptr<KvCache> c;
        const bool fits = cache_budget_ == 0 || (slots_.size() + 1) * stats_.cache_bytes <= cache_budget_;
        try {
            if (fits) c = std::make_unique<KvCache>(cfg_);
        } catch (const Error& e) {
            if (e.code() != Exit::out_of_memory) throw;
        } catch (const std::bad_alloc&) {
        }
        if (c) {
            caches_.push_back(std::move(c));
            fwd_.adopt(*caches_.back());
            slots_.push_back(Slot{caches_.back().get(), {}, false, 0});
            best = &slots_.back();
        } else {
            parallel_ = static_cast<int>(slots_.size());
            stats_.memory_capped = true;
        }
    }
    if (!best) return nullptr;
    best->busy = true;
    best->last_used = ++clock_;
    return best;
}

void Scheduler::start_from_prefix(Sequence& s) {
    const std::vector<int32_t>& prompt = s.req.prompt;
    Slot& own = *s.slot;
    // At least the prompt's last token is evaluated: its logits start the answer.
    const size_t cap = prompt.size() - 1;
    size_t m_own = std::min(cap, common_prefix(own.tokens, prompt));
    const Slot* donor = nullptr;
    size_t m_donor = 0;
    if (share_prefixes_)
        for (const Slot& o : slots_) {
            if (&o == &own) continue;
            const size_t m = std::min(cap, common_prefix(o.tokens, prompt));
            if (m > m_donor) donor = &o, m_donor = m;
        }
    if (!share_prefixes_) m_own = 0;
    // A few tokens cost less to evaluate than to copy a cache for.
    if (m_donor < kMinShared) donor = nullptr;
    if (m_own < kMinShared) m_own = 0;
    // Another cache's longer prefix, copied over (where its rings still
    // hold it); else this cache's own.
    if (donor && m_donor > m_own) {
        own.kv->copy_from(*donor->kv);
        if (own.kv->truncate(static_cast<int64_t>(m_donor))) {
            own.tokens.assign(prompt.begin(), prompt.begin() + static_cast<std::ptrdiff_t>(m_donor));
            s.prompt_done = s.cached = m_donor;
            return;
        }
        own.tokens = donor->tokens; // what it holds now (copied)
        m_own = std::min(cap, common_prefix(own.tokens, prompt));
    }
    if (m_own > 0 && own.kv->truncate(static_cast<int64_t>(m_own))) {
        own.tokens.resize(m_own);
        s.prompt_done = s.cached = m_own;
        return;
    }
    own.kv->clear();
    own.tokens.clear();
}

void Scheduler::end(Sequence& s, const char* why) {
    if (why) s.answer->result().stop = why;
    s.text += s.answer->finish();
    s.done = true;
}

void Scheduler::sample(Sequence& s, float* logits) {
    const GenerateParams& p = s.req.gen;
    GenerateResult& r = s.answer->result();
    if (p.n_predict >= 0 && r.generated >= p.n_predict) return end(s, "length");
    check_finite_logits(logits, lm_.model.hp.n_vocab);
    const int32_t id = s.sampler.sample(logits);
    std::string text;
    const Answer::Took took = s.answer->take(id, text);
    s.text += text;
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
    const float* logits = fwd_.eval(s.kv(), prompt.data() + s.prompt_done, n, false);
    stats_.prompt_s += seconds_since(t0);
    s.slot->tokens.insert(s.slot->tokens.end(), prompt.begin() + static_cast<std::ptrdiff_t>(s.prompt_done),
                          prompt.begin() + static_cast<std::ptrdiff_t>(s.prompt_done) + n);
    s.prompt_done += static_cast<size_t>(n);
    stats_.prompt_tokens += n;
    // Forward's logits are overwritten by the next pass: the first token now.
    if (s.prompt_done == prompt.size()) sample(s, const_cast<float*>(logits));
}

void Scheduler::run(std::vector<SeqRequest> requests, const std::function<void(SeqResult)>& on_done,
                    const std::function<bool()>& should_stop) {
    for (const SeqRequest& r : requests)
        KV_ASSERT(!r.prompt.empty() && static_cast<int64_t>(r.prompt.size()) < cfg_.n_ctx);
    auto stopping = [&] { return should_stop && should_stop(); };
    const size_t n_vocab = static_cast<size_t>(lm_.model.hp.n_vocab);
    const int per_pass = std::min(Forward::kMaxVerify, max_batch_);
    std::vector<std::unique_ptr<Sequence>> live; // in the order they joined
    std::vector<Sequence*> gen;
    std::vector<Forward::SeqToken> rows;
    size_t next = 0;
    while (true) {
        // Join: as many as there are caches for.
        while (!stopping() && next < requests.size() &&
               live.size() < static_cast<size_t>(parallel_)) {
            Slot* slot = take_slot(requests[next].prompt);
            if (!slot) break; // every cache is busy
            live.push_back(std::make_unique<Sequence>(next, std::move(requests[next]), slot, lm_));
            next++;
        }
        if (live.empty()) break;
        stats_.peak_running = std::max(stats_.peak_running, static_cast<int>(live.size()));

        // Every running sequence's next token, per_pass rows a pass.
        gen.clear();
        for (auto& s : live)
            if (!s->done && s->pending >= 0) gen.push_back(s.get());
        if (!gen.empty()) stats_.steps++;
        for (size_t i = 0; i < gen.size(); i += per_pass) {
            const size_t m = std::min<size_t>(per_pass, gen.size() - i);
            rows.clear();
            for (size_t j = 0; j < m; j++) {
                Sequence& q = *gen[i + j];
                rows.push_back({q.slot->kv, q.pending});
                q.slot->tokens.push_back(q.pending);
            }
            const auto t0 = std::chrono::steady_clock::now();
            auto* logits = const_cast<float*>(fwd_.eval_generated(rows));
            stats_.decode_s += seconds_since(t0);
            stats_.passes++;
            stats_.decoded += static_cast<int64_t>(m);
            for (size_t j = 0; j < m; j++) {
                gen[i + j]->pending = -1;
                sample(*gen[i + j], logits + j * n_vocab);
            }
        }
        // One prompt chunk: the oldest sequence still reading its prompt.
        for (auto& s : live)
            if (!s->done && s->prompt_done < s->req.prompt.size()) {
                prompt_chunk(*s);
                break;
            }
        if (stopping())
            for (auto& s : live)
                if (!s->done) end(*s, "interrupted");
        // Leave: report, and give the cache to the next.
        for (auto it = live.begin(); it != live.end();) {
            Sequence& s = **it;
            if (!s.done) {
                ++it;
                continue;
            }
            s.slot->busy = false; // its tokens stay findable until the slot is taken
            on_done(SeqResult{s.index, std::move(s.answer->result()), std::move(s.text),
                              static_cast<int64_t>(s.req.prompt.size()), s.cached});
            it = live.erase(it);
        }
    }
}

} // namespace kvrun
