// Compiled instead of the .cu files when CUDA is off (KVRUN_CUDA=OFF, or no
// CUDA compiler found): the CUDA entry points exist and say why they fail.
#include <stdexcept>

#include "ggml-like/cuda_backend.h"

namespace gl {

namespace {
constexpr const char* kNoCuda = "kvrun was built without CUDA";
}

bool cuda_available(std::string* why) {
    if (why) *why = kNoCuda;
    return false;
}

std::unique_ptr<Backend> make_cuda_backend(int) {
    throw std::runtime_error(kNoCuda);
}

} // namespace gl
