// The CUDA backend (ggml-like/cuda/). Built when CMake finds a CUDA compiler
// (option KVRUN_CUDA); otherwise ggml-like/cuda/cuda_stub.cpp provides these
// two functions and they report that CUDA is missing.
#pragma once

#include <memory>
#include <string>

#include "ggml-like/backend.h"

namespace gl {

// True when this build has CUDA, a driver answers, device 0 exists and this
// binary holds kernels for it; otherwise false with the reason in *why.
bool cuda_available(std::string* why = nullptr);

// The backend on CUDA device `device`. Throws std::runtime_error when CUDA is
// unavailable ("kvrun was built without CUDA" in a CPU-only build) or the
// device does not exist.
std::unique_ptr<Backend> make_cuda_backend(int device = 0);

} // namespace gl
