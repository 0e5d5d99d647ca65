#include "cli/common.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <random>
#include <csignal>
#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>
#include <optional>
#include <sstream>
#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include "error.h"
#include "file_io.h"
#include "ggml-like/cpu/gemm.h"
#include "ggml-like/cuda/cuda_backend.h"
#include "ggml-like/cpu/thread_pool.h"
#include "kv_cache.h"
#include "loader.h"
#include "memory_plan.h"
#include "unicode.h"

namespace kvrun::cli {

namespace {
// The process-wide state of a stop: a signal handler has no other way to
// reach the generation loop. g_stop_signal is the first SIGINT or SIGTERM
// (0: none), g_stop_points how many StopPoints are live.
std::atomic<bool> g_interrupted{false};
std::atomic<int> g_stop_signal{0};
std::atomic<int> g_stop_points{0};

// SIGINT (Ctrl-C) and SIGTERM (timeout, systemd, docker): where a loop polls
// interrupted() (a StopPoint is live) the first one sets the flag and that
// loop stops cleanly, finishing a write in progress; a second one, or the
// first where nothing polls, ends the process at once, after removing the
// temporaries of files being written. The status is 128 + the signal.
void on_stop_signal(int sig) {
    int none = 0;
    g_stop_signal.compare_exchange_strong(none, sig);
    const bool again = g_interrupted.exchange(true);
    if (!again && g_stop_points.load() > 0) return;
    remove_pending_temporaries();
    constexpr char interrupted_msg[] = "\nkvrun: interrupted\n";
    constexpr char terminated_msg[] = "\nkvrun: terminated\n";
    [[maybe_unused]] auto r = sig == SIGTERM
                                  ? ::write(2, terminated_msg, sizeof terminated_msg - 1)
                                  : ::write(2, interrupted_msg, sizeof interrupted_msg - 1);
    _exit(128 + sig);
}
} // namespace

void install_interrupt_handler() {
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sigaddset(&sa.sa_mask, SIGINT);
    sigaddset(&sa.sa_mask, SIGTERM);
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);
}

StopPoint::StopPoint() {
    g_stop_points.fetch_add(1);
}
StopPoint::~StopPoint() {
    g_stop_points.fetch_sub(1);
}

bool interrupted() {
    return g_interrupted.load(std::memory_order_relaxed);
}

bool terminated() {
    return g_stop_signal.load(std::memory_order_relaxed) == SIGTERM;
}

int interrupted_status() {
    const int sig = g_stop_signal.load(std::memory_order_relaxed);
    return sig != 0 ? 128 + sig : static_cast<int>(Exit::interrupted);
}

void clear_interrupt() {
    // SIGTERM ends the REPL too: it stays. Cleared only if no SIGTERM came
    // in between (it would then be lost, or taken for a Ctrl-C).
    int sig = g_stop_signal.load();
    if (sig == SIGTERM || !g_stop_signal.compare_exchange_strong(sig, 0)) return;
    g_interrupted.store(false);
}

