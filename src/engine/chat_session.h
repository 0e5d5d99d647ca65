// A conversation and the KV cache that holds it.
//
// The Session underneath keeps the token list the cache holds. Each turn it
// builds the token list the conversation should be (pinned prefix: BOS and
// system prompt; then per turn the user's text with the template's glue, the
// reply tokens exactly as sampled, and the end-of-turn glue), keeps the
// longest common prefix with what the cache holds (KvCache::truncate) and
// evaluates only the rest. A reply is never re-tokenized from text, so the
// next turn finds it in the cache as it was generated.
//
// The ring is used as a plain buffer here: the session never lets it wrap
// (n_past <= n_ctx), because truncate() — which /undo, /retry and every
// prefix reuse need — only works before the ring overwrites a slot, and
// because sliding token by token would cut turns in half. When a turn would
// not fit, or a reply fills the window, the oldest whole turns are dropped
// and what stays after the pinned prefix is evaluated again at its new
// the kept turns move down in place: their K/V stay, the keys re-rotated to
// their new positions (KvCache::drop), so an eviction costs a pass over the
// kept keys, not a forward pass. Eviction goes down to half the window, so
// the next turns have room again. It keeps the template's structure intact
// (the model never sees half a turn), and keeps the system prompt in place:
// it is the logical --keep prefix. Where the kept turns' tokens change (a
// template that folds the system prompt into the first user message:
// Mistral, Gemma) or a sliding-window ring has wrapped past the prefix, what
// follows the prefix is evaluated again instead.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "chat_template.h"
#include "sampler.h"
#include "session.h"

namespace kvrun {

// Tokens of a piece of template text: the template's special tokens parsed,
// message content as plain text; at the start of a conversation BOS is added
// when the vocabulary wants one and the text does not already begin with it.
std::vector<int32_t> chat_tokens(const Tokenizer& tok, const ChatText& text, bool at_start);

// What ends a reply: end markers that are single tokens are stopped on as
// tokens, others (the plain fallback's "\nUser:") as stop strings.
struct ReplyEnd {
    std::vector<int32_t> ids;
    std::vector<std::string> strings;
};
ReplyEnd reply_end(const ChatTemplate& t, const Tokenizer& tok);

struct ChatConfig {
    int batch = 512;
    int64_t n_predict = -1; // per reply; -1 = until the model ends its turn
    SamplerParams sampling;
    std::vector<std::string> stop; // extra stop strings
    // Evicted turns are dropped from the cache in place (the kept turns keep
    // the K/V they were computed with); false: the kept turns are evaluated
    // again, exactly as a fresh conversation would.
    bool evict_in_place = true;
    // Speculative decoding (speculative.h): drafts verified in batches; the
    // answers stay those of plain decoding. Not owned.
    Speculator* speculate = nullptr;
    int k_rotate = 0; // KvCacheConfig::k_rotate
};

struct TurnStats {
    int64_t reused = 0;    // tokens the cache already held when the turn began
    int64_t evaluated = 0; // prompt tokens evaluated (including re-evaluation after an eviction)
    int64_t generated = 0;
    int evicted_turns = 0;
    double prompt_s = 0, gen_s = 0;
    std::string stop = "none"; // eos, length, stop string, interrupted, context full
};

struct ChatHooks {
    std::function<void(std::string_view)> on_text;     // reply text as it streams
    std::function<bool()> should_stop;                 // Ctrl-C
    std::function<void(int64_t, int64_t)> on_progress; // prompt tokens done, total
    std::function<void(const std::string&)> on_notice; // the window is full: turns were evicted
    std::function<void(const std::string&)> on_detail; // -v: how an eviction was done
};

class ChatSession {
  public:
    ChatSession(const LoadedModel& lm, ChatTemplate tmpl, int n_ctx, gl::Type type_k,
                gl::Type type_v, Placement placement, ChatConfig cfg);

    const ChatTemplate& chat_template() const { return tmpl_; }
    // "" = the template's default. Takes effect now: the cache is rewound to
    // what the new prefix still shares.
    void set_system(std::string system);
    const std::string& system() const { return system_; }
    // The system prompt in effect: system(), or the template's default.
    std::string effective_system() const;

