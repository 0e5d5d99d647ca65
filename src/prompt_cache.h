// Prompt-cache files: the tokens of an evaluated prompt and their K/V rows,
// so a later run whose prompt starts with the same tokens evaluates only the
// new suffix.
//
// A file is valid only for what it records: a digest of the model file's
// header (all metadata and the tensor layout), the cache element types and
// dimensions, and a checksum over everything. Anything that does not match,
// a truncated or corrupt file, or one holding more tokens than the current
// context can take is rejected with a reason; the caller warns and recomputes.
// Files are written to a temporary name and renamed, so a reader never sees
// half a file, even with several writers.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gguf.h"
#include "kv_cache.h"

namespace kvrun {

// FNV-1a over the GGUF header region (metadata + tensor infos).
uint64_t model_digest(const GgufFile& f);

struct PromptCacheLoad {
    bool ok = false;
    std::string why;      // reason when !ok
    int64_t reused = 0;   // tokens now in the cache
};

// Save tokens [0, n) that `kv` holds (no wrap yet: n <= n_ctx).
void save_prompt_cache(const std::string& path, uint64_t digest, const KvCache& kv,
                       const std::vector<int32_t>& tokens);

// Load into an empty `kv` the longest prefix shared with `prompt`, keeping at
// least one prompt token to evaluate (its logits start generation).
// `rope` (Model::rope for this n_ctx) re-places sink keys for this n_ctx.
PromptCacheLoad load_prompt_cache(const std::string& path, uint64_t digest, KvCache& kv,
                                  const std::vector<int32_t>& prompt, const Rope& rope);

} // namespace kvrun
