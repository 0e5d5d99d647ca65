// `kvrun tokenize --pieces` on pieces that hold part of a character: an
// emoji split into byte tokens (SentencePiece byte fallback) or byte-level
// BPE pieces. Every token gets its line, the partial bytes shown as <0xNN>.
#include <doctest/doctest.h>

#include "test_util.h"

TEST_CASE("tokenize --pieces: partial UTF-8 pieces print as <0xNN>, one line per token") {
    for (const char* model : {"models/stories260K.gguf", "models/synthetic/tiny-qwen2-Q8_0.gguf"}) {
        INFO(std::string(model));
        const std::string m = kvtest::shared(model);
        const auto ids =
            kvtest::run_kvrun({"tokenize", "-m", m, "-p", "I like \xF0\x9F\x98\x80 caf\xC3\xA9"});
        REQUIRE(ids.status == 0);
        const auto r = kvtest::run_kvrun(
            {"tokenize", "-m", m, "-p", "I like \xF0\x9F\x98\x80 caf\xC3\xA9", "--pieces"});
        INFO(r.err);
        REQUIRE(r.status == 0);
        const auto lines = kvtest::lines(r.out);
        size_t n_ids = 1;
        for (char c : ids.out) n_ids += c == ' ';
        CHECK(lines.size() == n_ids);
        // The emoji's bytes are split over pieces somewhere: at least one shows as a byte.
        CHECK(r.out.find("<0xF0>") != std::string::npos);
        // Whole characters stay as they are.
        CHECK(r.out.find("\xC3\xA9") != std::string::npos);
    }
}