    // The sampling and reply length of the next answers (the REPL's /set
    // parameter). The repetition penalty keeps the tokens it has seen; the
    // generator goes on, or starts afresh from p.seed with `reseed`.
    void set_sampling(const SamplerParams& p, bool reseed = false);
    const SamplerParams& sampling() const { return cfg_.sampling; }
    void set_n_predict(int64_t n) { cfg_.n_predict = n; }
    // The tokens that end a reply (the template's turn end, end of text): a
    // grammar lets them through once its sentence is whole.
    const std::vector<int32_t>& reply_end_ids() const { return end_.ids; }
    // The last reply is not a whole sentence of the grammar in effect.
    bool grammar_incomplete() const { return sampler_.grammar_incomplete(); }
    int64_t n_predict() const { return cfg_.n_predict; }

    // Add a user message and generate the reply. Throws Error(context_overflow)
    // when the system prompt and this message alone do not fit (the message
    // is then dropped).
    TurnStats respond(const std::string& message, const ChatHooks& hooks);
    // Generate the last reply again. False when there is no turn.
    bool retry(const ChatHooks& hooks, TurnStats* stats);
    // Drop the last exchange; the cache keeps everything before it. False when empty.
    bool undo();
    // Drop every turn (the system prompt stays cached).
    void reset();

    // FILE holds the tokens and K/V (a prompt-cache file, validated the same
    // way on load); FILE.json the conversation. Loading a cache that does not
    // match keeps the conversation and recomputes at the next turn; the
    // returned string says what happened.
    // A conversation file larger than kMaxConversationBytes is refused by its
    // size before it is parsed; save() leaves the oldest evicted turns out
    // to stay below it. `should_stop` (Ctrl-C) abandons a load part way,
    // leaving the session as it was.
    static constexpr uint64_t kMaxConversationBytes = uint64_t{16} << 20;
    void save(const std::string& path) const;
    std::string load(const std::string& path, const std::function<bool()>& should_stop = {});

    struct Turn {
        std::string user, reply;
        std::vector<int32_t> reply_tokens;
        bool open = false; // reply still being generated
    };
    const std::vector<Turn>& turns() const { return turns_; }
    size_t first_live_turn() const { return first_live_; } // older turns were evicted
    int64_t cached_tokens() const { return static_cast<int64_t>(s_.tokens().size()); }
    int n_ctx() const { return s_.n_ctx(); }
    const KvCacheConfig& cache_config() const { return s_.cache().config(); }
    size_t kv_bytes() const { return s_.cache().ring_bytes(); } // the host ring
    const std::vector<int32_t>& cached() const { return s_.tokens(); }
    const KvCache& cache() const { return s_.cache(); }

  private:
    std::vector<int32_t> prefix_tokens() const;
    std::vector<int32_t> target() const;
    // What turn i adds to target(); `first`: it opens the live turns.
    std::vector<int32_t> turn_tokens(size_t i, bool first, const std::string& sys) const;
    // The first live turn from which target() holds at most `max_tokens`
    // (the last turn if none): what evicting one turn at a time would reach,
    // found by tokenizing only the turns the window can hold.
    size_t first_live_within(size_t max_tokens) const;
    void rewind_to_common_prefix(const std::vector<int32_t>& want);
    // Make the cache hold `want`, evaluating only what differs; the session
    // keeps the last token's logits. False when stopped by the hook.
    // `opens_turn`: st.reused is what the cache held of it.
    bool sync(const std::vector<int32_t>& want, const ChatHooks& hooks, TurnStats& st,
              bool opens_turn = false);
    // The window is full: evict the oldest turns until the conversation
    // (`want`, target()) takes at most half the window or only the current
    // turn is left, say so, and move what the cache holds of the kept turns
    // down in place. Returns the new target().
    std::vector<int32_t> evict(std::vector<int32_t> want, const ChatHooks& hooks, TurnStats& st);
    // The cache held a prefix of `before`; the conversation is now `after`
    // (older turns evicted): drop the evicted span from the cache in place.
    void drop_evicted(const std::vector<int32_t>& before, const std::vector<int32_t>& after,
                      const ChatHooks& hooks);
    void generate(const ChatHooks& hooks, TurnStats& st);

    const LoadedModel& lm_;
    ChatTemplate tmpl_;
    Session s_; // the cache holds exactly the conversation's tokens: it never wraps
    Sampler sampler_;
    ChatConfig cfg_;
    ReplyEnd end_;
    std::string system_;
    std::vector<Turn> turns_;
    size_t first_live_ = 0;
};

} // namespace kvrun
