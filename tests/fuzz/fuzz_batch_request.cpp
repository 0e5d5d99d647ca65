// libFuzzer target for kvrun batch's request reader (src/engine/requests.h):
// any bytes, as a JSON line and as a --lines message, give a request or the
// reason there is none, never a throw or a crash; a request's prompt is
// tokens of the vocabulary, and the error object batch prints from the
// reason serializes whatever bytes it quotes.
//
// The model is stories260K (relative to the project root, or
// $KVRUN_FUZZ_MODEL). Seeds: request lines this binary writes when started
// with KVRUN_FUZZ_WRITE_SEEDS=DIR (scripts/fuzz.sh does).
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "fuzz_support.h"
#include "loader.h"
#include "requests.h"

using namespace kvrun;

namespace {

struct Fixture {
    std::unique_ptr<LoadedModel> lm;
    std::unique_ptr<RequestReader> json_lines, text_lines;
};

Fixture& fixture() {
    static Fixture f = [] {
        Fixture x;
        x.lm = kvfuzz::load_model("fuzz_batch_request");
        RequestDefaults d;
        d.stop = {"\n"};
        x.json_lines = std::make_unique<RequestReader>(*x.lm, d);
        d.lines = true;
        d.system = "Be brief.";
        x.text_lines = std::make_unique<RequestReader>(*x.lm, d);
        return x;
    }();
    return f;
}

void check(const LoadedModel& lm, const ParsedRequest& p) {
    if (p.req) {
        if (p.req->prompt.empty()) std::abort();
        for (int32_t t : p.req->prompt)
            if (t < 0 || t >= lm.model.hp.n_vocab) std::abort();
    } else if (p.error.empty()) {
        std::abort(); // no request and no reason
    }
    const nlohmann::json out = {{"id", p.id}, {"error", p.error}};
    (void)out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

void write_seeds(const std::string& dir) {
    const char* seeds[] = {
        R"({"id": "a", "prompt": "Once upon a time", "max_tokens": 40, "temperature": 0})",
        R"({"id": 7, "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}], "seed": 18446744073709551615})",
        R"({"prompt": "x", "stop": ["a", "b"], "top_k": 5, "top_p": 0.5, "min_p": 0.1, "ignore_eos": true})",
        R"({"prompt": "x", "max_tokens": -1, "repeat_penalty": 1.1, "model": "m"})",
        "Tell me a story",
    };
    kvfuzz::write_seed_texts(dir, seeds);
}

} // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    return kvfuzz::write_seeds_or_fuzz(write_seeds);
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    Fixture& f = fixture();
    const std::string input(reinterpret_cast<const char*>(data), size);
    check(*f.lm, f.json_lines->parse(input, 1));
    check(*f.lm, f.text_lines->parse(input, 2));
    return 0;
}
