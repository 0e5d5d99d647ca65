#include "unicode.h"

#include <algorithm>
#include <array>

#include <utf8proc.h>

#include "error.h"

namespace kvrun::unicode {

// ---- UTF-8 -------------------------------------------------------------------

int valid_seq_len(std::string_view s, size_t i, size_t* bad_len) {
    if (bad_len) *bad_len = 1;
    auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
    unsigned char c = b(i);
    if (c < 0x80) return 1;
    int len;
    unsigned char lo = 0x80, hi = 0xBF; // allowed range of the second byte
    if (c >= 0xC2 && c <= 0xDF) {
        len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0) lo = 0xA0; // no overlongs
        if (c == 0xED) hi = 0x9F; // no surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0) lo = 0x90; // no overlongs
        if (c == 0xF4) hi = 0x8F; // nothing above U+10FFFF
    } else {
        return 0; // continuation byte, C0/C1 (always overlong), F5..FF
    }
    for (int k = 1; k < len; k++) {
        if (i + k >= s.size()) return -1;
        unsigned char x = b(i + k);
        if (k == 1 ? (x < lo || x > hi) : (x < 0x80 || x > 0xBF)) {
            if (bad_len) *bad_len = k;
            return 0;
        }
    }
    return len;
}

uint32_t next_cp(std::string_view s, size_t& i) {
    int len = valid_seq_len(s, i);
    auto b = [&](size_t k) { return static_cast<uint32_t>(static_cast<unsigned char>(s[k])); };
    uint32_t cp;
    switch (len) {
    case 1:
        cp = b(i);
        break;
    case 2:
        cp = (b(i) & 0x1F) << 6 | (b(i + 1) & 0x3F);
        break;
    case 3:
        cp = (b(i) & 0x0F) << 12 | (b(i + 1) & 0x3F) << 6 | (b(i + 2) & 0x3F);
        break;
    case 4:
        cp = (b(i) & 0x07) << 18 | (b(i + 1) & 0x3F) << 12 | (b(i + 2) & 0x3F) << 6 |
             (b(i + 3) & 0x3F);
        break;
    default:
        i += 1;
        return invalid_cp;
    }
    i += len;
    return cp;
}

void append_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
        out += static_cast<char>(cp);
    } else if (cp < 0x800) {
        out += static_cast<char>(0xC0 | cp >> 6);
        out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        out += static_cast<char>(0xE0 | cp >> 12);
        out += static_cast<char>(0x80 | (cp >> 6 & 0x3F));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
        out += static_cast<char>(0xF0 | cp >> 18);
        out += static_cast<char>(0x80 | (cp >> 12 & 0x3F));
        out += static_cast<char>(0x80 | (cp >> 6 & 0x3F));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    }
}

// ---- classes -------------------------------------------------------------------

static utf8proc_category_t category(uint32_t cp) {
    if (cp > 0x10FFFF) return UTF8PROC_CATEGORY_CN; // invalid_cp: "unassigned", in no class
    return utf8proc_category(static_cast<utf8proc_int32_t>(cp));
}

bool is_letter(uint32_t cp) {
    if (cp < 0x80) return (cp | 0x20) >= 'a' && (cp | 0x20) <= 'z';
    auto c = category(cp);
    return c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO;
}

bool is_number(uint32_t cp) {
    if (cp < 0x80) return cp >= '0' && cp <= '9';
    auto c = category(cp);
    return c >= UTF8PROC_CATEGORY_ND && c <= UTF8PROC_CATEGORY_NO;
}

bool is_whitespace(uint32_t cp) {
    // White_Space is a property, not a category: it is Zs/Zl/Zp plus these
    // controls (tab..carriage return, NEL). The regexes' \s means this set.
    if (cp == ' ' || (cp >= 0x09 && cp <= 0x0D) || cp == 0x85) return true;
    if (cp < 0x80) return false;
    auto c = category(cp);
    return c == UTF8PROC_CATEGORY_ZS || c == UTF8PROC_CATEGORY_ZL || c == UTF8PROC_CATEGORY_ZP;
}

bool is_mark(uint32_t cp) {
    if (cp < 0x80) return false;
    auto c = category(cp);
    return c == UTF8PROC_CATEGORY_MN || c == UTF8PROC_CATEGORY_MC || c == UTF8PROC_CATEGORY_ME;
}

bool is_cased_letter(uint32_t cp) {
    auto c = category(cp);
    return c == UTF8PROC_CATEGORY_LU || c == UTF8PROC_CATEGORY_LL || c == UTF8PROC_CATEGORY_LT;
}

