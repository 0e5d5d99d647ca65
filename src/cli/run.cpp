// `kvrun -m M -p PROMPT`: stream a continuation to stdout; stats to stderr.
#include <chrono>
#include <cstdio>
#include <random>

#include "cli/common.h"
#include "error.h"
#include "forward.h"
#include "memory_plan.h"
#include "prompt_cache.h"
#include "sampler.h"
#include "session.h"

namespace kvrun::cli {

namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

struct RunOptions {
    CommonOptions common;
    std::string prompt, prompt_file, ctx = "auto", prompt_cache;
    int64_t n_predict = -1;
    int keep = 4;
    int batch = 512;
    bool ignore_eos = false, quiet = false, echo = false, no_kv_cache = false;
    SamplerParams sampling;
    bool seed_given = false;
};

// Print on stdout now: a pipe reader sees each token as it is sampled.
void emit(const std::string& s) {
    if (s.empty()) return;
    std::fwrite(s.data(), 1, s.size(), stdout);
    std::fflush(stdout);
}
} // namespace

int run_generate(int argc, char** argv) {
    RunOptions o;
    CLI::App app{"kvrun: run a GGUF language model and stream its continuation to stdout", "kvrun"};
    app.footer(
        "Subcommands (kvrun SUBCOMMAND --help): tokenize, logits, info, perplexity, synth, quantize.\n"
        "Exit status: 0 ok, 1 other error, 2 bad usage, 3 bad or unsupported model,\n"
        "4 prompt longer than the context, 5 out of memory, 6 chat template error, 130 interrupted.");
    add_model_option(app, o.common);
    add_runtime_options(app, o.common);
    auto* p_opt = app.add_option("-p,--prompt", o.prompt, "prompt text");
    app.add_option("-f,--file", o.prompt_file, "read the prompt from FILE (- for stdin); appended after -p");
    app.add_option("-n,--n-predict", o.n_predict, "tokens to generate (-1 = until end of text)")->check(CLI::Range(int64_t{-1}, int64_t{1} << 40));
    app.add_option("-c,--ctx-size", o.ctx, "context size in tokens, or auto (sized from the prompt and -n)")->capture_default_str();
    app.add_option("--keep", o.keep, "tokens kept at the start when the window slides (attention sinks)")->capture_default_str()->check(CLI::Range(0, 1 << 20));
    app.add_option("-b,--batch-size", o.batch, "prompt tokens evaluated per batch")->capture_default_str()->check(CLI::Range(1, 1 << 16));
    app.add_option("--temp", o.sampling.temp, "temperature (0 = greedy)")->capture_default_str()->check(CLI::Range(0.0, 100.0));
    app.add_option("--top-k", o.sampling.top_k, "keep the k most likely tokens (0 = off)")->capture_default_str()->check(CLI::Range(0, 1 << 30));
    app.add_option("--top-p", o.sampling.top_p, "nucleus sampling mass (1 = off)")->capture_default_str()->check(CLI::Range(0.0, 1.0));
    app.add_option("--min-p", o.sampling.min_p, "drop tokens below min-p × the best probability (0 = off)")->capture_default_str()->check(CLI::Range(0.0, 1.0));
    app.add_option("--repeat-penalty", o.sampling.repeat_penalty, "penalty for recently seen tokens (1 = off)")->capture_default_str()->check(CLI::Range(0.0, 100.0));
    app.add_option("--repeat-last-n", o.sampling.repeat_last_n, "how many recent tokens the penalty looks at")->capture_default_str()->check(CLI::Range(0, 1 << 20));
    auto* seed_opt = app.add_option("--seed", o.sampling.seed, "random seed (default: random; printed with -v)");
    app.add_option("--prompt-cache", o.prompt_cache,
                   "save the evaluated prompt's K/V to FILE; reuse its common prefix with a later prompt");
    app.add_flag("--no-kv-cache", o.no_kv_cache,
                 "recompute the whole sequence for every new token (the textbook O(n^2) decoder; for teaching and "
                 "for measuring what the cache buys)");
    app.add_flag("--ignore-eos", o.ignore_eos, "keep generating past the end-of-text token");
    app.add_flag("--quiet", o.quiet, "no stats on stderr");
    app.add_flag("--echo", o.echo, "print the prompt before the continuation");
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        return app.exit(e) == 0 ? 0 : static_cast<int>(Exit::usage);
    }
    if (!*seed_opt) o.sampling.seed = std::random_device{}();
    if (o.prompt_file.empty() && !*p_opt) fail(Exit::usage, "give a prompt with -p TEXT or -f FILE");
    if (o.no_kv_cache && !o.prompt_cache.empty()) fail(Exit::usage, "--no-kv-cache and --prompt-cache exclude each other");
    const gl::Type tk = parse_cache_type(o.common.cache_type_k, "--cache-type-k");
    const gl::Type tv = parse_cache_type(o.common.cache_type_v, "--cache-type-v");

    const std::string prompt = read_prompt(o.prompt, o.prompt_file, static_cast<bool>(*p_opt));
    install_interrupt_handler();
    const auto t_load = Clock::now();
    auto lm = LoadedModel::load(o.common.model);
    const Hparams& hp = lm->model.hp;
    const Tokenizer& tok = lm->tokenizer;
    std::vector<int32_t> tokens = tok.encode(prompt, true, true);
    if (tokens.empty()) fail(Exit::usage, "the prompt is empty and the model adds no BOS token: nothing to continue");

    int n_ctx;
    const bool ctx_auto = o.ctx == "auto";
    if (ctx_auto) {
        n_ctx = auto_context(static_cast<int64_t>(tokens.size()), o.n_predict, hp.n_ctx_train);
    } else {
        char* end = nullptr;
        long v = std::strtol(o.ctx.c_str(), &end, 10);
        if (*end != '\0' || v < 2 || v > (1 << 30)) fail(Exit::usage, "-c {}: expected a number of tokens >= 2, or auto", o.ctx);
        n_ctx = static_cast<int>(v);
        if (hp.sliding_window == 0 || n_ctx < hp.sliding_window)
            check_prompt_fits(static_cast<int64_t>(tokens.size()), n_ctx);
    }
    const int threads = resolve_threads(o.common.threads);
    // Never plan a cache that cannot fit: shrink -c auto, refuse a fixed -c.
    const int64_t n_prompt = static_cast<int64_t>(tokens.size());
    MemoryPlan plan = plan_memory(lm->file, hp, n_ctx, tk, tv, o.batch, threads);
    if (!plan.fits()) {
        const int64_t fit = plan.max_ctx_that_fits;
        if (!ctx_auto || fit <= n_prompt) fail(Exit::out_of_memory, "{}", memory_advice(plan, hp, n_prompt));
        const int64_t rounded = fit / 256 * 256;
        n_ctx = static_cast<int>(rounded > n_prompt ? rounded : fit);
        fmt::print(stderr, "kvrun: -c auto reduced to {} tokens to fit in available memory ({})\n", n_ctx,
                   human_bytes(plan.mem_available));
    }
    int keep = std::min(o.keep, n_ctx - 1);
    if (hp.sliding_window > 0 && n_ctx >= hp.sliding_window) {
        // The model attends to the last `sliding_window` tokens only: that is
        // exactly a ring of that many slots with no sinks, and any prompt length fits.
        n_ctx = static_cast<int>(hp.sliding_window);
        keep = 0;
        if (o.common.verbose)
            fmt::print(stderr, "kvrun: model declares a sliding window of {} tokens: cache = window, no sinks\n", n_ctx);
    }
    KvCacheConfig kc{hp.n_layer, hp.n_head_kv, hp.head_dim, n_ctx, keep, tk, tv};
    KvCache kv(kc);
    auto backend = gl::make_cpu_backend(threads);
    Forward fwd(lm->model, kv, *backend, std::min(o.batch, n_ctx));
    Sampler sampler(o.sampling, hp.n_vocab);
    if (o.common.verbose) {
        fmt::print(stderr, "kvrun: {} ({} layers, width {}, {}/{} heads of {}, vocab {}), backend {}, {} threads\n",
                   hp.arch, hp.n_layer, hp.n_embd, hp.n_head, hp.n_head_kv, hp.head_dim, hp.n_vocab,
                   backend->name(), threads);
        fmt::print(stderr, "kvrun: n_ctx {} ({}), keep {}, KV cache {} ({} per token, {}), seed {}\n", n_ctx,
                   ctx_auto ? "auto" : "fixed", kc.keep, human_bytes(kv.ring_bytes()),
                   human_bytes(kv.ring_bytes() / n_ctx), gl::type_name(tk), o.sampling.seed);
        fmt::print(stderr, "kvrun: prompt {} tokens, loaded in {:.2f} s\n", tokens.size(), seconds_since(t_load));
    }

    if (o.echo) emit(prompt);
    for (int32_t t : tokens) sampler.accept(t);

    // Prompt, in batches, after whatever prefix a prompt-cache file supplies.
    const auto t_prompt = Clock::now();
    int64_t reused = 0;
    uint64_t digest = 0;
    if (!o.prompt_cache.empty()) {
        digest = model_digest(lm->file);
        PromptCacheLoad pc = load_prompt_cache(o.prompt_cache, digest, kv, tokens, lm->model.rope_inv_freq,
                                               hp.n_head_kv, hp.head_dim, hp.rope_dims, hp.rope_neox);
        if (pc.ok) {
            reused = pc.reused;
            fmt::print(stderr, "kvrun: prompt cache: reused {} of {} prompt tokens from {}\n", reused, tokens.size(),
                       o.prompt_cache);
        } else {
            fmt::print(stderr, "kvrun: prompt cache {} not used ({}): evaluating the whole prompt\n",
                       o.prompt_cache, pc.why);
        }
    }
    const float* logits = nullptr;
    for (size_t i = static_cast<size_t>(reused); i < tokens.size() && !interrupted();) {
        const int n = static_cast<int>(std::min<size_t>(fwd.max_batch(), tokens.size() - i));
        logits = fwd.eval(tokens.data() + i, n, false);
        i += n;
    }
    const double prompt_s = seconds_since(t_prompt);
    if (!o.prompt_cache.empty() && !interrupted() && reused < static_cast<int64_t>(tokens.size()) - 1)
        save_prompt_cache(o.prompt_cache, digest, kv, tokens);

    // Generation.
    std::vector<float> row(hp.n_vocab);
    Tokenizer::Decoder dec(tok);
    const bool strip_space = tokens.size() == 1 && tokens[0] == tok.bos() && tok.vocab().add_space_prefix;
    int64_t n_gen = 0;
    double ttft = -1;
    const auto t_gen = Clock::now();
    const char* stop = "length";
    while (logits && !interrupted()) {
        if (o.n_predict >= 0 && n_gen >= o.n_predict) break;
        std::copy(logits, logits + hp.n_vocab, row.begin());
        const int32_t id = sampler.sample(row.data());
        if (ttft < 0) ttft = seconds_since(t_prompt);
        if (tok.is_eog(id) && !o.ignore_eos) {
            stop = "eos";
            break;
        }
        std::string text = dec.push(id);
        if (strip_space && n_gen == 0 && !text.empty() && text[0] == ' ') text.erase(0, 1);
        emit(text);
        n_gen++;
        if (o.no_kv_cache) {
            // Forget everything and evaluate prompt + generated tokens from scratch.
            tokens.push_back(id);
            if (static_cast<int64_t>(tokens.size()) > n_ctx) {
                stop = "context full (--no-kv-cache cannot slide)";
                break;
            }
            kv.clear();
            for (size_t i = 0; i < tokens.size();) {
                const int n = static_cast<int>(std::min<size_t>(fwd.max_batch(), tokens.size() - i));
                logits = fwd.eval(tokens.data() + i, n, false);
                i += n;
            }
            continue;
        }
        logits = fwd.eval(&id, 1, false);
    }
    emit(dec.flush());
    const double gen_s = seconds_since(t_gen);
    if (interrupted()) stop = "interrupted";

    if (!o.quiet) {
        fmt::print(stderr,
                   "\n[kvrun] prompt {} tok, {:.1f} tok/s | generated {} tok, {:.1f} tok/s | first token {:.0f} ms | "
                   "n_ctx {}{} | KV {} ({}) | peak RSS {} | stop: {}\n",
                   n_prompt, prompt_s > 0 ? n_prompt / prompt_s : 0.0, n_gen,
                   gen_s > 0 && n_gen > 0 ? n_gen / gen_s : 0.0, ttft * 1000, n_ctx, ctx_auto ? " (auto)" : "",
                   human_bytes(kv.ring_bytes()), gl::type_name(tk), human_bytes(peak_rss_bytes()), stop);
    }
    return interrupted() ? static_cast<int>(Exit::interrupted) : 0;
}

} // namespace kvrun::cli
