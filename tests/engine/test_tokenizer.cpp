// Tokenizer tests: the reference's vocabulary test vectors, the goldens'
// prompt tokens, decoding (streamed, split characters, invalid bytes), the
// BPE pre-tokenizers piece by piece, vocabulary validation, and speed.
#include <doctest/doctest.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "error.h"
#include "gguf.h"
#include "tokenizer.h"
#include "unicode.h"
#include "test_util.h"

using namespace kvrun;
namespace fs = std::filesystem;

namespace {

const std::string k_shared = KVRUN_SHARED_DIR;

std::string slurp(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    REQUIRE_MESSAGE(f, "cannot read " << path);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

// Vocabularies are loaded once per file: the 32k-token ones take a moment.
const Tokenizer& tokenizer_for(const std::string& path) {
    static std::map<std::string, Tokenizer> cache;
    auto it = cache.find(path);
    if (it == cache.end()) {
        GgufFile f = GgufFile::open(path);
        it = cache.emplace(path, Tokenizer(Vocab::from_gguf(f))).first;
    }
    return it->second;
}

// Takes a C string: GCC 13 warns (falsely) about a reference returned from a
// call given a temporary std::string.
const Tokenizer& vocab_tok(const char* name) {
    return tokenizer_for(k_shared + "/vocab/ggml-vocab-" + std::string(name) + ".gguf");
}

// .inp: strings, each followed by a line "__ggml_vocab_test__" (so a string
// may be empty or end in newlines); .out: one line of ids per string.
std::vector<std::string> read_inputs(const std::string& path) {
    std::string raw = slurp(path);
    const std::string sep = "\n__ggml_vocab_test__\n";
    std::vector<std::string> out;
    for (size_t pos = 0; pos < raw.size();) {
        size_t next = raw.find(sep, pos);
        if (next == std::string::npos) {
            out.push_back(raw.substr(pos));
            break;
        }
        out.push_back(raw.substr(pos, next - pos));
        pos = next + sep.size();
    }
    return out;
}

std::vector<std::vector<int32_t>> read_outputs(const std::string& path) {
    std::istringstream in(slurp(path));
    std::vector<std::vector<int32_t>> out;
    for (std::string line; std::getline(in, line);) {
        std::istringstream ls(line);
        std::vector<int32_t> ids;
        for (int32_t id; ls >> id;) ids.push_back(id);
        out.push_back(ids);
    }
    return out;
}

std::vector<int32_t> ids_of(const Tokenizer& t, std::initializer_list<const char*> texts) {
    std::vector<int32_t> ids;
    for (const char* s : texts) {
        int32_t id = -1;
        for (int32_t i = 0; i < t.n_vocab(); i++)
            if (t.vocab().tokens[i] == s) id = i;
        REQUIRE_MESSAGE(id >= 0, "no token " << s);
        ids.push_back(id);
    }
    return ids;
}

std::vector<std::string> split(unicode::PreSplit kind, std::string_view text) {
    std::vector<std::string> out;
    for (std::string_view p : unicode::pre_split(kind, text)) out.emplace_back(p);
    return out;
}

// A minimal GGUF v3 writer for the validation tests.
struct GgufBuilder {
    std::string buf;
    uint64_t n_kv = 0;
    template <typename T> void put(T x) { buf.append(reinterpret_cast<const char*>(&x), sizeof x); }
    void str(std::string_view s) {
        put<uint64_t>(s.size());
        buf.append(s);
    }
    void key(std::string_view k, GgufType t) {
        str(k);
        put<uint32_t>(static_cast<uint32_t>(t));
        n_kv++;
    }
    GgufBuilder& s(std::string_view k, std::string_view v) {
        key(k, GgufType::string);
        str(v);
        return *this;
    }
    GgufBuilder& u32(std::string_view k, uint32_t v) {
        key(k, GgufType::u32);
        put(v);
        return *this;
    }
    GgufBuilder& flag(std::string_view k, bool v) {
        key(k, GgufType::boolean);
        put<uint8_t>(v ? 1 : 0);
        return *this;
    }
    GgufBuilder& strs(std::string_view k, const std::vector<std::string>& v) {
        key(k, GgufType::array);
        put<uint32_t>(static_cast<uint32_t>(GgufType::string));
        put<uint64_t>(v.size());
        for (const auto& x : v) str(x);
        return *this;
    }
    GgufBuilder& f32s(std::string_view k, const std::vector<float>& v) {
        key(k, GgufType::array);
        put<uint32_t>(static_cast<uint32_t>(GgufType::f32));
        put<uint64_t>(v.size());
        for (float x : v) put(x);
        return *this;
    }
    std::string bytes() const {
        std::string out = "GGUF";
        auto put_to = [&](auto x) { out.append(reinterpret_cast<const char*>(&x), sizeof x); };
        put_to(uint32_t{3});
        put_to(uint64_t{0});
        put_to(n_kv);
        out += buf;
        out.resize((out.size() + 31) / 32 * 32, '\0');
        return out;
    }
};

Vocab vocab_from(const GgufBuilder& b) {
    std::string data = b.bytes();
    GgufFile f = GgufFile::parse(reinterpret_cast<const uint8_t*>(data.data()), data.size());
    return Vocab::from_gguf(f);
}

std::string what_of(const GgufBuilder& b) {
    try {
        vocab_from(b);
    } catch (const Error& e) {
        CHECK(e.code() == Exit::bad_model);
        return e.what();
    }
    return "(no error)";
}


// Every vector of one of the reference's test sets (base: the .gguf path):
// the ids exactly, and decoding them gives the text back. Returns how many
// vectors matched.
size_t check_test_set(const std::string& base) {
    auto inputs = read_inputs(base + ".inp");
    auto expected = read_outputs(base + ".out");
    CAPTURE(base);
    REQUIRE(inputs.size() == expected.size());
    REQUIRE(inputs.size() >= 40);
    const Tokenizer& t = tokenizer_for(base);
    size_t matched = 0;
    for (size_t i = 0; i < inputs.size(); i++) {
        CAPTURE(i);
        CAPTURE(inputs[i]);
        auto ids = t.encode(inputs[i], false, false);
        matched += ids == expected[i];
        CHECK(ids == expected[i]);
        // Round trip: SPM adds the leading space to non-empty text.
        std::string want = inputs[i];
        if (t.vocab().kind == Vocab::Kind::spm && !want.empty()) want = " " + want;
        CHECK(t.decode(ids) == want);
    }
    return matched;
}

} // namespace

TEST_CASE("tokenizer: reference test vectors") {
    for (const char* name : {"llama-spm", "phi-3", "gpt-2", "qwen35"}) {
        std::string base = k_shared + "/vocab/ggml-vocab-" + name + ".gguf";
        size_t n = check_test_set(base);
        MESSAGE(std::string(name) << ": " << n << "/" << read_inputs(base + ".inp").size()
                                  << " vectors match");
    }
}

// All 15 test sets of the reference engine's source (the llama-cpp-python
// 0.3.36 sdist, fetched into the model cache by scripts/fetch-real-models.sh):
// each is either exact on every vector, or refused when its vocabulary loads,
// with the reason in one line. Which is which is pinned here.
TEST_CASE("real: the reference engine's tokenizer test sets") {
    struct Set {
        const char* name;
        bool supported;
    };
    const Set sets[] = {
        {"bert-bge", false},      {"command-r", true}, {"deepseek-coder", false},
        {"deepseek-llm", true},   {"falcon", false},   {"gemma-4", true},
        {"gpt-2", true},          {"llama-bpe", true}, {"llama-spm", true},
        {"mpt", true},            {"phi-3", true},     {"qwen2", true},
        {"qwen35", true},         {"refact", true},    {"starcoder", true},
    };
    const std::string dir = kvtest::real_model("llama.cpp-vocab");
    if (!kvtest::have_real_model("llama.cpp-vocab/ggml-vocab-gemma-4.gguf")) return;
    for (const Set& s : sets) {
        const std::string base = dir + "/ggml-vocab-" + s.name + ".gguf";
        CAPTURE(base);
        std::string refused;
        try {
            GgufFile f = GgufFile::open(base);
            (void)Vocab::from_gguf(f);
        } catch (const Error& e) {
            refused = e.what();
        }
        if (!s.supported) {
            CHECK(!refused.empty());
            CHECK(refused.find('\n') == std::string::npos);
            MESSAGE(std::string(s.name) << ": refused (" << refused << ")");
            continue;
        }
        REQUIRE_MESSAGE(refused.empty(), refused);
        size_t n = check_test_set(base);
        MESSAGE(std::string(s.name) << ": " << n << "/" << read_inputs(base + ".inp").size()
                                    << " vectors match");
    }
}

// Gemma 4's BPE over UTF-8 characters, beyond its test set: <bos> always,
// spaces as U+2581, a run of line breaks one token, and characters the
// vocabulary lacks spelled in <0xNN> bytes that decode back.
TEST_CASE("real: Gemma 4 tokenizer") {
    const std::string path = kvtest::real_model("llama.cpp-vocab/ggml-vocab-gemma-4.gguf");
    if (!kvtest::have_real_model("llama.cpp-vocab/ggml-vocab-gemma-4.gguf")) return;
    const Tokenizer& t = tokenizer_for(path);
    CHECK(t.vocab().kind == Vocab::Kind::bpe_utf8);
    CHECK(t.vocab().add_bos);
    auto with_bos = t.encode("Hello", true, false);
    REQUIRE(with_bos.size() >= 2);
    CHECK(with_bos[0] == t.bos());
    CHECK(t.vocab().tokens[t.bos()] == "<bos>");

    auto nl = t.encode("a\n\n\nb", false, false);
    REQUIRE(nl.size() == 3);
    CHECK(t.vocab().tokens[nl[1]] == "\n\n\n");
    auto sp = t.encode(" x", false, false);
    REQUIRE(!sp.empty());
    CHECK(t.vocab().tokens[sp[0]].rfind("\xE2\x96\x81", 0) == 0); // starts with U+2581

    // A private-use character is in no vocabulary: four byte tokens.
    const std::string pua = "\xF3\xB0\x80\x81";
    auto bytes = t.encode(pua, false, false);
    REQUIRE(bytes.size() == 4);
    for (int32_t id : bytes) CHECK(t.vocab().attrs[id] == TokenAttr::byte);
    for (std::string text : {pua, std::string("  two  spaces\t\ttabs \n\n end "),
                             std::string("déjà vu 🦙 你好 \r\n")})
        CHECK(t.decode(t.encode(text, false, false)) == text);
    // Special tokens are parsed only when asked.
    auto turn = t.encode("<|turn>user", false, true);
    CHECK(t.vocab().tokens[turn[0]] == "<|turn>");
    CHECK(t.encode("<|turn>user", false, false).size() > turn.size());
}

TEST_CASE("tokenizer: golden prompt tokens") {
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(k_shared + "/golden"))
        if (e.path().extension() == ".json") files.push_back(e.path());
    std::sort(files.begin(), files.end());
    REQUIRE(files.size() >= 28);
    for (const fs::path& p : files) {
        CAPTURE(p.filename().string());
        auto j = nlohmann::json::parse(slurp(p.string()));
        std::string model = j.at("model").get<std::string>();
        std::string path = k_shared + "/models/" + model;
        if (!fs::exists(path)) path = k_shared + "/models/synthetic/" + model;
        REQUIRE(fs::exists(path));
        const Tokenizer& t = tokenizer_for(path);
        auto want = j.at("prompt_tokens").get<std::vector<int32_t>>();
        CHECK(t.encode(j.at("prompt").get<std::string>(), true, true) == want);
        // The reference printed its continuation piece by piece, invalid
        // bytes replaced: the same as a streamed decode.
        auto gen = j.at("gen_tokens").get<std::vector<int32_t>>();
        CHECK(t.decode(gen) == j.at("gen_text").get<std::string>());
    }
}

