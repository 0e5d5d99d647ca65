// `kvrun -m M -p PROMPT`: stream a continuation to stdout; stats to stderr.
// Behaves in pipelines: stdin is read when asked (-f -) or when it is the only
// prompt (no -p or -f, not a terminal), so a `while read` loop keeps its
// input and an idle pipe is never waited on; stdout carries only the answer
// (or one --json object), a write error on it is an error, a closed pipe ends
// it quietly (SIGPIPE), and progress shows only on a terminal.
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <iterator>
#include <optional>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "chat_session.h"
#include "chat_template.h"
#include "cli/common.h"
#include "cli/speculative_options.h"
#include "error.h"
#include "file_io.h"
#include "forward.h"
#include "memory_plan.h"
#include "prompt_cache.h"
#include "sampler.h"
#include "cli/grammar_options.h"
#include "loader.h"
#include "context.h"
#include "session.h"
#include "system_memory.h"
#include "unicode.h"
#include "stop_sequences.h"

namespace kvrun::cli {

namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
}

struct RunOptions {
    CommonOptions common;
    std::string prompt, prompt_file, ctx = "auto", prompt_cache;
    int64_t n_predict = -1;
    int keep = 4;
    int batch = 512;
    bool ignore_eos = false, quiet = false, echo = false, no_kv_cache = false, escape = false;
    SamplerParams sampling;
    GrammarOptions grammar;
    SpeculativeOptions speculative;
    bool json = false, chat = false;
    std::vector<std::string> stop;
    std::string system, system_file, chat_template;
};

// Print on stdout now: a pipe reader sees each token as it is sampled. A
// failed write stops the generation (stdout_failed) and main reports it.
void emit(const std::string& s) {
    write_stdout(s);
}

std::string cache_types(const KvCacheConfig& c) {
    return cache_types_text(c.type_k, c.type_v, c.k_rotate);
}

// What a run did, for the stats line or the --json object.
struct RunFigures {
    int64_t n_prompt = 0, reused = 0;
    int64_t reached =
        0; // prompt tokens in the cache when generation began (< n_prompt: interrupted)
    int64_t n_gen = 0;
    bool prompt_done = false;                  // the prompt was evaluated (not interrupted)
    double prompt_s = 0, gen_s = 0, ttft = -1; // seconds; ttft -1 when nothing was sampled
    uint64_t seed = 0;
    std::string stop, matched; // stop reason; the stop string, if one ended it
};

// GPU memory as the run left it: weights copied, the KV mirror (the hot
// part with --kv-gpu-window; the host ring holds every slot), buffers.
gl::MemoryUse gpu_use(const Backends& be) {
    return be.gpu ? be.gpu->memory_use() : gl::MemoryUse{};
}

// Tokens per second, or nothing (JSON null, left out of the text) when the
// figure would mean nothing: no tokens, or no time measured.
std::optional<double> rate(int64_t tokens, double seconds) {
    if (tokens <= 0 || seconds <= 0) return std::nullopt;
    return tokens / seconds;
}
nlohmann::json or_null(std::optional<double> v) {
    return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
}

