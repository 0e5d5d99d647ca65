// Many sequences on one model at once (kvrun batch): continuous batching.
//
// Each sequence has a cache of its own (a KvCache of the Forward's config,
// reused by the next sequence when it ends), its own sampler and its own
// answer (answer.h). Every step evaluates the next token of every running
// sequence, in passes of up to Forward::kMaxVerify rows (one read of the
// weights per pass, not per sequence), then one chunk of at most max_batch
// prompt tokens of the oldest sequence still reading its prompt; sequences
// join and leave between steps, up to `parallel` at once.
//
// The same answer as a lone run: a prompt is evaluated alone, in the
// batches Session::eval would use, and a generated row takes the one-token
// dot products and attends its own cache (Forward::eval_generated), so each
// sequence's logits are bit for bit those of `kvrun -p` with the same
// settings (and -c), whatever else is in the pass and whenever it joined;
// its sampler draws from them as that run's would.
#pragma once

#include <cstdint>
#include <deque>
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
};

struct SchedulerStats {
    int64_t steps = 0, passes = 0;        // decode steps, and the Forward passes they took
    int64_t prompt_tokens = 0, generated = 0;
    int64_t decoded = 0;                  // tokens evaluated in decode passes
    double decode_s = 0, prompt_s = 0;    // seconds in decode passes, in prompt chunks
    int peak_running = 0;                 // sequences holding a cache at once, at most
    size_t cache_bytes = 0;               // one sequence's cache (ring and states)
    size_t peak_cache_bytes() const { return cache_bytes * static_cast<size_t>(peak_running); }
};

class Scheduler {
  public:
    // Every sequence's cache has config `cfg`; `max_batch` prompt tokens per
    // pass; at most `parallel` sequences at once.
    Scheduler(const LoadedModel& lm, const KvCacheConfig& cfg, Placement placement, int max_batch,
              int parallel);

    // Run every request; on_done gets each result as its sequence ends
    // (completion order). should_stop (Ctrl-C): no new sequence starts and
    // the running ones end "interrupted" after the step.
    void run(std::vector<SeqRequest> requests, const std::function<void(SeqResult)>& on_done,
             const std::function<bool()>& should_stop = {});
    const SchedulerStats& stats() const { return stats_; }

  private:
    struct Sequence {
        size_t index = 0;
        SeqRequest req;
        KvCache* kv = nullptr;
        Sampler sampler;
        std::unique_ptr<Answer> answer;
        std::string text;
        size_t prompt_done = 0;  // prompt tokens evaluated
        int32_t pending = -1;    // sampled, not evaluated yet
        bool done = false;
        Sequence(size_t i, SeqRequest r, KvCache* c, const LoadedModel& lm);
    };
    // A sequence's next prompt chunk; after the last one, its first token.
    void prompt_chunk(Sequence& s);
    // Sample from `logits` and take the token (or end the sequence).
    void sample(Sequence& s, float* logits);
    void end(Sequence& s, const char* why);

    const LoadedModel& lm_;
    KvCacheConfig cfg_;
    KvCache home_; // the Forward's own cache: also the first sequence slot
    Forward fwd_;
    int max_batch_, parallel_;
    std::vector<std::unique_ptr<KvCache>> caches_; // slots beyond home_
    std::vector<KvCache*> free_;
    SchedulerStats stats_;
};

} // namespace kvrun