TEST_CASE("tokenizer: vocabulary metadata") {
    const Tokenizer& spm = vocab_tok("llama-spm");
    CHECK(spm.vocab().kind == Vocab::Kind::spm);
    CHECK(spm.n_vocab() == 32000);
    CHECK(spm.bos() == 1);
    CHECK(spm.eos() == 2);
    CHECK(spm.vocab().unk == 0);
    CHECK(spm.vocab().add_bos);
    CHECK(spm.vocab().add_space_prefix);
    CHECK(spm.is_eog(2));
    CHECK_FALSE(spm.is_eog(1));
    CHECK(spm.encode("Hello", true, false) == std::vector<int32_t>{1, 15043});
    CHECK(spm.encode("", true, false) == std::vector<int32_t>{1});
    CHECK(spm.encode("", false, false).empty());

    const Tokenizer& gpt2 = vocab_tok("gpt-2");
    CHECK(gpt2.vocab().kind == Vocab::Kind::bpe);
    CHECK(gpt2.vocab().pre == "gpt-2");
    CHECK(gpt2.n_vocab() == 50257);
    CHECK_FALSE(gpt2.vocab().add_bos);
    CHECK_FALSE(gpt2.vocab().add_space_prefix);
    CHECK(gpt2.is_eog(50256));
    CHECK(gpt2.encode("Hello world", true, false) == std::vector<int32_t>{15496, 995});

    // phi-3 names no end-of-turn token: found by its text.
    const Tokenizer& phi3 = vocab_tok("phi-3");
    CHECK(phi3.eos() == 32000);
    CHECK(phi3.vocab().eot == ids_of(phi3, {"<|end|>"})[0]);
    CHECK(phi3.is_eog(phi3.vocab().eot));
    CHECK(phi3.is_eog(32000));
}

