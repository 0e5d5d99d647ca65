// Compiled instead of the .cu files when CUDA is off (KVRUN_CUDA=OFF, or no
// CUDA compiler found): the CUDA entry points exist and say why they fail.
#include <stdexcept>

#include "ggml-like/cuda/cuda_backend.h"

namespace gl {

namespace {
constexpr const char* kNoCuda = "kvrun was built without CUDA";
}

bool cuda_available(std::string* why) {
    if (why) *why = kNoCuda;
    return false;
}

std::unique_ptr<Backend> make_cuda_backend(int, const CudaOptions&) {
    throw std::runtime_error(kNoCuda);
}

bool cuda_memory_info(int, uint64_t* free_bytes, uint64_t* total_bytes) {
    *free_bytes = *total_bytes = 0;
    return false;
}

} // namespace gl