CLI::Option* add_sampling_options(CLI::App& app, SamplerParams& s) {
    app.add_option("--temp", s.temp, "temperature (0 = greedy)")
        ->capture_default_str()
        ->check(real_in(0.0, 100.0));
    app.add_option("--top-k", s.top_k, "keep the k most likely tokens (0 = off)")
        ->capture_default_str()
        ->check(int_in(0, 1 << 30));
    app.add_option("--top-p", s.top_p, "nucleus sampling mass (1 = off)")
        ->capture_default_str()
        ->check(real_in(0.0, 1.0));
    app.add_option("--min-p", s.min_p, "drop tokens below min-p × the best probability (0 = off)")
        ->capture_default_str()
        ->check(real_in(0.0, 1.0));
    app.add_option("--repeat-penalty", s.repeat_penalty,
                   "penalty for recently seen tokens (1 = off; more than 0)")
        ->capture_default_str()
        ->check(real_in(0.0, 100.0, true));
    app.add_option("--repeat-last-n", s.repeat_last_n,
                   "how many recent tokens the penalty looks at")
        ->capture_default_str()
        ->check(int_in(0, 1 << 20));
    // Random unless given: -1 asks for a random one too (llama.cpp's spelling).
    s.seed = std::random_device{}();
    return app
        .add_option_function<std::string>(
            "-s,--seed",
            [&s](const std::string& v) {
                if (v != "-1") s.seed = std::strtoull(v.c_str(), nullptr, 10);
            },
            "random seed, 0 to 18446744073709551615 (default and -1: random; printed with -v "
            "and in --json)")
        ->check(CLI::Validator(
            [](std::string& v) -> std::string {
                if (v == "-1") return {};
                errno = 0;
                char* end = nullptr;
                std::strtoull(v.c_str(), &end, 10);
                if (v.empty() || !std::isdigit(static_cast<unsigned char>(v[0])) || *end != '\0')
                    return "'" + v + "' is not a seed (a whole number from 0, or -1 for random)";
                if (errno == ERANGE)
                    return "'" + v + "' is out of range (0 to 18446744073709551615)";
                return {};
            },
            "SEED"));
}

namespace {
bool g_progress_shown = false;
}

void show_progress(int64_t done, int64_t total) {
    static const bool tty = ::isatty(2) == 1;
    if (!tty || total <= 0) return;
    fmt::print(stderr, "\r[kvrun] prompt {}/{} tokens ({}%)", done, total, done * 100 / total);
    std::fflush(stderr);
    g_progress_shown = true;
}

void clear_progress() {
    if (!g_progress_shown) return;
    fmt::print(stderr, "\r\033[K");
    std::fflush(stderr);
    g_progress_shown = false;
}

void add_model_option(CLI::App& app, CommonOptions& o) {
    app.add_option("-m,--model", o.model, "GGUF model file")->required();
}

void add_runtime_options(CLI::App& app, CommonOptions& o, bool auto_types) {
    app.add_option("-t,--threads", o.threads, "threads (default: physical cores)")
        ->check(int_in(0, 1024));
    const std::string types =
        std::string(kv_cache_type_names()) +
        (auto_types ? ", or auto (the largest type whose cache fits in memory)" : "");
    app.add_option("--cache-type-k,--ctk", o.cache_type_k, "KV cache type for K: " + types)
        ->capture_default_str();
    app.add_option("--cache-type-v,--ctv", o.cache_type_v, "KV cache type for V: " + types)
        ->capture_default_str();
    app.add_flag("--k-rotate", o.k_rotate,
                 "store keys rotated by an orthonormal Hadamard transform per head (queries too; "
                 "scores unchanged): 4-bit keys keep their quality (--ctk q4_0 --k-rotate); "
                 "4-bit values are rotated too (the output turned back)");
    app.add_flag("-v,--verbose", o.verbose, "log model and cache details to stderr");
    app.add_option(
        "--device", o.device,
        "where to compute: cpu, cuda or cuda:N (GPU N) (default: cpu, or cuda with -ngl)");
    add_offload_options(app, o);
    app.add_flag("--deterministic", o.deterministic,
                 "the same tokens whatever -b, -t, a reused prompt cache or chat history "
                 "(CPU only; slower prompts, see README)");
    app.add_flag("--precise", o.precise,
                 "CPU prompts skip the integer GEMM's 8-bit activations for OpenBLAS's or AMX's F32 "
                 "ones (the arithmetic the reference logits assume; slower prompts)");
}