nlohmann::json result_json(const RunFigures& f, const std::string& text, const Session& s,
                           const ContextPlan& plan, const Backends& backends,
                           const Speculator* spec, const std::string* echoed) {
    const KvCache& kv = s.cache();
    const int n_ctx = kv.n_ctx();
    const int64_t used = std::min<int64_t>(kv.n_past(), n_ctx);
    nlohmann::json j;
    if (echoed) j["prompt"] = *echoed; // --echo: inside the object, so stdout stays one JSON value
    j["text"] = text;
    j["stop"] = f.stop;
    j["stop_string"] = f.matched.empty() ? nlohmann::json(nullptr) : nlohmann::json(f.matched);
    j["tokens"] = {{"prompt", f.n_prompt},
                   {"generated", f.n_gen},
                   {"reused", f.reused},
                   {"evaluated", f.reached - f.reused},
                   {"forward", s.forward_tokens()}};
    j["seed"] = f.seed;
    j["timings"] = {
        {"prompt_s", f.prompt_s},
        {"generation_s", f.gen_s},
        {"prompt_tok_s", // of the evaluated tokens: reused ones cost nothing
         or_null(f.prompt_done ? rate(f.n_prompt - f.reused, f.prompt_s) : std::nullopt)},
        {"generation_tok_s", or_null(rate(f.n_gen, f.gen_s))},
        {"first_token_ms", f.ttft >= 0 ? nlohmann::json(f.ttft * 1000) : nlohmann::json(nullptr)}};
    j["cache"] = {{"n_ctx", n_ctx},
                  {"auto", plan.automatic},
                  {"keep", kv.keep()},
                  {"type_k", gl::type_name(kv.config().type_k)},
                  {"type_v", gl::type_name(kv.config().type_v)},
                  {"k_rotate", kv.config().k_rotate},
                  {"bytes", kv.ring_bytes()},
                  {"used", used},
                  {"fill", static_cast<double>(used) / n_ctx},
                  {"prompt_cache_reused", f.reused}};
    if (spec)
        j["speculative"] = speculation_json(*spec); // absent without --lookup or --draft-model
    const gl::MemoryUse gpu = gpu_use(backends);
    if (gpu.device) // absent on the CPU
        j["gpu"] = {{"layers", backends.n_gpu_layers},
                    {"n_layer", backends.n_layer},
                    {"kv_window", backends.kv_gpu_window},
                    {"weights_bytes", gpu.weights},
                    {"weights_mapped_bytes", gpu.weights_mapped},
                    {"kv_bytes", gpu.kv},
                    {"kv_host_bytes", kv.ring_bytes()},
                    {"scratch_bytes", gpu.scratch},
                    {"free_bytes", gpu.free},
                    {"total_bytes", gpu.total}};
    return j;
}

std::string stats_line(const RunFigures& f, const Session& s, const ContextPlan& plan,
                       const Backends& backends, const Speculator* spec) {
    const KvCache& kv = s.cache();
    const gl::MemoryUse gpu = gpu_use(backends);
    const std::optional<double> prompt_rate =
        f.prompt_done ? rate(f.n_prompt - f.reused, f.prompt_s) : std::nullopt;
    const std::optional<double> gen_rate = rate(f.n_gen, f.gen_s);
    // "prompt 1077 tok (1076 reused, 1 evaluated), ..." ; "prompt 1024/5099 tok (interrupted)"
    std::string prompt = f.reached < f.n_prompt
                             ? fmt::format("{}/{} tok (interrupted)", f.reached, f.n_prompt)
                             : fmt::format("{} tok", f.n_prompt);
    if (f.reused > 0)
        prompt += fmt::format(" ({} reused, {} evaluated)", f.reused, f.reached - f.reused);
    return fmt::format("[kvrun] prompt {}{} | generated {} tok{}{}{} | "
                       "n_ctx {}{} | KV {} ({}){} | peak RSS {} | stop: {}",
                       prompt, prompt_rate ? fmt::format(", {:.1f} tok/s", *prompt_rate) : "",
                       f.n_gen, gen_rate ? fmt::format(", {:.1f} tok/s", *gen_rate) : "",
                       spec ? speculation_summary(*spec) : "",
                       f.ttft >= 0 ? fmt::format(" | first token {:.0f} ms", f.ttft * 1000) : "",
                       kv.n_ctx(), plan.automatic ? " (auto)" : "", human_bytes(kv.ring_bytes()),
                       cache_types(kv.config()),
                       !gpu.device ? std::string()
                                   : " | " + gpu_memory_summary(gpu, backends.n_gpu_layers,
                                                                backends.n_layer, kv.ring_bytes()),
                       human_bytes(peak_rss_bytes()), f.stop);
}
} // namespace

