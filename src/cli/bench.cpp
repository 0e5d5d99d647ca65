// `kvrun bench -m M -p 512 -n 128 [-pg 512,128] -t 2 -r 5 [-d DEPTH] [--profile]
// [-o md|csv|json]`: prompt-processing (pp) and generation (tg) speed, mean ±
// standard deviation over repetitions, for one or more models and thread
// counts; llama-bench's tests, names and CSV columns.
//
// Every test runs after DEPTH tokens already in the cache (filled untimed;
// "@dDEPTH" in its name when not 0):
// pp: the prompt's tokens evaluated in batches.
// tg: tokens evaluated one at a time, as generation does; --json gives the
//     bytes each reads (weights + KV at that depth).
// pp+tg (-pg): a prompt, then generated tokens, timed together.
// The machine's read roof and the attention and matrix probes are lab
// measurements, in kvrun-lab (tools/); scripts/bench.sh puts the two together.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <utility>

#include <nlohmann/json.hpp>

#include "cli/common.h"
#include "cli/speculative_options.h"
#include "file_io.h"
#include "error.h"
#include "forward.h"
#include "ggml-like/attention.h"
#include "ggml-like/cpu/gemm.h"
#include "ggml-like/cpu/ops.h"
#include "ggml-like/kernels.h"
#include "ggml-like/cpu/thread_pool.h"
#include "context.h"
#include "loader.h"
#include "model_summary.h"
#include "session.h"
#include "system_memory.h"

namespace kvrun::cli {

namespace {

using Clock = std::chrono::steady_clock;

struct Stat {
    double mean = 0, sd = 0;
};
Stat stat_of(const std::vector<double>& v) {
    Stat s;
    if (v.empty()) return s;
    s.mean = std::accumulate(v.begin(), v.end(), 0.0) / v.size();
    double ss = 0;
    for (double x : v) ss += (x - s.mean) * (x - s.mean);
    s.sd = v.size() > 1 ? std::sqrt(ss / (v.size() - 1)) : 0.0;
    return s;
}

// One test: pp prompt tokens in batches, then tg generated one at a time
// (llama-bench's -p, -n and -pg).
struct PgTest {
    int pp = 0, tg = 0;
};

// llama-bench's names: pp512, tg128, pp512+tg128, and @d4096 after DEPTH tokens.
std::string test_name(const PgTest& t, int depth) {
    std::string name = t.pp > 0 && t.tg > 0 ? fmt::format("pp{}+tg{}", t.pp, t.tg)
                       : t.pp > 0           ? fmt::format("pp{}", t.pp)
                                            : fmt::format("tg{}", t.tg);
    return depth > 0 ? name + fmt::format("@d{}", depth) : name;
}

// "PP,TG" of -pg.
PgTest parse_pg(const std::string& s) {
    const std::vector<int> v = parse_count_list(s, "-pg");
    if (v.size() != 2 || v[0] <= 0 || v[1] <= 0)
        fail(Exit::usage, "-pg {}: expected PP,TG (prompt then generated tokens, e.g. 512,128)", s);
    return {v[0], v[1]};
}

// A CSV field (RFC 4180): quoted when it holds a comma, a quote or a line break.
std::string csv_field(const std::string& s) {
    if (s.find_first_of(",\"\r\n") == std::string::npos) return s;
    std::string q = "\"";
    for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
    return q + "\"";
}

struct Row {
    std::string model;
    std::string test; // "pp512", "tg128", "pp512+tg128", "tg128@d4096"
    int threads = 0;
    Stat tps;
    double bytes_per_token = 0; // tg only
    // Speculative rows: the drafts verified and accepted over the repetitions.
    std::string drafter{}; // "" for the others
    SpeculativeStats spec_stats{};
    double handoffs_per_token = 0; // tg on the CPU: thread-pool hand-offs per token
    // With --profile: every op of the timed tokens, summed, and their count
    // and wall time (the ops' times add up to at most that).
    OpProfile profile{};
    double profiled_tokens = 0, profiled_seconds = 0;
    // What the model is (llama-bench's columns): its file type, weight bytes
    // and parameters; and where it ran.
    std::string type{}, size{}, params{}, backend{};
    std::vector<double> samples{};            // tok/s of each repetition (--json)
    int n_prompt = 0, n_gen = 0, n_depth = 0; // the test's tokens (-o csv, --json)
    uint64_t size_bytes = 0, n_params = 0;    // -o csv: numbers, as llama-bench writes them