void add_offload_options(CLI::App& app, CommonOptions& o) {
    app.add_option(
        "--n-gpu-layers", o.n_gpu_layers,
        "(-ngl) layers to run on the GPU: the first N, or all (default: all with --device cuda); "
        "the output head runs there when all layers do");
    app.add_option(
           "--kv-gpu-window", o.kv_gpu_window,
           "keep only the sinks and the newest W tokens of each offloaded layer's KV cache on the "
           "GPU; older ones are attended on the CPU from host memory (default 0: all on the GPU)")
        ->check(int_in(0, 1 << 30));
    app.add_flag("--cpu-moe", o.cpu_moe,
                 "a mixture of experts' routed experts stay in host memory and run on the CPU, "
                 "the rest of each layer (attention, router, shared expert, KV) where -ngl puts "
                 "it");
    app.add_option("--n-cpu-moe", o.n_cpu_moe, "the same for the first N layers' experts only")
        ->check(int_in(0, 1 << 16));
}

int resolve_cpu_moe(const CommonOptions& o, int n_layer) {
    return o.cpu_moe ? n_layer : std::clamp(o.n_cpu_moe, 0, n_layer);
}

int cuda_device_index(const std::string& d) {
    if (d.rfind("cuda:", 0) != 0) return 0;
    char* end = nullptr;
    errno = 0;
    const long v = std::strtol(d.c_str() + 5, &end, 10);
    if (*end != '\0' || errno != 0 || v < 0 || v > 1024 || end == d.c_str() + 5)
        fail(Exit::usage, "--device {}: expected cuda:N with N a GPU number", d);
    return static_cast<int>(v);
}

namespace {

bool is_cuda_device(const std::string& d) {
    return d == "cuda" || d.rfind("cuda:", 0) == 0;
}

// `what` names the flag that asked for the GPU, for the error message.
std::unique_ptr<gl::Backend> make_cuda(const std::string& d, const std::string& what,
                                       const gl::CudaOptions& opt) {
    const int id = cuda_device_index(d);
    std::string why;
    if (!gl::cuda_available(&why)) fail(Exit::usage, "{}: {}", what, why);
    try {
        return gl::make_cuda_backend(id, opt);
    } catch (const std::runtime_error& e) {
        fail(Exit::usage, "{}: {}", what, e.what());
    }
}

} // namespace

std::unique_ptr<gl::Backend> make_backend(const CommonOptions& o, int threads) {
    const std::string& d = o.device;
    if (d.empty() || d == "cpu") return gl::make_cpu_backend(threads, o.deterministic, o.precise);
    if (o.deterministic)
        fail(Exit::usage, "--deterministic runs on the CPU only (not with --device {})", d);
    if (is_cuda_device(d)) return make_cuda(d, "--device " + d, {o.kv_gpu_window, threads});
    fail(Exit::usage, "--device {}: unknown device (use cpu, cuda or cuda:N)", d);
}

// -ngl N without --device on a machine with no usable GPU: llama-cli warns
// and runs on the CPU, and launch scripts pass -ngl 99 everywhere, so kvrun
// does the same (once per run). An explicit --device cuda still fails.
bool gpu_layers_fall_back(const CommonOptions& o) {
    if (!o.device.empty()) return false;
    // Only a valid -ngl that asks for GPU layers ("x" and -1 are usage errors later).
    const std::string& n = o.n_gpu_layers;
    const bool layers =
        n == "all" || n == "auto" ||
        (!n.empty() && n.size() <= 9 && n.find_first_not_of("0123456789") == std::string::npos &&
         std::stol(n) > 0);
    if (!layers) return false;
    static const std::optional<std::string> why = [] {
        std::string w;
        return gl::cuda_available(&w) ? std::nullopt : std::optional<std::string>(w);
    }();
    static bool told = false;
    if (why && !told) {
        // Every GPU flag falls back with it: one line names them all.
        const std::string window =
            o.kv_gpu_window > 0 ? fmt::format(" --kv-gpu-window {}", o.kv_gpu_window) : "";
        const std::string experts = o.cpu_moe         ? " --cpu-moe"
                                    : o.n_cpu_moe > 0 ? fmt::format(" --n-cpu-moe {}", o.n_cpu_moe)
                                                      : "";
        fmt::print(stderr, "kvrun: warning: -ngl {}{}{}: {}; running on the CPU\n", o.n_gpu_layers,
                   window, experts, *why);
        told = true;
    }
    return why.has_value();
}

