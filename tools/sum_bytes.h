// The lab's read probe: the sum of n bytes as unsigned numbers, a read of
// memory at its own pace (the sum keeps the read from being dropped). It is
// how `kvrun-lab roofline` and `kvrun-lab matrices` read, so its loop must be
// as lean as the matrix kernels' or the roof would understate the memory.
//
// One file per ISA (sum_bytes_avx2.cpp, sum_bytes_avx512.cpp,
// sum_bytes_neon.cpp), compiled with the runtime's flags for that ISA
// (GL_FLAGS_* in CMakeLists.txt); a variant is used only where the runtime's
// kernel table of the same name is (its cpuid / hwcaps check, and KVRUN_ISA).
#pragma once

#include <cstdint>
#include <vector>

namespace kvrun::lab {

using SumBytesFn = uint64_t (*)(const void* p, int64_t n);

// The definition every variant must equal: one byte at a time.
uint64_t sum_bytes_scalar(const void* p, int64_t n);

struct SumBytesVariant {
    const char* isa; // the runtime's table name: "avx512", "avx2", "neon", "scalar"
    SumBytesFn fn;
};
// The variants built in and usable on this CPU, best first; the scalar one last.
std::vector<SumBytesVariant> sum_bytes_variants();

// With the variant of the runtime's active table (gl::cpu::isa_name()), so the
// lab reads as the kernels it is compared with would.
uint64_t sum_bytes(const void* p, int64_t n);

} // namespace kvrun::lab
