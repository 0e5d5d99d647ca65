// libFuzzer target for the tokenizer: arbitrary bytes (invalid UTF-8
// included) are encoded and decoded with a SentencePiece and a byte-level BPE
// vocabulary, loaded once. Besides "never crashes", it checks what must hold
// for any input:
//  - every id is in range, every decoded string is valid UTF-8, and streamed
//    decoding equals whole decoding;
//  - the pieces of the ids spell the input byte for byte (SPM: after the
//    leading space; not when the text contains U+2581, which SPM reads as a
//    space, or when the vocabulary splits out user-defined tokens);
//  - hence for valid UTF-8 input, decode(encode(x)) == x.
// Vocabularies: $KVRUN_FUZZ_VOCAB (SPM) and $KVRUN_FUZZ_VOCAB_BPE, by
// default the shared test vocabularies relative to the project root.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "error.h"
#include "gguf.h"
#include "tokenizer.h"
#include "unicode.h"

using namespace kvrun;

namespace {

struct Loaded {
    std::unique_ptr<Tokenizer> tok;
    bool has_user_defined = false;
};

Loaded load(const char* env, const char* fallback) {
    const char* path = std::getenv(env);
    if (!path || !*path) path = fallback;
    try {
        GgufFile f = GgufFile::open(path);
        Loaded l;
        l.tok = std::make_unique<Tokenizer>(Vocab::from_gguf(f));
        for (TokenAttr a : l.tok->vocab().attrs)
            if (a == TokenAttr::user_defined) l.has_user_defined = true;
        return l;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "fuzz_tokenizer: cannot load vocabulary (set %s): %s\n", env,
                     e.what());
        std::abort();
    }
}

bool valid_utf8(std::string_view s) {
    for (size_t i = 0; i < s.size();) {
        int len = unicode::valid_seq_len(s, i);
        if (len <= 0) return false;
        i += len;
    }
    return true;
}

void check(const Loaded& l, std::string_view text) {
    const Tokenizer& t = *l.tok;
    for (bool special : {false, true}) {
        std::vector<int32_t> ids = t.encode(text, special, special);
        for (int32_t id : ids) KV_ASSERT(id >= 0 && id < t.n_vocab());
        std::string whole = t.decode(ids);
        KV_ASSERT(valid_utf8(whole));
        Tokenizer::Decoder d(t);
        std::string streamed;
        for (int32_t id : ids) {
            std::string part = d.push(id);
            KV_ASSERT(valid_utf8(part));
            streamed += part;
        }
        streamed += d.flush();
        KV_ASSERT(streamed == whole);
        for (int32_t id : ids) (void)t.piece(id, true);
    }

    if (l.has_user_defined) return;
    bool spm = t.vocab().kind == Vocab::Kind::spm;
    if (spm && text.find("\xE2\x96\x81") != std::string_view::npos) return;
    std::vector<int32_t> ids = t.encode(text, false, false);
    std::string want(text);
    if (spm && t.vocab().add_space_prefix && !want.empty()) want.insert(0, " ");
    std::string bytes;
    for (int32_t id : ids) bytes += t.piece(id);
    KV_ASSERT(bytes == want);
    if (valid_utf8(text)) KV_ASSERT(t.decode(ids) == want);
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static const Loaded spm = load("KVRUN_FUZZ_VOCAB", "../shared/vocab/ggml-vocab-llama-spm.gguf");
    static const Loaded bpe = load("KVRUN_FUZZ_VOCAB_BPE", "../shared/vocab/ggml-vocab-gpt-2.gguf");
    std::string_view text(reinterpret_cast<const char*>(data), size);
    check(spm, text);
    check(bpe, text);
    return 0;
}