bool offloads_every_layer(const CommonOptions& o) {
    if (gpu_layers_fall_back(o)) return false;
    return o.n_gpu_layers == "all" || (o.n_gpu_layers.empty() && is_cuda_device(o.device));
}

LoadedModel::Layers layers_home(const CommonOptions& o) {
    if (offloads_every_layer(o)) return LoadedModel::Layers::gpu;
    if (gpu_layers_fall_back(o)) return LoadedModel::Layers::cpu;
    const std::string& n = o.n_gpu_layers;
    if (n.empty()) return is_cuda_device(o.device) ? LoadedModel::Layers::split
                                                   : LoadedModel::Layers::cpu;
    return n == "0" ? LoadedModel::Layers::cpu : LoadedModel::Layers::split;
}

int resolve_gpu_layers(const CommonOptions& o, int n_layer) {
    const std::string& d = o.device;
    if (!d.empty() && d != "cpu" && !is_cuda_device(d))
        fail(Exit::usage, "--device {}: unknown device (use cpu, cuda or cuda:N)", d);
    const std::string& s = o.n_gpu_layers;
    if (s.empty()) return is_cuda_device(d) ? n_layer : 0;
    if (s == "auto")
        fail(Exit::usage, "-ngl auto: this command does not fit a plan to the GPU; give a "
                          "number of layers or all");
    long n = n_layer;
    if (s != "all") {
        char* end = nullptr;
        errno = 0;
        n = std::strtol(s.c_str(), &end, 10);
        if (s.empty() || *end != '\0' || errno != 0 || n < 0)
            fail(Exit::usage, "-ngl {}: expected a number of layers or all", s);
    }
    if (n > 0 && d == "cpu")
        fail(Exit::usage,
             "-ngl {} puts layers on the GPU but --device is cpu (use --device cuda, or no "
             "--device)",
             s);
    return static_cast<int>(std::min<long>(n, n_layer));
}

Placement Backends::placement() const {
    if (!gpu) return Placement::all(*cpu, n_layer);
    Placement p = n_gpu_layers == n_layer ? Placement::all(*gpu, n_layer)
                                          : Placement::split(*gpu, *cpu, n_gpu_layers, n_layer);
    if (n_cpu_moe > 0) p.experts_on(*cpu, n_cpu_moe);
    return p;
}

std::string Backends::describe() const {
    const std::string window =
        kv_gpu_window > 0 ? fmt::format(", KV on the GPU: sinks + newest {} tokens", kv_gpu_window)
                          : "";
    if (!gpu) return cpu->name();
    const std::string experts =
        n_cpu_moe == 0 ? ""
        : n_cpu_moe == 1
            ? fmt::format(", {} for layer 0's experts", cpu->name())
            : fmt::format(", {} for the experts of layers 0-{}", cpu->name(), n_cpu_moe - 1);
    if (n_gpu_layers == n_layer) return gpu->name() + window + experts;
    return fmt::format("{} for layers 0-{}{}{}, {} for layers {}-{} and the output", gpu->name(),
                       n_gpu_layers - 1, window, experts, cpu->name(), n_gpu_layers, n_layer - 1);
}

