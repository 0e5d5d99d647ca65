// `kvrun serve -m M`: OpenAI's chat and completions API over HTTP
// (src/serve/), on the many-sequence engine of kvrun batch: concurrent
// requests share the weights' reads and a common prompt prefix's KV blocks.
// Loopback by default; logs on stderr, one line a request.
#include <chrono>
#include <filesystem>
#include <functional>
#include <thread>

#include "chat_template.h"
#include "cli/common.h"
#include "error.h"
#include "file_io.h"
#include "format.h"
#include "loader.h"
#include "memory_plan.h"
#include "requests.h"
#include "serve/http_server.h" // its options only, without a server built
#include "system_memory.h"

namespace kvrun::cli {

namespace {

struct ServeOptions {
    CommonOptions common;
    serve::ServerOptions http; // --host, --port, --api-key, --cors-origin, --max-body, --timeout
    std::string ctx, api_key_file, chat_template, alias;
    int parallel = 4, keep = 4, batch = 512, max_queue = 64, shutdown_timeout = 10;
    bool no_prefix = false;
    SamplerParams sampling;
};

#ifdef KVRUN_SERVE
bool loopback(const std::string& host) {
    return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

std::string read_key_file(const std::string& path) {
    std::string key = read_regular_file(path, "API key file", Exit::usage);
    while (!key.empty() && (key.back() == '\n' || key.back() == '\r' || key.back() == ' '))
        key.pop_back();
    if (key.empty() || key.find_first_of("\n\r") != std::string::npos)
        fail(Exit::usage, "--api-key-file {}: expected one line holding the key", path);
    return key;
}
#endif

} // namespace

int run_serve(int argc, char** argv) {
    ServeOptions o;
    CLI::App app{"kvrun serve: OpenAI's chat and completions API over HTTP, many requests at once",
                 "kvrun serve"};
    add_model_option(app, o.common);
    add_runtime_options(app, o.common);
    app.add_option("--host", o.http.host,
                   "address to listen on (default loopback only; another needs --api-key to be "
                   "safe)")
        ->capture_default_str();
    app.add_option("--port", o.http.port, "port (0: any free one, printed on stderr)")
        ->capture_default_str()
        ->check(int_in(0, 65535));
    app.add_option("--parallel", o.parallel, "(-np) sequences decoded at once")
        ->capture_default_str()
        ->check(int_in(1, 256));
    app.add_option("-c,--ctx-size", o.ctx,
                   "each sequence's context: prompt and answer (default 4096, at most the "
                   "model's trained context)");
    app.add_option("--keep", o.keep, "tokens kept when a window slides (attention sinks)")
        ->capture_default_str()
        ->check(int_in(0, 1 << 20));
    app.add_option("-b,--batch-size", o.batch, "prompt tokens per pass")
        ->capture_default_str()
        ->check(int_in(1, 1 << 16));
    [[maybe_unused]] CLI::Option* seed_given = add_sampling_options(app, o.sampling);
    auto* key = app.add_option("--api-key", o.http.api_key,
                               "require 'Authorization: Bearer KEY' (visible in ps: prefer "
                               "--api-key-file)");
    app.add_option("--api-key-file", o.api_key_file, "the API key, read from a file")
        ->excludes(key);
    app.add_option("--chat-template", o.chat_template,
                   std::string("template family for \"messages\" instead of the model's (") +
                       ChatTemplate::names() + ")");
    app.add_option("--alias", o.alias,
                   "the model's name in the API (default: the file's name without .gguf)");
    app.add_option("--cors-origin", o.http.cors_origin,
                   "allow browser pages from ORIGIN to call the API (default: no CORS)");
    app.add_option("--max-body", o.http.max_body, "largest request body in bytes (413 beyond)")
        ->capture_default_str()
        ->check(int_in(1024, int64_t{1} << 30));
    app.add_option("--max-queue", o.max_queue,
                   "requests that may wait beyond --parallel (503 with Retry-After beyond)")
        ->capture_default_str()
        ->check(int_in(0, 1 << 20));
    app.add_option_function<int>(
           "--timeout", [&o](int s) { o.http.read_timeout_s = o.http.write_timeout_s = s; },
           "seconds a connection may stay silent while sending a request or taking the "
           "answer")
        ->default_str(std::to_string(o.http.read_timeout_s))
        ->check(int_in(1, 3600));
    app.add_option("--shutdown-timeout", o.shutdown_timeout,
                   "on SIGTERM or Ctrl-C: seconds in-flight answers may take before they are "
                   "cancelled")
        ->capture_default_str()
        ->check(int_in(0, 3600));
    app.add_flag("--no-prefix-cache", o.no_prefix,
                 "evaluate every prompt whole (by default a prompt starts from the longest "
                 "prefix the KV pool holds)");
    if (const auto done = parse_command_line(app, argc, argv)) return *done;
#ifndef KVRUN_SERVE
    fail(Exit::usage, "this kvrun was built without the HTTP server (install libcpp-httplib-dev "
                      "and build again; static builds have none)");
#else
    serve::ServerOptions& so = o.http;
    if (!o.api_key_file.empty()) so.api_key = read_key_file(o.api_key_file);
    if (!loopback(so.host) && so.api_key.empty())
        fmt::print(stderr,
                   "kvrun: serve: warning: listening on {} without --api-key: anyone "
                   "who can reach this machine can use the model\n",
                   so.host);
    ContextRequest req;
    set_cache_types(o.common, req, false);

    // Listen first: /health says 503 while the model loads.
    so.http_threads = o.parallel + std::min(o.max_queue, 256) + 16;
    so.verbose = o.common.verbose;
    serve::HttpServer http(so);
    http.start();
    fmt::print(stderr, "kvrun: serve: listening on http://{}:{}\n",
               so.host.find(':') != std::string::npos ? "[" + so.host + "]" : so.host, http.port());

    const StopPoint stop_point;
    auto lm = LoadedModel::load(o.common.model, layers_home(o.common), !o.common.precise);
    const Hparams& hp = lm->model.hp;
    const int64_t trained = hp.n_ctx_train > 0 ? hp.n_ctx_train : 4096;
    req.use = ContextRequest::Use::generate;
    req.ctx = o.ctx.empty() ? std::to_string(std::min<int64_t>(4096, trained)) : o.ctx;
    if (is_auto(req.ctx))
        fail(Exit::usage, "kvrun serve needs a number for -c (no prompt to size it from)");
    req.n_prompt = 1;
    req.n_predict = -1;
    req.keep = o.keep;
    req.batch = o.batch;
    const int threads = resolve_threads(o.common.threads);
    req.threads = threads;
    const ContextPlan plan = plan_and_tell(*lm, req, o.common.verbose);
    const KvCacheConfig& kc = plan.cache;
    const GpuFitInput fit{lm->file, kc, plan.batch};
    const Backends backends = make_backends(o.common, threads, hp, &fit);
    if (backends.gpu && o.parallel > 1)
        fail(Exit::usage, "kvrun serve runs more than one sequence on the CPU only for now: with "
                          "-ngl give --parallel 1");

    RequestDefaults defaults;
    defaults.sampling = o.sampling;
    defaults.chat_template = o.chat_template;
    const RequestReader reader(*lm, std::move(defaults));
    const std::filesystem::path file(o.common.model);
    std::vector<std::string> names;
    if (!o.alias.empty()) names.push_back(o.alias);
    names.push_back(file.stem().string());
    names.push_back(file.filename().string());
    names.push_back(o.common.model);
    serve::ApiLimits limits;
    limits.n_ctx = kc.n_ctx;
    const serve::ApiReader api(reader, names, hp.n_vocab, limits);
    const uint64_t budget = batch_cache_budget(mem_available_bytes());
    serve::Engine engine(*lm, kc, backends.placement(), plan.batch, o.parallel,
                         !o.no_prefix && !backends.gpu, budget, static_cast<size_t>(o.max_queue));
    // SIGTERM or Ctrl-C: new requests get 503; answers in flight finish
    // within --shutdown-timeout, then are cancelled (a stream ends with an
    // error event); then the port closes. Also on the way out of an
    // exception: the routes must be gone before the engine and the model.
    auto shutdown = [&](bool tell) {
        http.drain();
        engine.close();
        using namespace std::chrono;
        auto wait_for_answers = [&](seconds bound) {
            const auto deadline = steady_clock::now() + bound;
            while (http.in_flight() > 0 && steady_clock::now() < deadline)
                std::this_thread::sleep_for(milliseconds(20));
        };
        if (tell)
            fmt::print(stderr, "kvrun: serve: stopping: {} answers in flight\n", http.in_flight());
        wait_for_answers(seconds(o.shutdown_timeout));
        if (http.in_flight() > 0) {
            if (tell) fmt::print(stderr, "kvrun: serve: cancelling {} answers\n", http.in_flight());
            engine.cancel_all();
            wait_for_answers(seconds(5)); // their last events written
        }
        http.stop(); // idempotent
    };
    struct Guard { // before the routes see the engine
        std::function<void(bool)> f;
        ~Guard() {
            try {
                f(false);
            } catch (...) {
            }
        }
    } guard{shutdown};

    serve::Service svc;
    svc.lm = lm.get();
    svc.api = &api;
    svc.engine = &engine;
    svc.n_ctx = kc.n_ctx;
    svc.parallel = o.parallel;
    svc.created = std::chrono::duration_cast<std::chrono::seconds>(
                      std::chrono::system_clock::now().time_since_epoch())
                      .count();
    svc.fixed_seed = seed_given->count() > 0;
    http.attach(svc);
    const serve::EngineStats es = engine.stats();
    fmt::print(stderr,
               "kvrun: serve: ready: model '{}', n_ctx {}, {} sequences at once, KV pool {} "
               "({:.1f} whole caches), {} threads\n",
               api.model(), kc.n_ctx, o.parallel, human_bytes(es.sched.pool_bytes),
               es.sched.pool_rings, threads);

    while (!interrupted()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    shutdown(true);
    fmt::print(stderr, "kvrun: serve: stopped\n");
    return 0;
#endif
}

} // namespace kvrun::cli
