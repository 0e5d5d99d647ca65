// `kvrun batch -m M -f requests.jsonl`: many requests through one model at
// once (src/engine/scheduler.h), one JSON object per line in and out. For
// pipelines: results on stdout (completion order, or input order with
// --ordered), a malformed line an error object of its own while the rest
// goes on, progress and the summary on stderr.
#include <chrono>
#include <cstdio>
#include <map>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "chat_template.h"
#include "cli/common.h"
#include "context.h"
#include "error.h"
#include "file_io.h"
#include "format.h"
#include "loader.h"
#include "memory_plan.h"
#include "requests.h"
#include "scheduler.h"
#include "system_memory.h"

namespace kvrun::cli {

namespace {

using json = nlohmann::json;

struct BatchOptions {
    CommonOptions common;
    std::string file, ctx = "auto", system, chat_template;
    int64_t n_predict = -1;
    int keep = 4, batch = 512, parallel = 0;
    bool ordered = false, lines = false, ignore_eos = false, quiet = false, no_prefix = false;
    SamplerParams sampling;
    std::vector<std::string> stop;
};

const char* finish_reason(const std::string& stop) {
    if (stop == "eos" || stop == "stop string" || stop == "grammar") return "stop";
    if (stop == "length" || stop == "context full") return "length";
    return "interrupted";
}

// What stdout gets: each line as it is ready, or in input order (--ordered).
class Output {
  public:
    explicit Output(bool ordered) : ordered_(ordered) {}
    void put(size_t line_index, const json& j) {
        // Invalid UTF-8 (a parse error quoting the line's bytes, a --stop
        // string) is written as U+FFFD rather than failing the whole run.
        const std::string text = j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
        if (!ordered_) {
            write_stdout(text);
            return;
        }
        hold(line_index, text);
    }