namespace {

// -ngl auto: fit_gpu's plan for this run's cache in the device's free memory,
// said on stderr.
GpuPlan fit_to_device(const CommonOptions& o, const Hparams& hp, const GpuFitInput* fit) {
    if (!fit)
        fail(Exit::usage, "-ngl auto: this command does not fit a plan to the GPU; give a number "
                          "of layers or all");
    const int dev = cuda_device_index(o.device);
    uint64_t free_bytes = 0, total = 0;
    if (!gl::cuda_memory_info(dev, &free_bytes, &total))
        fail(Exit::usage, "-ngl auto: cannot read the free memory of CUDA device {}", dev);
    const KvCacheConfig& c = fit->cache;
    const GpuPlan g = fit_gpu(fit->file, hp, c.n_ctx, c.keep, c.type_k, c.type_v, o.kv_gpu_window,
                              fit->batch, free_bytes);
    const std::string experts =
        hp.is_moe() && g.n_gpu_layers > 0
            ? fmt::format(", the experts of {} of them on the host (--n-cpu-moe {})",
                          std::min(g.n_cpu_moe, g.n_gpu_layers), g.n_cpu_moe)
            : "";
    fmt::print(stderr, "kvrun: -ngl auto: {} of {} layers on the GPU{}: {} of its {} free\n",
               g.n_gpu_layers, hp.n_layer, experts, human_bytes(g.gpu_total()),
               human_bytes(free_bytes));
    return g;
}

} // namespace

Backends make_backends(const CommonOptions& o, int threads, const Hparams& hp,
                       const GpuFitInput* fit) {
    // OpenBLAS first, before the CUDA runtime's threads: its load sets an
    // environment variable (ggml-like/cpu/openblas.h).
    gl::gemm::load_blas();
    const int n_layer = hp.n_layer;
    Backends b;
    b.n_layer = n_layer;
    const bool fell_back = gpu_layers_fall_back(o);
    std::optional<GpuPlan> fitted;
    if (!fell_back && o.n_gpu_layers == "auto") {
        if (o.device == "cpu")
            fail(Exit::usage, "-ngl auto puts layers on the GPU but --device is cpu (use --device "
                              "cuda, or no --device)");
        fitted = fit_to_device(o, hp, fit);
    }
    b.n_gpu_layers = fell_back ? 0 : fitted ? fitted->n_gpu_layers : resolve_gpu_layers(o, n_layer);
    if (o.kv_gpu_window > 0 && b.n_gpu_layers == 0 && !fell_back)
        fail(Exit::usage, "--kv-gpu-window {} needs layers on the GPU (--device cuda or -ngl N)",
             o.kv_gpu_window);
    // The hot/cold split has only been checked on rings of one size.
    if (o.kv_gpu_window > 0 && !fell_back && !hp.swa_layers.empty())
        fail(Exit::usage,
             "--kv-gpu-window is not supported yet for models with sliding-window layers ({})",
             hp.arch);
    // An explicit --device cuda asks for a GPU whatever -ngl says: with -ngl 0
    // it fails on a machine without one, as --device cuda alone does.
    if (std::string why;
        b.n_gpu_layers == 0 && is_cuda_device(o.device) && !gl::cuda_available(&why))
        fail(Exit::usage, "--device {}: {}", o.device, why);
    if (o.deterministic && b.n_gpu_layers > 0)
        fail(Exit::usage, "--deterministic runs on the CPU only (not with -ngl or --device cuda)");
    // Gemma 4's window heads of their own size, shared K/V and per-layer
    // inputs and Qwen 3.5's recurrent layers have no CUDA path yet.
    if (b.n_gpu_layers > 0 && (hp.head_dim_swa > 0 || hp.n_kv_shared > 0 ||
                               hp.n_embd_per_layer > 0 || !hp.recurrent_layers.empty()))
        fail(Exit::usage, "{} models run on the CPU only for now (not with -ngl or --device cuda)",
             hp.arch);
    if (b.n_gpu_layers > 0) {
        const std::string d = is_cuda_device(o.device) ? o.device : "cuda";
        const std::string what =
            o.n_gpu_layers.empty() ? "--device " + d : "-ngl " + o.n_gpu_layers;
        b.gpu = make_cuda(d, what, {o.kv_gpu_window, threads});
        b.kv_gpu_window = o.kv_gpu_window;
    }
    // --cpu-moe / --n-cpu-moe with every layer on the CPU: nothing to keep
    // back, as -ngl without a GPU; said once.
    if ((o.cpu_moe || o.n_cpu_moe > 0) && b.n_gpu_layers == 0 && !fell_back) {
        static bool told = false;
        if (!told)
            fmt::print(stderr, "kvrun: warning: {}: {}; the experts run on the CPU with the rest\n",
                       o.cpu_moe ? "--cpu-moe" : fmt::format("--n-cpu-moe {}", o.n_cpu_moe),
                       hp.is_moe() ? "no layer is on a GPU" : "not a mixture of experts");
        told = true;
    }
    // Only offloaded layers' experts are kept back: the CPU's layers have theirs there already.
    b.n_cpu_moe = !hp.is_moe() ? 0
                               : std::min(fitted ? fitted->n_cpu_moe : resolve_cpu_moe(o, n_layer),
                                          b.n_gpu_layers);
    if (b.n_gpu_layers < n_layer || b.n_cpu_moe > 0)
        b.cpu = gl::make_cpu_backend(threads, o.deterministic, o.precise);
    return b;
}

