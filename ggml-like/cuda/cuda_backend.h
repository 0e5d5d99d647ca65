// The CUDA backend (ggml-like/cuda/). Built when CMake finds a CUDA compiler
// (option KVRUN_CUDA); otherwise ggml-like/cuda/cuda_stub.cpp provides these
// functions and they report that CUDA is missing.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "ggml-like/backend.h"

namespace gl {

// True when this build has CUDA, a driver answers, device 0 exists and this
// binary holds kernels for it; otherwise false with the reason in *why.
bool cuda_available(std::string* why = nullptr);

struct CudaOptions {
    // Hot/cold KV (--kv-gpu-window W): the device mirror of each ring holds
    // only the sinks and the W newest positions; attention over the older
    // slots runs on the CPU (cpu_threads), from the host ring, as a partial
    // merged with the GPU's by log-sum-exp (gl::attention_merge).
    // 0 = the whole ring on the device.
    int kv_gpu_window = 0;
    int cpu_threads = 1;
};

// The backend on CUDA device `device`. Throws std::runtime_error when CUDA is
// unavailable ("kvrun was built without CUDA" in a CPU-only build) or the
// device does not exist.
std::unique_ptr<Backend> make_cuda_backend(int device = 0, const CudaOptions& opt = {});

// Free and total memory of CUDA device `device` (cudaMemGetInfo). False, with
// both 0, when there is no such device or this build has no CUDA.
bool cuda_memory_info(int device, uint64_t* free_bytes, uint64_t* total_bytes);

} // namespace gl
