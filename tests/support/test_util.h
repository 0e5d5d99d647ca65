// Shared helpers for tests: where ../shared is, and running the kvrun binary
// (or the lab's).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kvtest {

// The ../shared folder next to the repository (CI has it there too), or
// $KVRUN_SHARED_DIR when set.
std::string shared(const std::string& rel);

// A real model fetched by scripts/fetch-real-models.sh (which `make test`
// runs first) into $KVRUN_MODEL_CACHE, default ~/.cache/kvrun-models. The
// path whether or not the file is there: tests that need it fail loudly,
// naming the script, when it is missing.
std::string real_model(const std::string& name);
// real_model(name) exists; otherwise records a failure that says how to get it.
bool have_real_model(const std::string& name);

struct RunResult {
    int status = -1; // exit status, or 128 + signal
    std::string out; // stdout
    std::string err; // stderr
};
// Run the kvrun binary built alongside the tests with these arguments,
// feeding `input` on stdin (closed afterwards; no stdin at all if null).
RunResult run_kvrun(const std::vector<std::string>& args, const std::string* input = nullptr);
// The same for another binary (e.g. KVRUN_LAB_BINARY, the lab tool).
RunResult run_binary(const std::string& binary, const std::vector<std::string>& args,
                     const std::string* input = nullptr);

// Non-empty lines of s.
std::vector<std::string> lines(const std::string& s);

// n normal floats (mean 0, sd `scale`) from a seeded generator.
std::vector<float> random_floats(size_t n, uint32_t seed, float scale = 1.0f);

} // namespace kvtest
