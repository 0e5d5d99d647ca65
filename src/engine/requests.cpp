#include "requests.h"

#include <algorithm>
#include <stdexcept>
#include <utility>

#include <fmt/format.h>

#include "chat_session.h"
#include "chat_template.h"
#include "error.h"
#include "json_schema.h"
#include "unicode.h"

namespace kvrun {

namespace {

using json = nlohmann::json;

std::vector<std::string> stop_list(const json& v) {
    if (v.is_string()) return {v.get<std::string>()};
    if (!v.is_array()) throw FieldError("stop", "\"stop\" must be a string or an array of them");
    std::vector<std::string> out;
    for (const json& s : v) {
        if (!s.is_string()) throw FieldError("stop", "\"stop\" must hold strings");
        out.push_back(s.get<std::string>());
    }
    return out;
}

} // namespace

float json_real(const json& v, const char* key, double lo, double hi) {
    if (!v.is_number()) throw FieldError(key, fmt::format("\"{}\" must be a number", key));
    const double d = v.get<double>();
    if (!(d >= lo && d <= hi))
        throw FieldError(key, fmt::format("\"{}\" must be in [{}, {}]", key, lo, hi));
    return static_cast<float>(d);
}

bool json_flag(const json& v, const char* key) {
    if (!v.is_boolean()) throw FieldError(key, fmt::format("\"{}\" must be true or false", key));
    return v.get<bool>();
}

json parse_request_json(std::string_view text) {
    int depth = 0;
    bool in_string = false, escaped = false;
    for (const char c : text) {
        if (in_string) {
            if (escaped)
                escaped = false;
            else if (c == '\\')
                escaped = true;
            else if (c == '"')
                in_string = false;
        } else if (c == '"') {
            in_string = true;
        } else if (c == '[' || c == '{') {
            if (++depth > kMaxJsonDepth)
                throw std::invalid_argument(
                    fmt::format("the JSON nests deeper than {} levels", kMaxJsonDepth));
        } else if (c == ']' || c == '}') {
            depth--;
        }
    }
    return json::parse(text);
}

struct RequestReader::Impl {
    Impl(const LoadedModel& lm, RequestDefaults d)
        : lm_(lm), d_(std::move(d)),
          tmpl_(ChatTemplate::for_model(lm.file, lm.tokenizer, d_.chat_template)),
          end_(reply_end(tmpl_, lm.tokenizer)) {}

    ParsedRequest parse(const std::string& line, size_t number_in_input) const {
        ParsedRequest p;
        p.id = static_cast<int64_t>(number_in_input);
        try {
            if (d_.lines) {
                std::string msg = line;
                if (!msg.empty() && msg.back() == '\r') msg.pop_back();
                check_text(msg);
                std::vector<ChatMessage> m;
                if (!d_.system.empty()) m.push_back({"system", d_.system});
                m.push_back({"user", msg});
                p.req = chat_request(m);
                p.chat = true;
                return p;
            }
            const json j = parse_request_json(line);
            if (!j.is_object()) throw std::invalid_argument("a request is a JSON object");
            if (j.contains("id")) p.id = j.at("id");
            p.req = request(j, line);
            p.chat = j.contains("messages");
        } catch (const json::exception& e) {
            p.error = std::string("not JSON: ") + e.what();
            p.req.reset();
        } catch (const std::exception& e) {
            p.error = e.what();
            p.req.reset();
        }
        return p;
    }

