// `kvrun tokenize -m M -p TEXT [--json]`: the ids the model would see.
#include <cstdio>

#include <nlohmann/json.hpp>

#include "cli/common.h"
#include "error.h"
#include "gguf.h"
#include "tokenizer.h"
#include "unicode.h"

namespace kvrun::cli {

namespace {
// A piece as a quoted JSON-style string. A byte-level piece may hold part of
// a character (the first bytes of an emoji): each byte that does not start a
// whole UTF-8 sequence is shown as <0xNN>, as SentencePiece names its byte
// tokens, so every piece prints and nothing is lost.
std::string quoted_piece(const std::string& piece) {
    std::string text;
    for (size_t i = 0; i < piece.size();) {
        const size_t at = i;
        if (unicode::next_cp(piece, i) == unicode::invalid_cp)
            text += fmt::format("<0x{:02X}>", static_cast<uint8_t>(piece[at]));
        else
            text.append(piece, at, i - at);
    }
    return nlohmann::json(text).dump();
}
} // namespace

int run_tokenize(int argc, char** argv) {
    CommonOptions c;
    std::string prompt, file;
    bool json = false, no_bos = false, no_special = false, pieces = false;
    CLI::App app{"kvrun tokenize: print the token ids of a text", "kvrun tokenize"};
    add_model_option(app, c);
    auto* p_opt = app.add_option("-p,--prompt", prompt, "text to tokenize");
    app.add_option("-f,--file", file, "read the text from FILE (- for stdin; stdin is also read without -p or -f when it is not a terminal)");
    app.add_flag("--json", json, "print a JSON array of ids (not with --pieces)");
    app.add_flag("--no-bos", no_bos, "do not add BOS even if the vocabulary asks for it");
    app.add_flag("--no-special", no_special, "treat special-token text as plain text");
    app.add_flag("--pieces", pieces, "print one 'id<TAB>piece' line per token");
    if (const auto done = parse_command_line(app, argc, argv)) return *done;
    if (json && pieces) fail(Exit::usage, "--json prints ids only: use --json or --pieces, not both");
    if (file.empty() && !*p_opt && stdin_has_data()) file = "-";
    if (file.empty() && !*p_opt) fail(Exit::usage, "give a text with -p TEXT, -f FILE or on stdin (a pipe)");
    const std::string text = read_prompt(prompt, file, static_cast<bool>(*p_opt));
    // Only the vocabulary is needed: no weights are bound, so vocab-only files work.
    GgufFile f = GgufFile::open(c.model);
    Tokenizer tok(Vocab::from_gguf(f));
    const std::vector<int32_t> ids = tok.encode(text, !no_bos, !no_special);
    if (json) {
        fmt::print("{}\n", nlohmann::json(ids).dump());
    } else if (pieces) {
        for (int32_t id : ids) fmt::print("{}\t{}\n", id, quoted_piece(tok.piece(id, true)));
    } else {
        std::string line;
        for (size_t i = 0; i < ids.size(); i++) line += (i ? " " : "") + std::to_string(ids[i]);
        fmt::print("{}\n", line);
    }
    return 0;
}

} // namespace kvrun::cli