int resolve_threads(int requested) {
    if (requested <= 0) return gl::ThreadPool::physical_cores();
    // More threads than CPUs: every step waits for a thread the scheduler
    // left out (a launcher's -t 8 on a 4-core laptop). Said once per run.
    static bool told = false;
    cpu_set_t set;
    CPU_ZERO(&set);
    const int cpus = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
    if (cpus > 0 && requested > cpus && !told) {
        fmt::print(stderr,
                   "kvrun: warning: -t {} is more threads than the {} CPU{} this process may "
                   "use; each step waits for the threads left out (leave -t out for {})\n",
                   requested, cpus, cpus == 1 ? "" : "s", gl::ThreadPool::physical_cores());
        told = true;
    }
    return requested;
}

gl::Type parse_cache_type(const std::string& name, const char* flag, bool auto_ok) {
    gl::Type t;
    if (!gl::type_from_name(name.c_str(), &t) || !kv_cache_type_ok(t))
        fail(Exit::usage, "{} {}: unsupported KV cache type (use {}{})", flag, name,
             auto_ok ? "auto, " : "", kv_cache_type_names());
    return t;
}

void set_cache_types(const CommonOptions& o, ContextRequest& req, bool auto_ok) {
    req.auto_k = auto_ok && is_auto(o.cache_type_k);
    req.auto_v = auto_ok && is_auto(o.cache_type_v);
    req.type_k =
        req.auto_k ? gl::Type::F16 : parse_cache_type(o.cache_type_k, "--cache-type-k", auto_ok);
    req.type_v =
        req.auto_v ? gl::Type::F16 : parse_cache_type(o.cache_type_v, "--cache-type-v", auto_ok);
    req.k_rotate = o.k_rotate;
    if (req.auto_k && o.k_rotate)
        fail(Exit::usage, "--ctk auto chooses whether keys are rotated: leave out --k-rotate");
}

std::vector<int32_t> parse_token_list(const std::string& s) {
    std::vector<int32_t> ids;
    std::string item;
    std::stringstream ss(s);
    while (std::getline(ss, item, ',')) {
        size_t b = item.find_first_not_of(" \t"), e = item.find_last_not_of(" \t");
        if (b == std::string::npos) fail(Exit::usage, "--tokens: empty item in '{}'", s);
        item = item.substr(b, e - b + 1);
        char* end = nullptr;
        errno = 0;
        long v = std::strtol(item.c_str(), &end, 10);
        if (*end != '\0' || errno != 0 || v < 0 || v > INT32_MAX)
            fail(Exit::usage, "--tokens: '{}' is not a token id", item);
        ids.push_back(static_cast<int32_t>(v));
    }
    if (ids.empty()) fail(Exit::usage, "--tokens: no token ids given");
    return ids;
}