TEST_CASE("tokenizer: special tokens in text") {
    const Tokenizer& spm = vocab_tok("llama-spm");
    // Parsed: <s> is BOS, and the text after it starts a new run (leading space).
    CHECK(spm.encode("<s>Hello</s>", false, true) == std::vector<int32_t>{1, 15043, 2});
    // Not parsed: plain text, never a control token.
    auto plain = spm.encode("<s>Hello</s>", false, false);
    CHECK(std::find(plain.begin(), plain.end(), 1) == plain.end());
    CHECK(std::find(plain.begin(), plain.end(), 2) == plain.end());
    CHECK(spm.decode(plain) == " <s>Hello</s>");
    CHECK(spm.piece(1) == "");
    CHECK(spm.piece(1, true) == "<s>");
    CHECK(spm.piece(0) == ""); // <unk>
    CHECK(spm.piece(0, true) == "<unk>");

    const Tokenizer& gpt2 = vocab_tok("gpt-2");
    auto ids = gpt2.encode("Hi<|endoftext|>there", false, true);
    CHECK(ids == std::vector<int32_t>{17250, 50256, 8117});
    CHECK(gpt2.decode(ids) == "Hithere");
    CHECK(gpt2.piece(50256, true) == "<|endoftext|>");
    auto ids2 = gpt2.encode("Hi<|endoftext|>there", false, false);
    CHECK(std::find(ids2.begin(), ids2.end(), 50256) == ids2.end());
    CHECK(gpt2.decode(ids2) == "Hi<|endoftext|>there");

    // phi-3's user-defined "</s>" is split out even without parse_special.
    const Tokenizer& phi3 = vocab_tok("phi-3");
    auto p = phi3.encode("a</s>b", false, false);
    CHECK(std::find(p.begin(), p.end(), 2) != p.end());
    CHECK(phi3.piece(2) == "</s>");
}

