// GBNF text -> Grammar: a recursive-descent parser that writes each rule's
// alternatives as element sequences, generating rules for groups,
// repetitions and non-ASCII character classes, then the checks the matcher
// relies on (every rule defined, no left recursion).
#include <algorithm>
#include <map>
#include <string>
#include <unordered_map>

#include "error.h"
#include "grammar.h"
#include "utf8_ranges.h"

namespace kvrun {

namespace {

using Seq = std::vector<Grammar::Elem>;

// Deeper groups are refused rather than recursed into (a hostile grammar
// would otherwise overflow the parser's stack).
constexpr int kMaxGroupDepth = 256;
// The largest count in {m,n}; the element budget bounds the rest.
constexpr uint64_t kMaxRepeat = 100000;

struct RuleDraft {
    std::string name;
    std::vector<Seq> alts;
    size_t origin = 0;                    // where it is defined (or, generated, written)
    size_t first_ref = std::string::npos; // first reference, for "not defined"
    bool defined = false;
    bool repetition = false; // generated for * + {m,}: named as such in errors
};

class GbnfCompiler {
  public:
    explicit GbnfCompiler(std::string_view s) : s_(s) {}

    Grammar compile() {
        skip_space();
        while (i_ < s_.size()) {
            const size_t at = i_;
            const std::string name = parse_name();
            if (name.empty()) fail_at(at, "expected a rule name");
            skip_space();
            if (s_.substr(i_, 3) != "::=")
                fail_at(i_, "expected ::= after the rule name '" + name + "'");
            i_ += 3;
            const uint32_t r = rule_id(name, at);
            if (rules_[r].defined) fail_at(at, "rule '" + name + "' is defined twice");
            rules_[r].defined = true;
            rules_[r].origin = at;
            cur_rule_ = r;
            generated_ = 0;
            parse_alternates(r);
            skip_space();
        }
        for (const RuleDraft& r : rules_)
            if (!r.defined) fail_at(r.first_ref, "rule '" + r.name + "' is not defined");
        const auto root = ids_.find("root");
        if (root == ids_.end()) fail(Exit::usage, "grammar: no rule named root (the start rule)");
        Grammar g = flatten();
        g.root = root->second;
        check_left_recursion(g);
        return g;
    }

  private:
    std::string_view s_;
    size_t i_ = 0;
    int depth_ = 0;
    uint32_t cur_rule_ = 0;
    int generated_ = 0; // generated rules of the current rule (their names)
    size_t elements_ = 0;
    std::vector<RuleDraft> rules_;
    std::unordered_map<std::string, uint32_t> ids_;
    std::vector<ByteSet> sets_;
    std::map<std::array<uint64_t, 4>, uint32_t> set_ids_;
    std::map<std::vector<CodepointRange>, uint32_t> class_rules_;

    [[noreturn]] void fail_at(size_t pos, const std::string& what) const {
        size_t line = 1, col = 1;
        for (size_t k = 0; k < pos && k < s_.size(); k++) {
            if (s_[k] == '\n')
                line++, col = 1;
            else if ((static_cast<uint8_t>(s_[k]) & 0xC0) != 0x80)
                col++;
        }
        fail(Exit::usage, "grammar: line {}, column {}: {}", line, col, what);
    }

    void count(size_t n) {
        elements_ += n;
        if (elements_ > kMaxGrammarElements)
            fail_at(i_, "the grammar is too large (over " + std::to_string(kMaxGrammarElements) +
                            " elements once repetitions are expanded)");
    }

    void skip_space() {
        while (i_ < s_.size()) {
            const char c = s_[i_];
            if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
                i_++;
            } else if (c == '#') {
                while (i_ < s_.size() && s_[i_] != '\n') i_++;
            } else {
                break;
            }
        }
    }

    static bool name_char(char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
               c == '-' || c == '_';
    }

    std::string parse_name() {
        const size_t start = i_;
        while (i_ < s_.size() && name_char(s_[i_])) i_++;
        return std::string(s_.substr(start, i_ - start));
    }

    bool at_rule_start() { // name ::= ahead: the current rule has ended
        const size_t save = i_;
        const bool named = !parse_name().empty();
        skip_space();
        const bool yes = named && s_.substr(i_, 3) == "::=";
        i_ = save;
        return yes;
    }

    uint32_t rule_id(const std::string& name, size_t ref_pos) {
        auto [it, added] = ids_.try_emplace(name, static_cast<uint32_t>(rules_.size()));
        if (added) {
            rules_.emplace_back();
            rules_.back().name = name;
            rules_.back().first_ref = ref_pos;
        }
        return it->second;
    }

