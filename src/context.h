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
    int keep = 4;             // --keep (generate)
    gl::Type type_k = gl::Type::F16, type_v = gl::Type::F16;
    int batch = 512, threads = 1;
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

// Throws Error(usage) for a bad -c, Error(context_overflow) when the prompt
// cannot fit, Error(out_of_memory) when no cache that the use accepts fits.
ContextPlan plan_context(const LoadedModel& lm, const ContextRequest& req);

// -c auto for generation: room for the prompt plus the requested tokens (-n;
// when unlimited, twice the prompt and at least 512 free slots), rounded up
// to a multiple of 256, capped at the model's trained context. Throws
// Error(context_overflow) when the prompt alone does not fit the model.
int auto_context(int64_t n_prompt, int64_t n_predict, int64_t n_ctx_train);

// A fixed -c must hold the prompt: throws Error(context_overflow) with the numbers.
void check_prompt_fits(int64_t n_prompt, int64_t n_ctx);

} // namespace kvrun