TEST_CASE("tokenizer: pieces and streamed decoding") {
    const Tokenizer& spm = vocab_tok("llama-spm");
    CHECK(spm.piece(15043) == " Hello"); // U+2581 -> space, leading space kept
    CHECK(spm.piece(13) == "\n");        // <0x0A>
    CHECK(spm.piece(-1) == "");
    CHECK(spm.piece(spm.n_vocab()) == "");

    // A 4-byte character spelled in byte-fallback tokens comes out whole,
    // and only once it is complete.
    auto llama = ids_of(spm, {"<0xF0>", "<0x9F>", "<0xA6>", "<0x99>"});
    Tokenizer::Decoder d(spm);
    CHECK(d.push(llama[0]) == "");
    CHECK(d.push(llama[1]) == "");
    CHECK(d.push(llama[2]) == "");
    CHECK(d.push(llama[3]) == "\xF0\x9F\xA6\x99");
    CHECK(d.flush() == "");
    CHECK(spm.decode(spm.encode("🦙", false, false)) == " 🦙");

    const std::string fffd = "\xEF\xBF\xBD";
    auto b = [&](const char* t) { return ids_of(spm, {t})[0]; };
    // A stray continuation byte or 0xFF is invalid at once.
    CHECK(spm.decode({b("<0x80>")}) == fffd);
    CHECK(spm.decode({b("<0xFF>"), b("<0x41>")}) == fffd + "A");
    // A lead byte followed by a non-continuation: one U+FFFD, then the rest.
    Tokenizer::Decoder d2(spm);
    CHECK(d2.push(b("<0xE2>")) == "");
    CHECK(d2.push(b("<0x82>")) == "");
    CHECK(d2.push(ids_of(spm, {"▁Hello"})[0]) == fffd + " Hello");
    // An incomplete character at the end is flushed as U+FFFD.
    Tokenizer::Decoder d3(spm);
    CHECK(d3.push(b("<0xF0>")) == "");
    CHECK(d3.flush() == fffd);
    CHECK(d3.flush() == "");
    // Overlong and surrogate encodings are invalid.
    CHECK(spm.decode({b("<0xC0>"), b("<0xAF>")}) == fffd + fffd);
    CHECK(spm.decode({b("<0xED>"), b("<0xA0>"), b("<0x80>")}) == fffd + fffd + fffd);

    // BPE: byte-level characters decode to bytes; a character split across
    // tokens is held back the same way.
    const Tokenizer& gpt2 = vocab_tok("gpt-2");
    auto ids = gpt2.encode("🦙 llama", false, false);
    Tokenizer::Decoder d4(gpt2);
    std::string streamed;
    for (int32_t id : ids) {
        std::string out = d4.push(id);
        CHECK(unicode::valid_seq_len(out + "x", 0) != 0); // never a broken prefix
        streamed += out;
    }
    streamed += d4.flush();
    CHECK(streamed == "🦙 llama");
    CHECK(gpt2.piece(220) == " ");
    CHECK(gpt2.piece(198) == "\n");
}

