#include "api.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <utility>

#include <fmt/format.h>

namespace kvrun::serve {

namespace {

using json = nlohmann::json;

// Present and not null (clients send null for "not set").
bool given(const json& j, const char* key) {
    return j.contains(key) && !j[key].is_null();
}

// true only when given as true.
bool flag(const json& j, const char* key) {
    return given(j, key) && json_flag(j[key], key);
}

// Fields kvrun does not do (yet), refused by name rather than ignored: an
// answer that silently left one out would be wrong.
void refuse_unsupported(const json& j, Route route) {
    if (given(j, "n") && !(j["n"].is_number_integer() && j["n"].get<int64_t>() == 1))
        throw FieldError("n", "\"n\" must be 1: kvrun gives one choice per request");
    if (given(j, "best_of") &&
        !(j["best_of"].is_number_integer() && j["best_of"].get<int64_t>() == 1))
        throw FieldError("best_of", "\"best_of\" must be 1");
    for (const char* key : {"tools", "functions"})
        if (given(j, key) && !(j[key].is_array() && j[key].empty()))
            throw FieldError(key, fmt::format("\"{}\": tool calls are not supported", key));
    for (const char* key : {"tool_choice", "function_call"})
        if (given(j, key) && j[key] != "none" && j[key] != "auto")
            throw FieldError(key, fmt::format("\"{}\": tool calls are not supported", key));
    if (given(j, "response_format")) {
        const json& f = j["response_format"];
        const json type = f.is_object() ? f.value("type", json()) : json();
        if (type != "text" && type != "json_object" && type != "json_schema")
            throw FieldError("response_format",
                             "\"response_format\" must be {\"type\": \"text\"}, "
                             "{\"type\": \"json_object\"} or {\"type\": \"json_schema\", "
                             "\"json_schema\": {\"schema\": ...}}");
        if (type == "json_schema" && !(f.contains("json_schema") && f["json_schema"].is_object() &&
                                       f["json_schema"].contains("schema")))
            throw FieldError("response_format",
                             "\"response_format\": \"json_schema\" needs \"json_schema\": "
                             "{\"name\", \"schema\"}");
    }
    if (route == Route::completion) {
        if (given(j, "echo") && j["echo"] != false)
            throw FieldError("echo", "\"echo\" is not supported");
        if (given(j, "suffix") && j["suffix"] != "")
            throw FieldError("suffix", "\"suffix\" (fill in the middle) is not supported");
    }
}

std::vector<std::pair<int32_t, float>> logit_bias(const json& v, int n_vocab, size_t most) {
    if (!v.is_object())
        throw FieldError("logit_bias", "\"logit_bias\" must be an object of token id: bias");
    if (v.size() > most)
        throw FieldError("logit_bias", fmt::format("\"logit_bias\" holds at most {} tokens", most));
    std::vector<std::pair<int32_t, float>> out;
    for (const auto& item : v.items()) {
        const std::string& key = item.key();
        int64_t id = -1;
        if (!key.empty() && key.size() <= 10 &&
            std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; }))
            id = std::stoll(key);
        if (id < 0 || id >= n_vocab)
            throw FieldError("logit_bias", fmt::format("\"logit_bias\": \"{}\" is not a token id "
                                                       "of this model (0 to {})",
                                                       key, n_vocab - 1));
        if (!item.value().is_number() || !(std::fabs(item.value().get<double>()) <= 100))
            throw FieldError("logit_bias", "\"logit_bias\": each bias is a number in [-100, 100]");
        out.emplace_back(static_cast<int32_t>(id), item.value().get<float>());
    }
    return out;
}

} // namespace

json ApiError::body() const {
    json e = {{"message", message},
              {"type", type},
              {"param", param.empty() ? json() : json(param)},
              {"code", code.empty() ? json() : json(code)}};
    return json{{"error", e}};
}

ApiReader::ApiReader(const RequestReader& reader, std::vector<std::string> models, int n_vocab,
                     ApiLimits limits)
    : reader_(reader), models_(std::move(models)), n_vocab_(n_vocab), limits_(limits) {}

bool ApiReader::knows_model(const std::string& name) const {
    return std::find(models_.begin(), models_.end(), name) != models_.end();
}

ApiParse ApiReader::parse(Route route, std::string_view body) const {
    ApiParse p;
    try {
        const json j = parse_request_json(body);
        if (!j.is_object()) throw std::invalid_argument("the body must be a JSON object");
        p.call = call(route, j, body);
    } catch (const json::exception& e) {
        p.error.message = std::string("the body is not JSON: ") + e.what();
        p.error.code = "invalid_json";
    } catch (const FieldError& e) {
        p.error.message = e.what();
        p.error.param = e.field;
    } catch (const ApiError& e) {
        p.error = e;
    } catch (const std::invalid_argument& e) {
        p.error.message = e.what();
    } catch (const std::exception& e) { // the tokenizer's or template's own errors
        p.error.message = e.what();
    }
    if (p.call) p.error = {};
    return p;
}

