// What the fuzz targets share: the seed-writing mode of scripts/fuzz.sh and
// the model the engine-level targets run on.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <memory>
#include <string>

#include "loader.h"

namespace kvfuzz {

// For LLVMFuzzerInitialize: with KVRUN_FUZZ_WRITE_SEEDS=DIR (scripts/fuzz.sh
// asks each target for its seeds so that no binary corpus is committed),
// write them there and exit; otherwise 0, and fuzzing starts.
inline int write_seeds_or_fuzz(void (*write_seeds)(const std::string& dir)) {
    if (const char* dir = std::getenv("KVRUN_FUZZ_WRITE_SEEDS"); dir && *dir) {
        write_seeds(dir);
        std::exit(0);
    }
    return 0;
}

// Seed files seed-0, seed-1, ... in dir, one per text.
template <size_t N>
inline void write_seed_texts(const std::string& dir, const char* const (&seeds)[N]) {
    for (size_t i = 0; i < N; i++) std::ofstream(dir + "/seed-" + std::to_string(i)) << seeds[i];
}

// KVRUN_FUZZ_MODEL, else stories260K from ../shared; aborts naming `target`
// when it cannot be loaded (a fuzzer without its model finds nothing).
inline std::unique_ptr<kvrun::LoadedModel> load_model(const char* target) {
    const char* model = std::getenv("KVRUN_FUZZ_MODEL");
    try {
        return kvrun::LoadedModel::load(model && *model ? model
                                                        : "../shared/models/stories260K.gguf");
    } catch (const std::exception& e) {
        std::fprintf(stderr, "%s: cannot load the model (set KVRUN_FUZZ_MODEL): %s\n", target,
                     e.what());
        std::abort();
    }
}

} // namespace kvfuzz
