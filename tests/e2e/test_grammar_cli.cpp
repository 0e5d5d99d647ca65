// kvrun --grammar end to end: sampled answers checked by recognisers written
// here by hand (not the matcher the sampler uses), greedy and seeded answers
// unchanged by a grammar they already follow, and the errors.
#include <doctest/doctest.h>

#include <cctype>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "test_util.h"

using kvtest::run_kvrun;

namespace {

const std::string kModel = kvtest::shared("models/stories260K.gguf");

// A hand-written recursive-descent reader over a string.
struct Reader {
    const std::string& s;
    size_t i = 0;
    bool eat(char c) {
        if (i < s.size() && s[i] == c) return ++i, true;
        return false;
    }
    int digits(int lo, int hi) { // [0-9]{lo,hi}: how many, or -1
        int n = 0;
        while (n < hi && i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) i++, n++;
        return n >= lo ? n : -1;
    }
};

// root ::= expr "="; expr ::= term (("+" | "-" | "*") term){0,3}
// term ::= [0-9]{1,3} | "(" [0-9]{1,3} (("+" | "-") [0-9]{1,3}){0,2} ")"
bool is_arithmetic(const std::string& s) {
    Reader r{s};
    auto term = [&] {
        if (r.eat('(')) {
            if (r.digits(1, 3) < 0) return false;
            for (int k = 0; k < 2 && (r.eat('+') || r.eat('-')); k++)
                if (r.digits(1, 3) < 0) return false;
            return r.eat(')');
        }
        return r.digits(1, 3) >= 0;
    };
    if (!term()) return false;
    for (int k = 0; k < 3 && (r.eat('+') || r.eat('-') || r.eat('*')); k++)
        if (!term()) return false;
    return r.eat('=') && r.i == s.size();
}
const char* kArithmetic = R"g(
root  ::= expr "="
expr  ::= term (("+" | "-" | "*") term){0,3}
term  ::= [0-9]{1,3} | "(" inner ")"
inner ::= [0-9]{1,3} (("+" | "-") [0-9]{1,3}){0,2}
)g";

// root ::= "[" item ("," " "? item){0,4} "]"; item ::= [a-z]{1,8}
bool is_list(const std::string& s) {
    Reader r{s};
    auto item = [&] {
        int n = 0;
        while (n < 8 && r.i < s.size() && s[r.i] >= 'a' && s[r.i] <= 'z') r.i++, n++;
        return n > 0;
    };
    if (!r.eat('[') || !item()) return false;
    for (int k = 0; k < 4 && r.eat(','); k++) {
        r.eat(' ');
        if (!item()) return false;
    }
    return r.eat(']') && r.i == s.size();
}
const char* kList = R"g(root ::= "[" item ("," " "? item){0,4} "]"
item ::= [a-z]{1,8})g";

// Three fields and a newline; a field is 1-10 of [A-Za-z0-9 ] or a quoted
// 0-10 characters other than a quote or a newline.
bool is_csv_line(const std::string& s) {
    Reader r{s};
    auto field = [&] {
        if (r.eat('"')) {
            int n = 0;
            while (n < 10 && r.i < s.size() && s[r.i] != '"' && s[r.i] != '\n') {
                // one UTF-8 character
                r.i++;
                while (r.i < s.size() && (static_cast<unsigned char>(s[r.i]) & 0xC0) == 0x80) r.i++;
                n++;
            }
            return r.eat('"');
        }
        int n = 0;
        while (n < 10 && r.i < s.size() &&
               (std::isalnum(static_cast<unsigned char>(s[r.i])) || s[r.i] == ' '))
            r.i++, n++;
        return n > 0;
    };
    if (!field()) return false;
    for (int k = 0; k < 2; k++)
        if (!r.eat(',') || !field()) return false;
    return r.eat('\n') && r.i == s.size();
}
const char* kCsv = R"g(root  ::= field "," field "," field "\n"
field ::= [A-Za-z0-9 ]{1,10} | "\"" [^"\n]{0,10} "\"")g";

} // namespace

