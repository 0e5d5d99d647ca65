// The grammar compiler, the matcher and the token mask (src/grammar): every
// GBNF construct against strings it must and must not match, hostile
// grammars as one-line errors, UTF-8 classes against every code point, and
// the vocabulary walk against checking each token on its own.
#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "constraint.h"
#include "error.h"
#include "gguf.h"
#include "grammar.h"
#include "matcher.h"
#include "sampler.h"
#include "test_util.h"
#include "tokenizer.h"
#include "utf8_ranges.h"

using namespace kvrun;

namespace {

std::shared_ptr<const Grammar> gbnf(std::string_view text) {
    return std::make_shared<const Grammar>(compile_gbnf(text));
}

std::string error_of(std::string_view text) {
    try {
        compile_gbnf(text);
    } catch (const Error& e) {
        CHECK(e.code() == Exit::usage);
        const std::string what = e.what();
        CHECK(what.find('\n') == std::string::npos);
        return what;
    }
    return "(compiled)";
}

std::string utf8(uint32_t cp) {
    std::vector<uint8_t> b;
    append_utf8(b, cp);
    return {b.begin(), b.end()};
}

bool seq_matches(const std::vector<ByteRange>& seq, const std::string& s) {
    if (seq.size() != s.size()) return false;
    for (size_t i = 0; i < s.size(); i++) {
        const auto b = static_cast<uint8_t>(s[i]);
        if (b < seq[i].first || b > seq[i].second) return false;
    }
    return true;
}

const char* kJson = R"(
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws
object ::= "{" ws ( string ":" ws value ("," ws string ":" ws value)* )? "}" ws
array  ::= "[" ws ( value ("," ws value)* )? "]" ws
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4}) )* "\"" ws
number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9]{1,15})? ws
ws     ::= | " " | "\n" [ \t]{0,20}
)";

} // namespace

TEST_CASE("grammar: UTF-8 byte patterns match exactly the code points of a class") {
    const std::vector<std::vector<CodepointRange>> classes = {
        complement_ranges(normalize_ranges({{'"', '"'}, {'\\', '\\'}})),
        normalize_ranges({{0x80, 0x10FFFF}}),
        normalize_ranges({{0x3B1, 0x3C9}, {0x4E00, 0x9FFF}, {0x1F600, 0x1F64F}}),
        normalize_ranges({{0x7F, 0x801}, {0xD000, 0xE123}, {0xFFFF, 0x10000}}),
        normalize_ranges({{0x10FFFF, 0x10FFFF}, {0x41, 0x41}}),
    };
    for (const auto& r : classes) {
        const auto seqs = utf8_sequences(r);
        auto in = [&](uint32_t cp) {
            for (auto [lo, hi] : r)
                if (cp >= lo && cp <= hi) return true;
            return false;
        };
        for (uint32_t cp = 0; cp <= 0x10FFFF; cp += cp < 0x30000 ? 1 : 13) {
            if (cp >= 0xD800 && cp <= 0xDFFF) continue;
            const std::string s = utf8(cp);
            int n = 0;
            for (const auto& q : seqs) n += seq_matches(q, s);
            if (n != (in(cp) ? 1 : 0))
                FAIL_CHECK("code point " << cp << " matched " << n << " times");
        }
        // Overlong forms, surrogates and bytes past 10FFFF match nothing.
        for (const std::string bad :
             {"\xC0\x80", "\xC1\xBF", "\xE0\x80\x80", "\xED\xA0\x80", "\xF0\x80\x80\x80",
              "\xF4\x90\x80\x80", "\xF5\x80\x80\x80", "\x80"})
            for (const auto& q : seqs) CHECK_FALSE(seq_matches(q, bad));
    }
}