TEST_CASE("tokenizer: round trips") {
    const Tokenizer& spm = vocab_tok("llama-spm");
    const Tokenizer& phi3 = vocab_tok("phi-3");
    const Tokenizer& gpt2 = vocab_tok("gpt-2");
    const char* texts[] = {
        "Hello, world!",
        "  leading and trailing spaces  ",
        "tabs\tand\nnewlines\r\n\n",
        "Привет, мир! 你好，世界。 🦙 café naïve — “quotes”",
        "mixed 123 numbers 4567890 and symbols !@#$%^&*()",
        "\xF0\x9F\x98\x80\xE2\x80\x8D\xF0\x9F\x91\x8D combined emoji",
        "a\x01\x02\x7f control bytes",
    };
    for (const char* s : texts) {
        CAPTURE(s);
        CHECK(spm.decode(spm.encode(s, false, false)) == std::string(" ") + s);
        CHECK(phi3.decode(phi3.encode(s, false, false)) == std::string(" ") + s);
        CHECK(gpt2.decode(gpt2.encode(s, false, false)) == s);
    }
    // With BOS: the BOS piece is empty, the text keeps its leading space.
    auto ids = spm.encode("Once upon a time", true, true);
    REQUIRE(ids.size() > 1);
    CHECK(ids[0] == 1);
    CHECK(spm.decode(ids) == " Once upon a time");
    // Invalid UTF-8 survives byte-level BPE bytes-exactly (decode replaces it).
    std::string bad = "ok\xFF\xC3(";
    auto bad_ids = gpt2.encode(bad, false, false);
    std::string bytes;
    for (int32_t id : bad_ids) bytes += gpt2.piece(id);
    CHECK(bytes == bad);
    CHECK(gpt2.decode(bad_ids) == "ok\xEF\xBF\xBD\xEF\xBF\xBD(");
    std::string spm_bytes;
    for (int32_t id : spm.encode(bad, false, false)) spm_bytes += spm.piece(id);
    CHECK(spm_bytes == " " + bad);
    // An invalid lead byte must not swallow the U+2581 of a following space.
    std::string bad2 = "\xF4= x";
    spm_bytes.clear();
    for (int32_t id : spm.encode(bad2, false, false)) spm_bytes += spm.piece(id);
    CHECK(spm_bytes == " " + bad2);
}

