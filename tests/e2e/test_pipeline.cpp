// kvrun in shell pipelines: stdin with -f - or as the only prompt, --json, stop sequences
// split across tokens, SIGPIPE, closed stdin, --chat one-shot.
#include <doctest/doctest.h>

#include <cstdio>
#include <sys/wait.h>

#include <nlohmann/json.hpp>

#include "stop_sequences.h"
#include "test_util.h"

using kvrun::StopMatcher;
using nlohmann::json;

namespace {
const std::string kStories = kvtest::shared("models/stories260K.gguf");

kvtest::RunResult gen(std::vector<std::string> extra, const std::string* input = nullptr) {
    std::vector<std::string> args = {"-m", kStories, "--temp", "0", "--quiet"};
    args.insert(args.end(), extra.begin(), extra.end());
    return kvtest::run_kvrun(args, input);
}
} // namespace

TEST_CASE("stop matcher: a stop string split across pushes is held back, then dropped") {
    StopMatcher m({"\nUser:"});
    CHECK(m.push("Hello") == "Hello");
    CHECK(m.push(" there\nUs") == " there"); // "\nUs" may start the stop string
    CHECK_FALSE(m.stopped());
    CHECK(m.push("e") == "");
    CHECK(m.push("r: more") == "");
    CHECK(m.stopped());
    CHECK(m.matched() == "\nUser:");
    CHECK(m.released() == 11);
    CHECK(m.push("after") == "");

    StopMatcher n({"abc", "bd"});
    CHECK(n.push("xab") == "x");
    CHECK(n.push("x") == "abx"); // not a stop after all: released
    CHECK(n.push("ab") == "");
    CHECK(n.flush() == "ab");
    CHECK_FALSE(n.stopped());
    StopMatcher e({"b", "ab"}); // the earliest match wins
    CHECK(e.push("xab") == "x");
    CHECK(e.matched() == "ab");
}

TEST_CASE("pipeline: -f - reads stdin after -p; -p alone leaves it unread; stdout carries only the "
          "answer") {
    const std::string doc = "The cat sat on the mat.";
    const auto piped = gen({"-p", "Summarize:", "-n", "12"}, &doc);
    const auto file = gen({"-p", "Summarize:", "-f", "-", "-n", "12"}, &doc);
    const auto joined = gen({"-p", "Summarize:\n" + doc, "-n", "12"});
    const auto alone = gen({"-p", "Summarize:", "-n", "12"});
    REQUIRE(file.status == 0);
    CHECK(file.out == joined.out);
    CHECK(file.out != alone.out);
    CHECK(piped.out == alone.out);
    CHECK(file.err.empty()); // --quiet: nothing but the answer anywhere
    // stdin alone is the prompt
    const auto only = gen({"-n", "12"}, &doc);
    CHECK(only.status == 0);
    CHECK(only.out == gen({"-p", doc, "-n", "12"}).out);
}

TEST_CASE("pipeline: --json prints one object with text, tokens, stop, timings, cache") {
    const auto streamed = gen({"-p", "Once upon a time", "-n", "20"});
    const auto r = gen({"-p", "Once upon a time", "-n", "20", "--json"});
    REQUIRE(r.status == 0);
    REQUIRE(kvtest::lines(r.out).size() == 1);
    const json j = json::parse(r.out);
    CHECK(j.at("text") == streamed.out);
    CHECK(j.at("stop") == "length");
    CHECK(j.at("stop_string").is_null());
    CHECK(j.at("tokens").at("generated") == 20);
    CHECK(j.at("tokens").at("prompt") == 5);
    CHECK(j.at("tokens").at("evaluated") == 5);
    for (const char* k :
         {"prompt_s", "generation_s", "prompt_tok_s", "generation_tok_s", "first_token_ms"})
        CHECK(j.at("timings").at(k).get<double>() >= 0);
    const json& c = j.at("cache");
    CHECK(c.at("n_ctx").get<int>() >= 25);
    CHECK(c.at("used") == 25); // the prompt and every generated token are in the cache
    CHECK(c.at("type_k") == "f16");
    CHECK(c.at("fill").get<double>() > 0);
    CHECK(c.at("bytes").get<int64_t>() > 0);
}