    uint32_t new_rule(size_t origin, bool repetition = false) {
        const auto id = static_cast<uint32_t>(rules_.size());
        RuleDraft r;
        r.name = rules_[cur_rule_].name + "#" + std::to_string(++generated_);
        r.origin = origin;
        r.defined = true;
        r.repetition = repetition;
        rules_.push_back(std::move(r));
        return id;
    }

    uint32_t set_id(const ByteSet& b) {
        auto [it, added] = set_ids_.try_emplace(b.bits, static_cast<uint32_t>(sets_.size()));
        if (added) sets_.push_back(b);
        return it->second;
    }

    Grammar::Elem byte_elem(uint8_t c) {
        ByteSet b;
        b.add(c);
        return {Grammar::Op::bytes, set_id(b)};
    }

    void parse_alternates(uint32_t r) {
        while (true) {
            Seq seq = parse_sequence();
            rules_[r].alts.push_back(std::move(seq));
            skip_space();
            if (i_ < s_.size() && s_[i_] == '|') {
                i_++;
                continue;
            }
            return;
        }
    }

    Seq parse_sequence() {
        Seq seq;
        while (true) {
            skip_space();
            if (i_ >= s_.size() || s_[i_] == '|' || s_[i_] == ')' || at_rule_start()) return seq;
            const size_t at = i_;
            Seq term = parse_primary();
            term = parse_postfix(std::move(term), at);
            seq.insert(seq.end(), term.begin(), term.end());
        }
    }

    Seq parse_primary() {
        const size_t at = i_;
        const char c = s_[i_];
        if (c == '"') return parse_literal();
        if (c == '[') return {class_elem(parse_class(), at)};
        if (c == '.') {
            i_++;
            return {class_elem(normalize_ranges({{0, 0x10FFFF}}), at)};
        }
        if (c == '(') {
            if (++depth_ > kMaxGroupDepth)
                fail_at(at, "groups nested deeper than " + std::to_string(kMaxGroupDepth));
            i_++;
            const uint32_t g = new_rule(at);
            parse_alternates(g);
            skip_space();
            if (i_ >= s_.size() || s_[i_] != ')') fail_at(at, "unclosed (");
            i_++;
            depth_--;
            count(1);
            return {{Grammar::Op::rule, g}};
        }
        if (name_char(c)) {
            const std::string name = parse_name();
            count(1);
            return {{Grammar::Op::rule, rule_id(name, at)}};
        }
        if (c == '*' || c == '+' || c == '?' || c == '{')
            fail_at(at, std::string("'") + c + "' follows nothing it could repeat");
        fail_at(at, std::string("unexpected '") + c + "'");
    }

    // One term as one element: a rule of its own when it is several.
    Grammar::Elem as_elem(Seq term, size_t at) {
        if (term.size() == 1) return term[0];
        const uint32_t r = new_rule(at);
        rules_[r].alts.push_back(std::move(term));
        count(1);
        return {Grammar::Op::rule, r};
    }

    // x* as a rule of its own: R ::= x R | (nothing)
    Grammar::Elem star(Grammar::Elem x, size_t at) {
        const uint32_t r = new_rule(at, true);
        rules_[r].alts.push_back({x, {Grammar::Op::rule, r}});
        rules_[r].alts.emplace_back();
        count(4);
        return {Grammar::Op::rule, r};
    }

    uint64_t parse_count() {
        const size_t at = i_;
        uint64_t n = 0;
        bool any = false;
        while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') {
            n = n * 10 + static_cast<uint64_t>(s_[i_++] - '0');
            any = true;
            if (n > kMaxRepeat)
                fail_at(at, "a repetition count over " + std::to_string(kMaxRepeat));
        }
        if (!any) fail_at(at, "expected a number in { }");
        return n;
    }

    Seq parse_postfix(Seq term, size_t at) {
        while (i_ < s_.size()) {
            const char c = s_[i_];
            if (c != '*' && c != '+' && c != '?' && c != '{') return term;
            const size_t op_at = i_++;
            uint64_t lo = 0, hi = 0;
            bool unbounded = false;
            if (c == '*') {
                unbounded = true;
            } else if (c == '+') {
                lo = 1, unbounded = true;
            } else if (c == '?') {
                hi = 1;
            } else {
                skip_space();
                lo = parse_count();
                skip_space();
                hi = lo;
                if (i_ < s_.size() && s_[i_] == ',') {
                    i_++;
                    skip_space();
                    if (i_ < s_.size() && s_[i_] == '}')
                        unbounded = true;
                    else
                        hi = parse_count();
                    skip_space();
                }
                if (i_ >= s_.size() || s_[i_] != '}') fail_at(op_at, "expected } to close {");
                i_++;
                if (!unbounded && hi < lo) fail_at(op_at, "{m,n} with n < m");
            }
            const Grammar::Elem x = as_elem(std::move(term), at);
            Seq out;
            count(lo + (unbounded ? 1 : 3 * (hi - lo)));
            out.assign(lo, x);
            if (unbounded) {
                out.push_back(star(x, op_at));
            } else if (hi > lo) {
                // Up to hi - lo more: O1 ::= x | (nothing), Ok ::= x O(k-1) | (nothing).
                uint32_t prev = 0;
                for (uint64_t k = 1; k <= hi - lo; k++) {
                    const uint32_t o = new_rule(op_at);
                    Seq first{x};
                    if (k > 1) first.push_back({Grammar::Op::rule, prev});
                    rules_[o].alts.push_back(std::move(first));
                    rules_[o].alts.emplace_back();
                    prev = o;
                }
                out.push_back({Grammar::Op::rule, prev});
            }
            term = std::move(out);
        }
        return term;
    }