    void check_text(const std::string& s) const {
        if (!unicode::valid_utf8(s)) throw std::invalid_argument("the text is not valid UTF-8");
    }
    SeqRequest base() const {
        SeqRequest r;
        r.sampling = d_.sampling;
        r.gen.n_predict = d_.n_predict;
        r.gen.ignore_eos = d_.ignore_eos;
        r.gen.stop = d_.stop;
        return r;
    }
    SeqRequest chat_request(const std::vector<ChatMessage>& m) const {
        SeqRequest r = base();
        r.prompt = chat_tokens(lm_.tokenizer, tmpl_.format_text(m, true), true);
        r.gen.end_ids = end_.ids;
        r.gen.stop.insert(r.gen.stop.end(), end_.strings.begin(), end_.strings.end());
        return r;
    }
    SeqRequest request(const json& j, std::string_view raw) const {
        static const char* known[] = {"id",          "prompt",  "messages",   "max_tokens",
                                      "temperature", "top_k",   "top_p",      "min_p",
                                      "seed",        "stop",    "ignore_eos", "repeat_penalty",
                                      "model",       "grammar", "json_schema"};
        for (const auto& item : j.items()) {
            const std::string& key = item.key();
            if (std::find_if(std::begin(known), std::end(known),
                             [&key](const char* s) { return key == s; }) == std::end(known))
                throw std::invalid_argument(fmt::format("unknown field \"{}\"", key));
        }
        if (j.contains("prompt") == j.contains("messages"))
            throw std::invalid_argument("give \"prompt\" or \"messages\" (one of them)");
        SeqRequest r;
        if (j.contains("prompt")) {
            if (!j["prompt"].is_string())
                throw std::invalid_argument("\"prompt\" must be a string");
            r = from_prompt(j["prompt"].get<std::string>());
        } else {
            r = from_messages(j["messages"]);
        }
        read_fields(j, r, raw);
        return r;
    }
    SeqRequest from_prompt(const std::string& text) const {
        check_text(text);
        SeqRequest r = base();
        r.prompt = lm_.tokenizer.encode(text, true, true);
        r.gen.strip_leading_space = r.prompt.size() == 1 && r.prompt[0] == lm_.tokenizer.bos() &&
                                    lm_.tokenizer.vocab().add_space_prefix;
        if (r.prompt.empty())
            throw std::invalid_argument("the prompt is empty and the model adds no BOS token");
        return r;
    }
    SeqRequest from_tokens(const json& ids) const {
        SeqRequest r = base();
        const int n_vocab = lm_.model.hp.n_vocab;
        for (const json& t : ids)
            r.prompt.push_back(json_whole<int32_t>(t, "prompt", 0, n_vocab - 1));
        if (r.prompt.empty()) throw std::invalid_argument("\"prompt\" holds no tokens");
        return r;
    }
    SeqRequest from_messages(const json& ms) const {
        if (!ms.is_array() || ms.empty())
            throw std::invalid_argument("\"messages\" must be a non-empty array");
        std::vector<ChatMessage> m;
        for (const json& e : ms) {
            if (!e.is_object() || !e.contains("role") || !e["role"].is_string() ||
                !e.contains("content"))
                throw std::invalid_argument(
                    "each message must be an object with a string \"role\" and a \"content\"");
            m.push_back({e["role"].get<std::string>(), content_text(e["content"])});
            check_text(m.back().content);
        }
        try {
            return chat_request(m);
        } catch (const Error& e) {
            throw std::invalid_argument(e.what());
        }
    }
    // A message's content: a string, or text parts joined.
    static std::string content_text(const json& c) {
        if (c.is_string()) return c.get<std::string>();
        if (!c.is_array())
            throw std::invalid_argument(
                "a message's \"content\" must be a string or a list of text parts");
        std::string text;
        for (const json& part : c) {
            if (!part.is_object() || !part.contains("type") || part["type"] != "text")
                throw std::invalid_argument(
                    "only text parts ({\"type\": \"text\", \"text\": ...}) are supported in "
                    "\"content\"");
            if (!part.contains("text") || !part["text"].is_string())
                throw std::invalid_argument("a text part needs a string \"text\"");
            text += part["text"].get<std::string>();
        }
        return text;
    }
    void read_fields(const json& j, SeqRequest& r, std::string_view raw) const {
        // A field set to null is a field not given (clients send nulls).
        auto has = [&j](const char* key) { return j.contains(key) && !j[key].is_null(); };
        if (has("max_tokens"))
            r.gen.n_predict =
                json_whole<int64_t>(j["max_tokens"], "max_tokens", -1, int64_t{1} << 40);
        if (has("temperature"))
            r.sampling.temp = json_real(j["temperature"], "temperature", 0, 100);
        if (has("top_k")) r.sampling.top_k = json_whole<int>(j["top_k"], "top_k", 0, 1 << 30);
        if (has("top_p")) r.sampling.top_p = json_real(j["top_p"], "top_p", 0, 1);
        if (has("min_p")) r.sampling.min_p = json_real(j["min_p"], "min_p", 0, 1);
        if (has("repeat_penalty"))
            r.sampling.repeat_penalty = json_real(j["repeat_penalty"], "repeat_penalty", 1e-6, 100);
        // Any 64-bit seed; -1 is llama.cpp's "random" (the default stays).
        if (has("seed") && j["seed"] != -1)
            r.sampling.seed =
                json_whole<uint64_t>(j["seed"], "seed", std::numeric_limits<int64_t>::min(),
                                     std::numeric_limits<uint64_t>::max());
        if (has("stop")) {
            const std::vector<std::string> s = stop_list(j["stop"]);
            for (const std::string& x : s) check_text(x);
            r.gen.stop.insert(r.gen.stop.end(), s.begin(), s.end());
        }
        if (has("ignore_eos")) {
            r.gen.ignore_eos = json_flag(j["ignore_eos"], "ignore_eos");
        }
        if (has("grammar")) { // GBNF, as kvrun --grammar takes it
            if (!j["grammar"].is_string())
                throw FieldError("grammar", "\"grammar\" must be a string (GBNF)");
            std::shared_ptr<const Grammar> g;
            try {
                g = std::make_shared<const Grammar>(compile_gbnf(j["grammar"].get<std::string>()));
            } catch (const Error& e) {
                throw FieldError("grammar", fmt::format("\"grammar\": {}", e.what()));
            }
            constrain(r, std::move(g), "the request's grammar");
        }
        if (has("json_schema")) { // a schema (an object), as kvrun --json-schema takes it
            if (r.sampling.grammar)
                throw FieldError("json_schema", "give \"grammar\" or \"json_schema\", not both");
            constrain(r,
                      schema_grammar(j["json_schema"], "json_schema",
                                     raw.empty() ? std::string()
                                                 : member_as_written(raw, {"json_schema"})),
                      "the request's json_schema");
        }
    }
    // The grammar of the texts a JSON schema accepts; FieldError(field) when
    // it cannot be built.
    static std::shared_ptr<const Grammar> schema_grammar(const json& schema, const char* field,
                                                         const std::string& as_written) {
        if (!schema.is_object() && !schema.is_boolean())
            throw FieldError(field, fmt::format("\"{}\" must be a JSON schema (an object)", field));
        try {
            return std::make_shared<const Grammar>(
                compile_gbnf(json_schema_to_gbnf(as_written.empty() ? schema.dump() : as_written)));
        } catch (const Error& e) {
            throw FieldError(field, fmt::format("\"{}\": {}", field, e.what()));
        }
    }
    void constrain(SeqRequest& r, std::shared_ptr<const Grammar> g, std::string source) const {
        r.sampling.grammar = std::make_shared<const OutputGrammar>(
            OutputGrammar{std::move(g), vocab_bytes_, r.gen.end_ids, r.gen.strip_leading_space,
                          std::move(source)});
    }

