#include "session.h"

#include <algorithm>
#include <cstring>
#include <cmath>

#include "answer.h"
#include "error.h"
#include "stop_sequences.h"

namespace kvrun {


Session::Session(const LoadedModel& lm, const KvCacheConfig& cfg, Placement placement,
                 int max_batch)
    : lm_(lm), kv_(cfg), fwd_(lm.model, kv_, std::move(placement), max_batch) {}

bool Session::eval(std::span<const int32_t> more, const EvalHooks& hooks) {
    const int64_t total = static_cast<int64_t>(more.size());
    const size_t n_vocab = static_cast<size_t>(lm_.model.hp.n_vocab);
    for (int64_t i = 0; i < total;) {
        if (hooks.should_stop && hooks.should_stop()) return false;
        const int n = static_cast<int>(std::min<int64_t>(fwd_.max_batch(), total - i));
        // The batch's logits from row `from` on: the last row's alone unless
        // on_rows wants more of them.
        const int from = hooks.on_rows
                             ? static_cast<int>(std::clamp<int64_t>(hooks.rows_from - i, 0, n - 1))
                             : n - 1;
        const float* rows = fwd_.eval_rows(more.data() + i, n, from);
        forward_tokens_ += n;
        tokens_.insert(tokens_.end(), more.begin() + i, more.begin() + i + n);
        if (hooks.on_rows && i + n > hooks.rows_from) hooks.on_rows(i + from, n - from, rows);
        last_ = const_cast<float*>(rows) + static_cast<size_t>(n - 1 - from) * n_vocab;
        i += n;
        if (hooks.on_progress) hooks.on_progress(i, total);
    }
    return true;
}

void Session::step(int32_t token) {
    last_ = const_cast<float*>(fwd_.eval_generated(token));
    forward_tokens_++;
    tokens_.push_back(token);
}

size_t common_prefix(std::span<const int32_t> a, std::span<const int32_t> b) {
    size_t m = 0;
    while (m < a.size() && m < b.size() && a[m] == b[m]) m++;
    return m;
}

Session::Synced Session::sync(std::span<const int32_t> want, const EvalHooks& hooks) {
    KV_ASSERT(!want.empty() && want.size() <= static_cast<size_t>(kv_.n_ctx()));
    size_t m = common_prefix(tokens_, want);
    const int64_t n = static_cast<int64_t>(want.size());
    // All of want is held: the logits after it start what follows. States
    // kept at its end have them; otherwise its last token is evaluated again.
    if (m == want.size()) {
        if (ended_.pos == n && !ended_.logits.empty() && restore_states(ended_))
            return Synced{n, true};
        m--;
    }
    // A sliding-window layer's ring keeps only its last positions, a
    // recurrent state only its kept copies: rewinding past them means
    // starting again from there.
    const int64_t kept = rewind_within(static_cast<int64_t>(m));
    if (kept > 0) keep_states_at(began_, false);
    const bool done = eval(want.subspan(static_cast<size_t>(kept)), hooks);
    if (done) keep_states_at(ended_, true);
    return Synced{kept, done};
}

bool Session::rewind(int64_t n) {
    if (kv_.truncate(n)) {
        tokens_.resize(static_cast<size_t>(n));
        forget_states_after(n);
        return true;
    }
    for (const KeptStates* k : {&ended_, &began_})
        if (k->pos == n && restore_states(*k)) return true;
    return false;
}

int64_t Session::rewind_within(int64_t n) {
    if (rewind(n)) return n;
    const KeptStates* best = nullptr;
    for (const KeptStates* k : {&ended_, &began_})
        if (k->pos >= 0 && k->pos <= n && (!best || k->pos > best->pos)) best = k;
    if (best && restore_states(*best)) return best->pos;
    clear();
    return 0;
}

void Session::keep_states(bool on) {
    keep_states_ = on && kv_.config().has_recurrent();
    if (!keep_states_) began_ = {}, ended_ = {};
}

void Session::keep_states_at(KeptStates& k, bool with_logits) {
    if (!keep_states_) return;
    const std::span<const float> s = kv_.states();
    k.pos = kv_.n_past();
    k.states.assign(s.begin(), s.end());
    if (with_logits && last_)
        k.logits.assign(last_, last_ + lm_.model.hp.n_vocab);
    else
        k.logits.clear();
}

bool Session::restore_states(const KeptStates& k) {
    if (!kv_.truncate_with_states(k.pos, k.states)) return false;
    tokens_.resize(static_cast<size_t>(k.pos));
    forget_states_after(k.pos);
    restored_logits_ = k.logits;
    last_ = restored_logits_.empty() ? nullptr : restored_logits_.data();
    return true;
}

void Session::forget_states_after(int64_t n) {
    for (KeptStates* k : {&began_, &ended_})
        if (k->pos > n) k->pos = -1;
}

bool Session::drop(int64_t from, int64_t to) {
    KV_ASSERT(from >= 0 && from <= to && to <= static_cast<int64_t>(tokens_.size()));
    if (!kv_.drop(from, to, lm_.model)) return false;
    tokens_.erase(tokens_.begin() + from, tokens_.begin() + to);
    forget_states_after(from);
    return true;
}

float* Session::verify(std::span<const int32_t> batch) {
    const int n = static_cast<int>(batch.size());
    kv_.checkpoint(kv_.n_past(), n);
    float* rows = const_cast<float*>(fwd_.eval_verify(batch.data(), n));
    forward_tokens_ += n;
    tokens_.insert(tokens_.end(), batch.begin(), batch.end());
    last_ = rows + static_cast<size_t>(n - 1) * lm_.model.hp.n_vocab;
    return rows;
}

void Session::checkpoint(int n) {
    kv_.checkpoint(kv_.n_past(), n);
}

void Session::take_back(int64_t n, float* logits) {
    if (n < kv_.n_past()) {
        forget_states_after(n);
        const int64_t pos0 = kv_.checkpoint_pos0();
        kv_.rollback(n);
        // The recurrent states went back to the checkpoint: on to n again.
        if (kv_.config().has_recurrent()) fwd_.replay_recurrent(static_cast<int>(n - pos0));
    }
    tokens_.resize(static_cast<size_t>(n));
    last_ = logits;
}

void Session::clear() {
    forget_states_after(0);
    kv_.clear();
    tokens_.clear();
    last_ = nullptr;
}

// Cached keys depend on the file and, for LongRoPE, on which factors this context uses.
uint64_t Session::model_digest() const {
    const bool long_rope = lm_.model.rope(kv_.n_ctx()).inv_freq != lm_.model.rope_inv_freq.data();
    if (!have_file_digest_) file_digest_ = kvrun::model_digest(lm_.file), have_file_digest_ = true;
    // K/V made by the batch-invariant arithmetic (--deterministic) only serve
    // runs in that mode, and the other way round: reuse must not change a
    // deterministic run's tokens.
    const bool invariant = batch_invariant();
    return file_digest_ ^ (long_rope ? kDigestLongRope : 0) ^
           (invariant ? kDigestDeterministic : 0);
}

bool Session::batch_invariant() const {
    const auto& be = fwd_.placement().layers;
    return std::all_of(be.begin(), be.end(),
                       [](const gl::Backend* b) { return b->batch_invariant(); });
}

PromptCacheLoad Session::load_prompt_cache(const std::string& path, uint64_t digest,
                                           const std::vector<int32_t>& want) {
    clear();
    PromptCacheLoad pc = kvrun::load_prompt_cache(path, digest, kv_, want, lm_.model);
    // The same model in another mode: say which, not "a different model".
    if (!pc.ok && pc.saved_digest != digest) {
        const uint64_t diff = pc.saved_digest ^ digest;
        const bool long_rope_now =
            lm_.model.rope(kv_.n_ctx()).inv_freq != lm_.model.rope_inv_freq.data();
        if (diff == kDigestDeterministic)
            pc.why =
                batch_invariant() ? "made without --deterministic" : "made with --deterministic";
        else if (diff == kDigestLongRope)
            pc.why = long_rope_now ? "made for a context within LongRoPE's original length"
                                   : "made for a context past LongRoPE's original length";
        else if (diff == (kDigestDeterministic ^ kDigestLongRope))
            pc.why = "made in the other --deterministic mode, for a context on the other side of "
                     "LongRoPE's original length";
    }
    if (pc.ok)
        tokens_.assign(want.begin(), want.begin() + pc.reused);
    else
        clear();
    return pc;
}

void Session::save_prompt_cache(const std::string& path, uint64_t digest) const {
    kvrun::save_prompt_cache(path, digest, kv_, tokens_);
}

GenerateResult Session::generate(const GenerateParams& p, Sampler& sampler,
                                 const GenerateHooks& hooks) {
    Answer answer(lm_.tokenizer, p);
    GenerateResult& r = answer.result();
    auto release = [&](const std::string& text) {
        if (hooks.on_text && !text.empty()) hooks.on_text(text);
    };
    auto stopping = [&] { return hooks.should_stop && hooks.should_stop(); };
    // Speculative rounds sample several tokens ahead; they wait here, in
    // order, and each goes through the same steps as a token sampled now.
    std::vector<SpeculatedToken> ahead;
    size_t next = 0; // ahead[next] is the next token
    // When the answer ends with tokens sampled ahead and not used, the cache,
    // the logits and the sampler go back to where plain decoding leaves them
    // (a chat's next turn, a caller's own sampling go on from there): the
    // cache without `unused` (and what follows), the sampler as it was before
    // ahead[redraw] was drawn.
    const SpeculatedToken* unused = nullptr;
    size_t redraw = 0;
    const SpeculatedToken* cur = nullptr; // the token being handled, when it came from `ahead`
    auto ends_before_next = [&] {         // the loop ends before taking the next token
        if (next < ahead.size()) unused = &ahead[next], redraw = next;
    };
    auto ends_at_cur = [&] { // the loop ends on a token plain decoding drew too
        if (cur) unused = cur, redraw = next;
    };
    while (true) {
        cur = nullptr;
        if (stopping()) {
            r.stop = "interrupted";
            ends_before_next();
            break;
        }
        if (p.n_predict >= 0 && r.generated >= p.n_predict) {
            r.stop = "length";
            ends_before_next();
            break;
        }
        int32_t id = 0;
        if (next < ahead.size()) {
            cur = &ahead[next++];
            last_ = cur->logits;
            id = cur->token;
        }
        KV_ASSERT(last_);
        check_finite_logits(last_, lm_.model.hp.n_vocab);
        if (!cur) id = sampler.sample(last_);
        if (!r.sampled_any) r.first_token = std::chrono::steady_clock::now(), r.sampled_any = true;
        std::string text;
        const Answer::Took took = answer.take(id, text);
        if (took == Answer::Took::end_token) {
            ends_at_cur();
            break;
        }
        if (hooks.on_token) hooks.on_token(id);
        release(text);
        if (took == Answer::Took::stop_string) {
            ends_at_cur();
            break;
        }
        if (sampler.grammar_done()) { // a whole sentence, and nothing may follow
            r.stop = "grammar";
            ends_at_cur();
            break;
        }
        if (stopping()) {
            r.stop = "interrupted";
            ends_at_cur();
            break;
        }
        if (p.no_kv_cache) {
            // Forget everything and evaluate the whole sequence from scratch.
            std::vector<int32_t> all = tokens_;
            all.push_back(id);
            if (static_cast<int64_t>(all.size()) > kv_.n_ctx()) {
                r.stop = "context full (--no-kv-cache cannot slide)";
                break;
            }
            clear();
            eval(all);
            continue;
        }
        if (cur && cur->evaluated) continue; // an accepted draft: in the cache already
        if (hooks.on_full && static_cast<int64_t>(tokens_.size()) >= kv_.n_ctx()) {
            if (const char* why = hooks.on_full()) {
                r.stop = why;
                break;
            }
            continue;
        }
        if (p.speculate) {
            ahead.clear();
            next = 0;
            if (p.speculate->round(*this, sampler, id,
                                   draft_limit(p, r.generated, hooks.on_full != nullptr), ahead))
                continue;
            const auto t0 = std::chrono::steady_clock::now();
            step(id);
            p.speculate->plain_step_took(
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
            continue;
        }
        step(id);
    }
    if (unused) {
        if (unused->pos < static_cast<int64_t>(tokens_.size()))
            take_back(unused->pos, unused->logits);
        last_ = unused->logits;
        if (redraw < ahead.size()) sampler.restore(ahead[redraw].sampler_state);
    }
    release(answer.finish());
    return r;
}

int Session::draft_limit(const GenerateParams& p, int64_t generated, bool bounded) const {
    // A round verifies the pending token and its drafts in one batch ...
    int64_t limit = std::min<int64_t>(fwd_.max_batch(), Forward::kMaxVerify) - 1;
    // ... produces at most drafts + 1 tokens of the answer ...
    if (p.n_predict >= 0) limit = std::min(limit, p.n_predict - generated - 1);
    const int64_t pos0 = kv_.n_past();
    // ... may not fill a window that must not slide (a chat evicts turns
    // instead, -n -1 stops), nor, while sinks are written, reach the slide ...
    if (bounded || pos0 < kv_.keep()) limit = std::min<int64_t>(limit, kv_.n_ctx() - pos0 - 1);
    // ... and must fit every ring's window (its slots are checkpointed).
    limit = std::min<int64_t>(limit, kv_.min_window() - 1);
    return static_cast<int>(std::max<int64_t>(limit, 0));
}

} // namespace kvrun
