// Text <-> token ids for the vocabularies GGUF files carry:
//  - SentencePiece-style (`tokenizer.ggml.model` = "llama"): score-driven merges,
//    byte fallback <0xNN>, U+2581 for spaces, optional leading space;
//  - byte-level BPE (`tokenizer.ggml.model` = "gpt2"): ranked merges from
//    `tokenizer.ggml.merges`, pre-tokenizer split chosen by `tokenizer.ggml.pre`;
//  - BPE over UTF-8 characters (`tokenizer.ggml.model` = "gemma4"): ranked
//    merges, SentencePiece's U+2581 for spaces and <0xNN> byte fallback, the
//    text split only at line breaks.
// Special/control tokens written in the text (e.g. "<s>", "<|im_start|>") are
// matched as whole tokens when parse_special is set.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <string_view>
#include <vector>

namespace kvrun {

class GgufFile;

enum class TokenAttr : int32_t { // tokenizer.ggml.token_type values
    undefined = 0, normal = 1, unknown = 2, control = 3, user_defined = 4, unused = 5, byte = 6,
};

struct Vocab {
    enum class Kind { spm, bpe, bpe_utf8 };
    Kind kind = Kind::spm;
    std::string pre = "default";     // byte-level BPE pre-tokenizer name
    std::vector<std::string> tokens; // as stored in the GGUF
    std::vector<float> scores;       // SPM merge scores (empty => all 0)
    std::vector<TokenAttr> attrs;    // per token
    std::vector<std::string> merges; // BPE: "left right", rank = index
    int32_t bos = -1, eos = -1, eot = -1, unk = -1, pad = -1;
    bool add_bos = true, add_eos = false, add_space_prefix = true;

    // Reads tokenizer.ggml.* keys; throws kvrun::Error(Exit::bad_model) on a
    // missing or inconsistent vocabulary, or an unsupported tokenizer model.
    static Vocab from_gguf(const GgufFile& f);
};

class Tokenizer {
  public:
    explicit Tokenizer(Vocab v);
    ~Tokenizer();
    Tokenizer(Tokenizer&&) noexcept;

    const Vocab& vocab() const;
    int32_t n_vocab() const;
    int32_t bos() const;
    int32_t eos() const;
    bool is_eog(int32_t id) const; // end of generation: eos, eot

    // add_bos: prepend BOS when the vocabulary says so (vocab().add_bos).
    std::vector<int32_t> encode(std::string_view text, bool add_bos, bool parse_special) const;
    // As encode(text, add_bos, true), except that control tokens written
    // across any of the `plain` byte spans of text are text there (a chat
    // message's content, ChatText: only the template's markers are special).
    std::vector<int32_t> encode(std::string_view text, bool add_bos,
                                std::span<const std::pair<size_t, size_t>> plain) const;

    // The bytes a token stands for when printed: U+2581 -> ' ', <0xNN> -> that
    // byte, BPE byte-level chars -> bytes; control tokens -> "" (unless
    // `special`, then their text). May be an incomplete UTF-8 sequence.
    std::string piece(int32_t id, bool special = false) const;

    // Streams valid UTF-8: bytes of a character split across tokens are held
    // back until the character is complete; invalid sequences become U+FFFD.
    class Decoder {
      public:
        explicit Decoder(const Tokenizer& t) : tok_(&t) {}
        std::string push(int32_t id); // text that is now complete
        std::string flush();          // whatever is left (incomplete tail -> U+FFFD)
      private:
        const Tokenizer* tok_;
        std::string pending_;
    };

    std::string decode(const std::vector<int32_t>& ids) const; // whole, via Decoder

  private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

} // namespace kvrun