    void attach(const OpProfile& p, double tokens, double seconds) {
        profile = p;
        profiled_tokens = tokens;
        profiled_seconds = seconds;
    }
};

// --profile, one pp or tg row: per op, calls, MB, ms per token, share of the
// time and the rate it read its bytes at, then the time outside every op
// (Forward's own bookkeeping). A prompt batch reads each weight once for all
// its tokens, so its MB and calls per token are a batch's divided by the
// batch's tokens. (scripts/bench.sh prints the same from --json, with each
// rate's fraction of kvrun-lab's read roof.)
void print_profile(const Row& r) {
    const double tokens = r.profiled_tokens, per_token_s = r.profiled_seconds / tokens;
    fmt::print("\nprofile of {} on {}, {} threads: {:.2f} ms per token\n\n", r.test, r.model,
               r.threads, per_token_s * 1e3);
    fmt::print("| op | calls/token | MB/token | ms/token | share | GB/s read |\n");
    fmt::print("| --- | ---: | ---: | ---: | ---: | ---: |\n");
    double in_ops = 0;
    for (size_t i = 0; i < r.profile.ops.size(); i++) {
        const OpProfile::Entry& e = r.profile.ops[i];
        if (e.calls == 0) continue;
        in_ops += e.seconds;
        const double s = e.seconds / tokens;
        std::string rate = " |", mb;
        if (e.bytes > 0) {
            mb = fmt::format("{:.1f}", e.bytes / tokens / 1e6);
            rate = fmt::format(" {:.1f} |", e.bytes / e.seconds / 1e9);
        }
        fmt::print("| {} | {:.3g} | {} | {:.3f} | {:.1f}% |{}\n", op_name(static_cast<Op>(i)),
                   e.calls / tokens, mb, s * 1e3, 100 * s / per_token_s, rate);
    }
    const double outside = std::max(0.0, r.profiled_seconds - in_ops) / tokens;
    fmt::print("| outside the ops | | | {:.3f} | {:.1f}% | |\n", outside * 1e3,
               100 * outside / per_token_s);
}

nlohmann::json profile_json(const Row& r) {
    nlohmann::json ops = nlohmann::json::array();
    for (size_t i = 0; i < r.profile.ops.size(); i++) {
        const OpProfile::Entry& e = r.profile.ops[i];
        if (e.calls == 0) continue;
        ops.push_back({{"op", op_name(static_cast<Op>(i))},
                       {"calls_per_token", e.calls / r.profiled_tokens},
                       {"bytes_per_token", e.bytes / r.profiled_tokens},
                       {"seconds_per_token", e.seconds / r.profiled_tokens}});
    }
    return {{"seconds_per_token", r.profiled_seconds / r.profiled_tokens}, {"ops", ops}};
}

// Greedy generation of tg tokens after `prompt`, plain and then with the
// drafter, `reps` times each: two rows. The answers must be the same (the
// speculative one is exact by construction); a difference is an error.
void bench_speculative(const LoadedModel& lm, const std::string& name, Session& session,
                       const Backends& be, int threads, const ContextPlan& plan,
                       const SpeculativeOptions& so, const std::string& prompt, int tg, int reps,
                       bool deterministic, std::vector<Row>& rows) {
    const std::vector<int32_t> tokens = lm.tokenizer.encode(prompt, true, true);
    if (static_cast<int64_t>(tokens.size()) + tg > session.n_ctx())
        fail(Exit::context_overflow,
             "the prompt ({} tokens) and -n {} do not fit the bench's context of {}", tokens.size(),
             tg, session.n_ctx());
    SamplerParams greedy;
    greedy.temp = 0;
    Speculation spec =
        make_speculation(so, lm, plan.cache, be, threads, deterministic, plan.batch, greedy);
    GenerateParams gp;
    gp.n_predict = tg;
    gp.ignore_eos = true;
    std::vector<int32_t> plain_answer;
    for (Speculator* s : {static_cast<Speculator*>(nullptr), spec.get()}) {
        gp.speculate = s;
        std::vector<double> v;
        std::vector<int32_t> answer;
        if (s) s->reset_stats();
        for (int r = 0; r < reps && !interrupted(); r++) {
            session.clear();
            session.eval(tokens);
            if (s) spec.prepare(session.tokens());
            Sampler sampler(greedy, lm.model.hp.n_vocab);
            const auto t0 = Clock::now();
            const GenerateResult g = session.generate(gp, sampler, {});
            v.push_back(static_cast<double>(g.generated) /
                        std::chrono::duration<double>(Clock::now() - t0).count());
            answer = g.tokens;
        }
        if (!s) {
            plain_answer = answer;
        } else if (answer != plain_answer && !interrupted()) {
            fail(Exit::error,
                 "bench: {} changed the greedy answer (a bug: speculative decoding is exact)",
                 s->drafter().name());
        }
        Row row{name,
                fmt::format("tg{} after {} tok{}", tg, tokens.size(),
                            s ? ", " + s->drafter().name() : ""),
                threads, stat_of(v), 0};
        row.samples = v;
        if (s) row.drafter = s->drafter().name(), row.spec_stats = s->stats();
        rows.push_back(row);
    }
}

} // namespace

int run_bench(int argc, char** argv) {
    std::vector<std::string> models;
    std::string threads_s = "0", pp_s = "512", tg_s = "128", depth_s = "0", ctk = "f16",
                ctv = "f16";
    std::string device;    // "" = cpu, or cuda with -ngl
    CommonOptions offload; // -ngl, --kv-gpu-window
    int reps = 5, batch = 512;
    bool json = false, profile = false, deterministic = false, precise = false;
    SpeculativeOptions speculative;
    std::string prompt_file;
    // The lab's measurements moved to kvrun-lab (tools/): say where, rather
    // than CLI11's "unrecognized option", to whoever still passes them.
    static const std::pair<const char*, const char*> kMoved[] = {
        {"--roofline", "roofline -t N"},
        {"--attention", "attention -m M -d DEPTH"},
        {"--matrices", "matrices -m M"}};
    for (int i = 1; i < argc; i++)
        for (const auto& [flag, lab] : kMoved)
            if (std::strcmp(argv[i], flag) == 0)
                fail(Exit::usage, "{} moved out of kvrun bench: kvrun-lab {}", flag, lab);
    CLI::App app{"kvrun bench: prompt and generation speed (mean ± sd over repetitions)",
                 "kvrun bench"};
    app.footer("The read roof and the attention and matrix probes are in kvrun-lab, built beside "
               "kvrun: kvrun-lab roofline|attention|matrices --help.");
    app.add_option("-m,--model", models, "GGUF model(s); repeat -m for several")->required();
    app.add_option("-p,--n-prompt", pp_s, "prompt lengths, comma-separated (0 = skip)")
        ->capture_default_str();
    app.add_option("-n,--n-gen", tg_s, "generated tokens, comma-separated (0 = skip)")
        ->capture_default_str();
    app.add_option("-d,--depth", depth_s,
                   "tokens already in the cache before each test, comma-separated (pp512@d4096)")
        ->capture_default_str();
    std::vector<std::string> pg_s;
    app.add_option("--pg", pg_s,
                   "(-pg) PP,TG: a prompt of PP tokens then TG generated, timed together "
                   "(pp512+tg128); repeatable");
    app.add_option("-t,--threads", threads_s, "thread counts, comma-separated (0 = physical cores)")
        ->capture_default_str();
    app.add_option("-r,--repetitions", reps, "repetitions")
        ->capture_default_str()
        ->check(int_in(1, 1000));
    app.add_option("-b,--batch-size", batch, "prompt batch")
        ->capture_default_str()
        ->check(int_in(1, 1 << 16));
    app.add_option("--ctk", ctk, "K cache type")->capture_default_str();
    app.add_option("--ctv", ctv, "V cache type")->capture_default_str();
    app.add_option("--device", device, "cpu, cuda or cuda:N (default: cpu, or cuda with -ngl)");
    add_offload_options(app, offload);
    app.add_flag(
        "--profile", profile,
        "time each op of the pp and tg runs (CPU): per weight matrix, attention, norms and the "
        "rest, with the bytes each reads and the rate it reads them at (--json: also the "
        "thread pool's hand-offs per generated token)");
    app.add_flag("--json", json, "print JSON instead of a markdown table");
    std::string output = "md";
    app.add_option("-o,--output", output, "md (a markdown table), csv, or json (as --json)")
        ->capture_default_str();
    app.add_flag("--deterministic", deterministic,
                 "measure the batch-invariant arithmetic of --deterministic (CPU)");
    app.add_flag("--precise", precise,
                 "measure --precise: F32 activations for prompt batches (CPU)");
    add_speculative_options(app, speculative);
    app.add_option("-f,--file", prompt_file,
                   "with --lookup or --draft-model: generation after this prompt (greedy, -n "
                   "tokens), plain and "
                   "speculative side by side; the two answers must be the same");
    if (const auto done = parse_command_line(app, argc, argv)) return *done;
    if (output == "json")
        json = true;
    else if (output != "md" && output != "csv")
        fail(Exit::usage, "-o {}: expected md, csv or json", output);
    std::vector<PgTest> pgs;
    for (const std::string& p : pg_s) pgs.push_back(parse_pg(p));
    const gl::Type tk = parse_cache_type(ctk, "--ctk"), tv = parse_cache_type(ctv, "--ctv");
    const std::vector<int> pps = parse_count_list(pp_s, "-p"), tgs = parse_count_list(tg_s, "-n"),
                           depths = parse_count_list(depth_s, "-d"),
                           thread_counts = parse_count_list(threads_s, "-t");
    const auto positive = [](const std::vector<int>& v) {
        return std::any_of(v.begin(), v.end(), [](int x) { return x > 0; });
    };
    if (!positive(pps) && !positive(tgs) && pgs.empty())
        fail(Exit::usage, "nothing to measure: -p and -n are 0");
    if (speculative.any() && prompt_file.empty())
        fail(Exit::usage, "--lookup and --draft-model measure generation after a real prompt: give "
                          "one with -f FILE");
    const std::string spec_prompt =
        prompt_file.empty() ? std::string()
                            : read_regular_file(prompt_file, "prompt file", Exit::usage);
    const StopPoint stop_point; // its loops poll interrupted()

    std::vector<Row> rows;
    for (const std::string& path : models) {
        CommonOptions placement;
        placement.device = device;
        placement.n_gpu_layers = offload.n_gpu_layers;
        placement.kv_gpu_window = offload.kv_gpu_window;
        placement.cpu_moe = offload.cpu_moe;
        placement.n_cpu_moe = offload.n_cpu_moe;
        placement.precise = precise;
        auto lm = LoadedModel::load(path, layers_home(placement), !placement.precise);
        const Hparams& hp = lm->model.hp;
        const std::string name = path.substr(path.find_last_of('/') + 1);
        const ModelSummary summary = summarize_model(lm->file);
        const size_t rows_before = rows.size();
        // Bytes one generated token reads: every weight matrix once, one
        // embedding row, and of a mixture's experts only the used ones.
        double weight_bytes_per_token = static_cast<double>(lm->model.token_embd.row_bytes);
        for (const auto& L : lm->model.layers)
            for (const gl::Tensor* w : L.token_matrices(hp.n_expert_used))
                weight_bytes_per_token += static_cast<double>(w->bytes());
        weight_bytes_per_token += static_cast<double>(lm->model.output.bytes());

        // Which kernels the figures below come from (the same model runs 2-3x
        // apart between paths).
        const LayerWeights& first = lm->model.layers.front();
        const gl::Tensor& up = first.w_up ? first.w_up : first.exp_up.front();
        const gl::Type wt = up.type;
        fmt::print(stderr,
                   "kvrun bench: {}: {} ({} weights), {} kernels, prompt batches on {}, "
                   "generated tokens' F16 attention in {} products; {}\n",
                   name, summary.file_type, gl::type_name(wt), gl::cpu::isa_name(),
                   gl::ops::batch_path_name(
                       up, batch,
                       {.tiles = !deterministic,
                        .int8 = !precise && !deterministic,
                        .packed = !precise}) +
                       (deterministic ? " (--deterministic)" : "") +
                       (precise ? " (--precise)" : ""),
                   !deterministic && gl::attention_half_products() ? "f16" : "f32",
                   gl::gemm::blas_description());
        std::mt19937 rng(42);
        const int max_pp = pps.empty() ? 0 : *std::max_element(pps.begin(), pps.end());
        const int max_tg = tgs.empty() ? 0 : *std::max_element(tgs.begin(), tgs.end());
        const int max_depth = depths.empty() ? 0 : *std::max_element(depths.begin(), depths.end());
        int max_pg = 0;
        for (const PgTest& t : pgs) max_pg = std::max(max_pg, t.pp + t.tg);
        const int max_test = std::max({max_pp, max_tg, max_pg});
        std::vector<int32_t> toks(max_depth + max_test + 1);
        for (auto& t : toks) t = static_cast<int32_t>(rng() % hp.n_vocab);

        for (int tc : thread_counts) {
            const int threads = resolve_threads(tc);
            CommonOptions co;
            co.device = device;
            co.n_gpu_layers = offload.n_gpu_layers;
            co.kv_gpu_window = offload.kv_gpu_window;
            co.cpu_moe = offload.cpu_moe;
            co.n_cpu_moe = offload.n_cpu_moe;
            co.deterministic = deterministic;
            co.precise = precise;
            const Backends be = make_backends(co, threads, hp);
            const size_t rows_at_threads = rows.size();
            if (profile && be.gpu)
                fail(Exit::usage,
                     "--profile times ops on the CPU; a GPU queues its work and returns "
                     "before it is done (run without -ngl and --device cuda)");
            ContextRequest req;
            req.use = ContextRequest::Use::bench;
            req.n_prompt = max_depth + max_test;
            if (speculative.any())
                req.n_prompt = std::max<int64_t>(
                    req.n_prompt,
                    static_cast<int64_t>(lm->tokenizer.encode(spec_prompt, true, true).size()) +
                        max_tg);
            req.type_k = tk;
            req.type_v = tv;
            req.batch = batch;
            req.threads = threads;
            const ContextPlan plan = plan_context(*lm, req);
            Session session(*lm, plan.cache, be.placement(), plan.batch);
            Forward& fwd = session.forward();
            // One timed repetition, seconds; under --profile its ops are timed into `prof`.
            auto timed = [&](OpProfile& prof, auto&& body) {
                if (profile) fwd.set_profile(&prof);
                const auto t0 = Clock::now();
                body();
                const double s = std::chrono::duration<double>(Clock::now() - t0).count();
                fwd.set_profile(nullptr);
                return s;
            };
            auto eval_all = [&](const int32_t* t, int n) {
                session.eval(std::span<const int32_t>(t, n));
            };
            eval_all(toks.data(),
                     std::min<int>(16, static_cast<int>(toks.size()))); // warm-up: fault weights in
            // llama-bench's tests, at each depth: the prompt lengths (pp),
            // the generation lengths (tg), then the prompt-then-generation
            // pairs (-pg: pp512+tg128). The depth's tokens are in the cache
            // first, untimed, and evaluated once: later repetitions cut the
            // cache back to them (a 4096-token prefill is a minute on a
            // 2-core AVX2 machine).
            std::vector<PgTest> tests;
            for (int pp : pps)
                if (pp > 0) tests.push_back({pp, 0});
            for (int tg : tgs)
                if (tg > 0) tests.push_back({0, tg});
            tests.insert(tests.end(), pgs.begin(), pgs.end());
            for (int depth : depths)
                for (const PgTest& t : tests) {
                    std::vector<double> v;
                    double handoffs = 0;
                    OpProfile prof;
                    double timed_s = 0;
                    for (int r = 0; r < reps && !interrupted(); r++) {
                        // The cache always holds a prefix of toks: cut it back.
                        if (static_cast<int64_t>(session.tokens().size()) < depth ||
                            !session.rewind(depth)) {
                            session.clear();
                            if (depth > 0) eval_all(toks.data(), depth);
                        }
                        const uint64_t h0 = be.cpu ? be.cpu->handoffs() : 0;
                        const double s = timed(prof, [&] {
                            if (t.pp > 0) eval_all(toks.data() + depth, t.pp);
                            for (int i = 0; i < t.tg; i++) session.step(toks[depth + t.pp + i]);
                        });
                        v.push_back((t.pp + t.tg) / s);
                        timed_s += s;
                        if (t.tg > 0)
                            handoffs =
                                static_cast<double>((be.cpu ? be.cpu->handoffs() : 0) - h0) / t.tg;
                    }
                    Row row{name, test_name(t, depth), threads, stat_of(v), 0};
                    row.n_prompt = t.pp, row.n_gen = t.tg, row.n_depth = depth;
                    row.samples = v;
                    if (t.pp == 0) {
                        // KV read per token at the mean depth of the run
                        const double kv_bytes = static_cast<double>(
                            KvCache::bytes_at_depth(plan.cache, depth + t.tg / 2));
                        row.bytes_per_token = weight_bytes_per_token + kv_bytes;
                        row.handoffs_per_token = handoffs;
                    }
                    if (profile)
                        row.attach(prof, static_cast<double>(t.pp + t.tg) * v.size(), timed_s);
                    rows.push_back(row);
                }
            if (speculative.any())
                for (int tg : tgs)
                    if (tg > 0)
                        bench_speculative(*lm, name, session, be, threads, plan, speculative,
                                          spec_prompt, tg, reps, deterministic, rows);
            const std::string backend =
                !be.gpu ? "cpu"
                : be.n_gpu_layers == be.n_layer && be.n_cpu_moe == 0
                    ? "cuda"
                    : fmt::format("cuda {}/{} layers{}", be.n_gpu_layers, be.n_layer,
                                  be.n_cpu_moe > 0
                                      ? fmt::format(", {} layers' experts on the CPU", be.n_cpu_moe)
                                      : "");
            for (size_t i = rows_at_threads; i < rows.size(); i++) rows[i].backend = backend;
        }
        for (size_t i = rows_before; i < rows.size(); i++) {
            rows[i].type = summary.file_type;
            rows[i].size = human_bytes(summary.weight_bytes);
            rows[i].params = params_text(summary.params);
            rows[i].size_bytes = summary.weight_bytes;
            rows[i].n_params = summary.params;
        }
    }

    if (json) {
        nlohmann::json j = nlohmann::json::array();
        for (const Row& r : rows) {
            nlohmann::json o = {{"model", r.model},
                                {"type", r.type},
                                {"size", r.size},
                                {"params", r.params},
                                {"backend", r.backend},
                                {"test", r.test},
                                {"n_prompt", r.n_prompt},
                                {"n_gen", r.n_gen},
                                {"n_depth", r.n_depth},
                                {"threads", r.threads},
                                {"tokens_per_second", r.tps.mean},
                                {"stddev", r.tps.sd},
                                {"samples", r.samples}};
            if (r.bytes_per_token > 0) o["bytes_per_token"] = r.bytes_per_token;
            // With the hand-off cost kvrun-lab roofline measures, the share of a
            // token spent handing work to the threads (scripts/bench.sh).
            if (profile && r.bytes_per_token > 0) o["handoffs_per_token"] = r.handoffs_per_token;
            if (r.profiled_tokens > 0) o["profile"] = profile_json(r);
            if (!r.drafter.empty())
                o["speculative"] = {{"drafter", r.drafter},
                                    {"rounds", r.spec_stats.rounds},
                                    {"drafted", r.spec_stats.drafted},
                                    {"accepted", r.spec_stats.accepted},
                                    {"acceptance", r.spec_stats.acceptance()}};
            j.push_back(o);
        }
        fmt::print("{}\n", j.dump(2));
        return interrupted() ? interrupted_status() : 0;
    }
    if (output == "csv") {
        // llama-bench's column names where it has the column (avg_ts, n_prompt, ...).
        fmt::print("model_filename,model_type,model_size,model_n_params,backend,n_threads,test,"
                   "n_prompt,n_gen,n_depth,avg_ts,stddev_ts,samples_ts\n");
        for (const Row& r : rows) {
            std::string samples;
            for (double x : r.samples)
                samples += fmt::format("{}{:.4f}", samples.empty() ? "" : " ", x);
            fmt::print("{},{},{},{},{},{},{},{},{},{},{:.4f},{:.4f},{}\n", csv_field(r.model),
                       csv_field(r.type), r.size_bytes, r.n_params, csv_field(r.backend), r.threads,
                       csv_field(r.test), r.n_prompt, r.n_gen, r.n_depth, r.tps.mean, r.tps.sd,
                       samples);
        }
        return interrupted() ? interrupted_status() : 0;
    }
    // Markdown, one cell per column in every row; the drafts column only
    // when a row has drafts.
    const bool any_drafts =
        std::any_of(rows.begin(), rows.end(), [](const Row& r) { return !r.drafter.empty(); });
    if (!rows.empty()) {
        fmt::print("| model | type | size | params | backend | threads | test | tok/s |{}\n",
                   any_drafts ? " drafts accepted |" : "");
        fmt::print("| --- | --- | ---: | ---: | --- | ---: | --- | ---: |{}\n",
                   any_drafts ? " ---: |" : "");
    }
    for (const Row& r : rows)
        fmt::print("| {} | {} | {} | {} | {} | {} | {} | {:.2f} ± {:.2f} |{}\n", r.model, r.type,
                   r.size, r.params, r.backend, r.threads, r.test, r.tps.mean, r.tps.sd,
                   !any_drafts ? ""
                   : r.drafter.empty()
                       ? " |"
                       : fmt::format(" {:.0f}% of {} |", 100 * r.spec_stats.acceptance(),
                                     r.spec_stats.drafted));
    for (const Row& r : rows)
        if (r.profiled_tokens > 0) print_profile(r);
    // Ctrl-C stops the loops; what was measured is printed, and the status says it was cut short.
    return interrupted() ? interrupted_status() : 0;
}

} // namespace kvrun::cli