    // One UTF-8 character of the grammar's text.
    uint32_t take_char() {
        const size_t at = i_;
        const auto b0 = static_cast<uint8_t>(s_[i_]);
        int n = b0 < 0x80 ? 1 : (b0 >> 5) == 6 ? 2 : (b0 >> 4) == 14 ? 3 : (b0 >> 3) == 30 ? 4 : 0;
        if (n == 0 || i_ + n > s_.size()) fail_at(at, "invalid UTF-8 in the grammar");
        uint32_t cp = n == 1 ? b0 : b0 & (0x7F >> n);
        for (int k = 1; k < n; k++) {
            const auto b = static_cast<uint8_t>(s_[i_ + k]);
            if ((b & 0xC0) != 0x80) fail_at(at, "invalid UTF-8 in the grammar");
            cp = (cp << 6) | (b & 0x3F);
        }
        static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
        if (cp < kMin[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            fail_at(at, "invalid UTF-8 in the grammar");
        i_ += n;
        return cp;
    }

    uint32_t parse_hex(int digits, size_t at) {
        uint32_t v = 0;
        for (int k = 0; k < digits; k++) {
            if (i_ >= s_.size())
                fail_at(at,
                        "a \\x, \\u or \\U escape needs " + std::to_string(digits) + " hex digits");
            const char h = s_[i_++];
            int d = h >= '0' && h <= '9'   ? h - '0'
                    : h >= 'a' && h <= 'f' ? h - 'a' + 10
                    : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                           : -1;
            if (d < 0)
                fail_at(at,
                        "a \\x, \\u or \\U escape needs " + std::to_string(digits) + " hex digits");
            v = v * 16 + static_cast<uint32_t>(d);
        }
        if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF))
            fail_at(at, "an escape that is not a Unicode scalar value");
        return v;
    }

    // A character in a literal or a class: an escape, or itself.
    uint32_t parse_char() {
        const size_t at = i_;
        if (s_[i_] != '\\') return take_char();
        if (++i_ >= s_.size()) fail_at(at, "a \\ at the end of the grammar");
        const char e = s_[i_++];
        switch (e) {
        case 'n':
            return '\n';
        case 'r':
            return '\r';
        case 't':
            return '\t';
        case '\\':
        case '"':
        case '\'':
        case '[':
        case ']':
        case '-':
        case '^':
        case '/':
            return static_cast<uint8_t>(e);
        case 'x':
            return parse_hex(2, at);
        case 'u':
            return parse_hex(4, at);
        case 'U':
            return parse_hex(8, at);
        default:
            fail_at(at, std::string("unknown escape \\") + e);
        }
    }

    Seq parse_literal() {
        const size_t at = i_++;
        Seq seq;
        std::vector<uint8_t> bytes;
        while (true) {
            if (i_ >= s_.size()) fail_at(at, "unterminated string literal");
            if (s_[i_] == '"') break;
            if (s_[i_] == '\n') fail_at(at, "a line break in a string literal (write \\n)");
            bytes.clear();
            append_utf8(bytes, parse_char());
            count(bytes.size());
            for (uint8_t b : bytes) seq.push_back(byte_elem(b));
        }
        i_++;
        return seq; // "" is an empty sequence: matches nothing, consumes nothing
    }

    std::vector<CodepointRange> parse_class() {
        const size_t at = i_++;
        bool negate = false;
        if (i_ < s_.size() && s_[i_] == '^') negate = true, i_++;
        std::vector<CodepointRange> r;
        while (true) {
            if (i_ >= s_.size()) fail_at(at, "unterminated character class");
            if (s_[i_] == ']') break;
            const uint32_t lo = parse_char();
            uint32_t hi = lo;
            if (i_ + 1 < s_.size() && s_[i_] == '-' && s_[i_ + 1] != ']') {
                i_++;
                hi = parse_char();
                if (hi < lo) fail_at(at, "a character range whose end is before its start");
            }
            r.emplace_back(lo, hi);
        }
        i_++;
        r = normalize_ranges(std::move(r));
        if (negate) r = complement_ranges(r);
        if (r.empty()) fail_at(at, "a character class that matches nothing");
        return r;
    }

