// libFuzzer target for building a tokenizer from a hostile vocabulary: a
// GGUF file's tokenizer.* metadata (tokens, scores, types, merges, special
// ids, pre-tokenizer) must make a Vocab and Tokenizer or be refused with
// kvrun::Error; a built tokenizer must encode and decode a few texts with
// every id in range. fuzz_gguf covers the file format; this covers what the
// vocabulary's values can do.
//
// Seeds: the vocabulary files in ../shared/vocab (run with -max_len=2000000),
// plus tiny SentencePiece and BPE vocabularies this binary writes when started
// with KVRUN_FUZZ_WRITE_SEEDS=DIR (see scripts/fuzz.sh): small inputs mutate fast.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "error.h"
#include "gguf.h"
#include "gguf_writer.h"
#include "tokenizer.h"
#include "fuzz_support.h"

using namespace kvrun;

namespace {

void write_seeds(const std::string& dir) {
    {
        GgufWriter w;
        w.set_str("general.architecture", "llama");
        w.set_str("tokenizer.ggml.model", "llama");
        std::vector<std::string> tokens = {"<unk>",
                                           "<s>",
                                           "</s>",
                                           "<0x0A>",
                                           "\xE2\x96\x81",
                                           "a",
                                           "b",
                                           "ab",
                                           "\xE2\x96\x81"
                                           "a",
                                           "<|im_start|>"};
        for (int b = 0; b < 16; b++)
            tokens.push_back("<0x" + std::string(1, "0123456789ABCDEF"[b]) + "F>");
        std::vector<float> scores(tokens.size());
        for (size_t i = 0; i < scores.size(); i++) scores[i] = -static_cast<float>(i);
        std::vector<int32_t> types(tokens.size(), 1);
        types[0] = 2, types[1] = 3, types[2] = 3, types[9] = 4;
        for (size_t i = 10; i < tokens.size(); i++) types[i] = 6;
        w.set_str_array("tokenizer.ggml.tokens", tokens);
        w.set_f32_array("tokenizer.ggml.scores", scores);
        w.set_i32_array("tokenizer.ggml.token_type", types);
        w.set_u32("tokenizer.ggml.bos_token_id", 1);
        w.set_u32("tokenizer.ggml.eos_token_id", 2);
        w.write(dir + "/seed-spm.gguf");
    }
    {
        GgufWriter w;
        w.set_str("general.architecture", "qwen2");
        w.set_str("tokenizer.ggml.model", "gpt2");
        w.set_str("tokenizer.ggml.pre", "qwen2");
        std::vector<std::string> tokens;
        for (int c = 0x21; c < 0x7f; c++) tokens.push_back(std::string(1, static_cast<char>(c)));
        for (const char* t : {"\xC4\xA0", "\xC4\xA0t", "th", "the", "<|endoftext|>"})
            tokens.push_back(t);
        std::vector<int32_t> types(tokens.size(), 1);
        types.back() = 3;
        w.set_str_array("tokenizer.ggml.tokens", tokens);
        w.set_i32_array("tokenizer.ggml.token_type", types);
        w.set_str_array("tokenizer.ggml.merges", {"\xC4\xA0 t", "t h", "th e"});
        w.set_u32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(tokens.size() - 1));
        w.write(dir + "/seed-bpe.gguf");
    }
}

} // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    return kvfuzz::write_seeds_or_fuzz(write_seeds);
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    try {
        GgufFile f = GgufFile::parse(data, size, "fuzz-vocab.gguf");
        Tokenizer tok(Vocab::from_gguf(f));
        for (const char* text :
             {"Hello world", " the theme\n\n  x", "<|im_start|>user\nhi<|im_end|>",
              "\xff\xfe abc \xE2\x96\x81", "12345 3.14 don't"}) {
            for (bool special : {false, true}) {
                const std::vector<int32_t> ids = tok.encode(text, special, special);
                for (int32_t id : ids)
                    if (id < 0 || id >= tok.n_vocab()) std::abort();
                (void)tok.decode(ids);
                for (int32_t id : ids) (void)tok.piece(id, true);
            }
        }
    } catch (const Error&) {
    }
    return 0;
}