TEST_CASE("grammar: every GBNF construct matches what it should and nothing else") {
    struct Case {
        const char* gbnf;
        std::vector<std::string> yes, no;
    };
    const std::vector<Case> cases = {
        {R"(root ::= "abc")", {"abc"}, {"", "ab", "abcd", "abd"}},
        {R"(root ::= "a" | "bc" | "")", {"a", "bc", ""}, {"b", "abc", "aa"}},
        {R"(root ::= ("ab" | "c")* "d")", {"d", "abd", "cabcd"}, {"", "ab", "abc", "dd"}},
        {R"(root ::= "x"+ "y"?)", {"x", "xxy", "xxxx"}, {"", "y", "xyy"}},
        {R"(root ::= [0-9]{2,4} "-" [a-z]{3} "." "q"{2,})",
         {"12-abc.qq", "1234-xyz.qqqq"},
         {"1-abc.qq", "12345-abc.qq", "12-ab.qq", "12-abc.q"}},
        {R"(root ::= ("ab"){3} "c"{0,2})",
         {"ababab", "abababcc"},
         {"abab", "abababab", "abababccc"}},
        {R"(root ::= "\"" [^"\\]* "\"")",
         {"\"\"", "\"h\xC3\xA9llo \xE6\x97\xA5\xE6\x9C\xAC \xF0\x9F\x98\x80\""},
         {"\"a\"b\"", "\"\\\"", "\"", "\"\xFF\""}},
        {R"(root ::= "\n\t\\\x41\u00e9\U0001F600" [\x30-\x39\]\-])",
         {"\n\t\\A\xC3\xA9\xF0\x9F\x98\x80"
          "5",
          "\n\t\\A\xC3\xA9\xF0\x9F\x98\x80]", "\n\t\\A\xC3\xA9\xF0\x9F\x98\x80-"},
         {"\n\t\\A\xC3\xA9\xF0\x9F\x98\x80"
          "a"}},
        {R"(root ::= . .)", {"ab", "\xC3\xA9\xE6\x97\xA5"}, {"a", "abc", "\xFF\xFE", "\xC3"}},
        {"# a list\nroot ::= item\n  (\",\" item)*   # more\nitem ::=\n  [a-z]+\n",
         {"a,bc,d", "x"},
         {"a,", ",a", "A"}},
        {"root ::= my-rule_2\nmy-rule_2 ::= \"z\"", {"z"}, {"zz", ""}},
        {R"g(root ::= "(" root ")" | "")g", {"((()))", ""}, {"(()", "())"}},
        {R"(root ::= "a" ( | "b") "c")", {"ac", "abc"}, {"abbc"}},
        {R"(root ::= [a-zA-Z_] [^a-z]*)",
         {"Q", "_\xC3\xA9"
               "9Z"},
         {"9", "ab"}},
        {R"(root ::= "" "a" "")", {"a"}, {""}},
    };
    for (const Case& c : cases) {
        CAPTURE(c.gbnf);
        const auto g = gbnf(c.gbnf);
        for (const std::string& s : c.yes) {
            CAPTURE(s);
            CHECK(GrammarMatcher::matches(g, s));
            // Every prefix of a sentence is allowed, a byte at a time.
            GrammarMatcher m(g);
            for (char ch : s) CHECK(m.advance(std::string(1, ch)));
        }
        for (const std::string& s : c.no) {
            CAPTURE(s);
            CHECK_FALSE(GrammarMatcher::matches(g, s));
        }
    }
    // A rejected step leaves the state as it was.
    GrammarMatcher m(gbnf(R"(root ::= "ab" "c"*)"));
    CHECK(m.advance("a"));
    CHECK_FALSE(m.allows("c"));
    CHECK_FALSE(m.advance("bd"));
    CHECK_FALSE(m.accepting());
    CHECK(m.advance("b"));
    CHECK(m.accepting());
    CHECK(m.can_continue());
    // Deep nesting by right recursion: the stack grows, nothing overflows.
    const std::string deep = std::string(5000, '(') + std::string(5000, ')');
    CHECK(GrammarMatcher::matches(gbnf(R"g(root ::= "(" root ")" | "")g"), deep));
    // Repetition does not grow the stack (a tail call): a long run stays cheap.
    GrammarMatcher rep(gbnf(R"(root ::= ("ab" | "c")*)"));
    for (int i = 0; i < 20000; i++) REQUIRE(rep.advance("abc"));
    CHECK(rep.accepting());
}

