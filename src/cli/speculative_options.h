// The speculative decoding flags of run, chat and bench (--draft-model,
// --lookup, --draft-max, --draft-min, --draft-p-min) and what they build.
#pragma once

#include <memory>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cli/common.h"
#include "draft_model.h"
#include "speculative.h"

namespace kvrun::cli {

struct SpeculativeOptions {
    std::string draft_model; // --draft-model (-md, --model-draft)
    int lookup = 0;          // --lookup N: draft up to N tokens from n-gram matches
    int draft_max = 8, draft_min = 1;
    float draft_p_min = 0.5f;
    bool any() const { return !draft_model.empty() || lookup > 0; }
};

void add_speculative_options(CLI::App& app, SpeculativeOptions& o);

// What a run drafts with: the draft model (when there is one) and the
// Speculator over it; empty without --draft-model or --lookup.
struct Speculation {
    std::unique_ptr<LoadedModel> draft;
    std::unique_ptr<gl::Backend> draft_cpu; // when the target has no CPU backend to share
    ModelDrafter* model_drafter = nullptr;  // owned by `spec`
    std::unique_ptr<Speculator> spec;
    Speculator* get() const { return spec.get(); }
    // After the prompt: the draft model evaluates it too.
    void prepare(std::span<const int32_t> tokens);
};

// Throws Error(usage) for a draft that does not share the target's
// vocabulary, for --lookup with --draft-model, and for out-of-range lengths.
// The draft model runs on the CPU, with the target's cache shape (context,
// keep, cache types).
Speculation make_speculation(const SpeculativeOptions& o, const LoadedModel& target,
                             const KvCacheConfig& cache, const Backends& backends, int threads,
                             bool deterministic, int max_batch, const SamplerParams& sampling);

// " | lookup: 120/200 drafts accepted (60%) in 45 rounds" for the stats lines.
std::string speculation_summary(const Speculator& s);
nlohmann::json speculation_json(const Speculator& s);

} // namespace kvrun::cli