TEST_CASE("tokenizer: GPT-2 pre-tokenizer") {
    using unicode::PreSplit;
    using V = std::vector<std::string>;
    CHECK(split(PreSplit::gpt2, "Hello world") == V{"Hello", " world"});
    CHECK(split(PreSplit::gpt2, "I'm can't we'll they've") ==
          V{"I", "'m", " can", "'t", " we", "'ll", " they", "'ve"});
    CHECK(split(PreSplit::gpt2, "I'M") == V{"I", "'", "M"}); // case-sensitive
    CHECK(split(PreSplit::gpt2, "12345 abc") == V{"12345", " abc"});
    CHECK(split(PreSplit::gpt2, "a  b") == V{"a", " ", " b"});
    CHECK(split(PreSplit::gpt2, "a \n\n b") == V{"a", " \n\n", " b"});
    CHECK(split(PreSplit::gpt2, "a   ") == V{"a", "   "});
    CHECK(split(PreSplit::gpt2, "  x") == V{" ", " x"});
    CHECK(split(PreSplit::gpt2, "你好世界 你好") == V{"你好世界", " 你好"});
    CHECK(split(PreSplit::gpt2, "🦙🦙 x") == V{"🦙🦙", " x"});
    CHECK(split(PreSplit::gpt2, "hello!!! ok?") == V{"hello", "!!!", " ok", "?"});
    CHECK(split(PreSplit::gpt2, "x\ty") == V{"x", "\t", "y"});
    CHECK(split(PreSplit::gpt2, "naïve café") == V{"naïve", " café"});
    CHECK(split(PreSplit::gpt2, "a\xFF"
                                "b") == V{"a", "\xFF", "b"}); // raw bytes kept
    CHECK(split(PreSplit::gpt2, "") == V{});
}

