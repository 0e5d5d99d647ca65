// Many sequences on one model at once (kvrun batch): continuous batching.
//
// Each sequence has a cache of its own (a KvCache of the Forward's config,
// reused by the next sequence when it ends), its own sampler and its own
// answer (answer.h). Every step evaluates the next token of every running
// sequence, in passes of up to max_batch rows (one read of the weights per
// pass, not per sequence), then one chunk of at most max_batch
// prompt tokens of the oldest sequence still reading its prompt; sequences
// join and leave between steps, up to `parallel` at once.
//
// Shared prefixes: a cache keeps what it held after its sequence left, and
// is found by its tokens until another sequence takes it over. A sequence
// about to read its prompt starts from the longest prefix any cache holds
// (its own, one left behind, or a running sequence's, copied over) and
// evaluates only the rest. Prefixes are copied, not shared in place: the
// block pool that stores them once is not built yet (docs/batch.md).
// Recurrent states hold only their end: a Qwen 3.5 prefix is reused only
// where a cache holds exactly it.
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
};

struct SeqResult {
    size_t index = 0;      // of the request, in the order given
    GenerateResult gen;    // tokens, stop reason, matched stop string
    std::string text;      // the answer's text (stop strings left out)
    int64_t n_prompt = 0;
    int64_t cached = 0;    // prompt tokens a cache held already (not evaluated)
};

struct SchedulerStats {
    int64_t steps = 0, passes = 0;        // decode steps, and the Forward passes they took
    int64_t prompt_tokens = 0, generated = 0;
    int64_t decoded = 0;                  // tokens evaluated in decode passes
    int64_t reused = 0;                   // prompt tokens found in a cache (not evaluated)
    double decode_s = 0, prompt_s = 0;    // seconds in decode passes, in prompt chunks
    int peak_running = 0;                 // sequences holding a cache at once, at most
    bool memory_capped = false;           // a cache could not be had: fewer at once than asked
    size_t cache_bytes = 0;               // one sequence's cache (ring and states)
    size_t peak_cache_bytes() const { return cache_bytes * static_cast<size_t>(peak_running); }
};

class Scheduler {
  public:
    // Every sequence's cache has config `cfg`; `max_batch` prompt tokens per
    // pass; at most `parallel` sequences at once, and no more caches than
    // `cache_budget` bytes hold (0: no limit; the first is always made);
    // `share_prefixes`: start from the longest prefix a cache holds.
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
    bool idle() const { return queue_.empty() && live_.empty(); }
    // Each sequence's text as it is released (streaming), called in step().
    void set_on_text(std::function<void(size_t index, const std::string& text)> f) {
        on_text_ = std::move(f);
    }
    const SchedulerStats& stats() const { return stats_; }
    // Shorter common prefixes are evaluated again (cheaper than a copy).
    static constexpr size_t kMinShared = 16;

  private:
    // A cache and the tokens it holds; it keeps them after its sequence
    // leaves, for the next prompts that share them.
    struct Slot {
        KvCache* kv = nullptr;
        std::vector<int32_t> tokens;
        bool busy = false;
        bool slid = false; // past n_ctx: tokens no longer tracked (nothing to find)
        uint64_t last_used = 0;
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
        size_t prompt_done = 0;  // prompt tokens in the cache
        int64_t cached = 0;      // of those, found there
        int32_t pending = -1;    // sampled, not evaluated yet
        bool started = false;    // the prompt's first chunk is behind
        bool done = false;
        Sequence(size_t i, SeqRequest r, Slot* s, const LoadedModel& lm);
        KvCache& kv() { return *slot->kv; }
    };
    // A free slot for `prompt`: the one holding the longest prefix of it,
    // else the least recently used (a new one while fewer than `parallel`
    // and memory allows); null when every slot is busy.
    Slot* take_slot(const std::vector<int32_t>& prompt);
    // Before its first prompt chunk: the longest prefix any slot holds.
    void start_from_prefix(Sequence& s);
    // A sequence's next prompt chunk; after the last one, its first token.
    void prompt_chunk(Sequence& s);
    // Sample from `logits` and take the token (or end the sequence).
    void sample(Sequence& s, float* logits);
    void end(Sequence& s, const char* why);
    void release(Sequence& s, const std::string& text); // its answer's text, and on_text

    const LoadedModel& lm_;
    KvCacheConfig cfg_;
    KvCache home_; // the Forward's own cache: also the first slot's
    Forward fwd_;
    int max_batch_, parallel_;
    bool share_prefixes_;
    uint64_t cache_budget_;
    std::vector<std::unique_ptr<KvCache>> caches_; // the other slots'
    std::vector<Slot> slots_;                      // reserved: Sequence points into it
    uint64_t clock_ = 0;
    SchedulerStats stats_;
    std::deque<std::pair<size_t, SeqRequest>> queue_; // submitted, not joined
    std::vector<std::unique_ptr<Sequence>> live_;      // joined, in the order they joined
    std::vector<size_t> cancelled_;                    // cancel() since the last step
    size_t next_index_ = 0;
    bool interrupt_ = false;
    std::function<void(size_t, const std::string&)> on_text_;
    std::vector<Sequence*> gen_;                       // step()'s scratch
    std::vector<Forward::SeqToken> rows_;
};

} // namespace kvrun
