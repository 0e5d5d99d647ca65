// Picks the kernel table for this CPU once, and routes gl::cpu::* through it.
//
// The per-ISA files are compiled with their own -m flags and only on their
// architecture, so this file names their tables only under the matching
// #if and asks the CPU (cpuid / hwcaps) before using one: a binary built on an
// AVX-512 machine must still run on an AVX2-only one.
#include "ggml-like/kernels.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#if defined(__x86_64__)
#include <cpuid.h>
#endif
#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#endif

namespace gl {

#if defined(__x86_64__)
extern const KernelTable kAvx512Table; // x86/avx512.cpp
extern const KernelTable kAvx2Table;   // x86/avx2.cpp
extern const KernelTable kAvxVnniTable; // x86/avx2.cpp, with x86/avxvnni_chain.cpp
#endif
#if defined(__aarch64__)
extern const KernelTable kNeonTable; // arm/neon.cpp
#endif

namespace {

// All members null: every entry falls back to gl::ref.
constexpr KernelTable kScalarTable = {"scalar", {}, {}, {},      {},      {}, {},
                                      {},       {}, {}, nullptr, nullptr, nullptr, {}, {}, {}};

#if defined(__x86_64__)
// AVX-VNNI (the VEX vpdpbusd): cpuid leaf 7, subleaf 1, EAX bit 4. (GCC 12's
// __builtin_cpu_supports("avxvnni") answers false on CPUs that have it.)
bool cpu_has_avxvnni() {
    unsigned a = 0, b = 0, c = 0, d = 0;
    constexpr unsigned kAvxVnniBit = 1u << 4;
    return __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & kAvxVnniBit);
}

// Asked through cpuid because older clang's __builtin_cpu_supports does not
// know "f16c". (AVX state support by the OS is checked by the builtins for
// avx2/avx512f, and F16C uses the same registers.)
bool cpu_has_f16c() {
    unsigned a = 0, b = 0, c = 0, d = 0;
    constexpr unsigned kF16cBit = 1u << 29; // CPUID.1:ECX.F16C
    return __get_cpuid(1, &a, &b, &c, &d) && (c & kF16cBit);
}

// AMD (and Hygon, its licensee) cores: cpuid leaf 0's vendor string.
bool cpu_is_amd() {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid(0, &a, &b, &c, &d)) return false;
    char vendor[13] = {};
    std::memcpy(vendor, &b, 4);
    std::memcpy(vendor + 4, &d, 4);
    std::memcpy(vendor + 8, &c, 4);
    return std::strcmp(vendor, "AuthenticAMD") == 0 || std::strcmp(vendor, "HygonGenuine") == 0;
}
#endif

// Whether a K-quant matrix-vector product should stream its rows one at a
// time (a vec_dot per row) rather than through the table's four-rows-at-once
// matvec. Four K-quant rows side by side share each activation block, which
// measured +30% Q4_K_M generation on an AMX Xeon; on Zen 4 the same loop
// reads DRAM at half the rate of one row at a time (TinyLlama Q4_K_M, 2
// threads: 19 against 34 GB/s, 97% of a plain read; docs/performance.md).
// The 32-element types keep four rows on both: their loop prefetches the
// four rows' span linearly and measured faster than one row on Zen 4 too.
bool k_quants_row_at_a_time() {
#if defined(__x86_64__)
    return cpu_is_amd();
#else
    return false;
#endif
}

constexpr bool is_k_quant(uint32_t id) {
    return id == static_cast<uint32_t>(Type::Q2_K) || id == static_cast<uint32_t>(Type::Q3_K) ||
           id == static_cast<uint32_t>(Type::Q4_K) || id == static_cast<uint32_t>(Type::Q5_K) ||
           id == static_cast<uint32_t>(Type::Q6_K);
}

bool cpu_has(const char* isa) {
#if defined(__x86_64__)
    if (std::strcmp(isa, "avx512") == 0)
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
               __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx2") &&
               __builtin_cpu_supports("fma") && cpu_has_f16c();
    if (std::strcmp(isa, "avx2") == 0)
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c();
    if (std::strcmp(isa, "avxvnni") == 0)
        return cpu_has("avx2") && cpu_has_avxvnni();
#elif defined(__aarch64__)
    if (std::strcmp(isa, "neon") == 0) {
#if defined(__linux__)
        // The table is built for armv8.2-a+dotprod+fp16: it needs the
        // dot-product instructions (absent on e.g. Cortex-A72) and, since the
        // compiler may use them, the half-precision ones.
        constexpr unsigned long kHwcapAsimdhp = 1ul << 10, kHwcapAsimddp = 1ul << 20;
        const unsigned long hw = getauxval(AT_HWCAP);
        return (hw & kHwcapAsimddp) && (hw & kHwcapAsimdhp);
#elif defined(__APPLE__)
        return true; // every Apple arm64 chip macOS runs on has dotprod
#else
        return false;
#endif
    }
#endif
    (void)isa;
    return false;
}

