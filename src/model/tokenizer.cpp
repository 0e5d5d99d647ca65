// Tokenizer: vocabulary loading, special-token splitting, SentencePiece-style
// and byte-level BPE encoding, and UTF-8-safe decoding. The encoders follow
// the behaviour of the reference engine (llama.cpp) so token ids match its
// test vectors and the goldens; the code is our own.
#include "tokenizer.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <queue>
#include <unordered_map>

#include "error.h"
#include "gguf.h"
#include "unicode.h"

namespace kvrun {

// ---- vocabulary ---------------------------------------------------------------

namespace {

constexpr std::string_view k_space_marker = "\xE2\x96\x81"; // U+2581, SentencePiece's space

// Texts of end-of-turn tokens for vocabularies that do not name one, in the
// order of preference (as the reference engine recognises them).
constexpr std::string_view k_eot_texts[] = {
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<turn|>",
    "<|endoftext|>",
    "<EOT>",
    "_<EOT>",
    // DeepSeek's "<｜end▁of▁sentence｜>", split so that \x9C does not swallow the 'e'
    "<\xEF\xBD\x9C"
    "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>",
};
// Texts that end generation whenever present (end of turn / of message).
constexpr std::string_view k_eog_texts[] = {
    "<|eot_id|>",    "<|im_end|>", "<|end|>", "<end_of_turn>", "<turn|>",
    "<|endoftext|>", "<|eom_id|>", "<EOT>",   "_<EOT>",
};

// A token id key: absent -> def; -1 / all-ones (how converters write "none")
// -> -1; anything else must index the vocabulary.
int32_t read_token_id(const GgufFile& f, std::string_view key, int64_t n, int32_t def) {
    const GgufValue* v = f.find(key);
    if (!v) return def;
    if (!v->is_integer())
        fail(Exit::bad_model, "{}: '{}' should be an integer, is {}", f.path(), key,
             gguf_type_name(v->type));
    bool is_signed = v->type == GgufType::i8 || v->type == GgufType::i16 ||
                     v->type == GgufType::i32 || v->type == GgufType::i64;
    if (is_signed ? v->i == -1 : (v->u == 0xFFFFFFFFu || v->u == UINT64_MAX)) return -1;
    if (is_signed ? (v->i < 0 || v->i >= n) : v->u >= static_cast<uint64_t>(n))
        fail(Exit::bad_model, "{}: '{}' = {} is out of range for a vocabulary of {} tokens",
             f.path(), key, is_signed ? v->i : static_cast<int64_t>(v->u), n);
    return static_cast<int32_t>(is_signed ? v->i : static_cast<int64_t>(v->u));
}

} // namespace

Vocab Vocab::from_gguf(const GgufFile& f) {
    Vocab v;
    auto model = f.get_str("tokenizer.ggml.model");
    if (!model)
        fail(Exit::bad_model, "{}: no tokenizer (missing 'tokenizer.ggml.model')", f.path());
    if (*model == "llama") {
        v.kind = Kind::spm;
    } else if (*model == "gpt2") {
        v.kind = Kind::bpe;
    } else if (*model == "gemma4") {
        v.kind = Kind::bpe_utf8;
    } else {
        fail(Exit::bad_model,
             "{}: unsupported tokenizer model '{}' (supported: 'llama' SentencePiece, 'gpt2' "
             "byte-level BPE, 'gemma4' BPE)",
             f.path(), *model);
    }

    const GgufValue& toks = f.need_array("tokenizer.ggml.tokens", GgufType::string);
    if (toks.strs.empty()) fail(Exit::bad_model, "{}: the vocabulary is empty", f.path());
    if (toks.strs.size() > static_cast<size_t>(INT32_MAX))
        fail(Exit::bad_model, "{}: {} tokens is too many", f.path(), toks.strs.size());
    const int64_t n = static_cast<int64_t>(toks.strs.size());
    v.tokens.assign(toks.strs.begin(), toks.strs.end());

    if (f.find("tokenizer.ggml.scores")) {
        const GgufValue& a = f.need_array("tokenizer.ggml.scores", GgufType::f32);
        if (a.count != static_cast<uint64_t>(n))
            fail(Exit::bad_model, "{}: {} scores for {} tokens", f.path(), a.count, n);
        v.scores.resize(n);
        for (int64_t k = 0; k < n; k++) v.scores[k] = static_cast<float>(a.array_f64(k));
    }

    // Without types every token is ordinary text (as the reference assumes).
    v.attrs.assign(n, TokenAttr::normal);
    if (f.find("tokenizer.ggml.token_type")) {
        const GgufValue& a = f.need_array("tokenizer.ggml.token_type", GgufType::i32);
        if (a.count != static_cast<uint64_t>(n))
            fail(Exit::bad_model, "{}: {} token types for {} tokens", f.path(), a.count, n);
        for (int64_t k = 0; k < n; k++) {
            int64_t t = a.array_i64(k);
            if (t < 0 || t > static_cast<int64_t>(TokenAttr::byte))
                fail(Exit::bad_model, "{}: token {} has unknown type {}", f.path(), k, t);
            v.attrs[k] = static_cast<TokenAttr>(t);
        }
    }

    if (v.kind != Kind::spm) {
        const GgufValue& a = f.need_array("tokenizer.ggml.merges", GgufType::string);
        v.merges.reserve(a.strs.size());
        for (size_t k = 0; k < a.strs.size(); k++) {
            std::string_view m = a.strs[k];
            // The first space at index >= 1 separates the halves.
            if (m.size() < 3 || m.find(' ', 1) == std::string_view::npos)
                fail(Exit::bad_model, "{}: merge {} ('{}') is not 'left right'", f.path(), k, m);
            v.merges.emplace_back(m);
        }
    }

    v.pre = std::string(f.get_str("tokenizer.ggml.pre").value_or("default"));
    bool llama3_pre = false;
    if (v.kind == Kind::bpe) {
        auto split = unicode::pre_split_from_name(v.pre);
        if (!split)
            fail(Exit::bad_model, "{}: unsupported BPE pre-tokenizer '{}'", f.path(), v.pre);
        llama3_pre = *split == unicode::PreSplit::llama3;
    }

    // Defaults where the file is silent follow the reference: SentencePiece
    // vocabularies are <unk>=0 <s>=1 </s>=2, add BOS and a leading space; BPE
    // ones add BOS only for the Llama 3 family, and never a space.
    bool spm = v.kind == Kind::spm;
    auto def = [&](int32_t id) { return spm && id < n ? id : -1; };
    v.unk = read_token_id(f, "tokenizer.ggml.unknown_token_id", n, def(0));
    v.bos = read_token_id(f, "tokenizer.ggml.bos_token_id", n, def(1));
    v.eos = read_token_id(f, "tokenizer.ggml.eos_token_id", n, def(2));
    v.eot = read_token_id(f, "tokenizer.ggml.eot_token_id", n, -1);
    v.pad = read_token_id(f, "tokenizer.ggml.padding_token_id", n, -1);
    v.add_bos = f.get_bool("tokenizer.ggml.add_bos_token").value_or(spm || llama3_pre);
    // Gemma 4 starts every prompt with <bos> whatever the file says: the
    // reference engine overrides a false add_bos_token for it.
    if (v.kind == Kind::bpe_utf8) {
        v.pre = "gemma4";
        v.add_bos = true;
    }
    v.add_eos = f.get_bool("tokenizer.ggml.add_eos_token").value_or(false);
    v.add_space_prefix = f.get_bool("tokenizer.ggml.add_space_prefix").value_or(spm);

    // Chat models often name no end-of-turn token; find it by its text so
    // generation stops at the end of the assistant's turn.
    if (v.eot < 0) {
        size_t best = std::size(k_eot_texts);
        for (int64_t k = 0; k < n; k++) {
            for (size_t j = 0; j < best; j++) {
                if (v.tokens[k] == k_eot_texts[j]) {
                    best = j;
                    v.eot = static_cast<int32_t>(k);
                    break;
                }
            }
        }
    }
    return v;
}

// ---- tokenizer state ---------------------------------------------------------------

namespace {

struct Merge {
    int32_t rank;
    int32_t result; // symbol id of the merged text
};

bool is_special_attr(TokenAttr a) {
    return a == TokenAttr::control || a == TokenAttr::user_defined || a == TokenAttr::unknown;
}

// SentencePiece never merges into control, unknown, unused or byte pieces:
// those only come from their own rules (special splitting, byte fallback).
bool spm_mergeable(TokenAttr a) {
    return a == TokenAttr::normal || a == TokenAttr::user_defined || a == TokenAttr::undefined;
}

int parse_byte_token(std::string_view t) { // "<0xNN>" -> NN, else -1
    if (t.size() != 6 || t.substr(0, 3) != "<0x" || t[5] != '>') return -1;
    int v = 0;
    for (char c : t.substr(3, 2)) {
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                       : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

} // namespace

struct Tokenizer::Impl {
    Vocab v;
    int32_t n = 0;
    // token text -> id; views into v.tokens (never modified after this is
    // built). A text listed twice maps to the last id, as in the reference.
    std::unordered_map<std::string_view, int32_t> to_id;
    std::vector<int32_t> specials;   // control/user-defined/unknown ids, longest text first
    std::vector<std::string> pieces; // (n) piece(id, special = false)
    std::vector<uint8_t> eog;        // (n) 1 = ends generation

    // SPM and UTF-8 BPE
    std::array<int32_t, 256> byte_token; // byte -> <0xNN> token (or -1)

    // BPE: symbols are token ids, plus ids >= n for merge results the
    // vocabulary lacks (their texts in extra), so merging works on integers.
    unicode::PreSplit pre = unicode::PreSplit::gpt2;
    bool ignore_merges = false; // whole pre-token in the vocab -> use it as is
    std::array<int32_t, 256> byte_sym;
    std::vector<std::string> extra;
    std::unordered_map<std::string, int32_t> extra_ids; // text -> id >= n
    std::unordered_map<uint64_t, Merge> merges;         // (left << 32 | right) -> merge

    // A BPE symbol: its id (-1 merged away, -2 a character no token or merge
    // knows) and its bytes in the word being encoded.
    struct Sym {
        int32_t id;
        int prev, next;
        uint32_t off, len;
    };

    explicit Impl(Vocab vocab);
    int32_t lookup(std::string_view text) const {
        auto it = to_id.find(text);
        return it == to_id.end() ? -1 : it->second;
    }

    struct Fragment {
        int32_t token; // >= 0: a special token; -1: text
        std::string_view text;
    };
    using Spans = std::span<const std::pair<size_t, size_t>>;
    std::vector<Fragment> partition(std::string_view text, bool parse_special,
                                    Spans plain = {}) const;
    std::vector<int32_t> encode(std::string_view text, bool add_bos, bool parse_special,
                                Spans plain) const;
    void encode_spm(std::string_view text, bool space_prefix, std::vector<int32_t>& out) const;
    void encode_bpe(std::string_view text, std::vector<int32_t>& out) const;
    void bpe_word(std::string_view word, std::vector<int32_t>& out) const;
    void encode_bpe_utf8(std::string_view text, std::vector<int32_t>& out) const;
    void bpe_utf8_word(std::string_view word, std::vector<int32_t>& out) const;
    void bpe_merge(std::vector<Sym>& syms) const;
    std::string make_piece(int32_t id) const;
};

Tokenizer::Impl::Impl(Vocab vocab) : v(std::move(vocab)) {
    KV_ASSERT(!v.tokens.empty() && v.tokens.size() <= static_cast<size_t>(INT32_MAX));
    n = static_cast<int32_t>(v.tokens.size());
    if (v.attrs.size() != v.tokens.size()) v.attrs.resize(n, TokenAttr::normal);
    if (!v.scores.empty() && v.scores.size() != v.tokens.size()) v.scores.resize(n, 0.0f);
    for (int32_t* id : {&v.bos, &v.eos, &v.eot, &v.unk, &v.pad})
        if (*id >= n) *id = -1;

    to_id.reserve(n);
    for (int32_t i = 0; i < n; i++) to_id.insert_or_assign(std::string_view(v.tokens[i]), i);

    // End-of-generation tokens are control tokens: never printed, and only
    // produced from text when special tokens are parsed.
    eog.assign(n, 0);
    for (int32_t id : {v.eos, v.eot})
        if (id >= 0) eog[id] = 1;
    for (std::string_view t : k_eog_texts)
        if (int32_t id = lookup(t); id >= 0) eog[id] = 1;
    for (int32_t i = 0; i < n; i++)
        if (eog[i] && v.attrs[i] != TokenAttr::control) v.attrs[i] = TokenAttr::control;

    for (int32_t i = 0; i < n; i++)
        if (is_special_attr(v.attrs[i]) && !v.tokens[i].empty()) specials.push_back(i);
    std::stable_sort(specials.begin(), specials.end(),
                     [&](int32_t a, int32_t b) { return v.tokens[a].size() > v.tokens[b].size(); });

    byte_token.fill(-1);
    byte_sym.fill(-1);
    if (v.kind != Vocab::Kind::bpe) {
        for (int b = 0; b < 256; b++) {
            int32_t id = lookup(fmt::format("<0x{:02X}>", b));
            if (id < 0 && b < 0x80 && v.kind == Vocab::Kind::spm)
                id = lookup(std::string(1, static_cast<char>(b)));
            byte_token[b] = id;
        }
    }
    if (v.kind != Vocab::Kind::spm) {
        if (v.kind == Vocab::Kind::bpe) {
            pre = unicode::pre_split_from_name(v.pre).value_or(unicode::PreSplit::gpt2);
            ignore_merges = pre == unicode::PreSplit::llama3;
        }
        auto intern = [&](std::string_view s) {
            if (int32_t id = lookup(s); id >= 0) return id;
            auto [it, added] = extra_ids.try_emplace(std::string(s), 0);
            if (added) {
                it->second = n + static_cast<int32_t>(extra.size());
                extra.emplace_back(s);
            }
            return it->second;
        };
        for (int b = 0; b < 256 && v.kind == Vocab::Kind::bpe; b++) {
            std::string s;
            unicode::append_utf8(s, unicode::byte_to_cp(static_cast<uint8_t>(b)));
            byte_sym[b] = intern(s);
        }
        merges.reserve(v.merges.size());
        for (size_t r = 0; r < v.merges.size() && r < static_cast<size_t>(INT32_MAX); r++) {
            std::string_view m = v.merges[r];
            size_t sp = m.find(' ', 1);
            if (sp == std::string_view::npos) continue; // from_gguf rejects these
            std::string_view left = m.substr(0, sp), right = m.substr(sp + 1);
            int32_t l = intern(left), rr = intern(right);
            int32_t res = intern(std::string(left) + std::string(right));
            uint64_t key = static_cast<uint64_t>(l) << 32 | static_cast<uint32_t>(rr);
            merges.try_emplace(key, Merge{static_cast<int32_t>(r), res}); // first = best rank
        }
    }

    pieces.resize(n);
    for (int32_t i = 0; i < n; i++) pieces[i] = make_piece(i);
}

std::string Tokenizer::Impl::make_piece(int32_t id) const {
    const std::string& t = v.tokens[id];
    switch (v.attrs[id]) {
    case TokenAttr::control:
    case TokenAttr::unknown:
    case TokenAttr::unused:
    case TokenAttr::undefined:
        return {};
    case TokenAttr::user_defined:
        return t;
    case TokenAttr::byte:
        if (v.kind != Vocab::Kind::bpe) {
            int b = parse_byte_token(t);
            return b < 0 ? std::string() : std::string(1, static_cast<char>(b));
        }
        return unicode::byte_decode(t);
    case TokenAttr::normal:
        break;
    }
    if (v.kind == Vocab::Kind::bpe) return unicode::byte_decode(t);
    std::string out;
    out.reserve(t.size());
    for (size_t i = 0; i < t.size();) {
        if (t.compare(i, k_space_marker.size(), k_space_marker) == 0) {
            out += ' ';
            i += k_space_marker.size();
        } else {
            out += t[i++];
        }
    }
    return out;
}

// Splits text around special tokens written in it. As in the reference, each
// special token in turn (longest first) cuts every remaining text fragment at
// its occurrences. Control and unknown tokens count only when parse_special;
// user-defined ones always do (they are part of the vocabulary's text).
std::vector<Tokenizer::Impl::Fragment>
Tokenizer::Impl::partition(std::string_view text, bool parse_special, Spans plain) const {
    auto in_plain = [&](size_t off, size_t len) {
        for (auto [b, e] : plain)
            if (off < e && off + len > b) return true;
        return false;
    };
    std::vector<Fragment> frags;
    if (text.empty()) return frags;
    frags.push_back({-1, text});
    std::array<bool, 256> present{}; // bytes in text: skips most specials cheaply
    for (char c : text) present[static_cast<uint8_t>(c)] = true;

    std::vector<Fragment> next;
    for (int32_t id : specials) {
        TokenAttr a = v.attrs[id];
        const bool control = a == TokenAttr::control || a == TokenAttr::unknown;
        if (!parse_special && control) continue;
        std::string_view tok = v.tokens[id];
        if (!present[static_cast<uint8_t>(tok[0])] || text.find(tok) == std::string_view::npos)
            continue;
        next.clear();
        for (const Fragment& f : frags) {
            if (f.token >= 0) {
                next.push_back(f);
                continue;
            }
            std::string_view rest = f.text;
            for (size_t at, from = 0; (at = rest.find(tok, from)) != std::string_view::npos;) {
                if (control &&
                    in_plain(static_cast<size_t>(rest.data() - text.data()) + at, tok.size())) {
                    from = at + 1; // written by a message: text
                    continue;
                }
                if (at > 0) next.push_back({-1, rest.substr(0, at)});
                next.push_back({id, {}});
                rest.remove_prefix(at + tok.size());
                from = 0;
            }
            if (!rest.empty()) next.push_back({-1, rest});
        }
        frags.swap(next);
    }
    return frags;
}

// ---- SentencePiece ----------------------------------------------------------------
// Start from single UTF-8 characters and repeatedly merge the adjacent pair
// whose concatenation is the highest-scoring vocabulary piece (ties: the
// leftmost). Symbols are spans of one escaped string, so a candidate is a
// view and a hash lookup: no string building in the loop.

void Tokenizer::Impl::encode_spm(std::string_view text, bool space_prefix,
                                 std::vector<int32_t>& out) const {
    std::string s; // text with ' ' -> U+2581, optionally prefixed by one
    s.reserve(text.size() + 8);
    if (space_prefix) s += k_space_marker;
    for (char c : text) {
        if (c == ' ') {
            s += k_space_marker;
        } else {
            s += c;
        }
    }

    struct Sym {
        size_t off, len; // span of s; len 0 = merged away
        int prev, next;
    };
    std::vector<Sym> syms; // (chars of s)
    for (size_t off = 0; off < s.size();) {
        // An invalid byte is a symbol of its own (the reference goes by the
        // lead byte alone, which can swallow part of a following U+2581).
        int valid = unicode::valid_seq_len(s, off);
        size_t len = valid > 0 ? static_cast<size_t>(valid) : 1;
        int idx = static_cast<int>(syms.size());
        syms.push_back({off, len, idx - 1, off + len < s.size() ? idx + 1 : -1});
        off += len;
    }
    if (syms.empty()) return;

    struct Cand {
        float score;
        int left, right;
        size_t len; // of the merged text; a mismatch means the pair went stale
    };
    auto worse = [](const Cand& a, const Cand& b) {
        return a.score < b.score || (a.score == b.score && a.left > b.left);
    };
    std::priority_queue<Cand, std::vector<Cand>, decltype(worse)> queue(worse);
    std::string_view sv(s);
    auto try_pair = [&](int l, int r) {
        if (l < 0 || r < 0) return;
        size_t len = syms[l].len + syms[r].len;
        int32_t id = lookup(sv.substr(syms[l].off, len));
        if (id < 0 || !spm_mergeable(v.attrs[id])) return;
        queue.push({v.scores.empty() ? 0.0f : v.scores[id], l, r, len});
    };
    for (int i = 1; i < static_cast<int>(syms.size()); i++) try_pair(i - 1, i);

    while (!queue.empty()) {
        Cand c = queue.top();
        queue.pop();
        Sym& l = syms[c.left];
        Sym& r = syms[c.right];
        // Merges only grow symbols, so an unchanged total length means both
        // halves are the ones this candidate was made from.
        if (l.len == 0 || r.len == 0 || l.len + r.len != c.len) continue;
        l.len += r.len;
        r.len = 0;
        l.next = r.next;
        if (r.next >= 0) syms[r.next].prev = c.left;
        try_pair(l.prev, c.left);
        try_pair(c.left, l.next);
    }

    for (int i = 0; i >= 0; i = syms[i].next) {
        std::string_view piece = sv.substr(syms[i].off, syms[i].len);
        int32_t id = lookup(piece);
        if (id >= 0 && spm_mergeable(v.attrs[id])) {
            out.push_back(id);
            continue;
        }
        // Not a piece: spell it in bytes (<0xNN>), or <unk> without those.
        for (char c : piece) {
            int32_t b = byte_token[static_cast<uint8_t>(c)];
            if (b < 0) b = v.unk;
            if (b >= 0) out.push_back(b);
        }
    }
}

// ---- byte-level BPE ----------------------------------------------------------------
// Pre-tokenize, then within each piece start from its bytes (as byte-level
// symbols) and repeatedly apply the lowest-ranked merge (ties: the leftmost).

void Tokenizer::Impl::encode_bpe(std::string_view text, std::vector<int32_t>& out) const {
    for (std::string_view word : unicode::pre_split(pre, text)) bpe_word(word, out);
}

void Tokenizer::Impl::bpe_word(std::string_view word, std::vector<int32_t>& out) const {
    if (ignore_merges) {
        std::string enc;
        unicode::byte_encode(word, enc);
        if (int32_t id = lookup(enc); id >= 0) {
            out.push_back(id);
            return;
        }
    }
    std::vector<Sym> syms(word.size()); // (bytes of word)
    for (size_t i = 0; i < word.size(); i++) {
        int idx = static_cast<int>(i);
        syms[i] = {byte_sym[static_cast<uint8_t>(word[i])], idx - 1,
                   i + 1 < word.size() ? idx + 1 : -1, static_cast<uint32_t>(i), 1};
    }
    if (syms.empty()) return;
    bpe_merge(syms);

    for (int i = 0; i >= 0; i = syms[i].next) {
        int32_t id = syms[i].id;
        if (id >= 0 && id < n) {
            out.push_back(id);
            continue;
        }
        // A merge result (or byte char) the vocabulary lacks: its characters
        // one by one, <unk> for any that is not a token either.
        std::string_view t = id >= n ? std::string_view(extra[id - n]) : std::string_view();
        for (size_t k = 0; k < t.size();) {
            size_t start = k;
            unicode::next_cp(t, k);
            int32_t cid = lookup(t.substr(start, k - start));
            if (cid < 0) cid = v.unk;
            if (cid >= 0) out.push_back(cid);
        }
    }
}

// Applies the lowest-ranked merge of adjacent symbols (ties: the leftmost)
// until none applies.
void Tokenizer::Impl::bpe_merge(std::vector<Sym>& syms) const {
    struct Cand {
        int32_t rank;
        int left, right;
        int32_t lid, rid; // the symbol ids the merge was found for
    };
    auto worse = [](const Cand& a, const Cand& b) {
        return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
    };
    std::priority_queue<Cand, std::vector<Cand>, decltype(worse)> queue(worse);
    auto try_pair = [&](int l, int r) {
        if (l < 0 || r < 0 || syms[l].id < 0 || syms[r].id < 0) return;
        uint64_t key = static_cast<uint64_t>(syms[l].id) << 32 | static_cast<uint32_t>(syms[r].id);
        auto it = merges.find(key);
        if (it != merges.end()) queue.push({it->second.rank, l, r, syms[l].id, syms[r].id});
    };
    for (int i = 1; i < static_cast<int>(syms.size()); i++) try_pair(i - 1, i);

    while (!queue.empty()) {
        Cand c = queue.top();
        queue.pop();
        Sym& l = syms[c.left];
        Sym& r = syms[c.right];
        // Stale when either side has since merged with something else.
        if (l.id != c.lid || r.id != c.rid || l.next != c.right) continue;
        l.id = merges.at(static_cast<uint64_t>(c.lid) << 32 | static_cast<uint32_t>(c.rid)).result;
        l.len += r.len;
        r.id = -1;
        l.next = r.next;
        if (r.next >= 0) syms[r.next].prev = c.left;
        try_pair(l.prev, c.left);
        try_pair(c.left, l.next);
    }
}

// ---- BPE over UTF-8 characters (Gemma 4) -------------------------------------------
// Spaces become U+2581 as in SentencePiece, the text is cut into runs of line
// breaks and runs of everything else, and each run is merged from its
// characters by rank. A run of line breaks that is a token is that token; a
// symbol the vocabulary lacks is spelled in <0xNN> byte tokens.

void Tokenizer::Impl::encode_bpe_utf8(std::string_view text, std::vector<int32_t>& out) const {
    std::string s;
    s.reserve(text.size() + 16);
    for (char c : text) {
        if (c == ' ') {
            s += k_space_marker;
        } else {
            s += c;
        }
    }
    std::string_view sv(s);
    for (size_t b = 0; b < sv.size();) {
        const bool newlines = sv[b] == '\n';
        size_t e = b;
        while (e < sv.size() && (sv[e] == '\n') == newlines) e++;
        std::string_view word = sv.substr(b, e - b);
        b = e;
        if (newlines) {
            if (int32_t id = lookup(word); id >= 0) {
                out.push_back(id);
                continue;
            }
        }
        bpe_utf8_word(word, out);
    }
}

void Tokenizer::Impl::bpe_utf8_word(std::string_view word, std::vector<int32_t>& out) const {
    std::vector<Sym> syms; // (characters of word)
    syms.reserve(word.size());
    for (size_t off = 0; off < word.size();) {
        int valid = unicode::valid_seq_len(word, off);
        size_t len = valid > 0 ? static_cast<size_t>(valid) : 1;
        std::string_view ch = word.substr(off, len);
        int32_t id = lookup(ch);
        if (id < 0) {
            auto it = extra_ids.find(std::string(ch));
            id = it == extra_ids.end() ? -2 : it->second;
        }
        int idx = static_cast<int>(syms.size());
        syms.push_back({id, idx - 1, off + len < word.size() ? idx + 1 : -1,
                        static_cast<uint32_t>(off), static_cast<uint32_t>(len)});
        off += len;
    }
    if (syms.empty()) return;
    bpe_merge(syms);

    for (int i = 0; i >= 0; i = syms[i].next) {
        const Sym& y = syms[i];
        if (y.id >= 0 && y.id < n) {
            out.push_back(y.id);
            continue;
        }
        for (char c : word.substr(y.off, y.len))
            if (int32_t b = byte_token[static_cast<uint8_t>(c)]; b >= 0) out.push_back(b);
    }
}

// ---- public interface ---------------------------------------------------------------

Tokenizer::Tokenizer(Vocab v) : impl_(std::make_unique<Impl>(std::move(v))) {}
Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;

const Vocab& Tokenizer::vocab() const {
    return impl_->v;
}
int32_t Tokenizer::n_vocab() const {
    return impl_->n;
}
int32_t Tokenizer::bos() const {
    return impl_->v.bos;
}
int32_t Tokenizer::eos() const {
    return impl_->v.eos;
}
bool Tokenizer::is_eog(int32_t id) const {
    return id >= 0 && id < impl_->n && impl_->eog[id];
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_bos,
                                       bool parse_special) const {
    return impl_->encode(text, add_bos, parse_special, {});
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_bos,
                                       std::span<const std::pair<size_t, size_t>> plain) const {
    return impl_->encode(text, add_bos, true, plain);
}

std::vector<int32_t> Tokenizer::Impl::encode(std::string_view text, bool add_bos,
                                             bool parse_special, Spans plain) const {
    const Impl& m = *this;
    std::vector<int32_t> out;
    out.reserve(text.size() / 3 + 2);
    if (add_bos && m.v.add_bos && m.v.bos >= 0) out.push_back(m.v.bos);
    // SPM: a text fragment at the start or right after a special token gets
    // the leading space (as SentencePiece sees each such run as a new text).
    bool after_special = true;
    for (const Impl::Fragment& f : m.partition(text, parse_special, plain)) {
        if (f.token >= 0) {
            out.push_back(f.token);
            after_special = true;
        } else if (m.v.kind == Vocab::Kind::spm) {
            m.encode_spm(f.text, m.v.add_space_prefix && after_special, out);
            after_special = false;
        } else if (m.v.kind == Vocab::Kind::bpe) {
            m.encode_bpe(f.text, out);
        } else {
            m.encode_bpe_utf8(f.text, out);
        }
    }
    if (add_bos && m.v.add_eos && m.v.eos >= 0) out.push_back(m.v.eos);
    return out;
}

std::string Tokenizer::piece(int32_t id, bool special) const {
    const Impl& m = *impl_;
    if (id < 0 || id >= m.n) return {};
    TokenAttr a = m.v.attrs[id];
    if (special && (a == TokenAttr::control || a == TokenAttr::unknown)) return m.v.tokens[id];
    return m.pieces[id];
}

namespace {
constexpr std::string_view k_replacement = "\xEF\xBF\xBD"; // U+FFFD

// Moves the complete part of `pending` to `out`: well-formed characters as
// they are, each maximal ill-formed subpart as one U+FFFD. An incomplete
// character at the end stays pending unless `final`.
void drain(std::string& pending, std::string& out, bool final) {
    size_t i = 0;
    while (i < pending.size()) {
        size_t bad = 1;
        int len = unicode::valid_seq_len(pending, i, &bad);
        if (len > 0) {
            out.append(pending, i, len);
            i += len;
        } else if (len == 0) {
            out += k_replacement;
            i += bad;
        } else {
            if (!final) break;
            out += k_replacement;
            i = pending.size();
        }
    }
    pending.erase(0, i);
}
} // namespace

std::string Tokenizer::Decoder::push(int32_t id) {
    pending_ += tok_->piece(id);
    std::string out;
    drain(pending_, out, false);
    return out;
}

std::string Tokenizer::Decoder::flush() {
    std::string out;
    drain(pending_, out, true);
    return out;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
    Decoder d(*this);
    std::string out;
    for (int32_t id : ids) out += d.push(id);
    out += d.flush();
    return out;
}

} // namespace kvrun
