#include "sum_bytes.h"

#include <cstring>

#include "ggml-like/kernels.h"

namespace kvrun::lab {

// Per-ISA files exist only on their architecture (CMakeLists.txt drops the
// others), hence the same #if as the runtime's dispatch.
#if defined(__x86_64__)
uint64_t sum_bytes_avx512(const void* p, int64_t n); // sum_bytes_avx512.cpp
uint64_t sum_bytes_avx2(const void* p, int64_t n);   // sum_bytes_avx2.cpp
#endif
#if defined(__aarch64__)
uint64_t sum_bytes_neon(const void* p, int64_t n); // sum_bytes_neon.cpp
#endif

namespace {

// Best first, as the runtime orders its tables.
constexpr SumBytesVariant kBuiltIn[] = {
#if defined(__x86_64__)
    {"avx512", sum_bytes_avx512},
    {"avx2", sum_bytes_avx2},
#endif
#if defined(__aarch64__)
    {"neon", sum_bytes_neon},
#endif
    {"scalar", sum_bytes_scalar},
};

SumBytesFn variant_for(const char* isa) {
    for (const SumBytesVariant& v : kBuiltIn)
        if (std::strcmp(v.isa, isa) == 0) return v.fn;
    return sum_bytes_scalar;
}

} // namespace

uint64_t sum_bytes_scalar(const void* p, int64_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    uint64_t s = 0;
    for (int64_t i = 0; i < n; i++) s += b[i];
    return s;
}

// The runtime's tables are the ones its cpuid / hwcaps check let through:
// each variant is compiled with that table's flags, so it runs exactly where
// the table does. Asking the runtime keeps one CPU check, not two. (Its
// list always ends with "scalar", so ours does.)
std::vector<SumBytesVariant> sum_bytes_variants() {
    std::vector<SumBytesVariant> out;
    for (const SumBytesVariant& v : kBuiltIn)
        for (int i = 0; i < gl::kernel_table_count(); i++)
            if (std::strcmp(gl::kernel_table(i).isa, v.isa) == 0) {
                out.push_back(v);
                break;
            }
    return out;
}

// Looked up per call, not once: the active table can change (force_scalar).
// A lookup is a few string compares against reads of kilobytes or more.
uint64_t sum_bytes(const void* p, int64_t n) {
    return variant_for(gl::cpu::isa_name())(p, n);
}

} // namespace kvrun::lab
