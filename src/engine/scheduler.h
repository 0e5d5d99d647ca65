// Many sequences on one model at once (kvrun batch): continuous batching.
//
// Each sequence has a cache of its own (a KvCache of the Forward's config
// over one shared KvPool, its blocks taken as it grows and given back when
// it ends), its own sampler and its own answer (answer.h). Every step evaluates the next token of
// every running sequence, in passes of up to max_batch rows (one read of the weights per pass, not
// per sequence), then one chunk of at most max_batch prompt tokens of the oldest sequence still
// reading its prompt; sequences join and leave between steps, up to `parallel` at once.
//
// Shared prefixes: every whole block of a prompt (and of an answer) is
// indexed in the pool by a hash of the tokens up to its end. A sequence
// about to read its prompt holds the indexed blocks of its longest such
// prefix, a running sequence's or one left behind (the pool keeps them
// until their memory is needed), and evaluates only the rest: a prefix N
// sequences share is stored once. Not for recurrent states (Qwen 3.5),
// which are not in blocks, nor past a ring's wrap.
//
// The same answer as a lone run: a prompt is evaluated alone, in the
// batches Session::eval would use, and a generated row takes the one-token
// dot products and attends its own cache (Forward::eval_generated), so each
// sequence's logits are bit for bit those of `kvrun -p` with the same
// settings (and -c), whatever else is in the pass and whenever it joined;
// its sampler draws from them as that run's would. A reused prefix was
// evaluated in other batches than a lone run's: with the batch-invariant
// backend (--deterministic) that changes no bit either; otherwise it may
// change the last bits, as a reused --prompt-cache file does.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <utility>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "answer.h"
#include "forward.h"
#include "kv_cache.h"
#include "loader.h"
#include "sampler.h"
#include "session.h"

namespace kvrun {

struct SeqRequest {
    std::vector<int32_t> prompt; // not empty, shorter than n_ctx
    SamplerParams sampling;
    // n_predict, ignore_eos, end_ids, stop, strip_leading_space (no
    // speculation, no --no-kv-cache). n_predict < 0 ends at a full
    // context ("context full"), as kvrun -p -n -1 does; otherwise the
    // sequence's window slides past n_ctx.
    GenerateParams gen;
    // >= 0: each answer token's log-probability and that many of the most
    // likely tokens' (at most 20), through Scheduler::set_on_logprob.
    int logprobs = -1;
};

// A sampled token's log-probability under the model: the log-softmax of
// its raw logits (before penalties, bias and temperature), with the `top`
// most likely tokens', best first.
struct TokenLogprob {
    int32_t token = 0;
    float logprob = 0;
    std::vector<std::pair<int32_t, float>> top;
};

struct SeqResult {
    size_t index = 0;   // of the request, in the order given
    GenerateResult gen; // tokens, stop reason, matched stop string
    std::string text;   // the answer's text (stop strings left out)
    int64_t n_prompt = 0;
    int64_t cached = 0; // prompt tokens a cache held already (not evaluated)
};

struct SchedulerStats {
    int64_t steps = 0, passes = 0; // decode steps, and the Forward passes they took
    int64_t prompt_tokens = 0, generated = 0;
    int64_t decoded = 0;               // tokens evaluated in decode passes
    int64_t reused = 0;                // prompt tokens found in a cache (not evaluated)
    double decode_s = 0, prompt_s = 0; // seconds in decode passes, in prompt chunks
    int peak_running = 0;              // sequences holding a cache at once, at most
    bool memory_capped = false;        // the pool holds fewer whole rings than `parallel`
    double pool_rings = 0;             // whole rings' worth of blocks in the pool
    int64_t preempted = 0;             // sequences paused for want of blocks, recomputed
    int64_t recomputed = 0;            // prompt tokens they evaluated again (not in prompt_tokens)
    size_t cache_bytes = 0;            // one sequence's whole rings and states, unshared
    size_t pool_bytes = 0;             // the pool: `parallel` sequences' whole rings
    size_t peak_block_bytes = 0;       // the most the sequences' blocks held at once
    size_t state_bytes = 0;            // one sequence's recurrent states
    size_t peak_kv_bytes() const {
        return peak_block_bytes + state_bytes * static_cast<size_t>(peak_running);
    }
};

// The log-softmax of `logits` at `token`, and the `top` (at most 20) best.
TokenLogprob token_logprob(std::span<const float> logits, int32_t token, int top);

class Scheduler {
  public:
    // Every sequence's cache has config `cfg`; `max_batch` prompt tokens per
    // pass; at most `parallel` sequences at once. The pool holds `parallel`
    // whole rings, or what `cache_budget` bytes hold (0: no limit; at least
    // one ring): sequences then start while it has blocks for their prompt
    // and are preempted when it has none for them to grow.
    // `share_prefixes`: start from the longest indexed prefix.
    Scheduler(const LoadedModel& lm, const KvCacheConfig& cfg, Placement placement, int max_batch,
              int parallel, bool share_prefixes = true, uint64_t cache_budget = 0);

    // Run every request; on_done gets each result as its sequence ends
    // (completion order). should_stop (Ctrl-C): no new sequence starts and
    // the running ones end "interrupted" after the step; the queued ones are
    // not reported.
    void run(std::vector<SeqRequest> requests, const std::function<void(SeqResult)>& on_done,
             const std::function<bool()>& should_stop = {});