TEST_CASE("tokenizer: Llama 3 / Qwen2 / SmolLM / DeepSeek pre-tokenizers") {
    using unicode::PreSplit;
    using V = std::vector<std::string>;
    CHECK(split(PreSplit::llama3, "I'M HERE") == V{"I", "'M", " HERE"}); // case-insensitive
    CHECK(split(PreSplit::llama3, "we'LL") == V{"we", "'LL"});
    CHECK(split(PreSplit::llama3, "1234567") == V{"123", "456", "7"});
    CHECK(split(PreSplit::llama3, "abc123def") == V{"abc", "123", "def"});
    CHECK(split(PreSplit::llama3, "$hello \thi") == V{"$hello", " ", "\thi"});
    CHECK(split(PreSplit::llama3, "hello\n\nworld") == V{"hello", "\n\n", "world"});
    CHECK(split(PreSplit::llama3, "a  \n  b") == V{"a", "  \n", " ", " b"});
    CHECK(split(PreSplit::llama3, "end...\n\nx") == V{"end", "...\n\n", "x"});
    CHECK(split(PreSplit::llama3, "  hi") == V{" ", " hi"});
    CHECK(split(PreSplit::llama3, "🦙hi 你好") == V{"🦙hi", " 你好"});
    CHECK(split(PreSplit::llama3, "x   ") == V{"x", "   "});
    CHECK(split(PreSplit::llama3, "3.14") == V{"3", ".", "14"});

    CHECK(split(PreSplit::qwen2, "1234 ab") == V{"1", "2", "3", "4", " ab"});
    CHECK(split(PreSplit::qwen2, "it's") == V{"it", "'s"});
    // Qwen 3.5: a combining mark stays on its word (Qwen2 makes it a piece of
    // its own, as punctuation), and a mark alone is a word, not punctuation.
    CHECK(split(PreSplit::qwen2, "cafe\u0301 x") == V{"cafe", "\u0301", " x"});
    CHECK(split(PreSplit::qwen35, "cafe\u0301 x") == V{"cafe\u0301", " x"});
    CHECK(split(PreSplit::qwen35, "\u0301\u0302!") == V{"\u0301\u0302", "!"});
    CHECK(split(PreSplit::qwen35, "1234 ab") == V{"1", "2", "3", "4", " ab"});

    CHECK(split(PreSplit::smollm, "abc 123") == V{"abc", " ", "1", "2", "3"});
    CHECK(split(PreSplit::smollm, "x42y") == V{"x", "4", "2", "y"});

    CHECK(split(PreSplit::deepseek_llm, "Hello, 世界 123\n") ==
          V{"Hello", ",", " ", "世界", " ", "123", "\n"});
    CHECK(split(PreSplit::deepseek_llm, "ab  ") == V{"ab", "  "});

    // gpt-4o (Phi-4-mini): cased words, contractions kept on them, digits in
    // threes, punctuation runs taking trailing line breaks and slashes. No
    // reference vectors are in ../shared: these follow the reference
    // engine's regex by hand, including its stand-in classes (a non-ASCII
    // letter counts as both upper and lower case, hence "É" alone below).
    CHECK(split(PreSplit::gpt4o, "Hello world") == V{"Hello", " world"});
    CHECK(split(PreSplit::gpt4o, "HELLO world") == V{"HELLO", " world"});
    CHECK(split(PreSplit::gpt4o, "helloWorld HTTPServer") == V{"hello", "World", " HTTPServer"});
    CHECK(split(PreSplit::gpt4o, "I'M HERE, don't we'LL") ==
          V{"I'M", " HERE", ",", " don't", " we'LL"});
    CHECK(split(PreSplit::gpt4o, "1234567") == V{"123", "456", "7"});
    CHECK(split(PreSplit::gpt4o, "3.14") == V{"3", ".", "14"});
    CHECK(split(PreSplit::gpt4o, "a/b\n\n") == V{"a", "/b", "\n\n"});
    CHECK(split(PreSplit::gpt4o, "x!!!/\ny") == V{"x", "!!!/\n", "y"});
    CHECK(split(PreSplit::gpt4o, "  hi\nabc") == V{" ", " hi", "\n", "abc"});
    CHECK(split(PreSplit::gpt4o, "ÉCOLE école") == V{"É", "COLE", " école"});

    // Every splitter covers its input exactly, whatever the bytes.
    std::string messy = "Ab'c 12 345\r\n\t \xE2\x80\x83x\xFF\xC3 🦙é\u3000。. ";
    for (PreSplit k : {PreSplit::gpt2, PreSplit::llama3, PreSplit::qwen2, PreSplit::smollm,
                       PreSplit::deepseek_llm, PreSplit::gpt4o}) {
        std::string joined;
        for (const auto& p : split(k, messy)) {
            CHECK_FALSE(p.empty());
            joined += p;
        }
        CHECK(joined == messy);
    }

    CHECK(unicode::pre_split_from_name("llama-bpe") == PreSplit::llama3);
    CHECK(unicode::pre_split_from_name("gpt-4o") == PreSplit::gpt4o);
    CHECK(unicode::pre_split_from_name("default") == PreSplit::gpt2);
    CHECK_FALSE(unicode::pre_split_from_name("no-such-pre"));
}

TEST_CASE("tokenizer: byte-level table") {
    for (int b = 0; b < 256; b++) CHECK(unicode::cp_to_byte(unicode::byte_to_cp(uint8_t(b))) == b);
    CHECK(unicode::byte_to_cp(' ') == 0x120);  // "Ġ"
    CHECK(unicode::byte_to_cp('\n') == 0x10A); // "Ċ"
    CHECK(unicode::byte_to_cp('A') == 'A');
    CHECK(unicode::cp_to_byte(0x2581) == -1);
}