int run_generate(int argc, char** argv) {
    // `kvrun -m M -i ...` is `kvrun chat -m M ...` (and so are llama-cli's
    // conversation-mode flags).
    for (int i = 1; i < argc; i++)
        if (!std::strcmp(argv[i], "-i") || !std::strcmp(argv[i], "--interactive") ||
            !std::strcmp(argv[i], "--interactive-first") || !std::strcmp(argv[i], "-cnv") ||
            !std::strcmp(argv[i], "--conversation")) {
            std::vector<char*> rest(argv, argv + argc);
            rest.erase(rest.begin() + i);
            return run_chat(static_cast<int>(rest.size()), rest.data());
        }
    RunOptions o;
    CLI::App app{"kvrun: run a GGUF language model and stream its continuation to stdout", "kvrun"};
    app.footer(
        "Subcommands (kvrun SUBCOMMAND --help): chat, tokenize, logits, info, perplexity, bench, "
        "quantize, synth;\n"
        "run is this one, by name (kvrun run -m M -p ... = kvrun -m M -p ...).\n"
        "-i (--interactive, -cnv) starts the chat REPL (kvrun chat). stdin is read with -f -, or "
        "as the "
        "whole\n"
        "prompt when neither -p nor -f is given and it is not a terminal.\n"
        "-n -1 (the default) stops when the context is full; -n N slides the window past it.\n"
        "Exit status: 0 ok, 1 other error, 2 bad usage, 3 bad or unsupported model,\n"
        "4 prompt longer than the context, 5 out of memory, 6 chat template error, 130 "
        "interrupted.");
    add_model_option(app, o.common);
    add_runtime_options(app, o.common, true);
    auto* p_opt = app.add_option("-p,--prompt", o.prompt, "prompt text");
    app.add_option("-f,--file", o.prompt_file,
                   "read the prompt from FILE (- for stdin); appended after -p");
    app.add_flag("-e,--escape", o.escape,
                 "process \\n \\t \\\\ \\\" \\' in -p, --system and --stop");
    app.add_option("-n,--n-predict", o.n_predict,
                   "tokens to generate (-1 = until end of text or a full context; N may slide the "
                   "window past -c)")
        ->check(int_in(-1, int64_t{1} << 40));
    app.add_option("-c,--ctx-size", o.ctx,
                   "context size in tokens, or auto (sized from the prompt and -n)")
        ->capture_default_str();
    app.add_option("--keep", o.keep,
                   "tokens kept at the start when the window slides (attention sinks)")
        ->capture_default_str()
        ->check(int_in(0, 1 << 20));
    app.add_option("-b,--batch-size", o.batch, "prompt tokens evaluated per batch")
        ->capture_default_str()
        ->check(int_in(1, 1 << 16));
    add_sampling_options(app, o.sampling);
    add_grammar_options(app, o.grammar);
    add_speculative_options(app, o.speculative);
    app.add_option(
        "--prompt-cache", o.prompt_cache,
        "save the evaluated prompt's K/V to FILE; reuse its common prefix with a later prompt");
    app.add_flag("--no-kv-cache", o.no_kv_cache,
                 "recompute the whole sequence for every new token (the textbook O(n^2) decoder; "
                 "for teaching and "
                 "for measuring what the cache buys)");
    app.add_flag("--ignore-eos", o.ignore_eos, "keep generating past the end-of-text token");
    app.add_flag("--quiet", o.quiet, "no stats on stderr");
    app.add_flag("--echo", o.echo, "print the prompt before the continuation");
    app.add_flag("--json", o.json,
                 "print one JSON object at the end (text, tokens, stop reason, timings, cache) "
                 "instead of streaming");
    app.add_option("--stop", o.stop, "stop when the model writes STRING (repeatable; not printed)");
    app.add_flag("--chat", o.chat, "apply the model's chat template to the -p message (one turn)");
    app.add_option("--system", o.system, "--chat: system prompt");
    app.add_option("--system-file", o.system_file, "--chat: read the system prompt from FILE");
    app.add_option("--chat-template", o.chat_template,
                   std::string("--chat: template family instead of the model's (") +
                       ChatTemplate::names() + ")");
    if (const auto done = parse_command_line(app, argc, argv)) return *done;
    const bool piped = o.prompt_file.empty() && !*p_opt && stdin_has_data();
    if (o.prompt_file.empty() && !*p_opt && !piped)
        fail(Exit::usage, "give a prompt with -p TEXT, -f FILE or on stdin (a pipe)");
    check_text_options(app, o.escape, o.prompt, o.system, o.stop);
    if (o.no_kv_cache && !o.prompt_cache.empty())
        fail(Exit::usage, "--no-kv-cache and --prompt-cache exclude each other");
    if (o.no_kv_cache && o.speculative.any())
        fail(Exit::usage, "--no-kv-cache recomputes every token: it does not verify drafts "
                          "(--lookup, --draft-model)");
    if (o.grammar.given() && o.speculative.any())
        fail(Exit::usage, "--grammar does not go with speculative decoding (--lookup, "
                          "--draft-model) yet");
    o.grammar.compile();
    ContextRequest types; // the cache's fields, checked before the model loads
    set_cache_types(o.common, types, true);

    if (!o.system_file.empty())
        o.system = read_regular_file(o.system_file, "system prompt file", Exit::usage);
    check_utf8(o.system, "the system prompt");
    if (!o.chat && (!o.system.empty() || !o.chat_template.empty()))
        fail(Exit::usage, "--system and --chat-template need --chat (or kvrun chat)");
    std::string prompt =
        read_prompt(o.prompt, piped ? std::string("-") : o.prompt_file, static_cast<bool>(*p_opt));
    // A chat message typed into a pipe or a file ends in the newline that
    // ended its line; the message is the line.
    if (o.chat && !prompt.empty() && prompt.back() == '\n') {
        prompt.pop_back();
        if (!prompt.empty() && prompt.back() == '\r') prompt.pop_back();
    }
    if (o.chat && prompt.find_first_not_of(" \t\r\n") == std::string::npos)
        fail(Exit::usage, "nothing to answer: the chat message is empty");
    const StopPoint stop_point; // its loops poll interrupted()
    const auto t_load = Clock::now();
    auto lm = LoadedModel::load(o.common.model, layers_home(o.common), !o.common.precise);
    const Hparams& hp = lm->model.hp;
    const Tokenizer& tok = lm->tokenizer;
    std::vector<int32_t> tokens;
    ReplyEnd reply_stop;
    std::string model_reads = prompt; // the text --echo prints: with --chat, the rendered template
    if (o.chat) {
        const ChatTemplate tmpl = ChatTemplate::for_model(lm->file, tok, o.chat_template);
        const std::string sys = o.system.empty() ? tmpl.default_system() : o.system;
        const ChatText text =
            tmpl.prefix_text(sys) + tmpl.user_text(prompt, true, sys) + tmpl.generation_prompt();
        model_reads = text.text;
        tokens = chat_tokens(tok, text, true);
        reply_stop = reply_end(tmpl, tok);
        if (o.common.verbose)
            fmt::print(stderr, "kvrun: chat template {} ({})\n", tmpl.name(),
                       !o.chat_template.empty() ? "--chat-template"
                       : tmpl.inferred()        ? "the model has none: inferred from its vocabulary"
                       : tmpl.family() == ChatFamily::plain ? "the model has none: plain fallback"
                                                            : "from the model");
    } else {
        tokens = tok.encode(prompt, true, true);
    }
    if (tokens.empty())
        fail(Exit::usage,
             "the prompt is empty and the model adds no BOS token: nothing to continue");

    const int threads = resolve_threads(o.common.threads);
    const int64_t n_prompt = static_cast<int64_t>(tokens.size());
    ContextRequest req = types;
    req.use = ContextRequest::Use::generate;
    req.ctx = o.ctx;
    req.n_prompt = n_prompt;
    req.n_predict = o.n_predict;
    if (!o.prompt_cache.empty()) req.min_ctx = prompt_cache_tokens(o.prompt_cache);
    req.keep = o.keep;
    req.batch = o.batch;
    req.threads = threads;
    const ContextPlan plan = plan_and_tell(*lm, req, o.common.verbose);
    const KvCacheConfig& kc = plan.cache;
    const int n_ctx = kc.n_ctx;
    const bool ctx_auto = plan.automatic;
    if (app.count("--keep") && o.keep >= n_ctx)
        fail(Exit::usage,
             "--keep {} must be less than the context of {} tokens (-c): nothing would be left to "
             "slide",
             o.keep, n_ctx);
    if (app.count("--keep") && kc.keep > n_ctx / 2)
        fmt::print(stderr,
                   "kvrun: warning: --keep {} pins more than half of the {}-token context: once "
                   "the window "
                   "slides, only {} recent tokens are seen\n",
                   kc.keep, n_ctx, n_ctx - kc.keep);
    const GpuFitInput fit{lm->file, kc, plan.batch};
    const Backends backends = make_backends(o.common, threads, hp, &fit);
    Session session(*lm, kc, backends.placement(), plan.batch);
    KvCache& kv = session.cache();
    o.sampling.grammar = o.grammar.bind(
        tok, reply_stop.ids,
        tokens.size() == 1 && tokens[0] == tok.bos() && tok.vocab().add_space_prefix);
    Sampler sampler(o.sampling, hp.n_vocab);
    Speculation speculation = make_speculation(o.speculative, *lm, kc, backends, threads,
                                               o.common.deterministic, plan.batch, o.sampling);
    if (o.common.verbose) {
        fmt::print(stderr,
                   "kvrun: {} ({} layers, width {}, {}/{} heads of {}, vocab {}), backend {}, {} "
                   "threads\n",
                   hp.arch, hp.n_layer, hp.n_embd, hp.n_head, hp.n_head_kv, hp.head_dim, hp.n_vocab,
                   backends.describe(), threads);
        fmt::print(stderr,
                   "kvrun: n_ctx {} ({}), keep {}, KV cache {} ({} per token, {}), seed {}\n",
                   n_ctx, ctx_auto ? "auto" : "fixed", kc.keep, human_bytes(kv.ring_bytes()),
                   human_bytes(KvCache::bytes_per_token(kv.config())), cache_types(kv.config()),
                   o.sampling.seed);
        if (kv.state_bytes() > 0)
            fmt::print(stderr, "kvrun: recurrent layers' state {} (fixed, whatever n_ctx)\n",
                       human_bytes(kv.state_bytes()));
        if (hp.n_mtp_layers > 0)
            fmt::print(stderr,
                       "kvrun: the file's {} multi-token-prediction layer{} not run\n",
                       hp.n_mtp_layers, hp.n_mtp_layers == 1 ? " is" : "s are");
        fmt::print(stderr, "kvrun: weights {} ({}), prompt {} token{}, loaded in {:.2f} s\n",
                   human_bytes(lm->file.file_size() - lm->file.data_offset()),
                   lm->file.data_moved() ? "moved onto huge pages" : "in the file mapping",
                   tokens.size(), tokens.size() == 1 ? "" : "s", seconds_since(t_load));
        if (speculation.get())
            fmt::print(
                stderr, "kvrun: speculative decoding: {}{}\n", speculation.get()->drafter().name(),
                speculation.draft
                    ? fmt::format(" on {}, its KV cache {}",
                                  speculation.draft_cpu ? speculation.draft_cpu->name()
                                                        : backends.cpu->name(),
                                  human_bytes(KvCache::ring_bytes_for(KvCacheConfig::for_model(
                                      speculation.draft->model.hp, kc.n_ctx, kc.keep, kc.type_k,
                                      kc.type_v))))
                    : "");
    }

    if (o.echo && !o.json) emit(model_reads);
    for (int32_t t : tokens) sampler.accept(t);

    // Prompt, in batches, after whatever prefix a prompt-cache file supplies.
    const auto t_prompt = Clock::now();
    int64_t reused = 0, cache_held = 0;
    std::string cache_unusable; // why the file's tokens could not be used (another mode...)
    uint64_t digest = 0;
    if (!o.prompt_cache.empty()) {
        digest = session.model_digest();
        const PromptCacheLoad pc = session.load_prompt_cache(o.prompt_cache, digest, tokens);
        cache_held = pc.held;
        if (!pc.ok) cache_unusable = pc.why;
        if (pc.ok) {
            reused = pc.reused;
            fmt::print(stderr, "kvrun: prompt cache: reused {} of {} prompt tokens from {}\n",
                       reused, tokens.size(), o.prompt_cache);
        } else {
            fmt::print(stderr,
                       "kvrun: prompt cache {} not used ({}): evaluating the whole prompt\n",
                       o.prompt_cache, pc.why);
        }
    }
    const int64_t to_eval = n_prompt - reused;
    EvalHooks prompt_hooks;
    prompt_hooks.should_stop = interrupted;
    if (to_eval > session.forward().max_batch())
        prompt_hooks.on_progress = [](int64_t done, int64_t total) { show_progress(done, total); };
    const bool prompt_done =
        session.eval(std::span<const int32_t>(tokens).subspan(static_cast<size_t>(reused)),
                     prompt_hooks) &&
        to_eval > 0;
    clear_progress();
    const double prompt_s = seconds_since(t_prompt);
    // How far the prompt got (all of it, unless Ctrl-C stopped it).
    const int64_t prompt_reached = std::min<int64_t>(session.tokens().size(), n_prompt);
    // The cache is an optimisation: a file that cannot (or may not) be
    // written costs a warning, never the answer.
    if (!o.prompt_cache.empty() && !interrupted() &&
        reused < static_cast<int64_t>(tokens.size()) - 1) {
        try {
            session.save_prompt_cache(o.prompt_cache, digest);
            // A file with more than this run kept of it is replaced: say so,
            // since a later run of the longer prompt will reuse less.
            if (cache_held > 0 && !cache_unusable.empty())
                // Not a shorter prefix: tokens this run could not use at all.
                fmt::print(
                    stderr,
                    "kvrun: prompt cache {} replaced: its {} tokens could not be used ({}); it "
                    "now holds "
                    "this prompt's {}\n",
                    o.prompt_cache, cache_held, cache_unusable, tokens.size());
            else if (cache_held > reused)
                fmt::print(stderr,
                           "kvrun: prompt cache {} replaced: it held {} tokens, of which this "
                           "prompt shares {}; it now holds this prompt's {}\n",
                           o.prompt_cache, cache_held, reused, tokens.size());
        } catch (const Error& e) {
            fmt::print(stderr, "kvrun: prompt cache not saved: {}\n", e.what());
        }
    }

    // Generation.
    GenerateParams gp;
    gp.n_predict = o.n_predict;
    gp.ignore_eos = o.ignore_eos;
    gp.end_ids = reply_stop.ids;
    gp.stop = o.stop;
    gp.stop.insert(gp.stop.end(), reply_stop.strings.begin(), reply_stop.strings.end());
    gp.strip_leading_space =
        tokens.size() == 1 && tokens[0] == tok.bos() && tok.vocab().add_space_prefix;
    gp.no_kv_cache = o.no_kv_cache;
    gp.speculate = speculation.get();
    std::string answer; // --json: the whole text, printed at the end
    bool reply_started = false;
    char last_char = '\n'; // of the text printed, for the stats line's placement
    GenerateHooks gh;
    // Text goes through the stop matcher, then to stdout (or the JSON text).
    gh.on_text = [&](std::string text) {
        // A chat reply begins after "Assistant:" or [/INST]: drop the space the model writes there.
        if (o.chat && !reply_started)
            text.erase(0, std::min(text.size(), text.find_first_not_of(" \t\n")));
        if (text.empty()) return;
        reply_started = true;
        if (o.json)
            answer += text;
        else
            emit(text);
        last_char = text.back();
    };
    gh.should_stop = [] { return interrupted() || stdout_failed(); };
    // -n -1 asks for the whole answer: it ends at a full context rather than
    // sliding on forever (a model that never writes EOS). -n N slides.
    constexpr const char* kContextFull = "context full";
    if (o.n_predict < 0) gh.on_full = [&] { return kContextFull; };
    const auto t_gen = Clock::now();
    GenerateResult gen;
    if (prompt_done) {
        speculation.prepare(
            session.tokens()); // the draft model reads the prompt too (timed as generation)
        gen = session.generate(gp, sampler, gh);
    }
    const double ttft =
        gen.sampled_any ? std::chrono::duration<double>(gen.first_token - t_prompt).count() : -1;
    const double gen_s = seconds_since(t_gen);
    std::string stop = gen.stop;
    if (interrupted()) stop = "interrupted";

    if (stdout_failed()) return static_cast<int>(Exit::error); // main says why

    const RunFigures f{n_prompt, reused, prompt_reached,  gen.generated, prompt_done, prompt_s,
                       gen_s,    ttft,   o.sampling.seed, stop,          gen.matched};
    if (o.json)
        emit(result_json(f, answer, session, plan, backends, speculation.get(),
                         o.echo ? &model_reads : nullptr)
                 .dump() +
             "\n");
    // On a terminal the stats line starts on a line of its own; in a pipe or
    // a file the answer stays exactly what the model wrote.
    const bool same_terminal = ::isatty(1) && ::isatty(2);
    if (!o.json && !o.quiet)
        fmt::print(stderr, "{}{}\n", same_terminal && last_char != '\n' ? "\n" : "",
                   stats_line(f, session, plan, backends, speculation.get()));
    if (stop == kContextFull && !o.quiet)
        fmt::print(
            stderr,
            "kvrun: stopped at a full context ({} tokens, -c); -n N keeps generating past it by "
            "sliding the window\n",
            n_ctx);
    if (interrupted()) return interrupted_status();
    return check_grammar_complete(sampler, stop);
}

} // namespace kvrun::cli
