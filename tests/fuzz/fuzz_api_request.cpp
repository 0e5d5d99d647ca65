// libFuzzer target for kvrun serve's request reader (src/serve/api.h): any
// bytes, as the body of /v1/chat/completions and of /v1/completions, give a
// call or the error object that says why there is none, never a throw or a
// crash. A call's prompt is tokens of the vocabulary and leaves room in the
// context for at least one answer token, max_tokens included; an error is a
// client error (400 or 404) with a message, and its body serializes
// whatever bytes it quotes.
//
// The model is stories260K (relative to the project root, or
// $KVRUN_FUZZ_MODEL). Seeds: bodies this binary writes when started with
// KVRUN_FUZZ_WRITE_SEEDS=DIR (scripts/fuzz.sh does).
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "fuzz_support.h"
#include "loader.h"
#include "requests.h"
#include "serve/api.h"

using namespace kvrun;

namespace {

constexpr int64_t kCtx = 256;

struct Fixture {
    std::unique_ptr<LoadedModel> lm;
    std::unique_ptr<RequestReader> reader;
    std::unique_ptr<serve::ApiReader> api;
};

Fixture& fixture() {
    static Fixture f = [] {
        Fixture x;
        x.lm = kvfuzz::load_model("fuzz_api_request");
        x.reader = std::make_unique<RequestReader>(*x.lm, RequestDefaults{});
        serve::ApiLimits limits;
        limits.n_ctx = kCtx;
        x.api = std::make_unique<serve::ApiReader>(*x.reader,
                                                   std::vector<std::string>{"tiny", "stories260K"},
                                                   x.lm->model.hp.n_vocab, limits);
        return x;
    }();
    return f;
}

void check(const LoadedModel& lm, const serve::ApiParse& p) {
    if (p.call) {
        const SeqRequest& r = p.call->req;
        if (r.prompt.empty() || static_cast<int64_t>(r.prompt.size()) >= kCtx) std::abort();
        for (int32_t t : r.prompt)
            if (t < 0 || t >= lm.model.hp.n_vocab) std::abort();
        if (r.gen.n_predict < 1 || static_cast<int64_t>(r.prompt.size()) + r.gen.n_predict > kCtx)
            std::abort();
        for (const auto& [t, bias] : r.sampling.logit_bias)
            if (t < 0 || t >= lm.model.hp.n_vocab || !(bias >= -100 && bias <= 100)) std::abort();
    } else {
        if (p.error.message.empty() || (p.error.status != 400 && p.error.status != 404))
            std::abort();
        (void)p.error.body().dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    }
}

void write_seeds(const std::string& dir) {
    const char* seeds[] = {
        R"({"model": "tiny", "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": [{"type": "text", "text": "Hello"}]}], "max_tokens": 40, "temperature": 0, "stream": true, "stream_options": {"include_usage": true}})",
        R"({"prompt": "Once upon a time", "max_completion_tokens": 9, "stop": ["a", "b"], "seed": 18446744073709551615, "logit_bias": {"5": -100, "17": 3.5}})",
        R"({"prompt": [1, 2, 3], "presence_penalty": 1.5, "frequency_penalty": -0.5, "top_k": 5, "top_p": 0.5, "min_p": 0.1, "n": 1})",
        R"({"prompt": ["x"], "logprobs": 0, "echo": false, "suffix": "", "user": "u", "response_format": {"type": "text"}})",
        R"({"messages": [{"role": "user", "content": "x"}], "tools": [], "tool_choice": "none", "model": "nope"})",
    };
    kvfuzz::write_seed_texts(dir, seeds);
}

} // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    return kvfuzz::write_seeds_or_fuzz(write_seeds);
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    Fixture& f = fixture();
    const std::string body(reinterpret_cast<const char*>(data), size);
    check(*f.lm, f.api->parse(serve::Route::chat, body));
    check(*f.lm, f.api->parse(serve::Route::completion, body));
    return 0;
}
