#include "ggml-like/cpu/gemm.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "ggml-like/kernels.h"

#include "ggml-like/cpu/openblas.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "ggml-like/cpu/x86/amx.h"
#define GL_HAVE_AMX 1
#endif

namespace gl::gemm {

namespace {

std::atomic<bool> g_forced_off{false};

#if GL_HAVE_AMX
// CPUID.(7,0):EDX bit 22 AMX-BF16, bit 24 AMX-TILE; CPUID.(7,1):EAX bit 5
// AVX512-BF16 (used to pack); XCR0 bits 17-18 = the OS saves tile state.
// Linux then hands out tile data per process on request (arch_prctl
// ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA = 18); without it the first tile
// instruction faults.
bool probe_amx() {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    if (!(d & (1u << 22)) || !(d & (1u << 24))) return false;
    if (!__get_cpuid_count(7, 1, &a, &b, &c, &d) || !(a & (1u << 5))) return false;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return false; // OSXSAVE
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & (3u << 17)) != (3u << 17)) return false;
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}
#endif

// KVRUN_AMX=0 / KVRUN_BLAS=0 switch a path off.
bool switched_off(const char* env) {
    const char* e = std::getenv(env);
    return e && std::strcmp(e, "0") == 0;
}

// Scratch blocks start on a cache line.
[[maybe_unused]] uint8_t* align64(uint8_t* p) {
    return p + (64 - reinterpret_cast<uintptr_t>(p) % 64) % 64;
}

bool amx_present() {
#if GL_HAVE_AMX
    static const bool ok = !switched_off("KVRUN_AMX") && probe_amx();
    return ok;
#else
    return false;
#endif
}

#if GL_HAVE_AMX
// Per-thread scratch of matmul_tiles: one bf16 panel (hi and lo), one float row, alignment slack.
size_t per_thread_bytes(int64_t n_in) {
    return 2 * sizeof(uint16_t) * amx::kPanelRows * n_in +
           sizeof(float) * static_cast<size_t>(n_in) + 64;
}
#endif

// The OpenBLAS path: each thread of our pool dequantizes a panel of weight
// rows to F32 and calls a single-threaded SGEMM for all tokens; OpenBLAS's own
// threads would fight ours for the same cores.
constexpr int64_t kBlasPanelRows =
    128; // SGEMM at 64 rows ran ~8% slower (one core, K 2048, 256 tokens)

size_t blas_per_thread_bytes(int64_t n_in) {
    return sizeof(float) * static_cast<size_t>(kBlasPanelRows * n_in) + 64;
}

// Not switched off, and the library loaded with kernels for this CPU
// (openblas.h); pinned to one thread of its own once, when loaded.
bool blas_allowed() {
    static const bool ok = [] {
        if (switched_off("KVRUN_BLAS")) return false;
        const openblas::Api* api = openblas::api();
        if (api) api->set_num_threads(1);
        return api != nullptr;
    }();
    return ok;
}

} // namespace

bool amx_enabled() {
    return !g_forced_off.load(std::memory_order_relaxed) && amx_present() &&
           std::strcmp(cpu::isa_name(), "avx512") == 0;
}

void force_off(bool off) {
    g_forced_off.store(off, std::memory_order_relaxed);
}

bool blas_enabled() {
    // Not under KVRUN_ISA=scalar (or force_scalar): that mode is the plain
    // reference path, which tests compare everything against.
    return !g_forced_off.load(std::memory_order_relaxed) && blas_allowed() &&
           std::strcmp(cpu::isa_name(), "scalar") != 0;
}

void load_blas() {
    blas_allowed();
}

std::string blas_description() {
    if (switched_off("KVRUN_BLAS")) return "OpenBLAS switched off (KVRUN_BLAS=0)";
    return openblas::describe();
}

Path path_for(Type weight, int64_t n_in, int64_t n_tok) {
    if (n_tok < kMinTokens) return Path::None;
    // Float weights keep their exact path (F32, and F16: measured with a
    // single bf16 part, tiny-f16 goldens 0.0008 -> 0.016; the hi + lo split
    // now used for the others was not tried on them).
    if (n_in % 32 == 0 && weight != Type::F32 && weight != Type::F16 && amx_enabled())
        return Path::Amx;
    // SGEMM on exactly dequantized weights and F32 activations: at least as
    // accurate as the dot-product path for every type.
    if (blas_enabled()) return Path::Blas;
    return Path::None;
}

bool applies(Type weight, int64_t n_in, int64_t n_tok) {
    return path_for(weight, n_in, n_tok) != Path::None;
}

const char* path_name(Path p) {
    switch (p) {
    case Path::Amx:
        return "amx-bf16";
    case Path::Blas:
        return "openblas";
    case Path::None:
        break;
    }
    return "dot products";
}