TEST_CASE(
    "cli grammar: sampled answers always follow the grammar (arithmetic, a list, a CSV line)") {
    struct G {
        const char* name;
        const char* gbnf;
        bool (*check)(const std::string&);
    };
    for (const G& g : {G{"arithmetic", kArithmetic, is_arithmetic}, G{"list", kList, is_list},
                       G{"csv", kCsv, is_csv_line}}) {
        CAPTURE(g.name);
        int distinct = 0;
        std::string last;
        for (int seed = 1; seed <= 20; seed++) {
            CAPTURE(seed);
            const auto r =
                run_kvrun({"-m", kModel, "-p", "Once upon a time", "-n", "120", "--temp", "1.0",
                           "--seed", std::to_string(seed), "--grammar", g.gbnf, "--quiet"});
            CAPTURE(r.err);
            REQUIRE(r.status == 0);
            CAPTURE(r.out);
            CHECK(g.check(r.out));
            distinct += r.out != last;
            last = r.out;
        }
        CHECK(distinct > 10); // sampled, not one answer over and over
    }
    // The recognisers themselves tell right from wrong.
    CHECK(is_arithmetic("12+(3-4)*5="));
    CHECK_FALSE(is_arithmetic("12+(3-4)*5"));
    CHECK_FALSE(is_arithmetic("1234="));
    CHECK(is_list("[ab, c,d]"));
    CHECK_FALSE(is_list("[ab,]"));
    CHECK(is_csv_line("a b,\"x,y\",3\n"));
    CHECK_FALSE(is_csv_line("a,b\n"));
}

TEST_CASE("cli grammar: a grammar the answer already follows changes nothing (greedy and seeded)") {
    // Everything but NUL, any length: the model's own answer is a sentence.
    const std::string any = R"g(root ::= [^\x00]*)g";
    for (const std::vector<std::string>& sampling :
         {std::vector<std::string>{"--temp", "0"},
          {"--temp", "1.0", "--seed", "7"},
          {"--temp", "0.8", "--top-k", "0", "--seed", "3"}}) {
        std::vector<std::string> args = {"-m", kModel, "-p",     "Once upon a time",
                                         "-n", "60",   "--quiet"};
        args.insert(args.end(), sampling.begin(), sampling.end());
        const auto plain = run_kvrun(args);
        args.insert(args.end(), {"--grammar", any});
        const auto constrained = run_kvrun(args);
        REQUIRE(plain.status == 0);
        CHECK(constrained.status == 0);
        CHECK(constrained.out == plain.out);
        CHECK(plain.out.size() > 50);
    }
    // No letter z: never written, and the rest of the story goes on.
    for (int seed = 1; seed <= 5; seed++) {
        const auto r = run_kvrun({"-m", kModel, "-p", "Once upon a time", "-n", "80", "--temp",
                                  "1.0", "--seed", std::to_string(seed), "--grammar",
                                  R"g(root ::= [^zZ]*)g", "--quiet"});
        CHECK(r.status == 0);
        CHECK(r.out.find_first_of("zZ") == std::string::npos);
        CHECK(r.out.size() > 40);
    }
}

TEST_CASE("cli grammar: the answer ends where the grammar does; a cut answer is an error") {
    // Complete, nothing may follow: it stops there, without an end token.
    const auto done = run_kvrun({"-m", kModel, "-p", "Once upon a time", "--temp", "0", "--grammar",
                                 R"g(root ::= "The end.")g", "--json"});
    REQUIRE(done.status == 0);
    CHECK(done.out.find("\"text\":\"The end.\"") != std::string::npos);
    CHECK(done.out.find("\"stop\":\"grammar\"") != std::string::npos);
    // -n cuts it first: the text so far, then one line and status 1.
    const auto cut = run_kvrun({"-m", kModel, "-p", "Once upon a time", "--temp", "0", "-n", "3",
                                "--grammar", R"g(root ::= "a" [a-z ]{20,40} ".")g", "--quiet"});
    CHECK(cut.status == 1);
    CHECK(cut.out.size() > 0);
    CHECK(cut.err.find("stopped (length) before its grammar was complete") != std::string::npos);
}