    // An ASCII class is one byte set; any other, a rule whose alternatives
    // spell its characters in UTF-8 (one rule per distinct class).
    Grammar::Elem class_elem(const std::vector<CodepointRange>& r, size_t at) {
        count(1);
        if (r.back().second < 0x80) {
            ByteSet b;
            for (auto [lo, hi] : r) b.add_range(static_cast<uint8_t>(lo), static_cast<uint8_t>(hi));
            return {Grammar::Op::bytes, set_id(b)};
        }
        if (auto it = class_rules_.find(r); it != class_rules_.end())
            return {Grammar::Op::rule, it->second};
        const uint32_t c = new_rule(at);
        ByteSet ascii;
        bool any_ascii = false;
        for (const auto& seq : utf8_sequences(r)) {
            if (seq.size() == 1) { // all one-byte sequences share one alternative
                ascii.add_range(seq[0].first, seq[0].second);
                any_ascii = true;
                continue;
            }
            Seq alt;
            for (auto [lo, hi] : seq) {
                ByteSet b;
                b.add_range(lo, hi);
                alt.push_back({Grammar::Op::bytes, set_id(b)});
            }
            count(alt.size() + 1);
            rules_[c].alts.push_back(std::move(alt));
        }
        if (any_ascii)
            rules_[c].alts.insert(rules_[c].alts.begin(), Seq{{Grammar::Op::bytes, set_id(ascii)}});
        class_rules_.emplace(r, c);
        return {Grammar::Op::rule, c};
    }

    Grammar flatten() {
        Grammar g;
        g.sets = std::move(sets_);
        g.alts.resize(rules_.size());
        for (size_t r = 0; r < rules_.size(); r++) {
            g.names.push_back(rules_[r].name);
            for (const Seq& alt : rules_[r].alts) {
                g.alts[r].push_back(static_cast<uint32_t>(g.code.size()));
                g.code.insert(g.code.end(), alt.begin(), alt.end());
                g.code.push_back({Grammar::Op::end, 0});
            }
        }
        return g;
    }

    // A rule that can reach itself before consuming a byte would make the
    // matcher expand it forever: refused, naming the rule (or the repetition
    // of something that can match nothing).
    void check_left_recursion(const Grammar& g) {
        const size_t n = g.n_rules();
        std::vector<char> nullable(n, 0);
        for (bool changed = true; changed;) {
            changed = false;
            for (size_t r = 0; r < n; r++) {
                if (nullable[r]) continue;
                for (uint32_t p : g.alts[r]) {
                    while (g.code[p].op == Grammar::Op::rule && nullable[g.code[p].arg]) p++;
                    if (g.code[p].op == Grammar::Op::end) {
                        nullable[r] = changed = true;
                        break;
                    }
                }
            }
        }
        // Edges r -> s: s is referenced where everything before it in an
        // alternative of r can match nothing. An iterative DFS finds a cycle.
        std::vector<std::vector<uint32_t>> calls(n);
        for (size_t r = 0; r < n; r++)
            for (uint32_t p : g.alts[r])
                for (; g.code[p].op == Grammar::Op::rule; p++) {
                    calls[r].push_back(g.code[p].arg);
                    if (!nullable[g.code[p].arg]) break;
                }
        std::vector<uint8_t> state(n, 0); // 0 new, 1 on the path, 2 done
        std::vector<std::pair<uint32_t, size_t>> path;
        for (size_t start = 0; start < n; start++) {
            if (state[start]) continue;
            path.emplace_back(static_cast<uint32_t>(start), 0);
            state[start] = 1;
            while (!path.empty()) {
                auto& [r, k] = path.back();
                if (k == calls[r].size()) {
                    state[r] = 2;
                    path.pop_back();
                    continue;
                }
                const uint32_t s = calls[r][k++];
                if (state[s] == 1) {
                    const RuleDraft& d = rules_[s];
                    if (d.repetition)
                        fail_at(d.origin, "a repetition of something that can match nothing");
                    fail_at(
                        d.origin,
                        "rule '" + d.name +
                            "' is left-recursive (it can reach itself before matching anything)");
                }
                if (state[s] == 0) {
                    state[s] = 1;
                    path.emplace_back(s, 0);
                }
            }
        }
    }
};

} // namespace

Grammar compile_gbnf(std::string_view text) {
    return GbnfCompiler(text).compile();
}

} // namespace kvrun
