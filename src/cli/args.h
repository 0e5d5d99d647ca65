// The command line as every subcommand reads it: llama.cpp's spellings
// accepted as aliases, a repeated option's last value winning, numbers
// checked as numbers (NaN and infinities refused), --version, and every
// parse error as one line `kvrun: error: ... (see --help)` with status 2.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <CLI/CLI.hpp>

namespace kvrun::cli {

// Parse argv into app. nullopt: go on; otherwise the command ends now with
// that status (0 after --help or --version, 2 after printing a usage error).
// Before CLI11 sees argv, llama.cpp's multi-letter single-dash flags (-ctk,
// -ngl, -sys, -fa, ...) are rewritten to the options this app has, and a
// single-dash word that is neither an alias nor a valid cluster of short
// options is refused ("unknown option -xyz (did you mean --xyz?)"), so
// CLI11's clustering never turns `-ctk` into `-c tk`.
std::optional<int> parse_command_line(CLI::App& app, int argc, char** argv);

// Validators for numeric options: the value must be a finite number (of the
// option's kind) within [lo, hi]; the message says "is not a number" for
// text, NaN and infinities, and gives the range otherwise.
// above_lo: lo itself is refused too (--repeat-penalty must be more than 0).
CLI::Validator real_in(double lo, double hi, bool above_lo = false);
CLI::Validator int_in(int64_t lo, int64_t hi);

// "kvrun 0.1.0 (g1234abc, x86-64 kernels AVX2 AVX-512 AMX, OpenBLAS, CUDA; this CPU: avx512)"
std::string version_string();

} // namespace kvrun::cli
