// One model, its KV cache, and the tokens that cache holds: the engine that
// run, chat, logits, perplexity and bench drive.
//
// Session owns the cache and the forward pass over it, remembers every token
// it evaluated since the last clear() (position by position), and offers the
// three loops every user of the engine needs: evaluate tokens in batches
// (eval), make the cache hold a given token list by keeping the common prefix
// (sync), and generate (sample -> decode -> stop strings -> text). What to do
// when a generation fills the window is the caller's: a plain run lets the
// ring slide; the chat session evicts whole turns (GenerateHooks::on_full).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "forward.h"
#include "kv_cache.h"
#include "loader.h"
#include "prompt_cache.h"
#include "sampler.h"
#include "speculative.h"

namespace kvrun {

struct EvalHooks {
    std::function<bool()> should_stop;                 // asked before each batch (Ctrl-C)
    std::function<void(int64_t, int64_t)> on_progress; // tokens done, total: after each batch
    // When set, every token's logits are computed and handed over a batch at
    // a time: rows[r * n_vocab ...] are the logits after token first + r.
    std::function<void(int64_t first, int n, const float* rows)> on_rows;
    // on_rows gets the rows of tokens from this one on; those before it are
    // not computed (nor handed over).
    int64_t rows_from = 0;
};

struct GenerateParams {
    int64_t n_predict = -1; // -1 = until an end token (or a stop string)
    bool ignore_eos = false;
    std::vector<int32_t>
        end_ids; // tokens that end the answer besides end-of-generation (chat turns)
    std::vector<std::string>
        stop; // stop strings: the answer ends before them, they are not printed
    bool strip_leading_space =
        false;                // SentencePiece's space before the first word after a lone BOS
    bool no_kv_cache = false; // recompute every token from scratch (the textbook O(n^2) decoder)
    Speculator* speculate = nullptr; // draft tokens and verify them in batches (speculative.h)
};

struct GenerateHooks {
    std::function<void(const std::string&)> on_text; // text released by the stop matcher, in order
    std::function<bool()> should_stop;               // asked before and after each token
    std::function<void(int32_t)> on_token; // each token that is part of the answer, as sampled
    // The cache holds n_ctx tokens and cannot take the next: make room and
    // return nullptr to go on (the session's logits must be those of the last
    // token then), or return the stop reason. Unset: the ring slides.
    std::function<const char*()> on_full;
};

struct GenerateResult {
    int64_t generated =
        0; // tokens sampled into the answer (including those spelling a stop string)
    std::vector<int32_t>
        tokens; // the answer's tokens, without those that spell a matched stop string
    std::string stop =
        "length"; // length, eos, stop string, grammar (complete), interrupted, or on_full's / no_kv_cache's reason
    std::string matched; // the stop string, when one ended the answer
    std::chrono::steady_clock::time_point first_token{}; // when the first token was sampled
    bool sampled_any = false;
};

// How many leading tokens two lists share (what a cache can keep of a request).
size_t common_prefix(std::span<const int32_t> a, std::span<const int32_t> b);

class Session {
  public:
    Session(const LoadedModel& lm, const KvCacheConfig& cfg, Placement placement, int max_batch);
    Session(const Session&) = delete;
    Session& operator=(const Session&) = delete;

    const LoadedModel& model() const { return lm_; }
    KvCache& cache() { return kv_; }
    const KvCache& cache() const { return kv_; }
    Forward& forward() { return fwd_; }
    int n_ctx() const { return kv_.n_ctx(); }
    // Every token evaluated since clear(), position by position.
    const std::vector<int32_t>& tokens() const { return tokens_; }
    // Positions the forward pass has computed since the session began (a
    // window that slides never computes one twice).
    int64_t forward_tokens() const { return forward_tokens_; }
    // Logits after the last evaluated token: Forward's own row, which the
    // sampler may modify (the next eval rewrites it). Not copied: a copy of a
    // 49k-token row per generated token measured 1-5% of SmolLM2-135M's tg.
    float* logits() { return last_; }

