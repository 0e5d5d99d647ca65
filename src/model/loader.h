// Everything a run needs, loaded once: the mapped file, the bound model, the
// tokenizer.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "gguf.h"
#include "model.h"
#include "packed_weights.h"
#include "tokenizer.h"

namespace kvrun {

struct LoadedModel {
    GgufFile file;
    Model model;
    Tokenizer tokenizer;
    // The weight matrices the CPU's GEMM reads packed (empty when packing
    // is off, or some layers run on a GPU).
    PackedWeights packed;

    // Where the layers run: all on the CPU (the weights move onto huge
    // pages if they can, see loader.cpp, and the matrices are packed),
    // split between a GPU and the CPU (huge pages only: a GPU layer's
    // packed copy would be memory no one reads), or all on a GPU.
    // pack: false under --precise, whose F32 activations read the plain rows.
    enum class Layers { cpu, split, gpu };
    static std::unique_ptr<LoadedModel> load(const std::string& path, Layers layers = Layers::cpu,
                                             bool pack = true);
};

} // namespace kvrun
