// Pieces every subcommand shares: common flags, cache types, the interrupt
// flag, reading prompts.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "ggml-like/types.h"

namespace kvrun::cli {

struct CommonOptions {
    std::string model;
    int threads = 0; // 0 = physical cores
    std::string cache_type_k = "f16", cache_type_v = "f16";
    bool verbose = false;
};

void add_model_option(CLI::App& app, CommonOptions& o);
void add_runtime_options(CLI::App& app, CommonOptions& o); // -t, cache types, -v
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

std::string human_bytes(uint64_t b);

int run_generate(int argc, char** argv);
int run_tokenize(int argc, char** argv);
int run_logits(int argc, char** argv);
int run_info(int argc, char** argv);
int run_synth(int argc, char** argv);
int run_quantize(int argc, char** argv);
int run_perplexity(int argc, char** argv);
int run_bench(int argc, char** argv);

} // namespace kvrun::cli
