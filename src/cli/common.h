// Pieces every subcommand shares: common flags, cache types, the interrupt
// flag, reading prompts.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "ggml-like/backend.h"
#include "ggml-like/types.h"
#include "sampler.h"

namespace kvrun::cli {

struct CommonOptions {
    std::string model;
    int threads = 0; // 0 = physical cores
    std::string cache_type_k = "f16", cache_type_v = "f16";
    bool verbose = false;
    std::string device = "cpu"; // --device: cpu, cuda or cuda:N
};

void add_model_option(CLI::App& app, CommonOptions& o);
void add_runtime_options(CLI::App& app, CommonOptions& o); // -t, cache types, -v, --device
// The backend --device asks for; throws Error(usage) for a device this build
// or machine lacks (the message says why, e.g. "kvrun was built without CUDA").
std::unique_ptr<gl::Backend> make_backend(const CommonOptions& o, int threads);
int resolve_threads(int requested);
gl::Type parse_cache_type(const std::string& name, const char* flag);

// "1,2, 3" -> ids; throws Error(usage) on junk.
std::vector<int32_t> parse_token_list(const std::string& s);
// Prompt from -p and/or -f (FILE, or - for stdin); validated as UTF-8.
std::string read_prompt(const std::string& text, const std::string& file, bool have_text);

// Ctrl-C: the first sets the flag (the current generation stops cleanly);
// a second one while the flag is still set exits at once with 130.
void install_interrupt_handler();
bool interrupted();
// The chat REPL: an answer was stopped, the next one may run.
void clear_interrupt();

// --temp, --top-k, --top-p, --min-p, --repeat-penalty, --repeat-last-n,
// --seed (returned: was it given?).
CLI::Option* add_sampling_options(CLI::App& app, SamplerParams& s);

// A one-line "prompt N/M tokens" indicator on stderr, only when stderr is a
// terminal (pipes and logs never see it); clear it before printing anything else.
void show_progress(int64_t done, int64_t total);
void clear_progress();

std::string human_bytes(uint64_t b);

int run_generate(int argc, char** argv);
int run_tokenize(int argc, char** argv);
int run_logits(int argc, char** argv);
int run_info(int argc, char** argv);
int run_synth(int argc, char** argv);
int run_quantize(int argc, char** argv);
int run_perplexity(int argc, char** argv);
int run_chat(int argc, char** argv);
int run_bench(int argc, char** argv);

} // namespace kvrun::cli
