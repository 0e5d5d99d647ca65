// A context-free grammar over bytes, compiled from GBNF (gbnf.cpp) and read
// by the matcher (matcher.h). Every rule is a list of alternatives, each a
// sequence of elements: a set of bytes, or a reference to a rule. Character
// classes over code points are compiled to alternatives of byte sets (their
// UTF-8 spellings), so the matcher, and the check of a token's bytes, never
// decode UTF-8: a token that ends inside a character is checked as far as
// it goes.
//
// Invariants the compiler establishes (the matcher relies on them): every
// referenced rule exists, and no rule can reach itself without consuming a
// byte (no left recursion, no repetition of something that can match
// nothing), so expanding references always ends.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace kvrun {

struct ByteSet {
    std::array<uint64_t, 4> bits{};
    bool has(uint8_t b) const { return (bits[b >> 6] >> (b & 63)) & 1; }
    void add(uint8_t b) { bits[b >> 6] |= uint64_t{1} << (b & 63); }
    void add_range(uint8_t lo, uint8_t hi) {
        for (unsigned b = lo; b <= hi; b++) add(static_cast<uint8_t>(b));
    }
    bool operator==(const ByteSet&) const = default;
};

struct Grammar {
    enum class Op : uint8_t {
        bytes, // arg: index into sets; consumes one byte in the set
        rule,  // arg: rule id; the rule's text, then what follows
        end,   // end of an alternative: return to the referencing element
    };
    struct Elem {
        Op op;
        uint32_t arg;
    };
    std::vector<Elem> code;                  // every alternative, each closed by Op::end
    std::vector<std::vector<uint32_t>> alts; // rule id -> starts of its alternatives in code
    std::vector<ByteSet> sets;               // distinct byte sets
    std::vector<std::string> names;          // rule id -> name (generated rules: "name#N")
    uint32_t root = 0;                       // the start rule

    size_t n_rules() const { return alts.size(); }
};

// Largest grammar compile_gbnf accepts, counted in elements after repetitions
// are expanded ({m,n} writes its operand m + 2(n - m) times): a bound on what
// one request can make the process allocate.
inline constexpr size_t kMaxGrammarElements = size_t{1} << 20;

// GBNF, the notation of the reference engine's --grammar: `name ::= body`
// rules, `|` alternatives, `( )` groups, `* + ? {m} {m,} {m,n}`, "literals"
// and [classes] (ranges, ^ negation) with \n \r \t \\ \" \' \[ \] \- \^
// \xHH \uHHHH \UHHHHHHHH escapes, `.` (any character), # comments. A rule
// may span lines. The start rule is `root`. Errors: Error(Exit::usage,
// "grammar: line L, column C: what"), one line.
Grammar compile_gbnf(std::string_view text);

// Any JSON object (RFC 8259; whitespace between tokens bounded): OpenAI's
// response_format {"type": "json_object"}. Compiled once.
std::shared_ptr<const Grammar> json_object_grammar();

} // namespace kvrun