    // Evaluate `more` after what the cache holds, max_batch tokens at a time.
    // False when should_stop stopped it (whole batches before it are in).
    bool eval(std::span<const int32_t> more, const EvalHooks& hooks = {});
    // One generated token (Forward::eval_generated).
    void step(int32_t token);
    // Make the cache hold `want`: keep the longest common prefix with what it
    // holds, evaluate the rest, and at least want's last token (its logits
    // start what follows). The ring must not have wrapped (see rewind).
    struct Synced {
        int64_t kept = 0; // tokens of want the cache already held and kept
        bool done = true; // false when should_stop stopped it
    };
    Synced sync(std::span<const int32_t> want, const EvalHooks& hooks = {});
    // Keep only the first n tokens; false when the ring has overwritten a slot
    // of those, or a recurrent state holds later ones and no kept state is at
    // n (the caller must clear(), or take rewind_within).
    bool rewind(int64_t n);
    // Keep the longest prefix of at most n tokens the cache can go back to
    // (n itself, a kept recurrent state before it, or nothing): its length.
    int64_t rewind_within(int64_t n);
    // Recurrent models: a state cannot give positions back (KvCache::truncate),
    // so with this on, sync() keeps the states where it began evaluating and
    // where it ended (with the logits there), and rewinding goes back to the
    // latest of them at or before the point asked: the chat's /retry
    // evaluates nothing again and /undo only the end-of-turn glue, not the
    // conversation. Two copies of the states (KvCache::state_bytes) each.
    void keep_states(bool on);
    // Forget tokens [from, to) and move the later ones down without
    // evaluating them (KvCache::drop); false when the cache cannot (the
    // caller re-evaluates). The last token's logits stay as they were.
    bool drop(int64_t from, int64_t to);
    void clear();

    // Speculative decoding (speculative.h). verify: evaluate `batch` (a
    // sampled token and its drafts) with every row of logits
    // (Forward::eval_verify), after a KV checkpoint; take_back(n, logits):
    // keep the first n tokens (n no fewer than before the batch), `logits`
    // being those after token n - 1. checkpoint(n): the next n tokens
    // evaluated may be taken back (a draft model's own steps).
    float* verify(std::span<const int32_t> batch);
    void checkpoint(int n);
    bool can_take_back(int64_t n) const { return kv_.can_rollback(n); }
    void take_back(int64_t n, float* logits);

    // Prompt-cache files (prompt_cache.h): the digest of the loaded model.
    uint64_t model_digest() const;
    // Every layer's backend computes batch-invariantly (--deterministic).
    bool batch_invariant() const;
    // Clears, then loads the longest prefix of `want` the file holds.
    PromptCacheLoad load_prompt_cache(const std::string& path, uint64_t digest,
                                      const std::vector<int32_t>& want);
    void save_prompt_cache(const std::string& path, uint64_t digest) const;

    // Sample, decode and match stop strings until the answer ends.
    GenerateResult generate(const GenerateParams& params, Sampler& sampler,
                            const GenerateHooks& hooks);

  private:
    // The most tokens a speculative round may draft now (speculative.h).
    int draft_limit(const GenerateParams& p, int64_t generated, bool bounded) const;

    // keep_states: the recurrent states at a position, and the logits after
    // it where they were kept (the sampler modifies the row it is given, so
    // a restored row is copied to restored_logits_ first).
    struct KeptStates {
        int64_t pos = -1; // -1: none
        std::vector<float> states, logits;
    };
    void keep_states_at(KeptStates& k, bool with_logits);
    bool restore_states(const KeptStates& k);
    // Kept states past n no longer match what the cache holds.
    void forget_states_after(int64_t n);

    const LoadedModel& lm_;
    KvCache kv_;
    Forward fwd_;
    bool keep_states_ = false;
    KeptStates began_, ended_; // where the last sync began and ended
    std::vector<float> restored_logits_;
    std::vector<int32_t> tokens_;
    float* last_ = nullptr;
    int64_t forward_tokens_ = 0;
    mutable uint64_t file_digest_ = 0; // model_digest(file), once computed (it hashes the weights)
    mutable bool have_file_digest_ = false;
};

} // namespace kvrun
