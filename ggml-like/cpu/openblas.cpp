#include "ggml-like/cpu/openblas.h"

#include <cstdlib>
#include <cstring>
#include <string_view>

#include <fmt/format.h>

#if GL_USE_BLAS && !GL_BLAS_STATIC
#include <dlfcn.h>

#include "ggml-like/cpu/thread_pool.h"
#endif

#if GL_BLAS_STATIC
// The linked library's C interface (CBLAS enums are ints in its ABI).
extern "C" {
void cblas_sgemm(int, int, int, int, int, int, float, const float*, int, const float*, int, float,
                 float*, int);
void openblas_set_num_threads(int);
char* openblas_get_corename(void);
char* openblas_get_config(void);
}
#endif

namespace gl::openblas {

const char* core_for_this_cpu() {
#if defined(__x86_64__)
    __builtin_cpu_init(); // also called from the static build's preinit, before constructors
    // (GCC's checks include the OS saving the AVX and AVX-512 registers.)
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
        return "SkylakeX";
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
#endif
    return nullptr;
}

namespace {

#if GL_BLAS_STATIC
// Whether the preinit below set $OPENBLAS_CORETYPE (not the user).
bool g_core_chosen_here = false;

void choose_core(int, char**, char**) {
    if (std::getenv("OPENBLAS_CORETYPE")) return;
    if (const char* core = core_for_this_cpu()) {
        setenv("OPENBLAS_CORETYPE", core, 0);
        g_core_chosen_here = true;
    }
}
// Runs before every constructor, OpenBLAS's gotoblas_init among them.
[[gnu::section(".preinit_array"), gnu::used]] void (*const g_choose_core)(int, char**,
                                                                          char**) = choose_core;
#endif

#if GL_USE_BLAS
// Kernels older than Haswell's (SSE/AVX without FMA): what a DYNAMIC_ARCH
// OpenBLAS falls back to on a CPU it does not know.
bool generic_core(std::string_view core) {
    for (const char* old : {"prescott", "core2", "katmai", "coppermine", "northwood", "banias",
                            "atom", "penryn", "dunnington", "nehalem", "sandybridge"})
        if (core.size() == std::strlen(old) &&
            std::equal(core.begin(), core.end(), old,
                       [](char a, char b) { return (a | 0x20) == b; }))
            return true;
    return false;
}
#endif

struct Loaded {
    Api api;
    bool usable = false;
    std::string line; // describe()
};

Loaded load() {
    Loaded l;
#if !GL_USE_BLAS
    l.line = "built without OpenBLAS";
    return l;
#else
#if GL_BLAS_STATIC
    // The library's constructor has read the variable: the one set here goes.
    const bool chosen = g_core_chosen_here;
    if (chosen) unsetenv("OPENBLAS_CORETYPE");
    const char* user_core = std::getenv("OPENBLAS_CORETYPE");
    l.api.sgemm = cblas_sgemm;
    l.api.set_num_threads = openblas_set_num_threads;
    const char* (*corename)() = [] { return static_cast<const char*>(openblas_get_corename()); };
    const char* (*config)() = [] { return static_cast<const char*>(openblas_get_config()); };
#else
    const char* user_core = std::getenv("OPENBLAS_CORETYPE");
    // The variable is set for the load only: OpenBLAS reads it in its
    // constructor, and nothing else of kvrun's environment changes.
    const char* pick = user_core ? nullptr : core_for_this_cpu();
    if (pick) setenv("OPENBLAS_CORETYPE", pick, 1);
    void* h = nullptr;
    {
        const StopSignalsBlocked for_its_threads; // they start in its constructor
        h = dlopen("libopenblas.so.0", RTLD_NOW | RTLD_LOCAL);
        if (!h) h = dlopen("libopenblas.so", RTLD_NOW | RTLD_LOCAL);
    }
    if (pick) unsetenv("OPENBLAS_CORETYPE");
    if (!h) {
        l.line = "OpenBLAS not found (libopenblas.so.0)";
        return l;
    }
    const bool chosen = pick != nullptr;
    l.api.sgemm = reinterpret_cast<decltype(l.api.sgemm)>(dlsym(h, "cblas_sgemm"));
    l.api.set_num_threads =
        reinterpret_cast<decltype(l.api.set_num_threads)>(dlsym(h, "openblas_set_num_threads"));
    auto corename = reinterpret_cast<const char* (*)()>(dlsym(h, "openblas_get_corename"));
    auto config = reinterpret_cast<const char* (*)()>(dlsym(h, "openblas_get_config"));
    if (!l.api.sgemm || !l.api.set_num_threads || !corename || !config) {
        l.line = "libopenblas.so.0 lacks cblas_sgemm or openblas_*: not used";
        return l;
    }
#endif
    const std::string core = corename() ? corename() : "?";
    // "OpenBLAS 0.3.21 DYNAMIC_ARCH NO_AFFINITY Cooperlake MAX_THREADS=64": the first two words.
    std::string version = config() ? config() : "OpenBLAS";
    if (const size_t sp = version.find(' ', version.find(' ') + 1); sp != std::string::npos)
        version.resize(sp);
    const char* why = user_core ? "from $OPENBLAS_CORETYPE"
                      : chosen  ? (std::strcmp(core_for_this_cpu(), "SkylakeX") == 0
                                       ? "chosen by kvrun for AVX-512"
                                       : "chosen by kvrun for AVX2")
                                : "chosen by the library";
    if (!user_core && core_for_this_cpu() && generic_core(core)) {
        l.line = fmt::format("{} runs {} kernels on an AVX2 CPU: not used", version, core);
        return l;
    }
    l.usable = true;
    l.line = fmt::format("{}, {} kernels {}", version, core, why);
    return l;
#endif
}

const Loaded& loaded() {
    static const Loaded l = load();
    return l;
}

} // namespace

const Api* api() {
    return loaded().usable ? &loaded().api : nullptr;
}

std::string describe() {
    return loaded().line;
}

} // namespace gl::openblas
