#include "chat_template.h"

#include <algorithm>

#include "error.h"
#include "gguf.h"
#include "tokenizer.h"

namespace kvrun {

namespace {

bool has(std::string_view s, std::string_view what) {
    return s.find(what) != std::string_view::npos;
}

// Python's str.strip() / Jinja's trim on ASCII whitespace.
std::string trim(std::string_view s) {
    const char* ws = " \t\n\r\f\v";
    const size_t b = s.find_first_not_of(ws);
    if (b == std::string_view::npos) return {};
    return std::string(s.substr(b, s.find_last_not_of(ws) - b + 1));
}

std::string rtrim(std::string_view s) {
    const size_t e = s.find_last_not_of(" \t\n\r\f\v");
    return e == std::string_view::npos ? std::string() : std::string(s.substr(0, e + 1));
}

// The string literals of a Jinja text, escapes resolved ('\n' -> newline).
std::vector<std::string> string_literals(std::string_view t) {
    std::vector<std::string> out;
    for (size_t i = 0; i < t.size(); i++) {
        const char q = t[i];
        if (q != '\'' && q != '"') continue;
        std::string lit;
        size_t j = i + 1;
        for (; j < t.size() && t[j] != q; j++) {
            if (t[j] == '\\' && j + 1 < t.size()) {
                const char e = t[++j];
                lit += e == 'n' ? '\n' : e == 't' ? '\t' : e;
            } else {
                lit += t[j];
            }
        }
        out.push_back(std::move(lit));
        i = j;
    }
    return out;
}

// Qwen-style templates write a default system turn when the conversation
// has none: a literal "<|im_start|>system\n...<|im_end|>" (one whose text is
// followed by message content instead is not a default).
std::string chatml_default_system(std::string_view t) {
    const std::string open = "<|im_start|>system\n", end = "<|im_end|>";
    for (const std::string& lit : string_literals(t)) {
        if (lit.rfind(open, 0) != 0) continue;
        const size_t e = lit.find(end, open.size());
        if (e != std::string::npos) return lit.substr(open.size(), e - open.size());
    }
    return {};
}

struct Name {
    const char* name;
    ChatFamily family;
};
constexpr Name kNames[] = {
    {"plain", ChatFamily::plain},     {"llama2", ChatFamily::llama2},
    {"llama3", ChatFamily::llama3},   {"chatml", ChatFamily::chatml},
    {"mistral", ChatFamily::mistral}, {"phi3", ChatFamily::phi3},
    {"gemma", ChatFamily::gemma},     {"gemma4", ChatFamily::gemma4},
    {"zephyr", ChatFamily::zephyr},
};

} // namespace

const char* ChatTemplate::names() {
    return "plain, llama2, llama3, chatml, mistral, phi3, gemma, gemma4, zephyr";
}

const char* ChatTemplate::name() const {
    for (const Name& n : kNames)
        if (n.family == family_) return n.name;
    return "?";
}

ChatTemplate ChatTemplate::named(std::string_view name, std::string bos, std::string eos) {
    ChatTemplate t;
    bool found = false;
    for (const Name& n : kNames)
        if (name == n.name) t.family_ = n.family, found = true;
    if (!found) fail(Exit::usage, "--chat-template {}: unknown (use one of {})", name, names());
    t.bos_ = std::move(bos);
    t.eos_ = std::move(eos);
    // These templates all begin with {{ bos_token }} in their usual form.
    t.bos_at_start_ = t.family_ == ChatFamily::llama3 || t.family_ == ChatFamily::gemma ||
                      t.family_ == ChatFamily::gemma4 || t.family_ == ChatFamily::mistral;
    return t;
}

ChatTemplate ChatTemplate::detect(std::string_view j, std::string bos, std::string eos) {
    // Order matters: the most specific markers first ([INST] is shared by
    // llama2 and mistral, <|assistant|> by phi3 and zephyr).
    const char* n = nullptr;
    if (trim(j).empty())
        n = "plain";
    else if (has(j, "<|im_start|>"))
        n = "chatml";
    else if (has(j, "<|start_header_id|>"))
        n = "llama3";
    else if (has(j, "<|turn>"))
        n = "gemma4";
    else if (has(j, "<start_of_turn>"))
        n = "gemma";
    else if (has(j, "<|assistant|>") && has(j, "<|end|>"))
        n = "phi3";
    else if (has(j, "<|assistant|>") && has(j, "<|user|>"))
        n = "zephyr";
    else if (has(j, "[INST]") && has(j, "<<SYS>>"))
        n = "llama2";
    else if (has(j, "[INST]"))
        n = "mistral";
    else
        fail(Exit::template_error,
             "the model's chat template is of no family kvrun knows; choose one with "
             "--chat-template ({})",
             names());
    ChatTemplate t = named(n, std::move(bos), std::move(eos));
    if (t.family_ == ChatFamily::mistral || t.family_ == ChatFamily::phi3)
        t.bos_at_start_ = has(j, "bos_token");
    if (t.family_ == ChatFamily::chatml) t.default_system_ = chatml_default_system(j);
    return t;
}

ChatTemplate ChatTemplate::for_model(const GgufFile& f, const Tokenizer& tok,
                                     const std::string& override_name) {
    const Vocab& v = tok.vocab();
    auto text = [&](int32_t id) {
        return id >= 0 && id < static_cast<int32_t>(v.tokens.size()) ? v.tokens[id] : std::string();
    };
    if (!override_name.empty()) return named(override_name, text(v.bos), text(v.eos));
    const std::string_view jinja = f.get_str("tokenizer.chat_template").value_or("");
    if (trim(jinja).empty()) {
        // No template (base models are often shipped so): a vocabulary with a
        // family's turn markers was trained, or at least built, for that format.
        auto has_token = [&](std::string_view s) {
            return std::find(v.tokens.begin(), v.tokens.end(), s) != v.tokens.end();
        };
        const char* n = nullptr;
        if (has_token("<|turn>") && has_token("<turn|>"))
            n = "gemma4";
        else if (has_token("<start_of_turn>") && has_token("<end_of_turn>"))
            n = "gemma";
        else if (has_token("<|im_start|>") && has_token("<|im_end|>"))
            n = "chatml";
        else if (has_token("<|start_header_id|>") && has_token("<|eot_id|>"))
            n = "llama3";
        else if (has_token("<|user|>") && has_token("<|assistant|>") && has_token("<|end|>"))
            n = "phi3";
        if (n) {
            ChatTemplate t = named(n, text(v.bos), text(v.eos));
            t.inferred_ = true;
            return t;
        }
    }
    return detect(jinja, text(v.bos), text(v.eos));
}

ChatText ChatTemplate::prefix_text(const std::string& sys) const {
    const std::string bos = bos_at_start_ ? bos_ : "";
    const ChatText m = ChatText::message(sys);
    switch (family_) {
    case ChatFamily::plain:
        return sys.empty() ? ChatText() : m + "\n\n";
    case ChatFamily::chatml:
        return sys.empty() ? ChatText() : "<|im_start|>system\n" + m + "<|im_end|>\n";
    case ChatFamily::llama3:
        return sys.empty() ? ChatText(bos)
                           : bos + "<|start_header_id|>system<|end_header_id|>\n\n" +
                                 ChatText::message(trim(sys)) + "<|eot_id|>";
    // Llama 2 opens the first [INST] with the system block; the pinned prefix
    // ends there and the first user message continues it.
    case ChatFamily::llama2:
        return sys.empty() ? ChatText() : bos_ + "[INST] <<SYS>>\n" + m + "\n<</SYS>>\n\n";
    case ChatFamily::phi3:
        return sys.empty() ? ChatText(bos) : bos + "<|system|>\n" + m + "<|end|>\n";
    case ChatFamily::zephyr:
        return sys.empty() ? ChatText() : "<|system|>\n" + m + eos_ + "\n";
    // Mistral's and Gemma's templates have no system role: kvrun folds the
    // system prompt into the first user message, as their later versions do.
    case ChatFamily::mistral:
    case ChatFamily::gemma:
        return bos;
    // Gemma 4 has a system turn (trimmed, as its template does).
    case ChatFamily::gemma4:
        return sys.empty() ? ChatText(bos)
                           : bos + "<|turn>system\n" + ChatText::message(trim(sys)) + "<turn|>\n";
    }
    return {};
}

ChatText ChatTemplate::user_text(const std::string& u, bool first, const std::string& sys) const {
    const bool fold = first && !sys.empty();
    using M = ChatText;
    switch (family_) {
    case ChatFamily::plain:
        return "User: " + M::message(u) + "\n";
    case ChatFamily::chatml:
        return "<|im_start|>user\n" + M::message(u) + "<|im_end|>\n";
    case ChatFamily::llama3:
        return "<|start_header_id|>user<|end_header_id|>\n\n" + M::message(trim(u)) + "<|eot_id|>";
    // content.strip() of "<<SYS>>...\n\n" + message: only the message's end is stripped.
    case ChatFamily::llama2:
        return fold ? M::message(rtrim(u)) + " [/INST]"
                    : bos_ + "[INST] " + M::message(trim(u)) + " [/INST]";
    // The folded "\n\n" between the system prompt and the message is content
    // too: plain text either way.
    case ChatFamily::mistral:
        return "[INST] " + M::message(fold ? sys + "\n\n" + u : u) + " [/INST]";
    case ChatFamily::phi3:
        return "<|user|>\n" + M::message(u) + "<|end|>\n";
    case ChatFamily::gemma:
        return "<start_of_turn>user\n" + M::message(trim(fold ? sys + "\n\n" + u : u)) +
               "<end_of_turn>\n";
    case ChatFamily::gemma4:
        return "<|turn>user\n" + M::message(trim(u)) + "<turn|>\n";
    case ChatFamily::zephyr:
        return "<|user|>\n" + M::message(u) + eos_ + "\n";
    }
    return {};
}

std::string ChatTemplate::generation_prompt() const {
    switch (family_) {
    case ChatFamily::plain:
        return "Assistant:";
    case ChatFamily::chatml:
        return "<|im_start|>assistant\n";
    case ChatFamily::llama3:
        return "<|start_header_id|>assistant<|end_header_id|>\n\n";
    case ChatFamily::llama2:
    case ChatFamily::mistral:
        return ""; // [/INST] already asks for the answer
    case ChatFamily::phi3:
    case ChatFamily::zephyr:
        return "<|assistant|>\n";
    case ChatFamily::gemma:
        return "<start_of_turn>model\n";
    // With thinking off (its template's default) the model's turn opens
    // with an empty thought channel.
    case ChatFamily::gemma4:
        return "<|turn>model\n<|channel>thought\n<channel|>";
    }
    return {};
}

ChatText ChatTemplate::reply_text(const std::string& a) const {
    switch (family_) {
    case ChatFamily::plain:
    case ChatFamily::llama2:
        return " " + ChatText::message(trim(a));
    case ChatFamily::llama3:
    case ChatFamily::gemma:
    case ChatFamily::gemma4:
        return ChatText::message(trim(a));
    default:
        return ChatText::message(a);
    }
}

std::string ChatTemplate::close() const {
    switch (family_) {
    case ChatFamily::plain:
        return "\n";
    case ChatFamily::chatml:
        return "<|im_end|>\n";
    case ChatFamily::llama3:
        return "<|eot_id|>";
    case ChatFamily::llama2:
        return " " + eos_;
    case ChatFamily::mistral:
        return eos_;
    case ChatFamily::phi3:
        return "<|end|>\n";
    case ChatFamily::gemma:
        return "<end_of_turn>\n";
    case ChatFamily::gemma4:
        return "<turn|>\n";
    case ChatFamily::zephyr:
        return eos_ + "\n";
    }
    return {};
}

std::vector<std::string> ChatTemplate::end_markers() const {
    switch (family_) {
    case ChatFamily::plain:
        return {"\nUser:"};
    case ChatFamily::chatml:
        return {"<|im_end|>"};
    case ChatFamily::llama3:
        return {"<|eot_id|>"};
    case ChatFamily::phi3:
        return {"<|end|>"};
    case ChatFamily::gemma:
        return {"<end_of_turn>"};
    case ChatFamily::gemma4:
        return {"<turn|>"};
    default:
        return {eos_}; // llama2, mistral, zephyr end with EOS
    }
}

ChatText ChatTemplate::format_text(const std::vector<ChatMessage>& msgs,
                                   bool add_generation_prompt) const {
    size_t i = 0;
    std::string sys = default_system_;
    if (!msgs.empty() && msgs[0].role == "system") sys = msgs[i++].content;
    ChatText out = prefix_text(sys);
    bool first = true;
    for (size_t k = 0; i < msgs.size(); i++, k++) {
        const ChatMessage& m = msgs[i];
        const char* want = k % 2 == 0 ? "user" : "assistant";
        if (m.role != want)
            fail(Exit::template_error,
                 "message {} has role '{}', expected '{}' (user and assistant alternate)", i + 1,
                 m.role, want);
        if (k % 2 == 0) {
            out += user_text(m.content, first, sys);
            first = false;
            if (i + 1 < msgs.size() || add_generation_prompt) out += generation_prompt();
        } else {
            out += reply_text(m.content) + close();
        }
    }
    return out;
}

} // namespace kvrun
