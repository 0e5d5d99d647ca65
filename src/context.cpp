#include "context.h"

#include <algorithm>
#include <cstdlib>

#include "error.h"
#include "format.h"
#include "memory_plan.h"

namespace kvrun {

namespace {

using Use = ContextRequest::Use;

// -c N: a whole number of tokens from `min` up.
int parse_ctx(const std::string& s, long min, const char* what) {
    char* end = nullptr;
    const long v = std::strtol(s.c_str(), &end, 10);
    if (s.empty() || *end != '\0' || v < min || v > (1 << 30))
        fail(Exit::usage, "-c {}: expected a number {}>= {}, or auto", s, what, min);
    return static_cast<int>(v);
}

} // namespace

int auto_context(int64_t n_prompt, int64_t n_predict, int64_t n_ctx_train) {
    if (n_prompt > n_ctx_train && n_ctx_train > 0)
        fail(Exit::context_overflow, "the prompt has {} tokens but the model's context is {} tokens", n_prompt,
             n_ctx_train);
    const int64_t extra = n_predict >= 0 ? n_predict : std::max<int64_t>(2 * n_prompt, 512);
    int64_t want = (n_prompt + extra + 255) / 256 * 256;
    want = std::min(want, n_ctx_train);
    return static_cast<int>(std::max<int64_t>(want, std::min<int64_t>(n_ctx_train, 2)));
}

void check_prompt_fits(int64_t n_prompt, int64_t n_ctx) {
    if (n_prompt > n_ctx)
        fail(Exit::context_overflow,
             "the prompt has {} tokens but the context (-c) holds {}: use -c {} or more, or -c auto", n_prompt,
             n_ctx, n_prompt);
}

ContextPlan plan_context(const LoadedModel& lm, const ContextRequest& req) {
    const Hparams& hp = lm.model.hp;
    ContextPlan p;
    p.automatic = req.ctx == "auto";
    int n_ctx = 0, keep = 0;
    switch (req.use) {
    case Use::generate: {
        if (p.automatic) {
            n_ctx = auto_context(req.n_prompt, req.n_predict, hp.n_ctx_train);
        } else {
            n_ctx = parse_ctx(req.ctx, 2, "of tokens ");
            if (hp.sliding_window == 0 || n_ctx < hp.sliding_window) check_prompt_fits(req.n_prompt, n_ctx);
        }
        // Never plan a cache that cannot fit: shrink -c auto, refuse a fixed -c.
        const MemoryPlan plan = plan_memory(lm.file, hp, n_ctx, req.type_k, req.type_v, req.batch, req.threads);
        if (!plan.fits()) {
            const int64_t fit = plan.max_ctx_that_fits;
            if (!p.automatic || fit <= req.n_prompt)
                fail(Exit::out_of_memory, "{}", memory_advice(plan, hp, req.n_prompt));
            const int64_t rounded = fit / 256 * 256;
            n_ctx = static_cast<int>(rounded > req.n_prompt ? rounded : fit);
            p.notes.push_back({fmt::format("-c auto reduced to {} tokens to fit in available memory ({})", n_ctx,
                                           human_bytes(plan.mem_available))});
        }
        keep = std::min(req.keep, n_ctx - 1);
        if (hp.sliding_window > 0 && n_ctx >= hp.sliding_window) {
            // The model attends to the last `sliding_window` tokens only: that is
            // exactly a ring of that many slots with no sinks, and any prompt length fits.
            n_ctx = static_cast<int>(hp.sliding_window);
            keep = 0;
            p.notes.push_back(
                {fmt::format("model declares a sliding window of {} tokens: cache = window, no sinks", n_ctx), true});
        }
        break;
    }
    case Use::chat: {
        // A conversation grows: take the model's context, up to 4096 tokens.
        n_ctx = p.automatic ? static_cast<int>(std::min<int64_t>(hp.n_ctx_train > 0 ? hp.n_ctx_train : 4096, 4096))
                            : parse_ctx(req.ctx, 16, "of tokens ");
        // The session never slides, so it must not attend past a declared window.
        if (hp.sliding_window > 0 && n_ctx > hp.sliding_window) n_ctx = static_cast<int>(hp.sliding_window);
        const MemoryPlan plan = plan_memory(lm.file, hp, n_ctx, req.type_k, req.type_v, req.batch, req.threads);
        if (!plan.fits()) {
            if (!p.automatic || plan.max_ctx_that_fits < 256)
                fail(Exit::out_of_memory, "{}", memory_advice(plan, hp, 0));
            n_ctx = static_cast<int>(plan.max_ctx_that_fits / 256 * 256);
            p.notes.push_back({fmt::format("-c auto reduced to {} tokens to fit in available memory", n_ctx)});
        }
        keep = 0; // the chat session never wraps the ring: the pinned system prompt needs no sinks
        break;
    }
    case Use::logits:
        if (p.automatic) {
            if (req.n_prompt > hp.n_ctx_train)
                fail(Exit::context_overflow, "{} tokens exceed the model's context of {}", req.n_prompt,
                     hp.n_ctx_train);
            n_ctx = static_cast<int>(std::max<int64_t>(req.n_prompt, 2));
        } else {
            n_ctx = parse_ctx(req.ctx, 2, "");
            check_prompt_fits(req.n_prompt, n_ctx);
        }
        keep = std::min(4, n_ctx - 1);
        break;
    case Use::score:
        n_ctx = parse_ctx(req.ctx, 2, "");
        if (n_ctx > hp.n_ctx_train)
            fail(Exit::context_overflow, "-c {} exceeds the model's context of {}", n_ctx, hp.n_ctx_train);
        keep = 0;
        break;
    case Use::bench:
        n_ctx = static_cast<int>(req.n_prompt + 1);
        keep = 4;
        break;
    }
    p.cache = KvCacheConfig::for_model(hp, n_ctx, keep, req.type_k, req.type_v);
    p.batch = std::min(req.batch, n_ctx);
    return p;
}

} // namespace kvrun
