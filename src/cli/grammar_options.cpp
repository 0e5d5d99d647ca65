#include "cli/grammar_options.h"

#include <fmt/format.h>

#include "error.h"
#include "file_io.h"
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
    app.add_option("--grammar-file", o.file, "read the --grammar from FILE")->excludes(text);
}

void GrammarOptions::compile() {
    if (!given()) return;
    std::string gbnf = text;
    source = "--grammar";
    if (!file.empty()) {
        gbnf = read_regular_file(file, "grammar file", Exit::usage, kMaxGrammarFile);
        source = "--grammar-file " + file;
    }
    try {
        compiled = std::make_shared<const Grammar>(compile_gbnf(gbnf));
    } catch (const Error& e) {
        fail(Exit::usage, "{}: {}", source, e.what());
    }
}

std::shared_ptr<const OutputGrammar> GrammarOptions::bind(const Tokenizer& tok,
                                                          std::vector<int32_t> end_ids,
                                                          bool strip_first_space) const {
    if (!compiled) return nullptr;
    auto g = std::make_shared<OutputGrammar>();
    g->grammar = compiled;
    g->vocab = std::make_shared<const TokenBytes>(tok);
    g->end_ids = std::move(end_ids);
    g->strip_first_space = strip_first_space;
    g->source = source;
    return g;
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
