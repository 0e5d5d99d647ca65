#include "context.h"

#include <strings.h>

#include <algorithm>
#include <cstdlib>

#include "error.h"
#include "format.h"
#include "ggml-like/hadamard.h"
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

// The rotation block --k-rotate asks for on this model's heads.
// The smallest head size of any layer (Gemma 4's window layers have their own).
int min_head_dim(const Hparams& hp) {
    return hp.head_dim_swa ? std::min(hp.head_dim, hp.head_dim_swa) : hp.head_dim;
}

int rotation_for(const Hparams& hp) {
    const int b = gl::hadamard_block(min_head_dim(hp));
    if (b < 2)
        fail(Exit::usage, "--k-rotate: the head size ({}) has no power-of-two block to rotate",
             hp.head_dim);
    return b;
}

} // namespace

std::vector<CacheTypes> cache_type_ladder(const Hparams& hp, const ContextRequest& req) {
    const int rot = req.k_rotate ? rotation_for(hp) : 0;
    if (!req.auto_k && !req.auto_v) return {{req.type_k, req.type_v, rot}};
    using T = gl::Type;
    const int hb = gl::hadamard_block(min_head_dim(hp));
    const int rot4 = hb > 1 ? hb : 0;
    const CacheTypes steps[] = {{T::F16, T::F16, 0},
                                {T::Q8_0, T::Q8_0, 0},
                                {T::Q8_0, T::Q4_0, 0},
                                {T::Q4_0, T::Q4_0, rot4}};
    std::vector<CacheTypes> out;
    for (const CacheTypes& s : steps) {
        const CacheTypes c{req.auto_k ? s.k : req.type_k, req.auto_v ? s.v : req.type_v,
                           req.auto_k ? s.k_rotate : rot};
        const int kvd_min = hp.n_head_kv * min_head_dim(hp);
        if (!gl::row_size_ok(c.k, kvd_min) || !gl::row_size_ok(c.v, kvd_min) ||
            !gl::row_size_ok(c.k, hp.kv_dim()) || !gl::row_size_ok(c.v, hp.kv_dim()))
            continue;
        if (std::none_of(out.begin(), out.end(), [&](const CacheTypes& o) {
                return o.k == c.k && o.v == c.v && o.k_rotate == c.k_rotate;
            }))
            out.push_back(c);
    }
    return out;
}

std::string cache_types_text(gl::Type k, gl::Type v, int k_rotate) {
    // Rotated keys always name both types: "q4_0, keys rotated" would read as if V were rotated
    // too.
    if (k_rotate > 0)
        return fmt::format("{}/{}, keys{} rotated", gl::type_name(k), gl::type_name(v),
                           KvCacheConfig::values_rotated_with(v, k_rotate) ? " and values" : "");
    return k == v ? std::string(gl::type_name(k))
                  : fmt::format("{}/{}", gl::type_name(k), gl::type_name(v));
}

int auto_context(int64_t n_prompt, int64_t n_predict, int64_t n_ctx_train) {
    if (n_prompt > n_ctx_train && n_ctx_train > 0)
        fail(Exit::context_overflow,
             "the prompt has {} tokens but the model's context is {} tokens", n_prompt,
             n_ctx_train);
    const int64_t extra = n_predict >= 0 ? n_predict : std::max<int64_t>(2 * n_prompt, 512);
    int64_t want = (n_prompt + extra + 255) / 256 * 256;
    want = std::min(want, n_ctx_train);
    return static_cast<int>(std::max<int64_t>(want, std::min<int64_t>(n_ctx_train, 2)));
}

void check_prompt_fits(int64_t n_prompt, int64_t n_ctx) {
    if (n_prompt > n_ctx)
        fail(
            Exit::context_overflow,
            "the prompt has {} tokens but the context (-c) holds {}: use -c {} or more, or -c auto",
            n_prompt, n_ctx, n_prompt);
}