size_t scratch_bytes(int64_t n_in, int64_t n_tok, int n_threads) {
    size_t bytes = 0;
#if GL_HAVE_AMX
    const int64_t n_tt = (n_tok + amx::kTileTokens - 1) / amx::kTileTokens;
    const size_t tokens =
        2 * sizeof(uint16_t) * static_cast<size_t>(n_tt * amx::kTileTokens * n_in);
    bytes = tokens + 64 + per_thread_bytes(n_in) * static_cast<size_t>(n_threads);
#endif
    if (blas_allowed())
        bytes = std::max(bytes, blas_per_thread_bytes(n_in) * static_cast<size_t>(n_threads));
    (void)n_in, (void)n_tok, (void)n_threads;
    return bytes;
}

namespace {

// y[t][r] for a panel of rows at a time: the weight rows dequantized once per
// batch (F32 weights used in place), then one SGEMM against all n_tok tokens.
void matmul_blas(ThreadPool& pool, const Tensor& w, const float* x, int64_t n_tok, float* y,
                 void* scratch) {
    const auto sgemm = openblas::api()->sgemm;
    const int64_t n_in = w.ne0, n_out = w.ne1;
    auto* base = static_cast<uint8_t*>(scratch);
    const size_t per_thread = blas_per_thread_bytes(n_in);
    const int64_t n_panels = (n_out + kBlasPanelRows - 1) / kBlasPanelRows;
    pool.parallel_for(
        n_panels,
        [&](int64_t pb, int64_t pe, int ith) {
            auto* panel = reinterpret_cast<float*>(align64(base + per_thread * ith));
            for (int64_t p = pb; p < pe; p++) {
                const int64_t r0 = p * kBlasPanelRows;
                const int64_t rows = std::min(kBlasPanelRows, n_out - r0);
                // F32 weights are used in place, with their row stride.
                const float* a = panel;
                int lda = static_cast<int>(n_in);
                if (w.type == Type::F32) {
                    a = reinterpret_cast<const float*>(w.row(r0));
                    lda = static_cast<int>(w.row_bytes / sizeof(float));
                } else {
                    for (int64_t r = 0; r < rows; r++)
                        cpu::dequantize_row(w.type, w.row(r0 + r), panel + r * n_in, n_in);
                }
                // y[t][r0 + r] = sum_k x[t][k] * a[r][k]
                sgemm(openblas::kRowMajor, openblas::kNoTrans, openblas::kTrans,
                      static_cast<int>(n_tok), static_cast<int>(rows), static_cast<int>(n_in), 1.0f,
                      x, static_cast<int>(n_in), a, lda, 0.0f, y + r0, static_cast<int>(n_out));
            }
        },
        n_out * n_in * n_tok);
}

void matmul_amx(ThreadPool& pool, const Tensor& w, const float* x, int64_t n_tok, float* y,
                void* scratch) {
#if GL_HAVE_AMX
    const int64_t n_in = w.ne0, n_out = w.ne1;
    const int64_t n_tt = (n_tok + amx::kTileTokens - 1) / amx::kTileTokens;
    uint16_t* xv = reinterpret_cast<uint16_t*>(align64(static_cast<uint8_t*>(scratch)));
    uint8_t* thread_base = reinterpret_cast<uint8_t*>(xv + 2 * n_tt * amx::kTileTokens * n_in);
    const size_t per_thread = per_thread_bytes(n_in);

    pool.parallel_for(
        n_tt, [&](int64_t b, int64_t e, int) { amx::pack_tokens(x, n_in, n_tok, b, e, xv); },
        n_tok * n_in);

    const int64_t n_panels = (n_out + amx::kPanelRows - 1) / amx::kPanelRows;
    pool.parallel_for(
        n_panels,
        [&](int64_t pb, int64_t pe, int ith) {
            uint8_t* mine = align64(thread_base + per_thread * ith);
            uint16_t* panel = reinterpret_cast<uint16_t*>(mine);
            float* row = reinterpret_cast<float*>(panel + 2 * amx::kPanelRows * n_in);
            for (int64_t p = pb; p < pe; p++) {
                const int64_t r0 = p * amx::kPanelRows;
                const int rows = static_cast<int>(std::min<int64_t>(amx::kPanelRows, n_out - r0));
                for (int r = 0; r < amx::kPanelRows; r++) {
                    if (r < rows) {
                        cpu::dequantize_row(w.type, w.row(r0 + r), row, n_in);
                    } else {
                        std::memset(row, 0, sizeof(float) * n_in);
                    }
                    amx::panel_row(row, n_in, r, panel);
                }
                amx::panel_matmul(panel, n_in, xv, n_tok, y + r0, n_out, rows);
            }
        },
        n_out * n_in * n_tok);
#else
    (void)pool, (void)w, (void)x, (void)n_tok, (void)y, (void)scratch;
    std::abort(); // path_for() never answers Amx in builds without AMX kernels
#endif
}

} // namespace

void matmul_tiles(ThreadPool& pool, const Tensor& w, const float* x, int64_t n_tok, float* y,
                  void* scratch, int64_t batch_tok) {
    switch (path_for(w.type, w.ne0, std::max(n_tok, batch_tok))) {
    case Path::Amx:
        return matmul_amx(pool, w, x, n_tok, y, scratch);
    case Path::Blas:
        return matmul_blas(pool, w, x, n_tok, y, scratch);
    case Path::None:
        break;
    }
    std::abort(); // callers check applies() first
}

} // namespace gl::gemm