ApiCall ApiReader::call(Route route, const json& j, std::string_view body) const {
    ApiCall c;
    c.route = route;
    c.model = model();
    if (given(j, "model")) {
        if (!j["model"].is_string()) throw FieldError("model", "\"model\" must be a string");
        const std::string m = j["model"].get<std::string>();
        if (!knows_model(m)) {
            ApiError e;
            e.status = 404;
            e.message =
                fmt::format("the model '{}' does not exist (this server has '{}')", m, model());
            e.param = "model";
            e.code = "model_not_found";
            throw e;
        }
        c.model = m;
    }
    refuse_unsupported(j, route);
    if (route == Route::chat) {
        if (!j.contains("messages")) throw FieldError("messages", "\"messages\" is required");
        if (j.contains("prompt"))
            throw FieldError("prompt", "\"prompt\" belongs to /v1/completions; give \"messages\"");
        c.req = reader_.from_messages(j["messages"]);
    } else {
        if (!j.contains("prompt")) throw FieldError("prompt", "\"prompt\" is required");
        if (j.contains("messages"))
            throw FieldError("messages",
                             "\"messages\" belongs to /v1/chat/completions; give \"prompt\"");
        const json& pr = j["prompt"];
        if (pr.is_string()) {
            c.req = reader_.from_prompt(pr.get<std::string>());
        } else if (pr.is_array() && pr.size() == 1 && pr[0].is_string()) {
            c.req = reader_.from_prompt(pr[0].get<std::string>());
        } else if (pr.is_array() && !pr.empty() && pr[0].is_number()) {
            c.req = reader_.from_tokens(pr);
        } else {
            throw FieldError("prompt", "\"prompt\" must be a string, a list of one string, or "
                                       "a list of token ids (one prompt per request)");
        }
    }
    // max_completion_tokens is the newer name of max_tokens.
    // The fields read_fields reads (not the whole body: messages may be long).
    json fields = json::object();
    for (const char* key : {"max_tokens", "temperature", "top_k", "top_p", "min_p",
                            "repeat_penalty", "seed", "stop", "ignore_eos", "grammar"})
        if (j.contains(key)) fields[key] = j[key];
    if (given(j, "max_completion_tokens")) fields["max_tokens"] = j["max_completion_tokens"];
    if (given(fields, "max_tokens") && fields["max_tokens"].is_number_integer() &&
        fields["max_tokens"].get<int64_t>() < 1)
        throw FieldError("max_tokens", "\"max_tokens\" must be at least 1");
    if (given(j, "stop") && j["stop"].is_array() && j["stop"].size() > limits_.max_stop)
        throw FieldError("stop",
                         fmt::format("\"stop\" holds at most {} strings", limits_.max_stop));
    reader_.read_fields(fields, c.req);
    // response_format: any JSON object, or JSON a schema accepts. "strict"
    // is what kvrun always does (an object takes no properties but those
    // the schema lists, unless additionalProperties says otherwise).
    if (given(j, "response_format")) {
        const json& f = j["response_format"];
        const json type = f.value("type", json());
        if ((type == "json_object" || type == "json_schema") && c.req.sampling.grammar)
            throw FieldError("grammar", "give \"grammar\" or a JSON \"response_format\", not both");
        if (type == "json_object")
            reader_.constrain(c.req, json_object_grammar(), "response_format json_object");
        if (type == "json_schema")
            reader_.constrain(
                c.req,
                RequestReader::schema_grammar(
                    f["json_schema"]["schema"], "response_format",
                    member_as_written(body, {"response_format", "json_schema", "schema"})),
                "response_format json_schema");
    }
    c.seeded = given(j, "seed") && j["seed"] != -1;
    // Chat: "logprobs": true with "top_logprobs": N (0-20); completions:
    // "logprobs": N (0-5), OpenAI's ranges.
    if (route == Route::chat) {
        const bool on = flag(j, "logprobs");
        if (given(j, "top_logprobs")) {
            if (!on) throw FieldError("top_logprobs", "\"top_logprobs\" needs \"logprobs\": true");
            c.req.logprobs = json_whole<int>(j["top_logprobs"], "top_logprobs", 0, 20);
        } else if (on) {
            c.req.logprobs = 0;
        }
    } else if (given(j, "logprobs")) {
        c.req.logprobs = json_whole<int>(j["logprobs"], "logprobs", 0, 5);
    }
    if (given(j, "presence_penalty"))
        c.req.sampling.presence_penalty =
            json_real(j["presence_penalty"], "presence_penalty", -2, 2);
    if (given(j, "frequency_penalty"))
        c.req.sampling.frequency_penalty =
            json_real(j["frequency_penalty"], "frequency_penalty", -2, 2);
    if (given(j, "logit_bias"))
        c.req.sampling.logit_bias = logit_bias(j["logit_bias"], n_vocab_, limits_.max_logit_bias);
    c.stream = flag(j, "stream");
    if (given(j, "stream_options")) {
        const json& so = j["stream_options"];
        if (!so.is_object())
            throw FieldError("stream_options", "\"stream_options\" must be an object");
        c.usage_chunk = flag(so, "include_usage");
    }

    // The context holds the prompt and the answer: a prompt that leaves no
    // room is refused, and max_tokens (or its absence) is capped to the room.
    const auto n_prompt = static_cast<int64_t>(c.req.prompt.size());
    if (n_prompt >= limits_.n_ctx) {
        ApiError e;
        e.message = fmt::format("the prompt takes {} tokens but the context holds {} (start "
                                "the server with a larger -c)",
                                n_prompt, limits_.n_ctx);
        e.param = route == Route::chat ? "messages" : "prompt";
        e.code = "context_length_exceeded";
        throw e;
    }
    const int64_t room = limits_.n_ctx - n_prompt;
    c.req.gen.n_predict = c.req.gen.n_predict < 0 ? room : std::min(c.req.gen.n_predict, room);
    return c;
}

