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
// half a file, even with several writers; an existing file that is not a
// prompt cache is never replaced (file_io.h). The checksum detects damage, not
// tampering: whoever can write the file can forge one that passes.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "gguf.h"
#include "kv_cache.h"

namespace kvrun {

// The model's identity for caches: FNV-1a over the GGUF header region
// (metadata + tensor infos), the file size and the weights' digest.
uint64_t model_digest(const GgufFile& f);

// Whether a file's first bytes are a prompt cache's (any version): only such
// a file (or an empty one) is replaced by a save.
bool is_prompt_cache_head(std::string_view head);

struct PromptCacheLoad {
    bool ok = false;
    std::string why;           // reason when !ok
    int64_t reused = 0;        // tokens now in the cache
    uint64_t saved_digest = 0; // the file's digest, when its header was read
    int64_t held = 0;          // tokens the file holds, when its header was read
};

// The number of tokens a prompt-cache file holds, read from its header
// alone (0 when it is missing, not a regular file or not a current prompt
// cache): -c auto makes room for them, so a shorter prompt that shares the
// prefix can still reuse it.
int64_t prompt_cache_tokens(const std::string& path);

// What a model digest mixes in besides the file (Session::model_digest): a
// file whose digest differs from this run's by exactly one of these was made
// by the same model in another mode, and the warning says which.
inline constexpr uint64_t kDigestLongRope = 0x4c6f6e67526f5045ull;      // "LongRoPE"
inline constexpr uint64_t kDigestDeterministic = 0x44657465726d696eull; // "Determin"

// Save the tokens `kv` holds (all of them: tokens.size() == n_past). Each
// layer's slots are saved as they are, so a sliding-window layer's ring may
// have wrapped. Throws Error(Exit::error) when the file cannot be written or
// may not be replaced, and when the tokens outran the cache (a prompt longer
// than a sliding-window model's ring): callers warn and go on.
void save_prompt_cache(const std::string& path, uint64_t digest, const KvCache& kv,
                       const std::vector<int32_t>& tokens);

// Load into an empty `kv` the longest prefix shared with `prompt`, keeping at
// least one prompt token to evaluate (its logits start generation). Sink keys
// are re-placed for this n_ctx with each layer's RoPE (`m`). A file whose
// sliding-window rings wrapped past the point where the prompts part cannot
// serve that prefix and is refused.
PromptCacheLoad load_prompt_cache(const std::string& path, uint64_t digest, KvCache& kv,
                                  const std::vector<int32_t>& prompt, const Model& m);

} // namespace kvrun