struct Tables {
    const KernelTable* t[8] = {}; // more than the candidates of any architecture
    int n = 0;
    bool k_row_at_a_time = k_quants_row_at_a_time();
    void add(const KernelTable* k) { t[n++] = k; }
};

// Tables usable here, best first. KVRUN_ISA=<name> caps the list at that
// table, so "best" (entry 0) is the one asked for and the tests still see the
// scalar one; an unknown or unavailable name is reported and ignored.
Tables build_tables() {
    struct Candidate {
        const char* isa;
        const KernelTable* table;
    };
    const Candidate all[] = {
#if defined(__x86_64__)
        {"avx512", &kAvx512Table},
        {"avxvnni", &kAvxVnniTable},
        {"avx2", &kAvx2Table},
#endif
#if defined(__aarch64__)
        {"neon", &kNeonTable},
#endif
        {"scalar", &kScalarTable},
    };
    const char* want = std::getenv("KVRUN_ISA");
    if (want && (!*want || std::strcmp(want, "auto") == 0)) want = nullptr;
    bool known = !want;
    for (const Candidate& c : all) known = known || std::strcmp(want, c.isa) == 0;
    if (!known) {
        std::fprintf(stderr, "kvrun: warning: KVRUN_ISA=%s is not built in or unknown; ignored\n",
                     want);
        want = nullptr;
    }

    Tables out;
    bool started = !want;
    for (const Candidate& c : all) {
        if (!started && std::strcmp(want, c.isa) == 0) started = true;
        if (!started) continue;
        if (c.table == &kScalarTable || cpu_has(c.isa)) {
            out.add(c.table);
        } else if (want && std::strcmp(want, c.isa) == 0) {
            std::fprintf(stderr, "kvrun: warning: KVRUN_ISA=%s but this CPU lacks it\n", want);
        }
    }
    return out;
}

const Tables& tables() {
    static const Tables t = build_tables(); // thread-safe one-time init
    return t;
}

std::atomic<bool> g_force_scalar{false};

const KernelTable& active() {
    return g_force_scalar.load(std::memory_order_relaxed) ? kScalarTable : *tables().t[0];
}

} // namespace

int kernel_table_count() {
    return tables().n;
}

const KernelTable& kernel_table(int i) {
    const Tables& t = tables();
    return (i >= 0 && i < t.n) ? *t.t[i] : kScalarTable;
}

