// A grammar applied to a model's tokens: which tokens may come next (a
// token's printed bytes must continue a sentence of the grammar; an end
// token is allowed once the text is a whole sentence), and the token mask
// over the whole vocabulary, walked in byte order so that tokens sharing a
// prefix share its matching work.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "grammar.h"
#include "matcher.h"

namespace kvrun {

class Tokenizer;

// The vocabulary as bytes, built once per model: each token's printed bytes
// (Tokenizer::piece: SentencePiece spaces, byte tokens and byte-level BPE
// decoded; control tokens empty, never allowed), and the tokens with bytes
// sorted by them, with each one's common prefix with the one before.
class TokenBytes {
  public:
    explicit TokenBytes(const Tokenizer& tok);
    int32_t n_vocab() const { return static_cast<int32_t>(offsets_.size() - 1); }
    std::string_view bytes(int32_t id) const {
        return {text_.data() + offsets_[id], offsets_[id + 1] - offsets_[id]};
    }
    bool end_of_generation(int32_t id) const { return eog_[id] != 0; }
    std::span<const int32_t> order() const { return order_; }
    std::span<const uint32_t> lcp() const { return lcp_; } // lcp()[k]: order()[k] with order()[k-1]

  private:
    std::string text_;
    std::vector<uint32_t> offsets_; // n_vocab + 1
    std::vector<char> eog_;
    std::vector<int32_t> order_;
    std::vector<uint32_t> lcp_;
};

// What a sampler needs to constrain an answer (SamplerParams::grammar);
// shared, read-only, by every sequence that uses it.
struct OutputGrammar {
    std::shared_ptr<const Grammar> grammar;
    std::shared_ptr<const TokenBytes> vocab;
    std::vector<int32_t> end_ids; // ends an answer besides end-of-generation tokens
    // The first token's leading space is not printed (a SentencePiece answer
    // after a lone BOS: GenerateParams::strip_leading_space), so not matched.
    bool strip_first_space = false;
    std::string source; // how the user gave it, for messages ("--grammar-file x.gbnf")
};

class GrammarConstraint {
  public:
    explicit GrammarConstraint(std::shared_ptr<const OutputGrammar> g);
    void reset(); // a new answer

    bool allows(int32_t id) const;
    // Sets every token it does not allow to -inf; returns how many it allows.
    int32_t mask(float* logits) const;
    void accept(int32_t id);                         // an allowed token was chosen
    bool complete() const { return m_.accepting(); } // the answer so far is a whole sentence
    bool done() const { return m_.accepting() && !m_.can_continue(); } // and nothing may follow
    const OutputGrammar& spec() const { return *g_; }

  private:
    bool is_end(int32_t id) const;
    std::string_view bytes(int32_t id) const;

    std::shared_ptr<const OutputGrammar> g_;
    GrammarMatcher m_;
    bool first_ = true;
    // mask()'s walk: the stacks after each prefix length of the current token
    mutable std::vector<std::vector<int32_t>> levels_;
    mutable std::vector<char> complete_at_;
    mutable std::vector<size_t> marks_;
};

} // namespace kvrun
