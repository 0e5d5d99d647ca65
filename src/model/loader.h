// Everything a run needs, loaded once: the mapped file, the bound model, the
// tokenizer.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "gguf.h"
#include "model.h"
#include "tokenizer.h"

namespace kvrun {

struct LoadedModel {
    GgufFile file;
    Model model;
    Tokenizer tokenizer;
    // weights_on_cpu: the CPU backend will stream the weights (false when
    // every layer runs on the GPU), so they move onto huge pages if they can
    // (see loader.cpp).
    static std::unique_ptr<LoadedModel> load(const std::string& path, bool weights_on_cpu = true);
};

} // namespace kvrun