TEST_CASE("cli grammar: bad grammars and clashing options are one-line usage errors") {
    auto usage = [](const std::vector<std::string>& extra, const std::string& says) {
        std::vector<std::string> args = {"-m", kModel, "-p", "x"};
        args.insert(args.end(), extra.begin(), extra.end());
        const auto r = run_kvrun(args);
        CAPTURE(r.err);
        CHECK(r.status == 2);
        CHECK(r.err.find(says) != std::string::npos);
        CHECK(kvtest::lines(r.err).size() == 1);
        CHECK(r.out.empty());
    };
    usage({"--grammar", "root ::= \"a\" b"},
          "--grammar: grammar: line 1, column 14: rule 'b' is not defined");
    usage({"--grammar", "root ::= root \"a\""}, "left-recursive");
    usage({"--grammar-file", "/nonexistent/g.gbnf"}, "/nonexistent/g.gbnf");
    usage({"--grammar", "root ::= \"a\"", "--grammar-file", "x"}, "excludes");
    usage({"--grammar", "root ::= \"a\"", "--lookup", "3"}, "speculative");
    usage({"--json-schema", "{\"uniqueItems\": true}"},
          "--json-schema: JSON schema: at #: \"uniqueItems\" is not supported");
    usage({"--json-schema", "{}", "--grammar", "root ::= \"a\""}, "excludes");
    const std::string path = "/tmp/kvrun-test-grammar.gbnf";
    std::ofstream(path) << "root ::= x\n\nx ::= (\"a\" | \n  \"b\"\n";
    usage({"--grammar-file", path},
          "--grammar-file " + path + ": grammar: line 3, column 7: unclosed (");
    std::remove(path.c_str());
}

TEST_CASE("cli grammar: kvrun batch takes a grammar per request") {
    // Two constrained requests beside a free one, decoded together; a bad
    // grammar is that request's error, the others go on.
    const std::string input =
        R"g({"id": "list", "prompt": "Once upon a time", "max_tokens": 120, "temperature": 1.0, "seed": 3, "grammar": "root ::= \"[\" item (\",\" \" \"? item){0,4} \"]\"\nitem ::= [a-z]{1,8}"})g"
        "\n"
        R"g({"id": "free", "prompt": "Once upon a time", "max_tokens": 20, "temperature": 0})g"
        "\n"
        R"g({"id": "sum", "prompt": "One day", "max_tokens": 120, "temperature": 1.0, "seed": 4, "grammar": "root ::= [0-9]{1,3} \"+\" [0-9]{1,3} \"=\""})g"
        "\n"
        R"g({"id": "bad", "prompt": "x", "grammar": "root ::= nothing"})g"
        "\n";
    const auto r =
        run_kvrun({"batch", "-m", kModel, "-c", "256", "--ordered", "--parallel", "3"}, &input);
    REQUIRE(r.status == 0);
    std::vector<nlohmann::json> out;
    for (const std::string& line : kvtest::lines(r.out)) out.push_back(nlohmann::json::parse(line));
    REQUIRE(out.size() == 4);
    CHECK(is_list(out[0]["text"].get<std::string>()));
    CHECK(out[0]["finish_reason"] == "stop");
    CHECK(out[1]["text"].get<std::string>().size() > 20);
    const std::string sum = out[2]["text"].get<std::string>();
    CHECK(sum.size() >= 4);
    CHECK(sum.back() == '=');
    CHECK(sum.find('+') != std::string::npos);
    CHECK(out[3]["error"].get<std::string>().find("rule 'nothing' is not defined") !=
          std::string::npos);
}

TEST_CASE("cli grammar: -j takes a JSON schema; every sampled answer is a document it accepts") {
    const std::string schema =
        R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
            "age": {"type": "integer", "minimum": 0, "maximum": 30},
            "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3}},
            "required": ["name", "age"], "additionalProperties": false})";
    for (int seed = 1; seed <= 10; seed++) {
        CAPTURE(seed);
        const auto r = run_kvrun({"-m", kModel, "-p", "Once upon a time", "-n", "200", "--temp",
                                  "1.0", "--seed", std::to_string(seed), "-j", schema, "--quiet"});
        REQUIRE(r.status == 0);
        CAPTURE(r.out);
        const nlohmann::json j = nlohmann::json::parse(r.out); // throws (fails) if not JSON
        REQUIRE(j.is_object());
        CHECK(j["name"].is_string());
        CHECK(j["age"].is_number_integer());
        CHECK(j["age"].get<int>() >= 0);
        CHECK(j["age"].get<int>() <= 30);
        for (const auto& [k, v] : j.items()) CHECK((k == "name" || k == "age" || k == "tags"));
        if (j.contains("tags")) CHECK(j["tags"].size() <= 3);
    }
    const auto bad = run_kvrun(
        {"-m", kModel, "-p", "x", "--json-schema", R"({"type": "string", "format": "email"})"});
    CHECK(bad.status == 2);
    CHECK(
        bad.err.find("--json-schema: JSON schema: at #: \"format\": \"email\" is not supported") !=
        std::string::npos);
}
