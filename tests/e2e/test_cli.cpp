// End-to-end tests of the kvrun binary: greedy stories260K output against the
// reference golden (decoded here from the golden's token ids with the model's
// own piece table, independently of kvrun's tokenizer), prompt sources,
// tokenize / logits / info output, exit statuses and one-line errors, seeds,
// and generation far past a small context window.
#include <doctest/doctest.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "gguf.h"
#include "test_util.h"

using nlohmann::json;
namespace fs = std::filesystem;

namespace {

const std::string kStories = kvtest::shared("models/stories260K.gguf");
const std::string kPrompt = "Once upon a time";

json golden(const std::string& name) {
    std::ifstream f(kvtest::shared("golden/" + name + ".json"));
    REQUIRE_MESSAGE(f, "cannot read golden " << name);
    return json::parse(f);
}

bool starts_with(const std::string& s, const std::string& p) {
    return s.rfind(p, 0) == 0;
}
bool contains(const std::string& s, const std::string& n) {
    return s.find(n) != std::string::npos;
}

// Decode SentencePiece ids with the vocabulary's piece strings: U+2581 is a
// space, <0xXX> is one byte. No leading-space handling: the golden text of a
// continuation keeps its spaces.
std::string spm_decode(const std::string& model, const std::vector<int>& ids) {
    kvrun::GgufFile f = kvrun::GgufFile::open(model);
    const auto& pieces = f.need_array("tokenizer.ggml.tokens", kvrun::GgufType::string).strs;
    std::string out;
    for (int id : ids) {
        REQUIRE(id >= 0);
        REQUIRE(static_cast<size_t>(id) < pieces.size());
        const std::string_view p = pieces[id];
        if (p.size() == 6 && p.substr(0, 3) == "<0x" && p[5] == '>') {
            out += static_cast<char>(std::stoi(std::string(p.substr(3, 2)), nullptr, 16));
            continue;
        }
        for (size_t i = 0; i < p.size();) {
            if (p.compare(i, 3, "\xe2\x96\x81") == 0) {
                out += ' ';
                i += 3;
            } else {
                out += p[i++];
            }
        }
    }
    return out;
}

// The first n greedy tokens of the stories260K "story" golden, as text.
std::string golden_story_text(size_t n) {
    const json g = golden("stories260K__story");
    std::vector<int> ids = g["gen_tokens"].get<std::vector<int>>();
    REQUIRE(ids.size() >= n);
    ids.resize(n);
    return spm_decode(kStories, ids);
}

// A temporary directory, removed with everything in it.
struct TempDir {
    fs::path path;
    TempDir() {
        std::string t = (fs::temp_directory_path() / "kvrun_cli_XXXXXX").string();
        REQUIRE(mkdtemp(t.data()) != nullptr);
        path = t;
    }
    ~TempDir() {
        std::error_code ec;
        fs::remove_all(path, ec);
    }
    std::string file(const std::string& name, const std::string& bytes) const {
        const std::string p = (path / name).string();
        std::ofstream f(p, std::ios::binary);
        f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
        return p;
    }
};

std::string slurp(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    REQUIRE_MESSAGE(f, "cannot read " << path);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

std::string describe(const kvtest::RunResult& r) {
    return "status " + std::to_string(r.status) + "\n--- stdout:\n" + r.out.substr(0, 2000) +
           "\n--- stderr:\n" + r.err.substr(0, 2000);
}

// A usage error: status 2, nothing on stdout, one short "kvrun: error:"
// line (parse errors included).
void expect_usage_error(const kvtest::RunResult& r) {
    INFO(describe(r));
    CHECK(r.status == 2);
    CHECK(r.out.empty());
    const auto lines = kvtest::lines(r.err);
    CHECK(lines.size() == 1);
    CHECK(r.err.size() < 400);
    if (!lines.empty()) CHECK(starts_with(lines[0], "kvrun: error:"));
}

// An error with one line on stderr starting "kvrun: error:", and nothing on stdout.
std::string expect_error_line(const kvtest::RunResult& r, int status) {
    INFO(describe(r));
    CHECK(r.status == status);
    CHECK(r.out.empty());
    const auto lines = kvtest::lines(r.err);
    REQUIRE(lines.size() == 1);
    CHECK(starts_with(lines[0], "kvrun: error:"));
    CHECK(r.err.back() == '\n');
    return lines[0];
}

// All the decimal numbers in s.
std::set<long long> numbers_in(const std::string& s) {
    std::set<long long> out;
    for (size_t i = 0; i < s.size();) {
        if (std::isdigit(static_cast<unsigned char>(s[i]))) {
            size_t j = i;
            while (j < s.size() && std::isdigit(static_cast<unsigned char>(s[j]))) j++;
            out.insert(std::stoll(s.substr(i, j - i)));
            i = j;
        } else {
            i++;
        }
    }
    return out;
}

kvtest::RunResult run(const std::vector<std::string>& args, const std::string* input = nullptr) {
    return kvtest::run_kvrun(args, input);
}

// The same with one thread, for the longer runs: on a busy 2-core machine the
// worker pool's spin-then-yield waits compete with this process reading the
// child's pipes, and a 256-token run can take 10+ s instead of 0.1 s.
// Threading is covered by the forward tests; the output must not depend on the
// thread count (checked below).
kvtest::RunResult run_1t(std::vector<std::string> args) {
    args.insert(args.end(), {"-t", "1"});
    return kvtest::run_kvrun(args);
}

// `kvrun bench ARGS --json`, which must succeed: its rows.
json bench_json(std::vector<std::string> args) {
    args.insert(args.begin(), "bench");
    args.push_back("--json");
    const auto r = run(args);
    INFO(describe(r));
    REQUIRE(r.status == 0);
    return json::parse(r.out);
}

} // namespace

TEST_CASE("cli: greedy stories260K continuation equals the golden text") {
    const json g = golden("stories260K__story");
    REQUIRE(g["prompt"] == kPrompt);
    const std::string gen_text = g["gen_text"].get<std::string>();
    const std::string expected = golden_story_text(100);
    // The independent decoding agrees with the golden's own text.
    REQUIRE(starts_with(gen_text, expected));
    REQUIRE(expected.size() < gen_text.size());
    REQUIRE(golden_story_text(200) == gen_text);

    const auto r = run({"-m", kStories, "-p", kPrompt, "-n", "100", "--temp", "0", "--quiet"});
    INFO(describe(r));
    CHECK(r.status == 0);
    CHECK(r.out == expected);
    CHECK(starts_with(r.out, ", there was a little girl named Lily."));
    CHECK(starts_with(gen_text, r.out));
    CHECK(r.err.empty()); // --quiet: no stats

    // Without --quiet the stats line goes to stderr only; stdout is unchanged.
    // (One thread here: the text must not depend on the thread count.)
    const auto s = run_1t({"-m", kStories, "-p", kPrompt, "-n", "100", "--temp", "0"});
    INFO(describe(s));
    CHECK(s.status == 0);
    CHECK(s.out == expected);
    CHECK(contains(s.err, "[kvrun]"));
    CHECK(contains(s.err, "generated 100 tok"));
    CHECK(!contains(s.out, "[kvrun]"));
    CHECK(!contains(s.err, "little girl")); // no generated text on stderr

    // The same with the weights moved onto huge pages (forced: this model is
    // below the size where kvrun moves them by itself) and with them kept in
    // the file mapping.
    for (const char* mode : {"1", "0"}) {
        setenv("KVRUN_HUGEPAGES", mode, 1);
        const auto h = run({"-m", kStories, "-p", kPrompt, "-n", "100", "--temp", "0", "-v"});
        unsetenv("KVRUN_HUGEPAGES");
        INFO(mode, describe(h));
        CHECK(h.status == 0);
        CHECK(h.out == expected);
        CHECK(contains(h.err, *mode == '1' ? "moved onto huge pages" : "in the file mapping"));
    }
}

TEST_CASE("cli: --echo, -f FILE and -f - give the same continuation as -p") {
    const std::string expected = golden_story_text(20);
    const std::vector<std::string> common = {"-m", kStories, "-n", "20", "--temp", "0", "--quiet"};
    auto with = [&](std::vector<std::string> extra, const std::string* input = nullptr) {
        std::vector<std::string> a = common;
        a.insert(a.end(), extra.begin(), extra.end());
        a.insert(a.end(), {"-t", "1"});
        return run(a, input);
    };
    const auto p = with({"-p", kPrompt});
    INFO(describe(p));
    REQUIRE(p.status == 0);
    CHECK(p.out == expected);

    const auto echo = with({"-p", kPrompt, "--echo"});
    CHECK(echo.status == 0);
    CHECK(echo.out == kPrompt + expected);

    TempDir dir;
    const std::string file = dir.file("prompt.txt", kPrompt); // no trailing newline
    const auto f = with({"-f", file});
    INFO(describe(f));
    CHECK(f.status == 0);
    CHECK(f.out == p.out);

    const auto in = with({"-f", "-"}, &kPrompt);
    INFO(describe(in));
    CHECK(in.status == 0);
    CHECK(in.out == p.out);

    const auto fe = with({"-f", file, "--echo"});
    CHECK(fe.out == echo.out);

    // A different prompt gives a different continuation (the file is really read).
    const std::string other = "The dog";
    const auto o = with({"-f", "-"}, &other);
    CHECK(o.status == 0);
    CHECK(o.out != p.out);
}

TEST_CASE("cli: tokenize --json equals the goldens' prompt tokens") {
    for (const char* name :
         {"stories260K__story", "stories260K__ascii", "stories260K__unicode", "stories260K__long",
          "tiny-f16__unicode", "tiny-qwen2-Q8_0__ascii", "tiny-qwen2-Q8_0__unicode"}) {
        CAPTURE(name);
        const json g = golden(name);
        std::string model = g["model"].get<std::string>();
        model = kvtest::shared(starts_with(model, "tiny-") ? "models/synthetic/" + model
                                                           : "models/" + model);
        const auto r =
            run({"tokenize", "-m", model, "-p", g["prompt"].get<std::string>(), "--json"});
        INFO(describe(r));
        REQUIRE(r.status == 0);
        CHECK(kvtest::lines(r.out).size() == 1);
        const json ids = json::parse(r.out);
        REQUIRE(ids.is_array());
        CHECK(ids == g["prompt_tokens"]);
    }
}

TEST_CASE("cli: logits --top-k 3 gives one row per token, matching the golden") {
    const json g = golden("stories260K__story");
    const std::vector<int> ids = g["prompt_tokens"].get<std::vector<int>>();
    std::string list;
    for (int id : ids) {
        if (!list.empty()) list += ',';
        list += std::to_string(id);
    }
    const auto r = run({"logits", "-m", kStories, "--tokens", list, "--top-k", "3"});
    INFO(describe(r));
    REQUIRE(r.status == 0);
    const json rows = json::parse(r.out);
    REQUIRE(rows.is_array());
    REQUIRE(rows.size() == ids.size());
    for (size_t i = 0; i < rows.size(); i++) {
        CAPTURE(i);
        const json& row = rows[i];
        const json& ref = g["prompt_logits"][i];
        REQUIRE(row.contains("lse"));
        REQUIRE(row["lse"].is_number());
        CHECK(std::abs(row["lse"].get<double>() - ref["lse"].get<double>()) < 0.1);
        REQUIRE(row.contains("top"));
        REQUIRE(row["top"].size() == 3);
        for (size_t k = 0; k < 3; k++) {
            const json& pair = row["top"][k];
            REQUIRE(pair.size() == 2);
            CHECK(pair[0].get<int>() == ref["top"][k][0].get<int>());
            CHECK(std::abs(pair[1].get<double>() - ref["top"][k][1].get<double>()) < 0.1);
            if (k) CHECK(pair[1].get<double>() <= row["top"][k - 1][1].get<double>());
            CHECK(pair[1].get<double>() <= row["lse"].get<double>());
        }
    }
}

TEST_CASE("cli: info prints the architecture and the KV bytes per token from the metadata") {
    for (const char* rel : {"models/stories260K.gguf", "models/synthetic/tiny-f16.gguf",
                            "models/synthetic/tiny-qwen2-Q8_0.gguf"}) {
        CAPTURE(rel);
        const std::string model = kvtest::shared(rel);
        uint64_t n_layer, n_head, n_kv, head_dim;
        std::string arch;
        {
            kvrun::GgufFile f = kvrun::GgufFile::open(model);
            arch = std::string(f.need_str("general.architecture"));
            n_layer = f.need_u64(arch + ".block_count");
            n_head = f.need_u64(arch + ".attention.head_count");
            n_kv = f.get_u64(arch + ".attention.head_count_kv").value_or(n_head);
            head_dim = f.get_u64(arch + ".attention.key_length")
                           .value_or(f.need_u64(arch + ".embedding_length") / n_head);
        }
        const uint64_t per_token_f16 = 2 * n_layer * n_kv * head_dim * 2; // K and V, 2 bytes each

        const auto t = run({"info", "-m", model});
        INFO(describe(t));
        REQUIRE(t.status == 0);
        CHECK(contains(t.out, arch));
        std::string kv_line;
        for (const std::string& l : kvtest::lines(t.out))
            if (contains(l, "KV per token")) kv_line = l;
        REQUIRE(!kv_line.empty());
        if (per_token_f16 < 1024) CHECK(contains(kv_line, std::to_string(per_token_f16) + " B"));
        CHECK(numbers_in(kv_line).count(static_cast<long long>(n_layer)));
        CHECK(numbers_in(kv_line).count(static_cast<long long>(head_dim)));

        const auto j = run({"info", "-m", model, "--json"});
        INFO(describe(j));
        REQUIRE(j.status == 0);
        json info;
        REQUIRE_NOTHROW(info = json::parse(j.out));
        CHECK(info["architecture"] == arch);
        CHECK(info["n_layer"] == n_layer);
        CHECK(info["n_head_kv"] == n_kv);
        CHECK(info["head_dim"] == head_dim);
        CHECK(info["file_bytes"] == fs::file_size(model));
        CHECK(info["kv"]["bytes_per_token"] == per_token_f16);
        CHECK(info["kv"]["bytes"] == per_token_f16 * info["kv"]["n_ctx"].get<uint64_t>());

        const auto f32 =
            run({"info", "-m", model, "--json", "--ctk", "f32", "--ctv", "f32", "-c", "100"});
        REQUIRE(f32.status == 0);
        const json i32 = json::parse(f32.out);
        CHECK(i32["kv"]["bytes_per_token"] == 2 * per_token_f16);
        CHECK(i32["kv"]["bytes"] == 200 * per_token_f16);
    }
}

TEST_CASE("cli: info on files kvrun cannot run prints what the header says, then why (exit 3); "
          "-c auto and --ctk auto tell what a run would pick") {
    for (const char* rel : {"vocab/ggml-vocab-gpt-2.gguf", "vocab/ggml-vocab-llama-spm.gguf"}) {
        CAPTURE(rel);
        const std::string path = kvtest::shared(rel);
        kvrun::GgufFile f = kvrun::GgufFile::open(path);
        const std::string arch(f.need_str("general.architecture"));
        const std::string name(f.get_str("general.name").value_or(""));
        const auto t = run({"info", "-m", path});
        INFO(describe(t));
        CHECK(t.status == 3);
        CHECK(contains(t.out, "architecture: " + arch));
        if (!name.empty()) CHECK(contains(t.out, "name:         " + name));
        CHECK(contains(t.out, "tokens"));
        CHECK(contains(t.out, "runnable:     no ("));
        const auto j = run({"info", "-m", path, "--json"});
        CHECK(j.status == 3);
        const json info = json::parse(j.out);
        CHECK(info["runnable"] == false);
        CHECK(info["architecture"] == arch);
        CHECK(info["n_vocab"].get<uint64_t>() == f.find("tokenizer.ggml.tokens")->count);
        CHECK(!info["why"].get<std::string>().empty());
    }
    CHECK(contains(run({"info", "-m", kvtest::shared("vocab/ggml-vocab-gpt-2.gguf")}).out,
                   "architecture 'gpt2' is not supported"));
    // A runnable file: its name, parameters, file type and chat template.
    const std::string tiny = kvtest::shared("models/synthetic/tiny-Q8_0.gguf");
    const json t = json::parse(run({"info", "-m", tiny, "--json"}).out);
    uint64_t params = 0;
    const kvrun::GgufFile tiny_file = kvrun::GgufFile::open(tiny);
    for (const auto& tensor : tiny_file.tensors())
        params += static_cast<uint64_t>(tensor.n_elements());
    CHECK(t["params"] == params);
    CHECK(!t["file_type"].get<std::string>().empty());
    CHECK(contains(t["chat_template"].get<std::string>(), "template"));
    // -c auto: kvrun chat's context (the model's, at most 4096).
    const json a = json::parse(run({"info", "-m", tiny, "--json", "-c", "auto"}).out);
    CHECK(a["kv"]["n_ctx"] == std::min<int64_t>(t["n_ctx_train"].get<int64_t>(), 4096));
    CHECK(a["kv"]["auto"] == true);
    // --ctk auto --ctv auto: what fits now; in 30 MB, smaller types than f16.
    const auto roomy =
        run({"info", "-m", tiny, "--json", "-c", "2048", "--ctk", "auto", "--ctv", "auto"});
    REQUIRE(roomy.status == 0);
    CHECK(json::parse(roomy.out)["kv"]["type_k"] == "f16");
    const auto tight = kvtest::run_binary(
        "/usr/bin/env", {"KVRUN_MEM_AVAILABLE=30000000", KVRUN_BINARY, "info", "-m", tiny, "-c",
                         "2048", "--ctk", "auto", "--ctv", "auto", "--json"});
    REQUIRE(tight.status == 0);
    const json tj = json::parse(tight.out);
    CHECK(tj["kv"]["types_auto"] == true);
    CHECK(tj["kv"]["type_v"] != "f16");
    const auto bad = run({"info", "-m", tiny, "-c", "lots"});
    CHECK(bad.status == 2);
    CHECK(contains(bad.err, "-c lots"));
}

TEST_CASE("cli: usage errors exit 2 with a short message") {
    expect_usage_error(run({"-p", kPrompt}));                                   // missing -m
    expect_usage_error(run({"-m", kStories, "-p", kPrompt, "--no-such-flag"})); // unknown flag
    expect_usage_error(run({"-m", kStories, "-p", kPrompt, "-n", "abc"}));
    expect_usage_error(run({"-m", kStories})); // no prompt
    expect_usage_error(run({"tokenize", "-p", kPrompt}));
    expect_usage_error(run({"info"}));

    const std::string q9 =
        expect_error_line(run({"-m", kStories, "-p", kPrompt, "--ctk", "q9"}), 2);
    CHECK(contains(q9, "q9"));
    const std::string big =
        expect_error_line(run({"logits", "-m", kStories, "--tokens", "1,999999"}), 2);
    CHECK(contains(big, "999999"));
    expect_usage_error(run({"logits", "-m", kStories, "--tokens", "1,abc"}));

    // --help is not an error.
    const auto h = run({"--help"});
    CHECK(h.status == 0);
    CHECK(contains(h.out, "--model"));
}

TEST_CASE("cli: unreadable or broken models exit 3 with one line") {
    TempDir dir;
    const std::string real = slurp(kStories);
    std::mt19937 rng(7);
    std::string noise(4096, '\0');
    for (char& c : noise) c = static_cast<char>(rng() & 0xff);
    noise[0] = 'X'; // never "GGUF" by chance
    const std::vector<std::pair<std::string, std::string>> models = {
        {"missing", (dir.path / "no-such-model.gguf").string()},
        {"directory", dir.path.string()},
        {"empty", dir.file("empty.gguf", "")},
        {"truncated", dir.file("truncated.gguf", real.substr(0, real.size() / 2))},
        {"header only", dir.file("header.gguf", real.substr(0, 5000))},
        {"random bytes", dir.file("noise.gguf", noise)},
        {"vocabulary only", kvtest::shared("vocab/ggml-vocab-llama-spm.gguf")},
    };
    for (const auto& [what, path] : models) {
        CAPTURE(what);
        const std::string line = expect_error_line(run({"-m", path, "-p", kPrompt}), 3);
        if (what != "directory") CHECK(contains(line, fs::path(path).filename().string()));
    }
    // The other subcommands map model errors the same way.
    expect_error_line(run({"info", "-m", dir.file("t2.gguf", real.substr(0, 1000))}), 3);
    expect_error_line(run({"logits", "-m", models[3].second, "--tokens", "1"}), 3);
}

TEST_CASE("cli: a prompt longer than -c exits 4 naming both numbers") {
    const std::string prompt = "Once upon a time there was a big dog who liked to run";
    const auto t = run({"tokenize", "-m", kStories, "-p", prompt, "--json"});
    REQUIRE(t.status == 0);
    const long long n = static_cast<long long>(json::parse(t.out).size());
    REQUIRE(n > 8);
    const std::string line = expect_error_line(run({"-m", kStories, "-c", "8", "-p", prompt}), 4);
    CAPTURE(line);
    const auto nums = numbers_in(line);
    CHECK(nums.count(n));
    CHECK(nums.count(8));
    // The same prompt fits -c n.
    const auto ok = run({"-m", kStories, "-c", std::to_string(n + 1), "-p", prompt, "-n", "1",
                         "--quiet", "--temp", "0"});
    CHECK(ok.status == 0);
}

TEST_CASE("cli: a prompt of invalid UTF-8 is rejected with one line") {
    TempDir dir;
    const std::string file = dir.file("bad.txt", std::string("Once \xff\xfe upon", 12));
    const auto r = run({"-m", kStories, "-f", file, "-n", "5"});
    INFO(describe(r));
    CHECK(r.status != 0);
    CHECK(r.status < 128); // an error, not a crash
    CHECK(r.out.empty());
    CHECK(kvtest::lines(r.err).size() == 1);
    const std::string truncated_utf8 = "caf\xc3";
    const auto s = run({"-m", kStories, "-f", "-", "-n", "5"}, &truncated_utf8);
    CHECK(s.status != 0);
    CHECK(s.status < 128);
    CHECK(kvtest::lines(s.err).size() == 1);
}

TEST_CASE("cli: sampling seeds are reproducible and matter") {
    auto sample = [](int seed) {
        const auto r = run_1t({"-m", kStories, "-p", kPrompt, "-n", "40", "--temp", "0.8", "--seed",
                               std::to_string(seed), "--quiet"});
        INFO(describe(r));
        CHECK(r.status == 0);
        CHECK(!r.out.empty());
        return r.out;
    };
    const std::string a = sample(1);
    CHECK(sample(1) == a);
    bool differs = false;
    for (int seed = 2; seed <= 6 && !differs; seed++) differs = sample(seed) != a;
    CHECK(differs);
}

TEST_CASE("cli: generation runs far past a 64-token context") {
    // 5 prompt + 256 generated positions in a 64-slot ring: it wraps 4+ times.
    const auto r = run_1t(
        {"-m", kStories, "-p", kPrompt, "-c", "64", "-n", "256", "--ignore-eos", "--temp", "0"});
    INFO(describe(r));
    REQUIRE(r.status == 0);
    CHECK(contains(r.err, "generated 256 tok"));
    CHECK(contains(r.err, "n_ctx 64"));
    CHECK(!contains(r.out, "[kvrun]"));
    // Until the window first slides the output is the ordinary greedy story.
    CHECK(starts_with(r.out, golden_story_text(50)));
    CHECK(r.out.size() > 400);
    // Two threads give the same text (a shorter run, past the first slide).
    const auto r2 = run({"-m", kStories, "-p", kPrompt, "-c", "64", "-n", "80", "--ignore-eos",
                         "--temp", "0", "--quiet", "-t", "2"});
    INFO(describe(r2));
    CHECK(r2.status == 0);
    CHECK(r2.out.size() > 80);
    CHECK(starts_with(r.out, r2.out));
}

TEST_CASE("cli: bench --profile splits a token's time by op, with each op's bytes") {
    // stories260K: 5 layers, 4 KV heads of 8 dimensions, F16 cache. Four
    // generated tokens from depth 0 see 1, 2, 3 and 4 slots; the 8-token
    // prompt is one batch.
    const json j =
        bench_json({"-m", kStories, "-p", "8", "-n", "4", "-t", "2", "-r", "2", "--profile"});
    REQUIRE(j.size() == 2);
    REQUIRE(j[0]["test"] == "pp8");
    REQUIRE(j[1]["test"] == "tg4");
    auto ops_of = [](const json& row) {
        REQUIRE(row.contains("profile"));
        std::map<std::string, json> ops;
        for (const json& o : row["profile"]["ops"]) ops[o["op"].get<std::string>()] = o;
        return ops;
    };
    std::map<std::string, json> ops = ops_of(j[1]), pp = ops_of(j[0]);
    const json& p = j[1]["profile"];
    // Each weight matrix once per layer (the output head once), with the
    // bytes the GGUF file gives its tensor.
    const kvrun::GgufFile f = kvrun::GgufFile::open(kStories);
    const int n_layer = 5;
    for (const char* w :
         {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"}) {
        INFO(w);
        REQUIRE(ops.count(w));
        CHECK(ops[w]["calls_per_token"].get<double>() == n_layer);
        double bytes = 0;
        for (int l = 0; l < n_layer; l++) {
            const kvrun::GgufTensor* t = f.tensor("blk." + std::to_string(l) + "." + w + ".weight");
            REQUIRE(t);
            bytes += static_cast<double>(t->nbytes);
        }
        CHECK(ops[w]["bytes_per_token"].get<double>() == bytes);
        // The prompt's batch reads each matrix once for its 8 tokens.
        CHECK(pp[w]["calls_per_token"].get<double>() == n_layer / 8.0);
        CHECK(pp[w]["bytes_per_token"].get<double>() == bytes / 8);
    }
    const kvrun::GgufTensor* out = f.tensor("output.weight");
    if (!out) out = f.tensor("token_embd.weight"); // tied
    REQUIRE(out);
    CHECK(ops["output"]["calls_per_token"].get<double>() == 1);
    CHECK(ops["output"]["bytes_per_token"].get<double>() == static_cast<double>(out->nbytes));
    // Attention reads the slots in view, K and V: 2.5 on average, 5 layers,
    // 32 elements of 2 bytes each.
    CHECK(ops["attention"]["calls_per_token"].get<double>() == n_layer);
    CHECK(ops["attention"]["bytes_per_token"].get<double>() == 2.5 * n_layer * 2 * 32 * 2);
    // Norms: two a layer (the FFN's with the attention's residual add) and
    // the output's; other ops: the embedding row, and per layer RoPE with
    // the K/V conversion, SwiGLU, the FFN's residual add.
    CHECK(ops["norms"]["calls_per_token"].get<double>() == 2 * n_layer + 1);
    CHECK(ops["other"]["calls_per_token"].get<double>() == 1 + 3 * n_layer);
    // The ops are disjoint stretches of the timed tokens.
    double in_ops = 0;
    for (const auto& [name, o] : ops) {
        CHECK(o["seconds_per_token"].get<double>() > 0);
        in_ops += o["seconds_per_token"].get<double>();
    }
    CHECK(in_ops <= p["seconds_per_token"].get<double>());
    // The profile's time per token and the run's rate are the same tokens
    // timed twice: they agree in unit and size. Not closer than a factor:
    // a token of this model takes microseconds, and one preemption of a
    // thread on a busy 2-core machine moves one timing by more than that.
    const double product =
        p["seconds_per_token"].get<double>() * j[1]["tokens_per_second"].get<double>();
    CHECK(product > 1.0 / 3);
    CHECK(product < 3.0);
    // The markdown form names every op and the time outside them.
    const auto m =
        run({"bench", "-m", kStories, "-p", "0", "-n", "4", "-t", "1", "-r", "1", "--profile"});
    INFO(describe(m));
    REQUIRE(m.status == 0);
    for (const char* w :
         {"| attn_q | 5 |", "| output | 1 |", "| attention | 5 |", "| outside the ops |"})
        CHECK(m.out.find(w) != std::string::npos);
}

TEST_CASE("cli: bench --json reports pp and tg, and tg's bytes per token") {
    // stories260K: 5 layers, 4 KV heads of 8 dimensions, F16 cache.
    const json j =
        bench_json({"-m", kStories, "-p", "32", "-n", "4", "-d", "0,64", "-t", "1", "-r", "2"});
    REQUIRE(j.is_array());
    std::vector<std::string> tests;
    for (const json& o : j) tests.push_back(o["test"].get<std::string>());
    // As llama-bench: every test at every depth.
    CHECK(tests == std::vector<std::string>{"pp32", "tg4", "pp32@d64", "tg4@d64"});
    for (const json& o : j) {
        INFO(o.dump());
        CHECK(o["tokens_per_second"].get<double>() > 0);
        // What scripts/bench.sh divides by kvrun-lab's roof; hand-offs only
        // with --profile.
        CHECK(o.contains("bytes_per_token") == (o["n_prompt"] == 0));
        CHECK(!o.contains("handoffs_per_token"));
    }
    CHECK(j[2]["n_prompt"] == 32);
    CHECK(j[2]["n_depth"] == 64);
    // The weights (F32: every matrix and one embedding row) plus the K/V a
    // token reads at the run's mean depth: 64 + 4 / 2 slots, 5 layers, K and
    // V of 32 F16 elements.
    CHECK(j[3]["bytes_per_token"].get<double>() - j[1]["bytes_per_token"].get<double>() ==
          5.0 * 64 * 2 * 32 * 2);
    const json p =
        bench_json({"-m", kStories, "-p", "0", "-n", "4", "-t", "2", "-r", "1", "--profile"});
    REQUIRE(p.size() == 1);
    // stories260K's loops are too small to hand off to a second thread, so
    // only that the count is there.
    CHECK(p[0]["handoffs_per_token"].get<double>() >= 0);

    // With nothing to measure, a usage error rather than an empty table.
    const auto none = run({"bench", "-m", kStories, "-p", "0", "-n", "0"});
    expect_usage_error(none);
    CHECK(none.err.find("nothing to measure") != std::string::npos);
}

TEST_CASE("cli: bench's lab flags moved to kvrun-lab, and the error says so") {
    for (const char* flag : {"--roofline", "--attention", "--matrices"}) {
        INFO(flag);
        const auto r = run({"bench", "-m", kStories, "-p", "0", "-n", "4", flag});
        const std::string line = expect_error_line(r, 2);
        CHECK(contains(line, flag));
        CHECK(contains(line, std::string("kvrun-lab ") + (flag + 2)));
    }
    const auto help = run({"bench", "--help"});
    CHECK(help.status == 0);
    CHECK(contains(help.out, "kvrun-lab"));
    CHECK(!contains(help.out, "--roofline"));
}

TEST_CASE("cli: bench's table has a cell per column in every row, with the model's type, size, "
          "parameters and backend; -o json is --json") {
    const std::string tiny = kvtest::shared("models/synthetic/tiny-Q8_0.gguf");
    const std::string prompt = "/tmp/kvrun-bench-table-" + std::to_string(::getpid()) + ".txt";
    std::ofstream(prompt) << "Once upon a time there was a cat. Once upon a time there was a cat.";
    auto cells = [](const std::string& line) {
        return std::count(line.begin(), line.end(), '|') - 1;
    };
    for (std::vector<std::string> extra :
         {std::vector<std::string>{"-m", kStories, "-m", tiny, "-p", "8", "-n", "4"},
          {"-m", kStories, "-p", "0", "-n", "8", "-f", prompt, "--lookup", "4"}}) {
        std::vector<std::string> a = {"bench", "-t", "1", "-r", "1"};
        a.insert(a.end(), extra.begin(), extra.end());
        const auto r = run(a);
        INFO(describe(r));
        REQUIRE(r.status == 0);
        const auto lines = kvtest::lines(r.out);
        REQUIRE(lines.size() >= 4);
        CHECK(contains(lines[0], "| model | type | size | params | backend | threads | test |"));
        for (const std::string& l : lines) CHECK(cells(l) == cells(lines[0]));
        CHECK(contains(r.out, "| stories260K.gguf | F32 | 1.12 MiB | 292.8K | cpu | 1 |"));
    }
    // A Q8_0 file is named by its general.file_type.
    CHECK(contains(run({"bench", "-m", tiny, "-p", "8", "-n", "0", "-t", "1", "-r", "1"}).out,
                   "| tiny-Q8_0.gguf | Q8_0 |"));
    std::remove(prompt.c_str());
    const auto o =
        run({"bench", "-m", kStories, "-p", "8", "-n", "0", "-t", "1", "-r", "2", "-o", "json"});
    REQUIRE(o.status == 0);
    const json j = json::parse(o.out);
    CHECK(j[0]["type"] == "F32");
    CHECK(j[0]["params"] == "292.8K");
    CHECK(j[0]["samples"].size() == 2);
    expect_usage_error(run({"bench", "-m", kStories, "-o", "tsv"}));
}

TEST_CASE("cli: bench speaks llama-bench: -pg PP,TG, -d on prompt tests, -o csv") {
    // -pg: a prompt then generated tokens, timed together, named as llama-bench names it.
    const json j = bench_json({"-m", kStories, "-p", "0", "-n", "0", "-pg", "16,8", "-pg", "8,4",
                               "-d", "0,32", "-t", "1", "-r", "1"});
    std::vector<std::string> tests;
    for (const json& o : j) tests.push_back(o["test"].get<std::string>());
    CHECK(tests == std::vector<std::string>{"pp16+tg8", "pp8+tg4", "pp16+tg8@d32", "pp8+tg4@d32"});
    CHECK(j[0]["n_prompt"] == 16);
    CHECK(j[0]["n_gen"] == 8);
    CHECK(j[3]["n_depth"] == 32);
    for (const char* bad : {"16", "16,0", "x,8", "16,8,4"}) {
        CAPTURE(bad);
        expect_usage_error(run({"bench", "-m", kStories, "-pg", bad}));
    }
    // -d applies to every test, prompt tests included (pp16@d48); CSV has
    // llama-bench's columns, sizes and parameters as numbers.
    const auto c = run({"bench", "-m", kStories, "-p", "16", "-n", "4", "-pg", "8,4", "-d", "48",
                        "-t", "1", "-r", "2", "-o", "csv"});
    INFO(describe(c));
    REQUIRE(c.status == 0);
    const auto lines = kvtest::lines(c.out);
    REQUIRE(lines.size() == 4);
    CHECK(lines[0] == "model_filename,model_type,model_size,model_n_params,backend,n_threads,"
                      "test,n_prompt,n_gen,n_depth,avg_ts,stddev_ts,samples_ts");
    CHECK(starts_with(lines[1], "stories260K.gguf,F32,1171200,292800,cpu,1,pp16@d48,16,0,48,"));
    CHECK(starts_with(lines[2], "stories260K.gguf,F32,1171200,292800,cpu,1,tg4@d48,0,4,48,"));
    CHECK(starts_with(lines[3], "stories260K.gguf,F32,1171200,292800,cpu,1,pp8+tg4@d48,8,4,48,"));
    for (size_t i = 1; i < lines.size(); i++)
        CHECK(std::count(lines[i].begin(), lines[i].end(), ',') == 12);
}