namespace {
// The memory plan for n_ctx tokens with the first cache types of the ladder
// that fit (the last one if none does); `types` is set to them. A choice
// other than the first is told in one line.
MemoryPlan plan_with_types(const LoadedModel& lm, const ContextRequest& req, int64_t n_ctx,
                           CacheTypes& types, std::vector<ContextPlan::Note>& notes) {
    const std::vector<CacheTypes> ladder = cache_type_ladder(lm.model.hp, req);
    const auto plan_for = [&](const CacheTypes& t) {
        return plan_memory(lm.file, lm.model.hp, n_ctx, t.k, t.v, req.batch, req.threads);
    };
    const MemoryPlan first = plan_for(ladder.front());
    MemoryPlan plan = first;
    size_t i = 0;
    while (!plan.fits() && i + 1 < ladder.size()) plan = plan_for(ladder[++i]);
    types = ladder[i];
    if (i > 0)
        notes.push_back(
            {fmt::format("{}: a {}-token {} cache needs {}, {} is free: using {} ({}{})",
                         req.auto_k ? "--ctk auto" : "--ctv auto", n_ctx,
                         cache_types_text(ladder[0].k, ladder[0].v, ladder[0].k_rotate),
                         human_bytes(first.kv), human_bytes(first.kv_free),
                         cache_types_text(types.k, types.v, types.k_rotate), human_bytes(plan.kv),
                         plan.fits() ? "" : ", the smallest, and it does not fit either")});
    return plan;
}
// What the auto types did or could do, for the out-of-memory message: the
// smallest types an auto side tried, and whether auto on both sides fits.
std::string auto_advice(const LoadedModel& lm, const ContextRequest& req, int64_t n_ctx) {
    const auto fits = [&](const CacheTypes& t) {
        return plan_memory(lm.file, lm.model.hp, n_ctx, t.k, t.v, req.batch, req.threads).fits();
    };
    std::string s;
    if (req.auto_k || req.auto_v) {
        const CacheTypes last = cache_type_ladder(lm.model.hp, req).back();
        s = fmt::format("; {} tried down to {}",
                        req.auto_k && req.auto_v ? "--ctk auto --ctv auto"
                        : req.auto_k             ? "--ctk auto"
                                                 : "--ctv auto",
                        cache_types_text(last.k, last.v, last.k_rotate));
    }
    if (req.auto_k && req.auto_v) return s;
    ContextRequest both = req;
    both.auto_k = both.auto_v = true;
    for (const CacheTypes& t : cache_type_ladder(lm.model.hp, both))
        if (fits(t))
            return s + fmt::format("; --ctk auto --ctv auto would fit {} tokens ({})", n_ctx,
                                   cache_types_text(t.k, t.v, t.k_rotate));
    return s;
}
} // namespace

CacheTypes choose_cache_types(const GgufFile& f, const Hparams& hp, const ContextRequest& req,
                              int64_t n_ctx) {
    const std::vector<CacheTypes> ladder = cache_type_ladder(hp, req);
    for (const CacheTypes& t : ladder)
        if (plan_memory(f, hp, n_ctx, t.k, t.v, req.batch, req.threads).fits()) return t;
    return ladder.back();
}

bool is_auto(std::string_view s) {
    return s.size() == 4 && strncasecmp(s.data(), "auto", 4) == 0;
}

