// User and file errors: thrown with context, caught in main, printed as one
// line on stderr, mapped to a documented exit status. Broken invariants use
// KV_ASSERT instead (always on; aborts with file and line).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace kvrun {

// Exit statuses, documented in `kvrun --help` and README.md.
enum class Exit : int {
    ok = 0,
    error = 1,            // anything not listed below (I/O, internal)
    usage = 2,            // bad flags or arguments
    bad_model = 3,        // unreadable, truncated or unsupported model file
    context_overflow = 4, // prompt does not fit the context
    out_of_memory = 5,    // the plan does not fit in memory
    template_error = 6,   // chat template problem
    interrupted = 130,    // Ctrl-C
};

class Error : public std::runtime_error {
  public:
    Error(Exit code, const std::string& what) : std::runtime_error(what), code_(code) {}
    Exit code() const { return code_; }

  private:
    Exit code_;
};

template <typename... Args>
[[noreturn]] void fail(Exit code, fmt::format_string<Args...> f, Args&&... args) {
    throw Error(code, fmt::format(f, std::forward<Args>(args)...));
}

} // namespace kvrun

#define KV_ASSERT(cond)                                                                            \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            std::fprintf(stderr, "kvrun: internal error: %s:%d: %s\n", __FILE__, __LINE__, #cond); \
            std::abort();                                                                          \
        }                                                                                          \
    } while (0)