std::optional<std::string> finish_reason(const std::string& stop) {
    if (stop == "eos" || stop == "stop string" || stop == "grammar") return "stop";
    if (stop == "length" || stop == "context full") return "length";
    return std::nullopt;
}

json usage(const SeqResult& r) {
    return json{{"prompt_tokens", r.n_prompt},
                {"completion_tokens", r.gen.generated},
                {"total_tokens", r.n_prompt + r.gen.generated},
                {"prompt_tokens_details", {{"cached_tokens", r.cached}}}};
}

namespace {

json head(const ApiCall& c, const std::string& id, int64_t created, bool chunk) {
    const char* object = c.route == Route::chat
                             ? (chunk ? "chat.completion.chunk" : "chat.completion")
                             : "text_completion";
    return json{{"id", id},
                {"object", object},
                {"created", created},
                {"model", c.model},
                {"system_fingerprint", "kvrun"}};
}

} // namespace

json logprobs_body(Route route, const Tokenizer& tok, std::span<const TokenLogprob> lps,
                   size_t& offset) {
    if (lps.empty()) return nullptr;
    // A control token's text is its name (<|im_end|>), not "".
    auto piece_of = [&tok](int32_t id) { return tok.piece(id, true); };
    // OpenAI's offsets count characters: bytes that start one.
    auto chars = [](const std::string& s) {
        return static_cast<size_t>(std::count_if(s.begin(), s.end(), [](char c) {
            return (static_cast<unsigned char>(c) & 0xC0) != 0x80;
        }));
    };
    auto bytes = [](const std::string& s) {
        json b = json::array();
        for (unsigned char ch : s) b.push_back(ch);
        return b;
    };
    if (route == Route::chat) {
        json content = json::array();
        for (const TokenLogprob& t : lps) {
            const std::string piece = piece_of(t.token);
            json top = json::array();
            for (const auto& [id, lp] : t.top) {
                const std::string p = piece_of(id);
                top.push_back({{"token", p}, {"logprob", lp}, {"bytes", bytes(p)}});
            }
            content.push_back({{"token", piece},
                               {"logprob", t.logprob},
                               {"bytes", bytes(piece)},
                               {"top_logprobs", top}});
        }
        return json{{"content", content}, {"refusal", nullptr}};
    }
    json tokens = json::array(), logprobs = json::array(), top = json::array(),
         offsets = json::array();
    for (const TokenLogprob& t : lps) {
        const std::string piece = piece_of(t.token);
        tokens.push_back(piece);
        logprobs.push_back(t.logprob);
        json alts = json::object();
        for (const auto& [id, lp] : t.top) alts[piece_of(id)] = lp;
        top.push_back(alts);
        offsets.push_back(offset);
        offset += chars(piece);
    }
    return json{{"tokens", tokens},
                {"token_logprobs", logprobs},
                {"top_logprobs", top},
                {"text_offset", offsets}};
}

json answer_body(const ApiCall& c, const std::string& id, int64_t created, const std::string& text,
                 const SeqResult& r, const json& logprobs) {
    json j = head(c, id, created, false);
    json choice = {{"index", 0},
                   {"logprobs", logprobs},
                   {"finish_reason", finish_reason(r.gen.stop).value_or("stop")}};
    if (c.route == Route::chat)
        choice["message"] = {{"role", "assistant"}, {"content", text}};
    else
        choice["text"] = text;
    j["choices"] = json::array({choice});
    j["usage"] = usage(r);
    return j;
}

json chunk_body(const ApiCall& c, const std::string& id, int64_t created, const std::string* text,
                const std::string* finish, bool role, const json& logprobs) {
    json j = head(c, id, created, true);
    json choice = {
        {"index", 0}, {"logprobs", logprobs}, {"finish_reason", finish ? json(*finish) : json()}};
    if (c.route == Route::chat) {
        json delta = json::object();
        if (role) delta["role"] = "assistant";
        if (text)
            delta["content"] = *text;
        else if (role)
            delta["content"] = "";
        choice["delta"] = delta;
    } else {
        choice["text"] = text ? *text : "";
    }
    j["choices"] = json::array({choice});
    if (c.usage_chunk) j["usage"] = nullptr;
    return j;
}

json usage_chunk_body(const ApiCall& c, const std::string& id, int64_t created,
                      const SeqResult& r) {
    json j = head(c, id, created, true);
    j["choices"] = json::array();
    j["usage"] = usage(r);
    return j;
}

} // namespace kvrun::serve