// ---- GPT-2 byte-level table ---------------------------------------------------------
// Printable bytes ('!'..'~', U+00A1..U+00AC, U+00AE..U+00FF) stand for
// themselves; the other 68 (controls, space, DEL, NBSP, soft hyphen) are
// moved, in byte order, to U+0100 upwards so every byte is a visible char.

namespace {
struct ByteTable {
    std::array<uint32_t, 256> to_cp{};
    std::array<int16_t, 256 + 68> to_byte{};
    ByteTable() {
        to_byte.fill(-1);
        uint32_t next = 256;
        for (int b = 0; b < 256; b++) {
            bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
            to_cp[b] = printable ? static_cast<uint32_t>(b) : next++;
            to_byte[to_cp[b]] = static_cast<int16_t>(b);
        }
    }
};
const ByteTable& byte_table() {
    static const ByteTable t;
    return t;
}
} // namespace

uint32_t byte_to_cp(uint8_t b) {
    return byte_table().to_cp[b];
}

int cp_to_byte(uint32_t cp) {
    const auto& t = byte_table().to_byte;
    return cp < t.size() ? t[cp] : -1;
}

void byte_encode(std::string_view bytes, std::string& out) {
    for (char c : bytes) append_utf8(out, byte_to_cp(static_cast<uint8_t>(c)));
}

std::string byte_decode(std::string_view text) {
    std::string out;
    out.reserve(text.size());
    for (size_t i = 0; i < text.size();) {
        size_t start = i;
        uint32_t cp = next_cp(text, i);
        int b = cp == invalid_cp ? -1 : cp_to_byte(cp);
        if (b >= 0) {
            out += static_cast<char>(b);
        } else {
            out.append(text.substr(start, i - start));
        }
    }
    return out;
}

// ---- pre-tokenizers --------------------------------------------------------------
// Each split regex is one matcher: given code points c[pos..end) it returns
// how many code points the pattern matches at pos (0: none), following the
// regex's leftmost-alternative semantics. A pre-tokenizer is a list of such
// patterns applied in turn: each splits every piece of the previous one into
// its matches and the unmatched gaps between them (as llama.cpp does with its
// lists of regexes). Lookaheads and `$` see only the current piece.