std::vector<int> parse_count_list(const std::string& s, const char* what) {
    std::vector<int> v;
    std::stringstream ss(s);
    std::string item;
    while (std::getline(ss, item, ',')) {
        char* end = nullptr;
        long x = std::strtol(item.c_str(), &end, 10);
        if (item.empty() || *end || x < 0 || x > (1 << 24))
            fail(Exit::usage, "{}: '{}' is not a count", what, item);
        v.push_back(static_cast<int>(x));
    }
    return v;
}

bool stdin_has_data() {
    if (::isatty(0)) return false;
    struct stat st {};
    if (::fstat(0, &st) != 0) return false;
    return S_ISFIFO(st.st_mode) || S_ISREG(st.st_mode) || S_ISSOCK(st.st_mode);
}

std::string process_escapes(const std::string& s) {
    std::string out;
    out.reserve(s.size());
    for (size_t i = 0; i < s.size(); i++) {
        const char next = i + 1 < s.size() ? s[i + 1] : '\0';
        const char* from = "ntr\\\"'";
        const char* to = "\n\t\r\\\"'";
        const char* hit = s[i] == '\\' && next ? std::strchr(from, next) : nullptr;
        if (hit) {
            out += to[hit - from];
            i++;
        } else {
            out += s[i];
        }
    }
    return out;
}

void check_text_options(const CLI::App& app, bool escape, std::string& prompt, std::string& system,
                        std::vector<std::string>& stop) {
    if (app.count("--system") && app.count("--system-file"))
        fail(Exit::usage, "--system and --system-file exclude each other: use one");
    if (!escape) return;
    prompt = process_escapes(prompt);
    system = process_escapes(system);
    for (std::string& s : stop) s = process_escapes(s);
}

std::string read_prompt(const std::string& text, const std::string& file, bool have_text) {
    std::string prompt = text;
    if (!file.empty()) {
        std::string body;
        if (file == "-") {
            // Typed at a terminal, the prompt ends at Ctrl-D: say so, or the
            // run looks hung.
            if (::isatty(0) && ::isatty(2))
                fmt::print(stderr, "kvrun: reading the prompt from the terminal; end it with "
                                   "Ctrl-D on a line of its own\n");
            body.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
        } else {
            body = read_regular_file(file, "prompt file", Exit::usage);
        }
        prompt = have_text && !prompt.empty() ? prompt + "\n" + body : body;
    }
    size_t bad = 0;
    if (!unicode::valid_utf8(prompt, &bad))
        fail(Exit::usage, "the prompt is not valid UTF-8 (bad byte at offset {})", bad);
    return prompt;
}

std::string gpu_memory_summary(const gl::MemoryUse& u, int n_gpu_layers, int n_layer,
                               uint64_t kv_host_bytes) {
    if (!u.device) return {};
    return fmt::format("GPU {}/{} layers: weights {}{}, KV {} (host {}), scratch {}", n_gpu_layers,
                       n_layer, human_bytes(u.weights),
                       u.weights_mapped ? " + " + human_bytes(u.weights_mapped) + " mapped" : "",
                       human_bytes(u.kv), human_bytes(kv_host_bytes), human_bytes(u.scratch));
}

ContextPlan plan_and_tell(const LoadedModel& lm, const ContextRequest& req, bool verbose) {
    ContextPlan plan = plan_context(lm, req);
    for (const ContextPlan::Note& n : plan.notes)
        if (!n.verbose_only || verbose) fmt::print(stderr, "kvrun: {}\n", n.text);
    const int64_t trained = lm.model.hp.n_ctx_train;
    if (!plan.automatic && trained > 0 && plan.cache.n_ctx > trained)
        fmt::print(stderr,
                   "kvrun: warning: -c {} is more than the model's trained context of {} tokens: "
                   "positions past it may give poor text\n",
                   plan.cache.n_ctx, trained);
    return plan;
}

} // namespace kvrun::cli
