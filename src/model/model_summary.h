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
    // A mixture of experts (expert_used_count of the tensors' last dimension
    // of experts): the parameters one token uses, every expert's share but
    // the used ones' left out (as model cards count "3B active"), and the
    // weight bytes one generated token reads: those, less the embedding
    // table but its one row (unless it is the output matrix too). Without
    // experts, params and the same bytes.
    int n_expert = 0, n_expert_used = 0;
    uint64_t active_params = 0;
    uint64_t bytes_per_token = 0;
};

ModelSummary summarize_model(const GgufFile& f);

// "Q4_K_M" for general.file_type 15; nullptr for numbers no tool defines.
const char* file_type_name(uint64_t file_type);

// "134.5M", "1.10B": parameter counts as model cards write them.
std::string params_text(uint64_t params);

} // namespace kvrun