TEST_CASE("grammar: bad and hostile grammars are one-line errors with the position") {
    CHECK(error_of("root ::= \"a\" foo") ==
          "grammar: line 1, column 14: rule 'foo' is not defined");
    CHECK(error_of("item ::= \"a\"") == "grammar: no rule named root (the start rule)");
    CHECK(error_of("root ::= root \"a\" | \"a\"").find("rule 'root' is left-recursive") !=
          std::string::npos);
    CHECK(error_of("root ::= x \"a\"\nx ::= \"\" | root").find("left-recursive") !=
          std::string::npos);
    CHECK(error_of("root ::= (\"a\"?)*").find("a repetition of something that can match nothing") !=
          std::string::npos);
    CHECK(error_of("root ::= \"a\"{1000000}").find("a repetition count over 100000") !=
          std::string::npos);
    std::string big = "root ::=";
    for (int i = 0; i < 12; i++) big += " \"ab\"{0,100000}";
    CHECK(error_of(big).find("too large") != std::string::npos);
    CHECK(error_of("root ::= " + std::string(300, '(') + "\"a\"" + std::string(300, ')'))
              .find("nested deeper than 256") != std::string::npos);
    CHECK(error_of("root ::= " + std::string(200, '(') + "\"a\"" + std::string(200, ')')) ==
          "(compiled)");
    CHECK(error_of("root ::= \"abc") == "grammar: line 1, column 10: unterminated string literal");
    CHECK(error_of("root ::= [abc").find("unterminated character class") != std::string::npos);
    CHECK(error_of("root ::= (\"a\"").find("unclosed (") != std::string::npos);
    CHECK(error_of("root ::= \"\\q\"").find("unknown escape \\q") != std::string::npos);
    CHECK(error_of("root ::= \"\\x4\"").find("hex digits") != std::string::npos);
    CHECK(error_of("root ::= \"\xFF\"").find("invalid UTF-8") != std::string::npos);
    CHECK(error_of("root ::= [z-a]").find("end is before its start") != std::string::npos);
    CHECK(error_of("root ::= []").find("matches nothing") != std::string::npos);
    CHECK(error_of("root ::= [^\\x00-\\U0010FFFF]").find("matches nothing") != std::string::npos);
    CHECK(error_of("root ::= \"a\"\nroot ::= \"b\"") ==
          "grammar: line 2, column 1: rule 'root' is defined twice");
    CHECK(error_of("root \"a\"").find("expected ::=") != std::string::npos);
    CHECK(error_of("root ::= * \"a\"").find("follows nothing") != std::string::npos);
    CHECK(error_of("root ::= \"a\"{3,1}").find("n < m") != std::string::npos);
    CHECK(error_of("root ::= \"a\" )").find("expected a rule name") != std::string::npos);
    CHECK(error_of("").find("no rule named root") != std::string::npos);
}

TEST_CASE("grammar: an ambiguity without bound stops with an error, not a stall") {
    // After n a's, s may be waiting for any number of b's up to n: one more
    // live stack per byte, until the bound.
    GrammarMatcher m(gbnf("root ::= s\ns ::= \"a\" s \"b\" | \"a\" s | \"\""));
    const auto t0 = std::chrono::steady_clock::now();
    std::string what;
    try {
        for (int i = 0; i < 10000; i++) m.advance("a");
    } catch (const Error& e) {
        what = e.what();
    }
    CHECK(what.find("too ambiguous") != std::string::npos);
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60));
}

TEST_CASE("grammar: the token mask equals checking each token on its own") {
    for (const char* vocab : {"vocab/ggml-vocab-llama-spm.gguf", "vocab/ggml-vocab-qwen35.gguf"}) {
        CAPTURE(vocab);
        GgufFile f = GgufFile::open(kvtest::shared(vocab));
        const Tokenizer tok(Vocab::from_gguf(f));
        auto og = std::make_shared<OutputGrammar>();
        og->grammar = gbnf(kJson);
        og->vocab = std::make_shared<const TokenBytes>(tok);
        og->source = "test";
        // States along a JSON text, partial characters and escapes included;
        // the last is complete (end tokens allowed) and may go on (spaces).
        const std::string text =
            "{\"n\xC3\xA9me\": [1.5e3, \"\\u00e9\xE6\x97\xA5\", true], \"x\": {}} ";
        const int32_t n = tok.n_vocab();
        std::vector<float> logits(n);
        // One constraint along the text: the walk's scratch is reused from
        // one mask to the next, as in a run.
        GrammarConstraint c(og);
        size_t at = 0;
        for (size_t cut : {size_t{0}, size_t{1}, size_t{3}, size_t{4}, size_t{11}, size_t{14},
                           size_t{21}, size_t{27}, size_t{29}, text.size() - 1, text.size()}) {
            CAPTURE(cut);
            // To the cut in the longest allowed tokens that spell the text.
            while (at < cut) {
                int32_t best = -1;
                size_t len = 0;
                for (int32_t id = 0; id < n; id++) {
                    const std::string_view b = og->vocab->bytes(id);
                    if (b.size() > len && b.size() <= cut - at &&
                        text.compare(at, b.size(), b) == 0 && c.allows(id))
                        best = id, len = b.size();
                }
                REQUIRE(best >= 0);
                c.accept(best);
                at += len;
            }
            std::fill(logits.begin(), logits.end(), 0.0f);
            const int32_t allowed = c.mask(logits.data());
            int32_t count = 0;
            for (int32_t id = 0; id < n; id++) {
                const bool one = c.allows(id);
                count += one;
                if (one != std::isfinite(logits[id]))
                    FAIL_CHECK("token " << id << " '" << og->vocab->bytes(id) << "'");
            }
            CHECK(count == allowed);
            CHECK(allowed > 0);
            CHECK(c.allows(tok.eos()) == (cut == text.size() || cut == text.size() - 1));
        }
    }
}
