// Everything a run needs, loaded once: the mapped file, the bound model, the
// tokenizer; and the sizing rule for the KV cache.
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
    // (see session.cpp).
    static std::unique_ptr<LoadedModel> load(const std::string& path, bool weights_on_cpu = true);
};

// -c auto: room for the prompt plus the requested tokens (-n; when unlimited,
// twice the prompt and at least 512 free slots), rounded up to a multiple of
// 256, capped at the model's trained context. Throws Error(context_overflow)
// when the prompt alone does not fit the model.
int auto_context(int64_t n_prompt, int64_t n_predict, int64_t n_ctx_train);

// A fixed -c must hold the prompt: throws Error(context_overflow) with the numbers.
void check_prompt_fits(int64_t n_prompt, int64_t n_ctx);

// Peak resident set size of this process, bytes.
uint64_t peak_rss_bytes();

// Valid UTF-8? On failure *bad_at is the offset of the first bad byte.
bool valid_utf8(std::string_view s, size_t* bad_at = nullptr);

} // namespace kvrun
