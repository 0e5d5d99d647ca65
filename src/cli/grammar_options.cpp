#include "cli/grammar_options.h"

#include <fmt/format.h>

#include "error.h"
#include "file_io.h"
#include "json_schema.h"
#include "sampler.h"
#include "tokenizer.h"

namespace kvrun::cli {

namespace {
// A grammar file is text someone wrote: a megabyte is far beyond any real one.
constexpr uint64_t kMaxGrammarFile = uint64_t{1} << 20;
} // namespace

void add_grammar_options(CLI::App& app, GrammarOptions& o) {
    auto* text = app.add_option("--grammar", o.text,
                                "the answer must follow this GBNF grammar (start rule: root); it "
                                "ends where the grammar does");
    auto* file = app.add_option("--grammar-file", o.file, "read the --grammar from FILE");
    auto* schema = app.add_option("-j,--json-schema", o.schema,
                                  "the answer must be JSON that this JSON schema accepts");
    auto* schema_file =
        app.add_option("--json-schema-file", o.schema_file, "read the --json-schema from FILE");
    const std::vector<CLI::Option*> all = {text, file, schema, schema_file};
    for (CLI::Option* a : all)
        for (CLI::Option* b : all)
            if (a != b) a->excludes(b);
}

void GrammarOptions::compile() {
    if (!given()) return;
    std::string gbnf;
    try {
        if (!text.empty()) {
            source = "--grammar";
            gbnf = text;
        } else if (!file.empty()) {
            source = "--grammar-file " + file;
            gbnf = read_regular_file(file, "grammar file", Exit::usage, kMaxGrammarFile);
        } else {
            source = schema.empty() ? "--json-schema-file " + schema_file : "--json-schema";
            gbnf = json_schema_to_gbnf(schema.empty()
                                           ? read_regular_file(schema_file, "JSON schema file",
                                                               Exit::usage, kMaxGrammarFile)
                                           : schema);
        }
        compiled = std::make_shared<const Grammar>(compile_gbnf(gbnf));
    } catch (const Error& e) {
        fail(Exit::usage, "{}: {}", source, e.what());
    }
}

std::shared_ptr<const OutputGrammar> GrammarOptions::bind(const Tokenizer& tok,
                                                          std::vector<int32_t> end_ids,
                                                          bool strip_first_space) const {
    if (!compiled) return nullptr;
    return std::make_shared<const OutputGrammar>(
        OutputGrammar{compiled, std::make_shared<const TokenBytes>(tok), std::move(end_ids),
                      strip_first_space, source});
}

int check_grammar_complete(const Sampler& s, const std::string& stop) {
    if (!s.grammar_incomplete()) return 0;
    fmt::print(stderr,
               "kvrun: the answer stopped ({}) before its grammar was complete: it is not a "
               "whole sentence of the grammar\n",
               stop);
    return static_cast<int>(Exit::error);
}

} // namespace kvrun::cli
