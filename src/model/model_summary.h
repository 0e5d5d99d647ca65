// What a GGUF file is, in the words a user compares models by: its file type
// (general.file_type, "Q4_K_M"), its parameter count and its weights' bytes.
// Read from the header alone, so it works on files kvrun cannot run.
#pragma once

#include <cstdint>
#include <string>

#include "gguf.h"

namespace kvrun {

struct ModelSummary {
    std::string name;      // general.name, or ""
    std::string file_type; // "Q4_K_M" from general.file_type; else the most common weight type
    uint64_t params = 0;   // elements of every tensor
    uint64_t weight_bytes = 0;
};

ModelSummary summarize_model(const GgufFile& f);

// "Q4_K_M" for general.file_type 15; nullptr for numbers no tool defines.
const char* file_type_name(uint64_t file_type);

// "134.5M", "1.10B": parameter counts as model cards write them.
std::string params_text(uint64_t params);

} // namespace kvrun