  private:
    void hold(size_t line_index, std::string text) {
        held_[line_index] = std::move(text);
        while (!held_.empty() && held_.begin()->first == next_) {
            write_stdout(held_.begin()->second);
            held_.erase(held_.begin());
            next_++;
        }
    }
    bool ordered_;
    size_t next_ = 0;
    std::map<size_t, std::string> held_;
};

} // namespace

int run_batch(int argc, char** argv) {
    BatchOptions o;
    CLI::App app{"kvrun batch: many requests through one model at once, JSON lines in and out",
                 "kvrun batch"};
    add_model_option(app, o.common);
    add_runtime_options(app, o.common);
    app.add_option("-f,--file", o.file,
                   "requests, one JSON object per line (- or no -f: stdin): {\"id\", \"prompt\" "
                   "or \"messages\", \"max_tokens\", \"temperature\", \"top_k\", \"top_p\", "
                   "\"min_p\", \"seed\", \"stop\", \"ignore_eos\", \"repeat_penalty\"}");
    app.add_flag("--lines", o.lines,
                 "each input line is one user message (the model's chat template, --system)");
    app.add_option("--system", o.system, "--lines: the system prompt");
    app.add_option("--chat-template", o.chat_template,
                   std::string("template family for \"messages\" and --lines instead of the "
                               "model's (") +
                       ChatTemplate::names() + ")");
    app.add_flag("--ordered", o.ordered, "print results in input order (default: as they finish)");
    app.add_option("--parallel", o.parallel,
                   "sequences at once (default: what memory holds, at most 16)")
        ->check(int_in(1, 1024));
    app.add_option("-n,--n-predict", o.n_predict,
                   "tokens per answer unless a request says (max_tokens; -1 = until the end of "
                   "the answer or a full context)")
        ->check(int_in(-1, int64_t{1} << 40));
    app.add_option("-c,--ctx-size", o.ctx,
                   "each sequence's context, or auto (the longest prompt and -n)")
        ->capture_default_str();
    app.add_option("--keep", o.keep, "tokens kept when a window slides (attention sinks)")
        ->capture_default_str()
        ->check(int_in(0, 1 << 20));
    app.add_option("-b,--batch-size", o.batch, "prompt tokens per pass")
        ->capture_default_str()
        ->check(int_in(1, 1 << 16));
    add_sampling_options(app, o.sampling);
    app.add_option("--stop", o.stop, "stop each answer at STRING (repeatable)");
    app.add_flag("--ignore-eos", o.ignore_eos, "keep generating past the end-of-text token");
    app.add_flag("--quiet", o.quiet, "no summary on stderr");
    app.add_flag("--no-prefix-cache", o.no_prefix,
                 "evaluate every prompt whole (by default a prompt starts from the longest "
                 "prefix, 16 tokens or more, that a sequence's cache holds)");
    if (const auto done = parse_command_line(app, argc, argv)) return *done;
    if (!o.system.empty() && !o.lines) fail(Exit::usage, "--system needs --lines");
    if (o.file.empty() && !stdin_has_data())
        fail(Exit::usage, "give the requests with -f FILE or on stdin (a pipe)");
    ContextRequest req;
    set_cache_types(o.common, req, false);
    const std::string input = o.file.empty() || o.file == "-"
                                  ? read_prompt("", "-", false)
                                  : read_regular_file(o.file, "requests file", Exit::usage);

    const StopPoint stop_point;
    const auto t0 = std::chrono::steady_clock::now();
    auto lm = LoadedModel::load(o.common.model, layers_home(o.common), !o.common.precise);
    const Hparams& hp = lm->model.hp;

    // Read every line first: -c auto and --parallel are sized from them.
    RequestDefaults defaults;
    defaults.sampling = o.sampling;
    defaults.n_predict = o.n_predict;
    defaults.ignore_eos = o.ignore_eos;
    defaults.stop = o.stop;
    defaults.lines = o.lines;
    defaults.system = o.system;
    defaults.chat_template = o.chat_template;
    const RequestReader reader(*lm, std::move(defaults));
    std::vector<ParsedRequest> parsed;
    for (size_t at = 0; at < input.size();) {
        size_t end = input.find('\n', at);
        if (end == std::string::npos) end = input.size();
        const std::string line = input.substr(at, end - at);
        at = end + 1;
        if (line.find_first_not_of(" \t\r") == std::string::npos) continue; // blank lines
        parsed.push_back(reader.parse(line, parsed.size() + 1));
    }
    int64_t longest = 1, most = 0;
    bool unlimited = false;
    for (const ParsedRequest& p : parsed)
        if (p.req) {
            longest = std::max<int64_t>(longest, static_cast<int64_t>(p.req->prompt.size()));
            most = std::max(most, p.req->gen.n_predict);
            unlimited = unlimited || p.req->gen.n_predict < 0;
        }
    req.use = ContextRequest::Use::generate;
    req.ctx = o.ctx;
    req.n_prompt = is_auto(o.ctx) ? longest : 1; // a fixed -c: each prompt is checked below
    req.n_predict = unlimited ? -1 : most;
    req.keep = o.keep;
    req.batch = o.batch;
    const int threads = resolve_threads(o.common.threads);
    req.threads = threads;
    const ContextPlan plan = plan_and_tell(*lm, req, o.common.verbose);
    const KvCacheConfig& kc = plan.cache;
    size_t n_ok = 0;
    for (ParsedRequest& p : parsed) {
        if (p.req && static_cast<int64_t>(p.req->prompt.size()) >= kc.n_ctx) {
            p.error = fmt::format("the prompt takes {} tokens but the context (-c) holds {}",
                                  p.req->prompt.size(), kc.n_ctx);
            p.req.reset();
        }
        n_ok += p.req ? 1 : 0;
    }

    // Sequences at once: what memory holds (a cache each), at most 16.
    const size_t per_seq = KvCache::ring_bytes_for(kc) + KvCache::state_bytes_for(kc);
    // Caches within their budget (batch_cache_budget); more asked for wait.
    const uint64_t available = mem_available_bytes();
    const uint64_t budget = batch_cache_budget(available);
    int parallel = o.parallel;
    if (parallel == 0)
        parallel =
            static_cast<int>(std::clamp<uint64_t>(batch_sequences_that_fit(available, per_seq), 1,
                                                  std::max<size_t>(1, std::min<size_t>(16, n_ok))));
    const GpuFitInput fit{lm->file, plan.cache, plan.batch};
    const Backends backends = make_backends(o.common, threads, hp, &fit);
    if (backends.gpu && o.parallel == 0) parallel = 1; // one sequence on CUDA, for now
    if (backends.gpu && parallel > 1)
        fail(Exit::usage, "kvrun batch runs more than one sequence on the CPU only for now: with "
                          "-ngl give --parallel 1");
    if (o.common.verbose)
        fmt::print(stderr,
                   "kvrun: batch: {} requests ({} malformed), {} at once, n_ctx {}, {} "
                   "per sequence's cache, {} threads\n",
                   parsed.size(), parsed.size() - n_ok, parallel, kc.n_ctx, human_bytes(per_seq),
                   threads);

    Output out(o.ordered);
    std::vector<SeqRequest> requests;
    std::vector<size_t> line_of; // request -> its index in `parsed`
    for (size_t i = 0; i < parsed.size(); i++) {
        if (!parsed[i].req) {
            out.put(i, json{{"id", parsed[i].id}, {"error", parsed[i].error}});
            continue;
        }
        line_of.push_back(i);
        requests.push_back(std::move(*parsed[i].req));
    }
    // With -ngl (one sequence) no prefix is attached: the CUDA mirror reads
    // a cache whose blocks are in order, as a lone run's.
    Scheduler sched(*lm, kc, backends.placement(), plan.batch, parallel,
                    !o.no_prefix && !backends.gpu, budget);
    size_t finished = 0;
    std::vector<bool> reported(requests.size());
    const bool progress = ::isatty(2) != 0;
    sched.run(
        std::move(requests),
        [&](SeqResult r) {
            const ParsedRequest& p = parsed[line_of[r.index]];
            // As kvrun -p --chat prints a reply: without the space the
            // model writes after the template's "Assistant:" (the tokens keep it).
            if (p.chat) r.text.erase(0, std::min(r.text.size(), r.text.find_first_not_of(" \t\n")));
            json j = {{"id", p.id},
                      {"text", r.text},
                      {"finish_reason", finish_reason(r.gen.stop)},
                      {"prompt_tokens", r.n_prompt},
                      {"completion_tokens", r.gen.generated},
                      {"cached_tokens", r.cached}};
            if (!r.gen.matched.empty()) j["stop_string"] = r.gen.matched;
            out.put(line_of[r.index], j);
            reported[r.index] = true;
            finished++;
            if (progress) show_progress(static_cast<int64_t>(finished), static_cast<int64_t>(n_ok));
        },
        [] { return interrupted() || stdout_failed(); });
    clear_progress();
    // Ctrl-C: those that never started say so (a pipeline tells "not run" from "lost").
    for (size_t i = 0; i < reported.size(); i++)
        if (!reported[i])
            out.put(line_of[i],
                    json{{"id", parsed[line_of[i]].id}, {"error", "not run: interrupted"}});
    if (stdout_failed()) return static_cast<int>(Exit::error);

    if (sched.stats().memory_capped)
        fmt::print(stderr,
                   "kvrun: batch: memory held KV blocks for {:.1f} whole caches of {}, "
                   "not {}: sequences took blocks as they grew, {} at once at most, {} "
                   "preempted and recomputed ({} prompt tokens again)\n",
                   sched.stats().pool_rings, human_bytes(per_seq), parallel,
                   sched.stats().peak_running, sched.stats().preempted, sched.stats().recomputed);
    const double wall =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const SchedulerStats& st = sched.stats();
    if (!o.quiet)
        fmt::print(stderr,
                   "[kvrun batch] {} requests ({} done, {} malformed) | {} at once | prompt {} "
                   "tok, {:.1f} tok/s | generated {} tok, decode passes {:.1f} tok/s | {:.1f} s "
                   "in all | {} decode steps in {} passes | prefix cache {} of {} prompt tokens "
                   "({:.0f}%) | KV peak {} in blocks ({} sequences; {} each unshared)\n",
                   parsed.size(), finished, parsed.size() - n_ok, st.peak_running, st.prompt_tokens,
                   st.prompt_s > 0 ? st.prompt_tokens / st.prompt_s : 0.0, st.generated,
                   st.decode_s > 0 ? st.decoded / st.decode_s : 0.0, wall, st.steps, st.passes,
                   st.reused, st.reused + st.prompt_tokens,
                   st.reused + st.prompt_tokens > 0
                       ? 100.0 * st.reused / static_cast<double>(st.reused + st.prompt_tokens)
                       : 0.0,
                   human_bytes(st.peak_kv_bytes()), st.peak_running, human_bytes(per_seq));
    return interrupted() ? interrupted_status() : 0;
}

} // namespace kvrun::cli
