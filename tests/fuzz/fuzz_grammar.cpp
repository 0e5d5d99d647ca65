// libFuzzer target for the GBNF compiler and the matcher (src/grammar): any
// bytes as a grammar compile or give Error(usage), never a crash, a hang or
// unbounded memory; a grammar that compiles is then matched against the
// same bytes a byte at a time and whole, where the two must agree.
//
// Seeds: grammars this binary writes when started with
// KVRUN_FUZZ_WRITE_SEEDS=DIR (scripts/fuzz.sh does).
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>

#include "error.h"
#include "fuzz_support.h"
#include "grammar.h"
#include "matcher.h"

using namespace kvrun;

namespace {

void write_seeds(const std::string& dir) {
    const char* seeds[] = {
        "root ::= \"a\" | \"bc\" | \"\"",
        "root ::= (\"ab\" | [c-e])* \"d\"{2,4} [^\"\\\\]+ .?",
        "root ::= item (\",\" item)*\nitem ::= [a-z\\u00e9-\\U0001F600]{1,8} # a comment\n",
        "root ::= \"(\" root \")\" | \"\"",
        "root   ::= object\nobject ::= \"{\" ws ( string \":\" ws value )? \"}\"\nvalue ::= object "
        "| "
        "string | [0-9]+\nstring ::= \"\\\"\" [^\"]* \"\\\"\"\nws ::= [ \\t\\n]*",
    };
    kvfuzz::write_seed_texts(dir, seeds);
}

} // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    return kvfuzz::write_seeds_or_fuzz(write_seeds);
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string text(reinterpret_cast<const char*>(data), size);
    std::shared_ptr<const Grammar> g;
    try {
        g = std::make_shared<const Grammar>(compile_gbnf(text));
    } catch (const Error& e) {
        if (e.code() != Exit::usage) std::abort();
        return 0;
    }
    try {
        GrammarMatcher bytewise(g);
        bool alive = true;
        for (char c : text)
            if (!(alive = bytewise.advance(std::string(1, c)))) break;
        const bool whole = GrammarMatcher::matches(g, text);
        if (whole != (alive && bytewise.accepting())) std::abort();
    } catch (const Error& e) { // too ambiguous: bounded, and said
        if (e.code() != Exit::usage) std::abort();
    }
    return 0;
}