TEST_CASE("pipeline: --stop strings end the answer across token boundaries and are not printed") {
    const auto full = gen({"-p", "Once upon a time", "-n", "40", "--json"});
    const std::string text = json::parse(full.out).at("text");
    // "le gi" spans the tokens of "little" and " girl" in the greedy story.
    const size_t at = text.find("le gi");
    REQUIRE(at != std::string::npos);
    const auto cut =
        gen({"-p", "Once upon a time", "-n", "40", "--stop", "zzz", "--stop", "le gi"});
    CHECK(cut.status == 0);
    CHECK(cut.out == text.substr(0, at));
    const json j =
        json::parse(gen({"-p", "Once upon a time", "-n", "40", "--stop", "le gi", "--json"}).out);
    CHECK(j.at("stop") == "stop string");
    CHECK(j.at("stop_string") == "le gi");
    CHECK(j.at("text") == text.substr(0, at));
}

TEST_CASE("pipeline: a closed pipe downstream ends kvrun quietly (SIGPIPE)") {
    const std::string cmd = "bash -c '\"" + std::string(KVRUN_BINARY) + "\" -m \"" + kStories +
                            "\" -p \"Once upon a time\" -n 100000 --ignore-eos --temp 0 -c 64 "
                            "</dev/null 2>/tmp/kvrun_sigpipe_err.$$ "
                            "| head -c 20 >/dev/null; s=${PIPESTATUS[0]}; cat "
                            "/tmp/kvrun_sigpipe_err.$$; rm -f /tmp/kvrun_sigpipe_err.$$; exit $s'";
    FILE* p = popen(cmd.c_str(), "r");
    REQUIRE(p);
    std::string err;
    char buf[256];
    while (size_t n = fread(buf, 1, sizeof buf, p)) err.append(buf, n);
    const int st = pclose(p);
    REQUIRE(WIFEXITED(st));
    const int code = WEXITSTATUS(st);
    CHECK((code == 0 || code == 141));
    CHECK(err.find("error") == std::string::npos);
}

TEST_CASE("pipeline: with stdin closed or empty nothing waits for input") {
    const auto none = kvtest::run_kvrun({"-m", kStories});
    CHECK(none.status == 2);
    CHECK(kvtest::lines(none.err).size() == 1);
    const std::string empty;
    CHECK(kvtest::run_kvrun({"chat", "-m", kStories}, &empty).status == 2);
    CHECK(kvtest::run_kvrun({"chat", "-m", kStories}).status == 2);
    CHECK(kvtest::run_kvrun({"-m", kStories, "-i"}).status == 2); // -i is the chat REPL: same rule
    CHECK(gen({"-p", "Once", "-n", "3"}).status == 0);
}

TEST_CASE("pipeline: chat with stdin not a terminal answers one message; --chat equals it") {
    const std::string msg = "Hello there\n";
    const auto chat = kvtest::run_kvrun({"chat", "-m", kStories, "--temp", "0", "-n", "24"}, &msg);
    REQUIRE(chat.status == 0);
    const auto once = gen({"--chat", "-p", "Hello there", "-n", "24"});
    REQUIRE(once.status == 0);
    CHECK(!once.out.empty());
    // One behaviour for both ways of asking one question: the same text,
    // no newline added, the same stats line.
    CHECK(chat.out == once.out);
    const auto once_stats = kvtest::run_kvrun(
        {"-m", kStories, "--temp", "0", "-n", "24", "--chat", "-p", "Hello there"});
    CHECK(chat.err.find("| generated 24 tok") != std::string::npos);
    CHECK(once_stats.err.find("| generated 24 tok") != std::string::npos);
    CHECK(chat.err.find("stop: length") != std::string::npos);
    // The plain fallback stops where the model starts the user's next line.
    CHECK(once.out.find("\nUser:") == std::string::npos);
    // With -p, chat leaves stdin unread, as a plain run does
    const std::string there = "there";
    const auto both = kvtest::run_kvrun(
        {"chat", "-m", kStories, "--temp", "0", "-n", "24", "-p", "Hello"}, &there);
    CHECK(both.out == gen({"--chat", "-p", "Hello", "-n", "24"}).out);
}
