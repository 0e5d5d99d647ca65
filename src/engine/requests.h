// Requests as programs send them (kvrun batch's JSON lines; the same fields
// a server's bodies will carry): one JSON object, or with `lines` one line
// of plain text as a user message, read into a SeqRequest for the
// scheduler or into the reason it is none. Whatever the bytes, parse()
// returns; it never throws (tests/fuzz/fuzz_batch_request.cpp).
//
// Fields: "id" (any JSON, echoed back), "prompt" (text, continued as kvrun -p
// continues it) or "messages" ([{role, content}] through the model's chat
// template), "max_tokens", "temperature", "top_k", "top_p", "min_p",
// "repeat_penalty", "seed", "stop" (a string or a list), "ignore_eos",
// "model" (ignored). Any other field is an error naming it.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "loader.h"
#include "sampler.h"
#include "scheduler.h"

namespace kvrun {

// How deep arrays and objects nest in JSON text, at most 64 (more is refused
// before parsing: nlohmann's copies recurse, and a body nested a hundred
// thousand deep would overflow the stack). Throws std::invalid_argument.
constexpr int kMaxJsonDepth = 64;
nlohmann::json parse_request_json(std::string_view text);

// A request field that is wrong: the message names it, `field` too (the
// server's error object carries it as "param").
struct FieldError : std::invalid_argument {
    FieldError(std::string f, const std::string& what)
        : std::invalid_argument(what), field(std::move(f)) {}
    std::string field;
};

// A field's value checked (FieldError otherwise): a number in [lo, hi]; a
// boolean; a whole number in [lo, hi] (lo <= 0), read as an integer so that
// a seed past 2^53 keeps its bits.
float json_real(const nlohmann::json& v, const char* key, double lo, double hi);
bool json_flag(const nlohmann::json& v, const char* key);
template <class T> T json_whole(const nlohmann::json& v, const char* key, int64_t lo, uint64_t hi) {
    if (!v.is_number_integer())
        throw FieldError(key, "\"" + std::string(key) + "\" must be a whole number");
    bool fits;
    if (v.is_number_unsigned()) {
        fits = v.get<uint64_t>() <= hi;
    } else {
        const int64_t x = v.get<int64_t>();
        fits = x >= lo && (x < 0 || static_cast<uint64_t>(x) <= hi);
    }
    if (!fits)
        throw FieldError(key, "\"" + std::string(key) + "\" must be in [" + std::to_string(lo) +
                                  ", " + std::to_string(hi) + "]");
    return v.is_number_unsigned() ? static_cast<T>(v.get<uint64_t>())
                                  : static_cast<T>(v.get<int64_t>());
}

// What a request does not say.
struct RequestDefaults {
    SamplerParams sampling;
    int64_t n_predict = -1;
    bool ignore_eos = false;
    std::vector<std::string> stop;
    bool lines = false;        // each input is one user message, not JSON
    std::string system;        // lines: the system prompt
    std::string chat_template; // "" = the model's
};

struct ParsedRequest {
    nlohmann::json id;             // the request's "id", else its number in the input
    std::optional<SeqRequest> req; // none: `error` says why
    std::string error;
    bool chat = false; // through the chat template: a reply's leading space is left out
};

// The member at `path` in the JSON text `body` (already parsed once, so
// valid and not too deep) with its keys in the order written; "" when
// missing. nlohmann::json sorts keys, and a schema's property order is the
// order its answer is written in.
std::string member_as_written(std::string_view body, std::initializer_list<const char*> path);

class RequestReader {
  public:
    RequestReader(const LoadedModel& lm, RequestDefaults d);
    ~RequestReader();
    ParsedRequest parse(const std::string& input, size_t number_in_input) const;

    // The pieces parse() is made of, for another dialect of the same fields
    // (the server's OpenAI bodies, src/serve/api_request.h). Each throws
    // std::invalid_argument naming the field at fault.
    // A prompt (a string) with the defaults, continued as kvrun -p does.
    SeqRequest from_prompt(const std::string& text) const;
    // Tokens as given (ids checked against the vocabulary).
    SeqRequest from_tokens(const nlohmann::json& ids) const;
    // [{role, content}] through the chat template; content is a string or
    // a list of {"type": "text", "text"} parts.
    SeqRequest from_messages(const nlohmann::json& messages) const;
    // The sampling and stopping fields (max_tokens ... ignore_eos) of `j`
    // that are there, over r's.
    // `raw`: j's text, when there is one (a schema's key order).
    void read_fields(const nlohmann::json& j, SeqRequest& r, std::string_view raw = {}) const;
    // r's answer must be a sentence of g (SamplerParams::grammar), ending
    // where r ends (its end tokens); `source` names it in messages.
    void constrain(SeqRequest& r, std::shared_ptr<const Grammar> g, std::string source) const;
    // The grammar of the texts a JSON schema accepts (FieldError(field)
    // when it cannot be built).
    // `as_written`: the schema's text with its keys in the order given
    // (member_as_written), so that properties come in that order; empty:
    // schema's (sorted keys).
    static std::shared_ptr<const Grammar> schema_grammar(const nlohmann::json& schema,
                                                         const char* field,
                                                         const std::string& as_written = {});

  private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

} // namespace kvrun
