#include "cli/speculative_options.h"

#include "error.h"
#include "forward.h"

namespace kvrun::cli {

void add_speculative_options(CLI::App& app, SpeculativeOptions& o) {
    const int most = Forward::kMaxVerify - 1;
    app.add_option(
        "--draft-model", o.draft_model,
        "speculative decoding: a smaller model with the same vocabulary drafts tokens, the model "
        "verifies them in one batch (same answer; -md and --model-draft too)");
    app.add_option("--lookup", o.lookup,
                   "speculative decoding without a second model: draft up to N tokens that "
                   "followed the latest "
                   "match of the last few tokens in the prompt and the answer so far (same answer)")
        ->check(int_in(0, most));
    app.add_option("--draft-max", o.draft_max, "--draft-model: tokens drafted per round at most")
        ->capture_default_str()
        ->check(int_in(1, most));
    app.add_option("--draft-min", o.draft_min, "fewer drafted than this: a plain step instead")
        ->capture_default_str()
        ->check(int_in(1, most));
    app.add_option(
           "--draft-p-min", o.draft_p_min,
           "--draft-model: stop drafting when the draft's most likely token is less likely than P")
        ->capture_default_str()
        ->check(real_in(0.0, 1.0));
}

void Speculation::prepare(std::span<const int32_t> tokens) {
    if (model_drafter) model_drafter->prepare(tokens);
}

Speculation make_speculation(const SpeculativeOptions& o, const LoadedModel& target,
                             const KvCacheConfig& cache, const Backends& backends, int threads,
                             bool deterministic, int max_batch, const SamplerParams& sampling) {
    Speculation s;
    if (!o.any()) return s;
    if (!o.draft_model.empty() && o.lookup > 0)
        fail(Exit::usage, "--lookup and --draft-model are two ways to draft: give one");
    SpeculativeParams sp;
    sp.draft_max = o.lookup > 0 ? o.lookup : o.draft_max;
    sp.draft_min = o.draft_min;
    if (sp.draft_min > sp.draft_max)
        fail(Exit::usage, "--draft-min {} is more than the {} tokens a round drafts at most",
             sp.draft_min, sp.draft_max);
    if (o.lookup > 0) {
        s.spec = std::make_unique<Speculator>(std::make_unique<LookupDrafter>(NgramLookup{}), sp);
        return s;
    }
    s.draft = LoadedModel::load(o.draft_model);
    check_same_vocabulary(target, *s.draft);
    // A round reads the draft once per drafted token and the model once: a
    // draft that reads nearly as many bytes as the model loses every round
    // (the newcomer measured 2.6x slower with a same-size draft). Say so.
    const auto weight_bytes = [](const LoadedModel& m) {
        return m.file.file_size() - m.file.data_offset();
    };
    const uint64_t tb = weight_bytes(target), db = weight_bytes(*s.draft);
    const double ratio = static_cast<double>(db) / static_cast<double>(tb);
    if (db > tb)
        // Larger than the model (the two -m swapped?): a percentage over 100
        // reads oddly; how many times the model's reads each draft costs.
        fmt::print(stderr,
                   "kvrun: warning: the draft model reads {} per token, {:.1f} times the model's "
                   "{}: every drafted token costs more than the model's own step (swap -m and "
                   "-md, use a draft several times smaller, or --lookup)\n",
                   human_bytes(db), ratio, human_bytes(tb));
    else if (db * 2 > tb)
        fmt::print(stderr,
                   "kvrun: warning: the draft model reads {} per token, {:.0f}% of the model's "
                   "{}: drafts cost about as much as they save (use a draft several times "
                   "smaller, or --lookup)\n",
                   human_bytes(db), 100.0 * ratio, human_bytes(tb));
    const Hparams& dh = s.draft->model.hp;
    const KvCacheConfig dc =
        KvCacheConfig::for_model(dh, cache.n_ctx, cache.keep, cache.type_k, cache.type_v);
    gl::Backend* cpu = backends.cpu.get();
    if (!cpu) {
        s.draft_cpu = gl::make_cpu_backend(threads, deterministic);
        cpu = s.draft_cpu.get();
    }
    const std::string name = o.draft_model.substr(o.draft_model.find_last_of('/') + 1);
    auto drafter = std::make_unique<ModelDrafter>(*s.draft, dc, Placement::all(*cpu, dh.n_layer),
                                                  max_batch, sampling, o.draft_p_min, name);
    s.model_drafter = drafter.get();
    s.spec = std::make_unique<Speculator>(std::move(drafter), sp);
    return s;
}

std::string speculation_summary(const Speculator& s) {
    const SpeculativeStats& st = s.stats();
    return fmt::format(" | {}: {}/{} drafts accepted ({:.0f}%) in {} rounds", s.drafter().name(),
                       st.accepted, st.drafted, 100 * st.acceptance(), st.rounds);
}

nlohmann::json speculation_json(const Speculator& s) {
    const SpeculativeStats& st = s.stats();
    return {{"drafter", s.drafter().name()}, {"rounds", st.rounds},
            {"drafted", st.drafted},         {"accepted", st.accepted},
            {"acceptance", st.acceptance()}, {"draft_model_s", st.draft_s}};
}

} // namespace kvrun::cli
