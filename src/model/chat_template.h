// Chat templates: how a model was trained to see a conversation.
//
// GGUF files carry `tokenizer.chat_template`, a Jinja program. Rather than
// interpret Jinja, kvrun recognises the template family from marker strings
// in its text (every model of a family renders turns the same way) and
// renders that family natively. Families: llama2 ([INST] with <<SYS>>),
// llama3 (header ids), chatml (Qwen, SmolLM), mistral ([INST] without
// <<SYS>>), phi3, gemma, zephyr; `plain` is the documented fallback for a
// model without a template:
//
//     {system}\n\n            (only with a system prompt)
//     User: {message}\nAssistant: {reply}\n   (per turn)
//
// A conversation renders as prefix + turns, and each turn as
//     user(...) + generation_prompt() + reply(...) + close()
// so the chat session can tokenize it piece by piece: the prefix (BOS and
// system prompt) is pinned, the reply is the tokens the model generated, and
// a new turn only adds its own text.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kvrun {

class GgufFile;
class Tokenizer;

// Template text and the byte spans of it that are message content (the
// system prompt, a user message, a reply). Content is tokenized as plain
// text: a message that writes "<|im_start|>" gets those characters, not the
// control token, so only the template's own markers are special and a message
// cannot forge turns.
struct ChatText {
    std::string text;
    std::vector<std::pair<size_t, size_t>> content; // [begin, end) within text

    ChatText() = default;
    ChatText(std::string marker) : text(std::move(marker)) {} // template text
    ChatText(const char* marker) : text(marker) {}
    static ChatText message(std::string s) {
        ChatText t(std::move(s));
        if (!t.text.empty()) t.content.emplace_back(0, t.text.size());
        return t;
    }
    ChatText& operator+=(const ChatText& o) {
        for (auto [b, e] : o.content) content.emplace_back(text.size() + b, text.size() + e);
        text += o.text;
        return *this;
    }
    friend ChatText operator+(ChatText a, const ChatText& b) { return a += b; }
};

enum class ChatFamily { plain, llama2, llama3, chatml, mistral, phi3, gemma, gemma4, zephyr };

struct ChatMessage {
    std::string role; // system, user, assistant
    std::string content;
};

class ChatTemplate {
  public:
    // Recognise a template text; "" gives the plain fallback. `bos`/`eos` are
    // the texts the template's bos_token / eos_token stand for. Throws
    // Error(template_error) for a text of no known family.
    static ChatTemplate detect(std::string_view jinja, std::string bos, std::string eos);
    // --chat-template NAME (see names()); throws Error(usage) for an unknown name.
    static ChatTemplate named(std::string_view name, std::string bos, std::string eos);
    // The model's template (or `override_name` when not empty), with the
    // vocabulary's BOS/EOS texts.
    static ChatTemplate for_model(const GgufFile& f, const Tokenizer& tok,
                                  const std::string& override_name);
    static const char* names(); // "llama2, llama3, ..." for help texts

    ChatFamily family() const { return family_; }
    // The file has no template and the family was read off its vocabulary's
    // turn markers (e.g. <start_of_turn> for a base Gemma file).
    bool inferred() const { return inferred_; }
    const char* name() const;
    // A system prompt the template writes when the conversation has none
    // (Qwen: "You are a helpful assistant.").
    const std::string& default_system() const { return default_system_; }

    // The pieces; `system` is the effective system prompt ("" for none).
    // The *_text forms mark the message content in them (ChatText).
    std::string prefix(const std::string& system) const { return prefix_text(system).text; }
    ChatText prefix_text(const std::string& system) const;
    // The text of a user message; `first`: the first turn after the prefix
    // (families that fold the system prompt into the first message do it here).
    std::string user(const std::string& text, bool first, const std::string& system) const {
        return user_text(text, first, system).text;
    }
    ChatText user_text(const std::string& text, bool first, const std::string& system) const;
    std::string generation_prompt() const;
    // an assistant message as the template writes it
    std::string reply(const std::string& text) const { return reply_text(text).text; }
    ChatText reply_text(const std::string& text) const;
    std::string close() const;            // what ends an assistant message
    // Texts that end a reply: special tokens the model emits (stopped on as
    // tokens when they are single tokens) or, for `plain`, "\nUser:".
    std::vector<std::string> end_markers() const;

    // The whole conversation as one string, exactly as the model's template
    // renders it with add_generation_prompt. Roles must be an optional
    // system message, then user and assistant alternating, starting with
    // user; otherwise throws Error(template_error).
    std::string format(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const {
        return format_text(messages, add_generation_prompt).text;
    }
    ChatText format_text(const std::vector<ChatMessage>& messages,
                         bool add_generation_prompt) const;

  private:
    ChatFamily family_ = ChatFamily::plain;
    std::string bos_, eos_;
    bool inferred_ = false;
    bool bos_at_start_ = false; // the template writes bos_token first
    std::string default_system_;
};

} // namespace kvrun
