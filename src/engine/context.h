// How big the KV cache is, decided once, for every subcommand.
//
// Each use sizes the cache its own way, for reasons of its own, and those
// ways are named here rather than spread over the subcommands:
//   generate  -c auto = room for the prompt and -n (auto_context), shrunk to
//             what memory allows; a fixed -c must hold the prompt; keep =
//             --keep; a model with a declared sliding window gets a ring of
//             exactly that window and no sinks (any prompt length fits).
//   chat      -c auto = the model's context up to 4096 (a conversation
//             grows); at least 16; never past a sliding window (the chat
//             session never slides); keep 0 (it never wraps the ring).
//   logits    -c auto = the tokens given; keep 4; no memory plan (one batch).
//   score     perplexity chunks: -c is the chunk, within the model's context;
//             keep 0 (a chunk never wraps).
//   bench     the deepest run asked for plus one slot; keep 4.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kv_cache.h"
#include "loader.h"

namespace kvrun {

struct ContextRequest {
    enum class Use { generate, chat, logits, score, bench };
    Use use = Use::generate;
    std::string ctx = "auto"; // -c: a number of tokens, or auto
    int64_t n_prompt = 0;     // tokens the context must hold at once (bench: the deepest run)
    int64_t n_predict = -1;   // -n; -1 = unlimited
    // generate, -c auto: hold at least this many tokens when the model
    // allows (a prompt cache's tokens, so a shorter prompt sharing its
    // prefix can reuse it).
    int64_t min_ctx = 0;
    int keep = 4; // --keep (generate)
    gl::Type type_k = gl::Type::F16, type_v = gl::Type::F16;
    int batch = 512, threads = 1;
    bool k_rotate = false; // --k-rotate: keys in Hadamard blocks (KvCacheConfig::k_rotate)
    // --ctk auto / --ctv auto (generate and chat): that side's type is the
    // first of f16, q8_0, q4_0 (keys rotated) whose cache holds the context
    // in memory (cache_type_ladder); type_k / type_v are ignored for it.
    bool auto_k = false, auto_v = false;
};

struct ContextPlan {
    KvCacheConfig cache;
    bool automatic = false; // -c auto
    int batch = 0;          // tokens per Forward batch: the request's, at most n_ctx
    // What the CLI tells the user about the choice, in order; verbose ones only with -v.
    struct Note {
        std::string text;
        bool verbose_only = false;
    };
    std::vector<Note> notes;
};

// "auto" in any case (-c AUTO, --ctk Auto), as type names are.
bool is_auto(std::string_view s);

// Throws Error(usage) for a bad -c, Error(context_overflow) when the prompt
// cannot fit, Error(out_of_memory) when no cache that the use accepts fits.
ContextPlan plan_context(const LoadedModel& lm, const ContextRequest& req);

// -c auto for generation: room for the prompt plus the requested tokens (-n;
// when unlimited, twice the prompt and at least 512 free slots), rounded up
// to a multiple of 256, capped at the model's trained context. Throws
// Error(context_overflow) when the prompt alone does not fit the model.
int auto_context(int64_t n_prompt, int64_t n_predict, int64_t n_ctx_train);

// The cache types --ctk auto / --ctv auto try, smallest last: f16/f16,
// q8_0/q8_0, q8_0 K with q4_0 V, then q4_0/q4_0 with rotated keys (the
// steps on a side that is not auto keep that side's type). Types whose blocks
// do not divide the model's rows are left out.
struct CacheTypes {
    gl::Type k, v;
    int k_rotate; // KvCacheConfig::k_rotate
};
std::vector<CacheTypes> cache_type_ladder(const Hparams& hp, const ContextRequest& req);
// The first types of the ladder whose cache of n_ctx tokens fits in memory
// now (the last when none does): what --ctk auto / --ctv auto pick.
CacheTypes choose_cache_types(const GgufFile& f, const Hparams& hp, const ContextRequest& req,
                              int64_t n_ctx);
// "q8_0/q4_0", "f16", "q4_0/q4_0, keys rotated": for messages and stats lines.
std::string cache_types_text(gl::Type k, gl::Type v, int k_rotate);

// A fixed -c must hold the prompt: throws Error(context_overflow) with the numbers.
void check_prompt_fits(int64_t n_prompt, int64_t n_ctx);

} // namespace kvrun
