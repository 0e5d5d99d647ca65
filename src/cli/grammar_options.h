// --grammar, --grammar-file, --json-schema (-j), --json-schema-file: the
// grammar an answer must follow (GBNF, or the grammar of a JSON schema's
// texts; src/grammar), compiled before the model loads (a bad one is a
// usage error, exit 2, saying where) and bound to the model's vocabulary
// after.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "constraint.h"
#include "grammar.h"

namespace kvrun {
class Sampler;
class Tokenizer;
} // namespace kvrun

namespace kvrun::cli {

struct GrammarOptions {
    std::string text, file, schema, schema_file;
    std::shared_ptr<const Grammar> compiled; // after compile(), when one was given
    std::string source; // "--grammar", "--json-schema-file F" ..., for messages

    bool given() const {
        return !text.empty() || !file.empty() || !schema.empty() || !schema_file.empty();
    }
    void compile(); // Error(Exit::usage) for a bad grammar or an unreadable file
    // The sampler's part (SamplerParams::grammar); null without a grammar.
    std::shared_ptr<const OutputGrammar> bind(const Tokenizer& tok, std::vector<int32_t> end_ids,
                                              bool strip_first_space) const;
};

void add_grammar_options(CLI::App& app, GrammarOptions& o);

// After an answer: one line on stderr and Exit::error when a grammar was
// given and the answer is not a whole sentence of it (-n, a stop string or
// a full context cut it first); 0 otherwise.
int check_grammar_complete(const Sampler& s, const std::string& stop);

} // namespace kvrun::cli