    // The same, a step at a time, for requests that arrive while others run
    // (a server): submit() queues one and returns its index (0, 1, ... in
    // the order submitted); step() runs one step (joins, the decode passes,
    // one prompt chunk, leaves) and hands each sequence that ended to
    // on_done; cancel(index) ends a queued or running one ("cancelled") at
    // the next step; interrupt() ends every running one ("interrupted") and
    // drops the queue; idle(): nothing queued or running.
    size_t submit(SeqRequest r);
    void step(const std::function<void(SeqResult)>& on_done);
    void cancel(size_t index);
    void interrupt() { interrupt_ = true; }
    bool idle() const { return queue_.empty() && live_.empty() && paused_.empty(); }
    // Each sequence's text as it is released (streaming), called in step().
    void set_on_text(std::function<void(size_t index, const std::string& text)> f) {
        on_text_ = std::move(f);
    }
    // Each answer token's log-probability, for requests that ask
    // (SeqRequest::logprobs), before the text it releases.
    void set_on_logprob(std::function<void(size_t index, const TokenLogprob&)> f) {
        on_logprob_ = std::move(f);
    }
    const SchedulerStats& stats() const { return stats_; }
    // Now: requests waiting (queued or preempted), sequences running, and
    // the pool's blocks that sequences hold, of all it has (both kinds).
    size_t waiting() const { return queue_.size() + paused_.size(); }
    size_t running() const { return live_.size(); }
    int held_blocks() const;
    int pool_blocks() const;

  private:
    // A cache over the pool, and the tokens at its positions (indexing its
    // blocks needs them; kept up to n_ctx).
    struct Slot {
        std::unique_ptr<KvCache> own; // null for the Forward's home_
        KvCache* kv = nullptr;
        std::vector<int32_t> tokens;
        bool busy = false;
    };
    // A token now in slot's cache.
    void note_token(Slot& slot, int32_t token);
    struct Sequence {
        size_t index = 0;
        SeqRequest req;
        Slot* slot = nullptr;
        Sampler sampler;
        std::unique_ptr<Answer> answer;
        std::string text;
        size_t prompt_done = 0; // prompt tokens in the cache
        int64_t cached = 0;     // of those, found there (when it first started)
        int32_t pending = -1;   // sampled, not evaluated yet
        bool started = false;   // the sampler has seen the prompt
        bool attached = false;  // its cache starts from the longest indexed prefix
        size_t prompt_seen = 0; // prompt tokens counted (evaluated or found), across preemptions
        bool done = false;
        bool paused = false; // preempted this step: back to the queue
        // Every token it has taken; after a preemption the first `replay`
        // of them are fed again (not sampled) as its cache is rebuilt, so it
        // goes on exactly where it was.
        std::vector<int32_t> taken;
        size_t replay = 0;
        Sequence(size_t i, SeqRequest r, Slot* s, const LoadedModel& lm);
        KvCache& kv() { return *slot->kv; }
    };
    // A free slot (a new one while fewer than `parallel`); null when every
    // slot is busy.
    Slot* take_slot();
    // Before its first prompt chunk: the longest indexed prefix.
    void start_from_prefix(Sequence& s);
    // Blocks for a sequence's next n positions. Where the pool has none
    // left, the youngest running sequence is preempted (its blocks given
    // back, itself queued again), until they are there or s itself was the
    // youngest (false: s is paused).
    bool make_room(Sequence& s, int n);
    void preempt(Sequence& s);
    // Whether the pool has room for a sequence with this prompt to start.
    bool room_to_start(size_t prompt_tokens) const;
    void publish(Sequence& s); // its whole blocks indexed
    // The next token after `logits`: the one it took before a preemption,
    // else sampled.
    void advance(Sequence& s, float* logits);
    // A sequence's next prompt chunk; after the last one, its first token.
    void prompt_chunk(Sequence& s);
    // Sample from `logits` and take the token (or end the sequence).
    void sample(Sequence& s, float* logits);
    void end(Sequence& s, const char* why);
    void release(Sequence& s, const std::string& text); // its answer's text, and on_text

    const LoadedModel& lm_;
    KvCacheConfig cfg_;
    int max_batch_, parallel_;
    uint64_t cache_budget_;
    double pool_rings_ = 0; // set by make_pool, before pool_
    std::shared_ptr<KvPool> pool_;
    KvCache home_; // the Forward's own cache: also the first slot's
    Forward fwd_;
    bool share_prefixes_;
    std::vector<Slot> slots_; // reserved: Sequence points into it
    SchedulerStats stats_;
    std::deque<std::pair<size_t, SeqRequest>> queue_; // submitted, not joined
    std::deque<std::unique_ptr<Sequence>> paused_;    // preempted, to join again first
    std::vector<std::unique_ptr<Sequence>> live_;     // joined, in the order they joined
    std::vector<size_t> cancelled_;                   // cancel() since the last step
    size_t next_index_ = 0;
    bool interrupt_ = false;
    std::function<void(size_t, const std::string&)> on_text_;
    std::function<void(size_t, const TokenLogprob&)> on_logprob_;
    std::vector<float> raw_logits_; // sample()'s scratch: the logits before the sampler's changes
    std::vector<Sequence*> gen_;    // step()'s scratch
    std::vector<Sequence*> pass_;
    std::vector<Forward::SeqToken> rows_;
};

} // namespace kvrun
