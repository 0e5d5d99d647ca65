// Pieces every subcommand shares: common flags, cache types, the interrupt
// flag, reading prompts.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli/args.h"
#include "cli/output.h"

#include "ggml-like/backend.h"
#include "context.h"
#include "loader.h"
#include "format.h"
#include "forward.h"
#include "ggml-like/types.h"
#include "sampler.h"

namespace kvrun::cli {

struct CommonOptions {
    std::string model;
    int threads = 0; // 0 = physical cores
    std::string cache_type_k = "f16", cache_type_v = "f16";
    bool verbose = false;
    std::string device;       // --device: cpu, cuda or cuda:N; "" = cpu (cuda with -ngl N)
    std::string n_gpu_layers; // -ngl N | all; "" = all with --device cuda, none on the CPU
    int kv_gpu_window = 0;    // --kv-gpu-window W; 0 = each offloaded layer's whole ring on the GPU
    bool cpu_moe = false;     // --cpu-moe: every layer's experts in host memory
    int n_cpu_moe = 0;        // --n-cpu-moe N: the first N layers' experts in host memory
    bool deterministic = false; // --deterministic: batch- and thread-invariant CPU arithmetic
    bool precise = false;       // --precise: F32 activations for CPU prompt batches
    bool k_rotate = false; // --k-rotate: keys stored in Hadamard blocks (ContextRequest::k_rotate)
};

void add_model_option(CLI::App& app, CommonOptions& o);
// -t, cache types, -v, --device, -ngl, --kv-gpu-window, --deterministic, --precise
void add_runtime_options(CLI::App& app, CommonOptions& o, bool auto_types = false);
// -ngl and --kv-gpu-window alone (for subcommands with their own --device).
void add_offload_options(CLI::App& app, CommonOptions& o);
// The backend --device asks for; throws Error(usage) for a device this build
// or machine lacks (the message says why, e.g. "kvrun was built without CUDA").
std::unique_ptr<gl::Backend> make_backend(const CommonOptions& o, int threads);

// How many of n_layer layers run on the GPU: -ngl N (clamped to n_layer) or
// all, else all with --device cuda and none otherwise. Throws Error(usage)
// for junk or for -ngl N > 0 with --device cpu.
int resolve_gpu_layers(const CommonOptions& o, int n_layer);
// How many layers keep a mixture's experts in host memory: all with
// --cpu-moe, else --n-cpu-moe N (clamped to n_layer).
int resolve_cpu_moe(const CommonOptions& o, int n_layer);
// N of --device cuda:N (0 for cuda or no device); Error(usage) on a bad N.
int cuda_device_index(const std::string& device);
// Whether the options put every layer on the GPU (-ngl all, or --device cuda
// without -ngl), known before the model is: then the CPU never streams the
// weights, and loading leaves them in the file mapping. Invalid options are
// left for resolve_gpu_layers to reject.
bool offloads_every_layer(const CommonOptions& o);
// Where the options put the layers, for LoadedModel::load (cpu, split or
// gpu), known before the model is. Invalid options count as split (nothing
// packed); resolve_gpu_layers rejects them after.
LoadedModel::Layers layers_home(const CommonOptions& o);

// The backends of a run and which layers each runs (Placement in forward.h):
// the first n_gpu_layers on the GPU, the rest and, unless the GPU holds every
// layer, the output head on the CPU; a mixture's first n_cpu_moe layers'
// routed experts on the CPU too.
struct Backends {
    std::unique_ptr<gl::Backend> gpu; // null when no layer is offloaded
    std::unique_ptr<gl::Backend> cpu; // null when the GPU runs everything
    int n_gpu_layers = 0, n_layer = 0;
    int n_cpu_moe = 0; // offloaded layers 0.. whose experts run on the CPU (--cpu-moe, --n-cpu-moe)
    int kv_gpu_window = 0;
    Placement placement() const;
    // For -v and logs: "cpu/avx2", "cuda:0 (...)", or both with their layers.
    std::string describe() const;
};
// Throws Error(usage) like make_backend ("-ngl 4: kvrun was built without CUDA").
// What -ngl auto fits to the device's free memory (fit_gpu): the file and
// the run's cache and batch. Commands without a memory plan pass none, and
// -ngl auto is then a usage error.
struct GpuFitInput {
    const GgufFile& file;
    const KvCacheConfig& cache;
    int batch = 512;
};
Backends make_backends(const CommonOptions& o, int threads, const Hparams& hp,
                       const GpuFitInput* fit = nullptr);
int resolve_threads(int requested);
// plan_context, with what it decided told on stderr ("kvrun: -c auto reduced
// to ..."; the notes meant for -v only with `verbose`).
ContextPlan plan_and_tell(const LoadedModel& lm, const ContextRequest& req, bool verbose);
gl::Type parse_cache_type(const std::string& name, const char* flag, bool auto_ok = false);
// The cache fields of a ContextRequest from --ctk, --ctv and --k-rotate;
// "auto" accepted where `auto_ok` (run and chat: they have a memory plan).
void set_cache_types(const CommonOptions& o, ContextRequest& req, bool auto_ok);

// run and chat: --system with --system-file is an error; with -e, escapes in
// the prompt, the system text and the stop strings are processed.
void check_text_options(const CLI::App& app, bool escape, std::string& prompt, std::string& system,
                        std::vector<std::string>& stop);
// "1,2, 3" -> ids; throws Error(usage) on junk.
std::vector<int32_t> parse_token_list(const std::string& s);
// "512,0,4096" -> counts in [0, 2^24] (bench's and kvrun-lab's -p/-n/-d/-t);
// throws Error(usage) naming `what` on junk.
std::vector<int> parse_count_list(const std::string& s, const char* what);
// -e (--escape), as llama-cli does it: \\n \\t \\r \\\\ \\" \\' become the
// characters; any other backslash stays as written.
std::string process_escapes(const std::string& s);
// Whether stdin can be the input when no -p or -f is given (the rule of run,
// chat and tokenize): a pipe, a file or a socket. A terminal is not read (that
// would wait for typing), nor is a closed stdin or a character device.
bool stdin_has_data();
// Prompt from -p and/or -f (FILE, or - for stdin); validated as UTF-8.
std::string read_prompt(const std::string& text, const std::string& file, bool have_text);

// Ctrl-C (SIGINT) and SIGTERM: while a StopPoint is live, the first sets the
// flag (the current generation stops cleanly, a file being written is
// finished); a second one, or one while no StopPoint is live, removes the
// temporaries of files being written and exits at once. Statuses: 130 for
// SIGINT, 143 for SIGTERM (interrupted_status()).
void install_interrupt_handler();
// A scope whose loop polls interrupted() often (generation, perplexity,
// bench, the chat REPL, the lab's probes): a stop signal there only sets the
// flag. (quantize has none: a signal ends it, its output's temporary removed.)
class StopPoint {
  public:
    StopPoint();
    ~StopPoint();
    StopPoint(const StopPoint&) = delete;
    StopPoint& operator=(const StopPoint&) = delete;
};
bool interrupted();
// The stop was SIGTERM's (the chat REPL leaves instead of clearing the line).
bool terminated();
// 128 + the signal that stopped the run (130 when none did).
int interrupted_status();
// The chat REPL: an answer was stopped, the next one may run (not after
// SIGTERM, which stops the REPL as well).
void clear_interrupt();

// --temp, --top-k, --top-p, --min-p, --repeat-penalty, --repeat-last-n,
// --seed (returned: was it given?).
CLI::Option* add_sampling_options(CLI::App& app, SamplerParams& s);

// A one-line "prompt N/M tokens" indicator on stderr, only when stderr is a
// terminal (pipes and logs never see it); clear it before printing anything else.
void show_progress(int64_t done, int64_t total);
void clear_progress();

// "GPU 22/22 layers: weights 600.00 MiB, KV 44.00 MiB (host 44.00 MiB), scratch
// 9.50 MiB" from a backend's memory_use (weights mapped in place, if any,
// after the weights); "" when u.device is false (no GPU in the run). For the
// run's stats line and chat's /stats.
std::string gpu_memory_summary(const gl::MemoryUse& u, int n_gpu_layers, int n_layer,
                               uint64_t kv_host_bytes);

int run_generate(int argc, char** argv);
int run_tokenize(int argc, char** argv);
int run_logits(int argc, char** argv);
int run_info(int argc, char** argv);
int run_synth(int argc, char** argv);
int run_quantize(int argc, char** argv);
int run_perplexity(int argc, char** argv);
int run_chat(int argc, char** argv);
int run_bench(int argc, char** argv);
int run_batch(int argc, char** argv);
int run_serve(int argc, char** argv);

} // namespace kvrun::cli
