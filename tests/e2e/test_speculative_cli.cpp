// Speculative decoding from the command line: --lookup and --draft-model
// (-md) print the answer plain decoding prints, in run, chat and bench, and
// refuse what they cannot do with one line.
#include <doctest/doctest.h>

#include <cstdio>
#include <fstream>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace {

using json = nlohmann::json;
const std::string kStories = kvtest::shared("models/stories260K.gguf");

kvtest::RunResult ok(const std::vector<std::string>& args, const std::string* input = nullptr) {
    kvtest::RunResult r = kvtest::run_kvrun(args, input);
    INFO("kvrun stderr: ", r.err);
    REQUIRE(r.status == 0);
    return r;
}

void expect_usage_error(const kvtest::RunResult& r, const std::string& says) {
    INFO("status ", r.status, ", stderr: ", r.err);
    CHECK(r.status == 2);
    CHECK(r.out.empty());
    CHECK(kvtest::lines(r.err).size() == 1);
    CHECK(r.err.rfind("kvrun: error:", 0) == 0);
    CHECK(r.err.find(says) != std::string::npos);
}

} // namespace

TEST_CASE("cli speculative: --lookup and --draft-model print plain decoding's answer") {
    // -c 64 and 300 tokens: the window slides (and the rings wrap) many times.
    const std::vector<std::string> base = {"-m", kStories, "-p", "Once upon a time",
                                           "-c", "64",     "-n", "300"};
    for (const std::vector<std::string>& sampling :
         {std::vector<std::string>{"--temp", "0"},
          std::vector<std::string>{"--temp", "0.8", "--seed", "11"}}) {
        std::vector<std::string> plain = base;
        plain.insert(plain.end(), sampling.begin(), sampling.end());
        const std::string want = ok(plain).out;
        CHECK(want.size() > 500);
        for (const std::vector<std::string>& spec :
             {std::vector<std::string>{"--lookup", "8"}, std::vector<std::string>{"--lookup", "2"},
              std::vector<std::string>{"--lookup", "14", "--draft-min", "3"}}) {
            std::vector<std::string> args = plain;
            args.insert(args.end(), spec.begin(), spec.end());
            CAPTURE(args.back());
            CHECK(ok(args).out == want);
        }
        if (sampling[1] ==
            "0") { // a draft model's sampled drafts go through the rejection rule instead
            std::vector<std::string> args = plain;
            args.insert(args.end(), {"-md", kStories, "--draft-max", "5", "--draft-p-min", "0"});
            CHECK(ok(args).out == want);
        }
    }
    // --json: what was drafted and kept.
    std::vector<std::string> args = base;
    args.insert(args.end(), {"--temp", "0", "--lookup", "8", "--json"});
    const json j = json::parse(ok(args).out);
    INFO(j.dump());
    const json& s = j["speculative"];
    CHECK(s["drafter"] == "lookup");
    // How many rounds run depends on the clock (drafting pauses while it
    // loses to plain steps, draft_length.h); some always do.
    CHECK(s["rounds"].get<int>() > 0);
    CHECK(s["accepted"].get<int>() <= s["drafted"].get<int>());
    if (s["drafted"].get<int>() > 0)
        CHECK(s["acceptance"].get<double>() ==
              doctest::Approx(s["accepted"].get<double>() / s["drafted"].get<double>()));
    CHECK(j["tokens"]["generated"] == 300);
    // The stats line says it too.
    std::vector<std::string> line = base;
    line.insert(line.end(), {"--temp", "0", "--draft-model", kStories});
    const std::string err = ok(line).err;
    CHECK(err.find("draft model stories260K.gguf: ") != std::string::npos);
    CHECK(err.find("drafts accepted") != std::string::npos);
    // A draft as large as the model saves nothing: the run warns.
    CHECK(err.find("kvrun: warning: the draft model reads 1.12 MiB per token, 100% of the "
                   "model's") != std::string::npos);
    const std::string plain_err = ok(std::vector<std::string>(base.begin(), base.end())).err;
    CHECK(plain_err.find("the draft model reads") == std::string::npos);
    // A draft larger than the model (the two swapped): how many times its reads.
    const std::string larger =
        ok({"-m", kvtest::shared("models/synthetic/tiny-Q4_0.gguf"), "--draft-model",
            kvtest::shared("models/synthetic/tiny-Q8_0.gguf"), "-p", "Hello", "-n", "4", "--temp",
            "0"})
            .err;
    CHECK(larger.find(" times the model's ") != std::string::npos);
    CHECK(larger.find("swap -m and -md") != std::string::npos);
}

TEST_CASE("cli speculative: a chat answer with --lookup is plain decoding's") {
    const std::string input = "Tell me a story about a cat.\n";
    const std::vector<std::string> base = {"chat", "-m",  kStories, "--temp", "0",
                                           "-n",   "120", "-c",     "512"};
    const kvtest::RunResult plain = ok(base, &input);
    std::vector<std::string> args = base;
    args.insert(args.end(), {"--lookup", "6"});
    const kvtest::RunResult spec = ok(args, &input);
    CHECK(spec.out == plain.out);
    CHECK(plain.out.size() > 100);
}

TEST_CASE("cli speculative: bench measures tg with --lookup beside plain tg, after a real prompt") {
    // A story that repeats itself: lookup finds matches in it.
    const std::string prompt = "/tmp/kvrun-bench-prompt-" + std::to_string(::getpid()) + ".txt";
    {
        std::ofstream f(prompt);
        for (int i = 0; i < 3; i++)
            f << "Once upon a time, there was a little girl named Lily. She loved to play in the "
                 "park. ";
    }
    const kvtest::RunResult r = ok({"bench", "-m", kStories, "-p", "0", "-n", "64", "-r", "2", "-t",
                                    "1", "-f", prompt, "--lookup", "8", "--json"});
    const json j = json::parse(r.out);
    INFO(j.dump());
    REQUIRE(j.size() == 3); // tg64 (random tokens), then plain and lookup after the prompt
    CHECK(j[1]["test"].get<std::string>().find("tg64 after ") == 0);
    CHECK(!j[1].contains("speculative"));
    CHECK(j[2]["speculative"]["drafter"] == "lookup");
    CHECK(j[2]["speculative"]["drafted"].get<int>() > 0);
    CHECK(j[2]["tokens_per_second"].get<double>() > 0);
    expect_usage_error(
        kvtest::run_kvrun({"bench", "-m", kStories, "-p", "0", "-n", "8", "--lookup", "4"}),
        "-f FILE");
}

TEST_CASE("cli speculative: what it cannot do is a usage error of one line") {
    const std::vector<std::string> base = {"-m", kStories, "-p", "Once", "-n", "4"};
    auto with = [&](std::vector<std::string> more) {
        std::vector<std::string> a = base;
        a.insert(a.end(), more.begin(), more.end());
        return kvtest::run_kvrun(a);
    };
    // qwen2's BPE vocabulary of 50257 tokens is not stories260K's 512.
    expect_usage_error(
        with({"--draft-model", kvtest::shared("models/synthetic/tiny-qwen2-Q8_0.gguf")}),
        "vocabulary");
    expect_usage_error(with({"--lookup", "4", "--draft-model", kStories}), "give one");
    expect_usage_error(with({"--lookup", "4", "--no-kv-cache"}), "--no-kv-cache");
    expect_usage_error(with({"--lookup", "15"}), "--lookup");
    expect_usage_error(with({"--draft-model", kStories, "--draft-max", "4", "--draft-min", "5"}),
                       "--draft-min");
}