namespace {

struct Text {
    const uint32_t* c;
    size_t end;
    size_t ws_tail; // where the piece's trailing white space starts (end: none)
    bool in(size_t k) const { return k < end; }
    bool is(size_t k, uint32_t cp) const { return k < end && c[k] == cp; }
};

using Matcher = size_t (*)(const Text& t, size_t pos);

bool is_other(uint32_t cp) {
    return !is_letter(cp) && !is_number(cp) && !is_whitespace(cp);
}
bool is_crlf(uint32_t cp) {
    return cp == '\r' || cp == '\n';
}

template <typename Pred> size_t run(const Text& t, size_t pos, Pred p) {
    size_t k = pos;
    while (k < t.end && p(t.c[k])) k++;
    return k - pos;
}

// `P?R+` (P one optional char): with backtracking this is "P then R+" when
// both fit, else "R+" from pos.
template <typename P, typename R> size_t opt_then_run(const Text& t, size_t pos, P p, R r) {
    if (t.in(pos + 1) && p(t.c[pos]) && r(t.c[pos + 1])) return 1 + run(t, pos + 1, r);
    return r(t.c[pos]) ? run(t, pos, r) : 0;
}

// 's|'t|'re|'ve|'m|'ll|'d, optionally ASCII case-insensitive.
size_t contraction(const Text& t, size_t pos, bool icase) {
    if (!t.is(pos, '\'') || !t.in(pos + 1)) return 0;
    auto low = [&](size_t k) -> uint32_t {
        if (!t.in(k)) return 0;
        uint32_t cp = t.c[k];
        return icase && cp >= 'A' && cp <= 'Z' ? cp + 32 : cp;
    };
    uint32_t a = low(pos + 1), b = low(pos + 2);
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
    return 0;
}

// \s+(?!\S)|\s+ : a white-space run, minus its last char when a non-space
// follows (so that char can lead the next word), unless that leaves nothing.
size_t space_run(const Text& t, size_t pos) {
    size_t k = run(t, pos, is_whitespace);
    if (k >= 2 && pos + k < t.end) return k - 1;
    return k;
}

auto is_space_char = [](uint32_t cp) { return cp == ' '; };

// 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
size_t match_gpt2(const Text& t, size_t pos) {
    if (size_t n = contraction(t, pos, false)) return n;
    if (size_t n = opt_then_run(t, pos, is_space_char, is_letter)) return n;
    if (size_t n = opt_then_run(t, pos, is_space_char, is_number)) return n;
    if (size_t n = opt_then_run(t, pos, is_space_char, is_other)) return n;
    return space_run(t, pos);
}

// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?W+|\p{N}{1,D}|
//  ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
// where W is \p{L} (Llama 3, Qwen2), or [\p{L}\p{M}] with Marks (Qwen 3.5:
// combining marks stay on their word, and are not punctuation either).
template <size_t MaxDigits, bool Marks = false> size_t match_llama3(const Text& t, size_t pos) {
    if (size_t n = contraction(t, pos, true)) return n;
    auto word = [](uint32_t cp) { return is_letter(cp) || (Marks && is_mark(cp)); };
    auto lead = [](uint32_t cp) { return !is_crlf(cp) && !is_letter(cp) && !is_number(cp); };
    auto other = [](uint32_t cp) { return is_other(cp) && !(Marks && is_mark(cp)); };
    if (size_t n = opt_then_run(t, pos, lead, word)) return n;
    if (is_number(t.c[pos])) {
        size_t n = run(t, pos, is_number);
        return n < MaxDigits ? n : MaxDigits;
    }
    if (size_t n = opt_then_run(t, pos, is_space_char, other))
        return n + run(t, pos + n, is_crlf);
    size_t k = run(t, pos, is_whitespace);
    // \s*[\r\n]+ : up to and including the run's last line break
    for (size_t j = pos + k; j > pos; j--) {
        if (is_crlf(t.c[j - 1])) return j - pos;
    }
    return space_run(t, pos);
}

// GPT-4o's (o200k: Phi-4-mini, Llama 4), as the reference engine runs it:
// [^\r\n\p{L}\p{N}]?U*L+C?|[^\r\n\p{L}\p{N}]?U+L*C?|\p{N}{1,3}|
//  ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
// where U is a letter other than a-z, L a letter other than A-Z (the
// reference's stand-ins for the cased classes: a non-ASCII letter is both, a
// mark neither) and C a contraction, ASCII case-insensitive.
size_t match_gpt4o(const Text& t, size_t pos) {
    auto upper = [](uint32_t cp) { return is_letter(cp) && !(cp >= 'a' && cp <= 'z'); };
    auto lower = [](uint32_t cp) { return is_letter(cp) && !(cp >= 'A' && cp <= 'Z'); };
    auto lead = [](uint32_t cp) { return !is_crlf(cp) && !is_letter(cp) && !is_number(cp); };
    // The two word alternatives from s, in the order a backtracking matcher
    // tries them: U* as long as possible such that an L follows, else U+ L*.
    auto word = [&](size_t s) -> size_t {
        if (!t.in(s)) return 0;
        const size_t u = run(t, s, upper);
        for (size_t k = u + 1; k-- > 0;)
            if (size_t l = run(t, s + k, lower)) return k + l + contraction(t, s + k + l, true);
        if (u == 0) return 0;
        const size_t l = run(t, s + u, lower);
        return u + l + contraction(t, s + u + l, true);
    };
    if (lead(t.c[pos])) {
        if (size_t n = word(pos + 1)) return 1 + n;
    } else if (size_t n = word(pos)) {
        return n;
    }
    if (is_number(t.c[pos])) return std::min<size_t>(run(t, pos, is_number), 3);
    if (size_t n = opt_then_run(t, pos, is_space_char, is_other))
        return n + run(t, pos + n, [](uint32_t cp) { return is_crlf(cp) || cp == '/'; });
    size_t k = run(t, pos, is_whitespace);
    for (size_t j = pos + k; j > pos; j--) {
        if (is_crlf(t.c[j - 1])) return j - pos;
    }
    return space_run(t, pos);
}

size_t match_one_number(const Text& t, size_t pos) {
    return is_number(t.c[pos]) ? 1 : 0;
}

// DeepSeek LLM: [\r\n] | \s?[cased letters]+ | \s?[ASCII/fullwidth punct]+ |
// \s+$ | [CJK and Hangul ranges]+ | \p{N}+
size_t match_crlf(const Text& t, size_t pos) {
    return is_crlf(t.c[pos]) ? 1 : 0;
}

size_t match_ds_letters(const Text& t, size_t pos) {
    return opt_then_run(t, pos, is_whitespace, is_cased_letter);
}

size_t match_ds_punct(const Text& t, size_t pos) {
    auto punct = [](uint32_t c) {
        return (c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x7E) ||
               (c >= 0xFF01 && c <= 0xFF0F) || (c >= 0xFF1A && c <= 0xFF5E) ||
               (c >= 0x2018 && c <= 0x201F) || (c >= 0x3000 && c <= 0x3002);
    };
    return opt_then_run(t, pos, is_whitespace, punct);
}

// Uses the precomputed tail: scanning the run at every position would be
// quadratic in a long run of inner white space.
size_t match_ds_trailing_space(const Text& t, size_t pos) {
    return pos >= t.ws_tail ? t.end - pos : 0;
}

size_t match_ds_cjk(const Text& t, size_t pos) {
    return run(t, pos, [](uint32_t c) {
        return (c >= 0x0800 && c <= 0x9FA5) || (c >= 0xAC00 && c <= 0xD7FF);
    });
}

size_t match_numbers(const Text& t, size_t pos) {
    return run(t, pos, is_number);
}

struct Range {
    size_t b, e;
};

void apply(Matcher m, const std::vector<uint32_t>& cps, std::vector<Range>& ranges) {
    std::vector<Range> out;
    out.reserve(ranges.size() * 2);
    for (const Range& r : ranges) {
        size_t tail = r.e;
        while (tail > r.b && is_whitespace(cps[tail - 1])) tail--;
        Text t{cps.data(), r.e, tail};
        size_t gap = r.b;
        for (size_t pos = r.b; pos < r.e;) {
            size_t n = m(t, pos);
            if (n == 0) {
                pos++;
                continue;
            }
            if (gap < pos) out.push_back({gap, pos});
            out.push_back({pos, pos + n});
            pos += n;
            gap = pos;
        }
        if (gap < r.e) out.push_back({gap, r.e});
    }
    ranges.swap(out);
}

std::vector<Matcher> matchers(PreSplit kind) {
    switch (kind) {
    case PreSplit::gpt2:
        return {match_gpt2};
    case PreSplit::llama3:
        return {match_llama3<3>};
    case PreSplit::qwen2:
        return {match_llama3<1>};
    case PreSplit::qwen35:
        return {match_llama3<1, true>};
    case PreSplit::smollm:
        return {match_one_number, match_gpt2};
    case PreSplit::deepseek_llm:
        return {match_crlf,   match_ds_letters, match_ds_punct, match_ds_trailing_space,
                match_ds_cjk, match_numbers};
    case PreSplit::gpt4o:
        return {match_gpt4o};
    }
    return {match_gpt2};
}

} // namespace