namespace cpu {

const char* isa_name() {
    return active().isa;
}

float vec_dot(Type weight, int64_t n, const void* w, const void* a) {
    const uint32_t id = static_cast<uint32_t>(weight);
    if (id < kTypeIdLimit) {
        if (auto f = active().vec_dot[id]) return f(n, w, a);
    }
    return ref::vec_dot(weight, n, w, a);
}

void matvec(Type weight, int64_t n, const void* w, size_t row_bytes, int64_t n_rows, const void* a,
            float* y) {
    const uint32_t id = static_cast<uint32_t>(weight);
    if (id < kTypeIdLimit && !(is_k_quant(id) && tables().k_row_at_a_time)) {
        if (auto f = active().matvec[id]) return f(n, w, row_bytes, n_rows, a, y);
    }
    const auto* row = static_cast<const uint8_t*>(w);
    for (int64_t r = 0; r < n_rows; r++) y[r] = vec_dot(weight, n, row + r * row_bytes, a);
}

bool has_gemm(Type weight) {
    const uint32_t id = static_cast<uint32_t>(weight);
    return id < kTypeIdLimit && active().gemm[id] != nullptr;
}

void gemm(Type weight, int64_t n, const void* w, size_t row_bytes, int64_t n_rows,
          const Q8Tokens& a, float* y, size_t y_stride, void* scratch) {
    active().gemm[static_cast<uint32_t>(weight)](n, w, row_bytes, n_rows, a, y, y_stride, scratch);
}

bool has_packed_gemm(Type weight) {
    const uint32_t id = static_cast<uint32_t>(weight);
    return id < kTypeIdLimit && active().gemm_packed[id] != nullptr;
}

void gemm_packed(Type weight, int64_t n, const void* panels, int64_t n_rows, const Q8Tokens& a,
                 float* y, size_t y_stride) {
    active().gemm_packed[static_cast<uint32_t>(weight)](n, panels, n_rows, a, y, y_stride);
}

void quantize_row(Type t, const float* src, void* dst, int64_t n) {
    const uint32_t id = static_cast<uint32_t>(t);
    if (id < kTypeIdLimit) {
        if (auto f = active().quantize_row[id]) return f(src, dst, n);
    }
    ref::quantize_row(t, src, dst, n);
}

void dequantize_row(Type t, const void* src, float* dst, int64_t n) {
    const uint32_t id = static_cast<uint32_t>(t);
    if (id < kTypeIdLimit) {
        if (auto f = active().dequantize_row[id]) return f(src, dst, n);
    }
    ref::dequantize_row(t, src, dst, n);
}

void axpy(Type x_type, int64_t n, float alpha, const void* x, float* y) {
    const uint32_t id = static_cast<uint32_t>(x_type);
    if (id < kTypeIdLimit) {
        if (auto f = active().axpy[id]) return f(n, alpha, x, y);
    }
    ref::axpy(x_type, n, alpha, x, y);
}

void dot_rows(Type t, int64_t hd, const void* rows, size_t stride, int64_t n, const float* q,
              float scale, float* out) {
    const uint32_t id = static_cast<uint32_t>(t);
    if (id < kTypeIdLimit) {
        if (auto f = active().dot_rows[id]) return f(hd, rows, stride, n, q, scale, out);
    }
    ref::dot_rows(t, hd, rows, stride, n, q, scale, out);
}

void axpy_rows(Type t, int64_t hd, const void* rows, size_t stride, int64_t n, const float* w,
               float* y) {
    const uint32_t id = static_cast<uint32_t>(t);
    if (id < kTypeIdLimit) {
        if (auto f = active().axpy_rows[id]) return f(hd, rows, stride, n, w, y);
    }
    ref::axpy_rows(t, hd, rows, stride, n, w, y);
}

void rows_to_f32(Type t, int64_t hd, const void* rows, size_t stride, int64_t n, float* dst) {
    const uint32_t id = static_cast<uint32_t>(t);
    if (id < kTypeIdLimit) {
        if (auto f = active().rows_to_f32[id]) return f(hd, rows, stride, n, dst);
    }
    ref::rows_to_f32(t, hd, rows, stride, n, dst);
}

void axpy_heads(Type t, int64_t hd, const void* rows, size_t stride, int64_t n, const float* w,
                size_t w_stride, int nh, float* const* y) {
    const uint32_t id = static_cast<uint32_t>(t);
    if (id < kTypeIdLimit) {
        if (auto f = active().axpy_heads[id]) return f(hd, rows, stride, n, w, w_stride, nh, y);
    }
    ref::axpy_heads(t, hd, rows, stride, n, w, w_stride, nh, y);
}

void dot_tile(Type t, int64_t hd, const void* tile, int width, int lo, int hi, const float* q,
              int nh, float scale, float* out, size_t out_stride) {
    const uint32_t id = static_cast<uint32_t>(t);
    if (id < kTypeIdLimit) {
        if (auto f = active().dot_tile[id])
            return f(hd, tile, width, lo, hi, q, nh, scale, out, out_stride);
    }
    ref::dot_tile(t, hd, tile, width, lo, hi, q, nh, scale, out, out_stride);
}

bool has_axpy_heads(Type t) {
    const uint32_t id = static_cast<uint32_t>(t);
    return t == Type::F32 || (id < kTypeIdLimit && active().axpy_heads[id] != nullptr);
}

float exp_sum(float* x, int64_t n, float mx) {
    if (auto f = active().exp_sum) return f(x, n, mx);
    return ref::exp_sum(x, n, mx);
}

float max_of(const float* x, int64_t n) {
    if (auto f = active().max_of) return f(x, n);
    return ref::max_of(x, n);
}

void delta_rule(float* s, int64_t d_v, int64_t d_k, const float* k, const float* q,
                const float* v, float decay, float beta, float scale, float* o) {
    if (auto f = active().delta_rule) return f(s, d_v, d_k, k, q, v, decay, beta, scale, o);
    ref::delta_rule(s, d_v, d_k, k, q, v, decay, beta, scale, o);
}

void force_scalar(bool on) {
    g_force_scalar.store(on, std::memory_order_relaxed);
}

} // namespace cpu

} // namespace gl
