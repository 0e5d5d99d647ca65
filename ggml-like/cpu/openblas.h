// OpenBLAS for prompt batches, with its kernels chosen for this CPU.
//
// OpenBLAS (a DYNAMIC_ARCH build such as Debian's) picks its kernels once,
// when it is loaded, from the CPU it recognizes or from $OPENBLAS_CORETYPE.
// A CPU newer than the library is not recognized and gets the generic SSE3
// "Prescott" kernels, 4x slower than AVX-512 ones. So kvrun decides before
// the library loads: the core named by the CPU's features (SkylakeX for
// AVX-512, Haswell for AVX2 + FMA) unless the user set $OPENBLAS_CORETYPE.
//  - Dynamic builds load libopenblas.so.0 at run time (dlopen) after setting
//    the variable for the load; the binary runs without the library too.
//  - Static builds link it: a preinit function sets the variable before the
//    library's constructor reads it.
// A library that still runs generic kernels on a CPU with AVX2 is not used:
// the prompt batches take kvrun's own kernels.
#pragma once

#include <string>

namespace gl::openblas {

// CBLAS's sgemm, row-major, C = alpha A B^T + beta C style arguments; and
// openblas_set_num_threads.
struct Api {
    void (*sgemm)(int order, int trans_a, int trans_b, int m, int n, int k, float alpha,
                  const float* a, int lda, const float* b, int ldb, float beta, float* c,
                  int ldc) = nullptr;
    void (*set_num_threads)(int) = nullptr;
};
// CBLAS's enum values (the C interface's, fixed by the standard).
constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;

// The library, loaded on the first call; nullptr when kvrun is built without
// it, it is not installed, or it runs generic kernels on this CPU.
const Api* api();

// The core kvrun asks OpenBLAS for on this CPU ("SkylakeX", "Haswell"), or
// nullptr to leave the choice to the library (no AVX2, not x86-64).
const char* core_for_this_cpu();

// For --version, info and bench: "OpenBLAS 0.3.21, SkylakeX kernels chosen
// by kvrun for AVX-512", or why it is not used ("OpenBLAS not found ...").
std::string describe();

} // namespace gl::openblas