TEST_CASE("tokenizer: vocabulary validation") {
    auto base = [](const char* model) {
        GgufBuilder b;
        b.s("tokenizer.ggml.model", model)
            .strs("tokenizer.ggml.tokens", {"<unk>", "<s>", "</s>", "a"});
        return b;
    };
    CHECK(what_of(base("bert")).find("unsupported tokenizer model 'bert'") != std::string::npos);
    CHECK(
        what_of(GgufBuilder().strs("tokenizer.ggml.tokens", {"a"})).find("tokenizer.ggml.model") !=
        std::string::npos);
    CHECK(what_of(base("llama").f32s("tokenizer.ggml.scores", {0, 0}))
              .find("2 scores for 4 tokens") != std::string::npos);
    CHECK(what_of(base("llama").u32("tokenizer.ggml.bos_token_id", 7)).find("out of range") !=
          std::string::npos);
    CHECK(what_of(base("gpt2")).find("tokenizer.ggml.merges") != std::string::npos);
    CHECK(what_of(base("gpt2").strs("tokenizer.ggml.merges", {"ab"})).find("merge 0") !=
          std::string::npos);
    CHECK(what_of(base("gpt2").strs("tokenizer.ggml.merges", {}).s("tokenizer.ggml.pre", "weird"))
              .find("pre-tokenizer 'weird'") != std::string::npos);

    // "none" written as all-ones is -1, not an error; SPM defaults apply.
    Vocab v = vocab_from(base("llama").u32("tokenizer.ggml.padding_token_id", 0xFFFFFFFFu));
    CHECK(v.pad == -1);
    CHECK(v.bos == 1);
    CHECK(v.eos == 2);
    CHECK(v.unk == 0);
    CHECK(v.add_bos);
    CHECK(v.add_space_prefix);
    CHECK(v.scores.empty());
    CHECK(v.attrs.size() == 4);

    // A tiny BPE vocabulary: merges applied by rank within each pre-token.
    Vocab b = vocab_from(GgufBuilder()
                             .s("tokenizer.ggml.model", "gpt2")
                             .strs("tokenizer.ggml.tokens", {"a", "b", "ab", "abab", "Ġ", "Ġab"})
                             .strs("tokenizer.ggml.merges", {"a b", "ab ab", "Ġ ab"}));
    CHECK_FALSE(b.add_bos);
    CHECK(b.bos == -1);
    Tokenizer t(std::move(b));
    CHECK(t.encode("abab", true, true) == std::vector<int32_t>{3});
    CHECK(t.encode("ab ab", true, true) == std::vector<int32_t>{2, 5});
    CHECK(t.encode("aba", true, true) == std::vector<int32_t>{2, 0});
    CHECK(t.decode({2, 5}) == "ab ab");

    // Llama 3 family: BOS by default, and a pre-token that is a whole token
    // is used as is, merges or not; EOS appended when the vocabulary says so.
    auto llama3 = [](const char* pre) {
        return GgufBuilder()
            .s("tokenizer.ggml.model", "gpt2")
            .s("tokenizer.ggml.pre", pre)
            .strs("tokenizer.ggml.tokens", {"a", "b", "c", "abc", "<s>", "</s>"})
            .strs("tokenizer.ggml.merges", {})
            .u32("tokenizer.ggml.bos_token_id", 4)
            .u32("tokenizer.ggml.eos_token_id", 5);
    };
    Tokenizer l3(vocab_from(llama3("llama-bpe")));
    CHECK(l3.vocab().add_bos);
    CHECK(l3.encode("abc", true, false) == std::vector<int32_t>{4, 3});
    CHECK(l3.encode("abc", false, false) == std::vector<int32_t>{3});
    Tokenizer g2(vocab_from(llama3("gpt-2").flag("tokenizer.ggml.add_eos_token", true)));
    CHECK_FALSE(g2.vocab().add_bos);
    CHECK(g2.encode("abc", true, false) == std::vector<int32_t>{0, 1, 2, 5});
    CHECK(g2.encode("abc", false, false) == std::vector<int32_t>{0, 1, 2});
}

TEST_CASE("tokenizer: speed on 10k words") {
    std::string text = slurp(k_shared + "/text/stories260K-samples.txt");
    REQUIRE(text.size() > 50000);
    for (const char* name : {"llama-spm", "gpt-2"}) {
        const Tokenizer& t = vocab_tok(name);
        auto t0 = std::chrono::steady_clock::now();
        auto ids = t.encode(text, true, true);
        double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                        .count();
        MESSAGE(std::string(name) << ": " << text.size() << " bytes -> " << ids.size()
                                  << " tokens in " << ms << " ms");
        CHECK(ms < 2000); // generous: sanitizer builds; a release build takes milliseconds
        std::string back = t.decode(ids);
        CHECK(back == (t.vocab().kind == Vocab::Kind::spm ? " " + text : text));
    }
}
