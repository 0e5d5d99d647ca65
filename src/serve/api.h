// OpenAI's API as kvrun serve speaks it, apart from HTTP: a request body
// read into a SeqRequest for the scheduler (or into the error object that
// says why it is none), and the JSON shapes of answers, stream chunks and
// errors. Whatever the bytes, parse() returns; it never throws
// (tests/fuzz/fuzz_api_request.cpp).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "requests.h"
#include "scheduler.h"
#include "tokenizer.h"

namespace kvrun::serve {

enum class Route { chat, completion };

// OpenAI's error object: {"error": {"message", "type", "param", "code"}}.
struct ApiError {
    int status = 400;
    std::string message;
    std::string type = "invalid_request_error";
    std::string param; // the field at fault, or ""
    std::string code;  // a machine-readable reason, or ""
    nlohmann::json body() const;
};

struct ApiCall {
    Route route = Route::chat;
    SeqRequest req;
    std::string model;        // as the request named it
    bool stream = false;      // server-sent events
    bool usage_chunk = false; // stream_options.include_usage
    bool seeded = false;      // "seed" given: the answer repeats
};

struct ApiParse {
    std::optional<ApiCall> call;
    ApiError error; // when there is no call
};

struct ApiLimits {
    int64_t n_ctx = 0;    // a prompt must be shorter; max_tokens is capped to the rest
    size_t max_stop = 16; // stop strings per request
    size_t max_logit_bias = 1024;
};

class ApiReader {
  public:
    // `models`: the names a request's "model" may give (the first is the
    // one answers carry); `reader` holds the defaults (the command line's
    // sampling, the chat template).
    ApiReader(const RequestReader& reader, std::vector<std::string> models, int n_vocab,
              ApiLimits limits);
    ApiParse parse(Route route, std::string_view body) const;
    const std::string& model() const { return models_.front(); }
    bool knows_model(const std::string& name) const;

  private:
    ApiCall call(Route route, const nlohmann::json& j, std::string_view body) const;
    const RequestReader& reader_;
    std::vector<std::string> models_;
    int n_vocab_;
    ApiLimits limits_;
};

// OpenAI's finish_reason for a scheduler stop reason ("eos", "stop string",
// "length", "context full"); none for "cancelled" or "interrupted".
std::optional<std::string> finish_reason(const std::string& stop);

// The answer's usage: prompt_tokens, completion_tokens, total_tokens,
// prompt_tokens_details.cached_tokens.
nlohmann::json usage(const SeqResult& r);

// A choice's "logprobs" for these tokens (null when there are none):
// chat's {"content": [{token, logprob, bytes, top_logprobs}]}, or the
// completions' {tokens, token_logprobs, top_logprobs, text_offset}, whose
// offsets start at `offset` (advanced past the tokens' text).
nlohmann::json logprobs_body(Route route, const Tokenizer& tok, std::span<const TokenLogprob> lps,
                             size_t& offset);

// A whole answer (stream: false).
nlohmann::json answer_body(const ApiCall& c, const std::string& id, int64_t created,
                           const std::string& text, const SeqResult& r,
                           const nlohmann::json& logprobs = nullptr);
// One stream chunk: the role (chat's first), a piece of text, or the end
// (finish set, no text).
nlohmann::json chunk_body(const ApiCall& c, const std::string& id, int64_t created,
                          const std::string* text, const std::string* finish, bool role,
                          const nlohmann::json& logprobs = nullptr);
// The last chunk with stream_options.include_usage: no choices, the usage.
nlohmann::json usage_chunk_body(const ApiCall& c, const std::string& id, int64_t created,
                                const SeqResult& r);

} // namespace kvrun::serve