    const LoadedModel& lm_;
    RequestDefaults d_;
    ChatTemplate tmpl_;
    ReplyEnd end_;
    // The vocabulary as bytes for grammars, built once (requests are read
    // on several threads in kvrun serve: nothing here is built lazily).
    std::shared_ptr<const TokenBytes> vocab_bytes_ =
        std::make_shared<const TokenBytes>(lm_.tokenizer);
};

RequestReader::RequestReader(const LoadedModel& lm, RequestDefaults d)
    : impl_(std::make_unique<Impl>(lm, std::move(d))) {}

RequestReader::~RequestReader() = default;

std::shared_ptr<const Grammar> RequestReader::schema_grammar(const nlohmann::json& schema,
                                                             const char* field,
                                                             const std::string& as_written) {
    return Impl::schema_grammar(schema, field, as_written);
}

std::string member_as_written(std::string_view body, std::initializer_list<const char*> path) {
    const auto j = nlohmann::ordered_json::parse(body, nullptr, false);
    const nlohmann::ordered_json* at = &j;
    for (const char* key : path) {
        if (!at->is_object() || !at->contains(key)) return {};
        at = &(*at)[key];
    }
    return at->dump();
}

void RequestReader::constrain(SeqRequest& r, std::shared_ptr<const Grammar> g,
                              std::string source) const {
    impl_->constrain(r, std::move(g), std::move(source));
}

ParsedRequest RequestReader::parse(const std::string& input, size_t number_in_input) const {
    return impl_->parse(input, number_in_input);
}

SeqRequest RequestReader::from_prompt(const std::string& text) const {
    return impl_->from_prompt(text);
}

SeqRequest RequestReader::from_tokens(const nlohmann::json& ids) const {
    return impl_->from_tokens(ids);
}

SeqRequest RequestReader::from_messages(const nlohmann::json& messages) const {
    return impl_->from_messages(messages);
}

void RequestReader::read_fields(const nlohmann::json& j, SeqRequest& r,
                                std::string_view raw) const {
    impl_->read_fields(j, r, raw);
}

} // namespace kvrun