ContextPlan plan_context(const LoadedModel& lm, const ContextRequest& req) {
    const Hparams& hp = lm.model.hp;
    ContextPlan p;
    p.automatic = is_auto(req.ctx);
    int n_ctx = 0, keep = 0;
    CacheTypes types = cache_type_ladder(hp, req).front();
    switch (req.use) {
    case Use::generate: {
        if (p.automatic) {
            n_ctx = auto_context(req.n_prompt, req.n_predict, hp.n_ctx_train);
            if (req.min_ctx > n_ctx) {
                const int64_t cap = hp.n_ctx_train > 0 ? hp.n_ctx_train : int64_t{1} << 20;
                const int64_t want = std::min((req.min_ctx + 255) / 256 * 256, cap);
                if (want > n_ctx) {
                    p.notes.push_back({fmt::format("-c auto: {} tokens, to hold the prompt "
                                                   "cache's {}",
                                                   want, req.min_ctx),
                                       true});
                    n_ctx = static_cast<int>(want);
                }
            }
        } else {
            n_ctx = parse_ctx(req.ctx, 2, "of tokens ");
            if (hp.sliding_window == 0 || n_ctx < hp.sliding_window)
                check_prompt_fits(req.n_prompt, n_ctx);
        }
        // Never plan a cache that cannot fit: shrink -c auto, refuse a fixed -c.
        const MemoryPlan plan = plan_with_types(lm, req, n_ctx, types, p.notes);
        if (!plan.fits()) {
            const int64_t fit = plan.max_ctx_that_fits;
            if (!p.automatic || fit <= req.n_prompt)
                fail(Exit::out_of_memory, "{}{}", memory_advice(plan, hp, req.n_prompt),
                     auto_advice(lm, req, n_ctx));
            const int64_t rounded = fit / 256 * 256;
            n_ctx = static_cast<int>(rounded > req.n_prompt ? rounded : fit);
            p.notes.push_back(
                {fmt::format("-c auto reduced to {} tokens to fit in available memory ({})", n_ctx,
                             human_bytes(plan.mem_available))});
        }
        keep = std::min(req.keep, n_ctx - 1);
        if (hp.sliding_window > 0 && n_ctx >= hp.sliding_window) {
            // The model attends to the last `sliding_window` tokens only: that is
            // exactly a ring of that many slots with no sinks, and any prompt length fits.
            n_ctx = static_cast<int>(hp.sliding_window);
            keep = 0;
            p.notes.push_back(
                {fmt::format(
                     "model declares a sliding window of {} tokens: cache = window, no sinks",
                     n_ctx),
                 true});
        }
        break;
    }
    case Use::chat: {
        // A conversation grows: take the model's context, up to 4096 tokens.
        n_ctx = p.automatic ? static_cast<int>(std::min<int64_t>(
                                  hp.n_ctx_train > 0 ? hp.n_ctx_train : 4096, 4096))
                            : parse_ctx(req.ctx, 16, "of tokens ");
        // The session never slides, so it must not attend past a declared window.
        if (hp.sliding_window > 0 && n_ctx > hp.sliding_window)
            n_ctx = static_cast<int>(hp.sliding_window);
        const MemoryPlan plan = plan_with_types(lm, req, n_ctx, types, p.notes);
        if (!plan.fits()) {
            if (!p.automatic || plan.max_ctx_that_fits < 256)
                fail(Exit::out_of_memory, "{}{}", memory_advice(plan, hp, 0),
                     auto_advice(lm, req, n_ctx));
            n_ctx = static_cast<int>(plan.max_ctx_that_fits / 256 * 256);
            p.notes.push_back(
                {fmt::format("-c auto reduced to {} tokens to fit in available memory", n_ctx)});
        }
        keep = 0; // the chat session never wraps the ring: the pinned system prompt needs no sinks
        break;
    }
    case Use::logits:
        if (p.automatic) {
            if (req.n_prompt > hp.n_ctx_train)
                fail(Exit::context_overflow, "{} tokens exceed the model's context of {}",
                     req.n_prompt, hp.n_ctx_train);
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
            fail(Exit::context_overflow, "-c {} exceeds the model's context of {}", n_ctx,
                 hp.n_ctx_train);
        keep = 0;
        break;
    case Use::bench:
        n_ctx = static_cast<int>(req.n_prompt + 1);
        keep = 4;
        break;
    }
    p.cache = KvCacheConfig::for_model(hp, n_ctx, keep, types.k, types.v, types.k_rotate);
    p.batch = std::min(req.batch, n_ctx);
    return p;
}

} // namespace kvrun