std::optional<PreSplit> pre_split_from_name(std::string_view name) {
    // Only names whose reference behaviour is one of these splitters: an
    // unknown one is an error rather than a silently different tokenization.
    if (name == "default" || name == "gpt-2" || name == "phi-2" || name == "roberta-bpe" ||
        name == "mpt")
        return PreSplit::gpt2;
    if (name == "llama3" || name == "llama-v3" || name == "llama-bpe" || name == "falcon3")
        return PreSplit::llama3;
    if (name == "qwen2" || name == "deepseek-r1-qwen") return PreSplit::qwen2;
    if (name == "qwen35") return PreSplit::qwen35;
    // Single digits, then GPT-2's split: StarCoder, Refact and Command R too.
    if (name == "smollm" || name == "starcoder" || name == "refact" || name == "command-r")
        return PreSplit::smollm;
    if (name == "deepseek-llm") return PreSplit::deepseek_llm;
    if (name == "gpt-4o" || name == "llama4") return PreSplit::gpt4o;
    return std::nullopt;
}

std::vector<std::string_view> pre_split(PreSplit kind, std::string_view text) {
    std::vector<uint32_t> cps; // (n) code points; invalid bytes as invalid_cp
    std::vector<size_t> offs;  // (n + 1) byte offset of each code point
    cps.reserve(text.size());
    offs.reserve(text.size() + 1);
    for (size_t i = 0; i < text.size();) {
        offs.push_back(i);
        cps.push_back(next_cp(text, i));
    }
    offs.push_back(text.size());

    std::vector<Range> ranges;
    if (!cps.empty()) ranges.push_back({0, cps.size()});
    for (Matcher m : matchers(kind)) apply(m, cps, ranges);

    std::vector<std::string_view> out;
    out.reserve(ranges.size());
    for (const Range& r : ranges) out.push_back(text.substr(offs[r.b], offs[r.e] - offs[r.b]));
    return out;
}

bool valid_utf8(std::string_view s, size_t* bad_at) {
    for (size_t i = 0; i < s.size();) {
        const int len = valid_seq_len(s, i);
        if (len <= 0) { // ill-formed, or cut short by the end of s
            if (bad_at) *bad_at = i;
            return false;
        }
        i += static_cast<size_t>(len);
    }
    return true;
}

} // namespace kvrun::unicode

namespace kvrun {
void check_utf8(std::string_view text, const char* what) {
    size_t bad = 0;
    if (!unicode::valid_utf8(text, &bad))
        fail(Exit::usage, "{} is not valid UTF-8 (bad byte at offset {})", what, bad);
}
} // namespace kvrun
