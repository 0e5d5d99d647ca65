// kvrun batch as a pipeline meets it: JSON lines in (a file or stdin), one
// result per line out with the request's id, a malformed line an error
// object of its own while the rest go on, --ordered keeping input order,
// --lines for plain text, and every answer the one `kvrun -p` gives alone.
#include <doctest/doctest.h>

#include <csignal>
#include <cstdio>
#include <fstream>
#include <string>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace {

using json = nlohmann::json;
const std::string kStories = kvtest::shared("models/stories260K.gguf");

struct TempFile {
    std::string path;
    explicit TempFile(const std::string& text) {
        char name[] = "/tmp/kvrun-batch-XXXXXX";
        const int fd = ::mkstemp(name);
        REQUIRE(fd >= 0);
        ::close(fd);
        path = name;
        std::ofstream(path) << text;
    }
    ~TempFile() { std::remove(path.c_str()); }
};

std::vector<json> json_lines(const std::string& out) {
    std::vector<json> v;
    for (const std::string& l : kvtest::lines(out)) v.push_back(json::parse(l));
    return v;
}

// kvrun -p alone, same settings: its stdout is the answer.
std::string lone(const std::string& prompt, int n, const std::vector<std::string>& more = {}) {
    std::vector<std::string> args = {"-m", kStories, "-p", prompt, "-n", std::to_string(n),
                                     "-c", "128",    "--quiet"};
    args.insert(args.end(), more.begin(), more.end());
    const auto r = kvtest::run_kvrun(args);
    REQUIRE(r.status == 0);
    return r.out;
}

} // namespace

TEST_CASE("batch: JSON lines in and out; malformed lines answered with errors, the rest as "
          "kvrun -p answers them") {
    const std::string input =
        R"({"id": "a", "prompt": "Once upon a time", "max_tokens": 40, "temperature": 0})" "\n"
        "not json\n"
        R"({"id": 7, "prompt": "Lily wanted", "max_tokens": 30, "temperature": 0.8, "seed": 5})" "\n"
        "\n"
        R"({"id": "c", "prmpt": "typo"})" "\n"
        R"({"id": "d", "prompt": "One day", "max_tokens": 50, "temperature": 0, "stop": "."})" "\n"
        R"({"id": "e", "prompt": "The dog", "max_tokens": "many"})" "\n"
        R"({"id": "f", "prompt": "The cat", "max_tokens": 3, "temperature": 0})" "\n"
        "{\"id\": \"g\", \"prompt\": \"bad \xff byte\"}\n"
        R"({"id": "h", "prompt": "The cat", "max_tokens": 2.5})" "\n";
    TempFile f(input);
    const auto r = kvtest::run_kvrun(
        {"batch", "-m", kStories, "-f", f.path, "-c", "128", "--ordered", "--parallel", "3"});
    REQUIRE(r.status == 0);
    const std::vector<json> out = json_lines(r.out);
    REQUIRE(out.size() == 9); // the blank line is no request
    // --ordered: input order, ids as given (a line without one: its number).
    CHECK(out[0]["id"] == "a");
    CHECK(out[1]["id"] == 2);
    CHECK(out[1]["error"].get<std::string>().find("not JSON") != std::string::npos);
    CHECK(out[2]["id"] == 7);
    CHECK(out[3]["error"] == "unknown field \"prmpt\"");
    CHECK(out[4]["id"] == "d");
    CHECK(out[5]["error"] == "\"max_tokens\" must be a whole number");
    CHECK(out[6]["id"] == "f");
    // Invalid UTF-8 in a line: its error, written as valid JSON; the run goes on.
    CHECK(out[7]["id"] == 8); // the id could not be read
    CHECK(out[7].contains("error"));
    CHECK(out[8]["error"] == "\"max_tokens\" must be a whole number");
    // The answers are kvrun -p's.
    CHECK(out[0]["text"] == lone("Once upon a time", 40, {"--temp", "0"}));
    CHECK(out[0]["finish_reason"] == "length");
    CHECK(out[0]["completion_tokens"] == 40);
    CHECK(out[2]["text"] == lone("Lily wanted", 30, {"--temp", "0.8", "-s", "5"}));
    CHECK(out[4]["text"] == lone("One day", 50, {"--temp", "0", "--stop", "."}));
    CHECK(out[4]["finish_reason"] == "stop");
    CHECK(out[4]["stop_string"] == ".");
    CHECK(out[6]["text"] == lone("The cat", 3, {"--temp", "0"}));
    CHECK(out[0]["prompt_tokens"] == 5);
    // The summary on stderr, one line.
    CHECK(r.err.find("[kvrun batch] 9 requests (4 done, 5 malformed)") != std::string::npos);
}

TEST_CASE("batch: stdin, --lines with --system, and a prompt too long for -c") {
    const std::string in = "Hello there\nTell me a story\n";
    const auto r = kvtest::run_kvrun({"batch", "-m", kStories, "--lines", "--system", "Be brief",
                                      "-n", "8", "--temp", "0", "-c", "64"},
                                     &in);
    REQUIRE(r.status == 0);
    std::vector<json> out = json_lines(r.out);
    REQUIRE(out.size() == 2);
    for (const json& j : out) {
        CHECK(j["completion_tokens"].get<int>() <= 8);
        CHECK(j["prompt_tokens"].get<int>() > 4); // the template's glue and the system prompt
    }
    // kvrun -p --chat renders the same single turn.
    const auto one = kvtest::run_kvrun({"-m", kStories, "--chat", "--system", "Be brief", "-p",
                                        "Hello there", "-n", "8", "--temp", "0", "-c", "64",
                                        "--quiet"});
    REQUIRE(one.status == 0);
    CHECK((out[0]["id"] == 1 ? out[0] : out[1])["text"] == one.out);

    std::string longer = R"({"prompt": ")";
    for (int i = 0; i < 100; i++) longer += "once upon a time ";
    longer += "\"}\n";
    const std::string two = longer + R"({"prompt": "short", "max_tokens": 2})" "\n";
    const auto t = kvtest::run_kvrun({"batch", "-m", kStories, "-c", "64", "--ordered"}, &two);
    REQUIRE(t.status == 0);
    out = json_lines(t.out);
    REQUIRE(out.size() == 2);
    CHECK(out[0]["error"].get<std::string>().find("context (-c) holds 64") != std::string::npos);
    CHECK(out[1]["completion_tokens"] == 2);
}

TEST_CASE("batch: a shared prefix is evaluated once; --deterministic answers stay kvrun -p's") {
    const std::string sys = "Once upon a time, there was a little girl named Lily who loved to "
                            "play in the park with her friends. ";
    std::string in;
    for (const char* q : {"One day,", "She saw", "Then the", "The end"})
        in += json{{"prompt", sys + q}, {"max_tokens", 12}, {"temperature", 0}}.dump() + "\n";
    const auto r = kvtest::run_kvrun({"batch", "-m", kStories, "-c", "128", "--ordered",
                                      "--parallel", "2", "--deterministic"},
                                     &in);
    REQUIRE(r.status == 0);
    const std::vector<json> out = json_lines(r.out);
    REQUIRE(out.size() == 4);
    int64_t cached = 0;
    for (const json& j : out) cached += j["cached_tokens"].get<int64_t>();
    CHECK(cached >= 3 * 16); // the three after the first start from its prefix
    CHECK(r.err.find("prefix cache " + std::to_string(cached) + " of") != std::string::npos);
    CHECK(out[1]["text"] == lone(sys + "She saw", 12, {"--temp", "0", "--deterministic"}));
    CHECK(out[3]["text"] == lone(sys + "The end", 12, {"--temp", "0", "--deterministic"}));
    // --no-prefix-cache: every prompt whole.
    const auto whole = kvtest::run_kvrun({"batch", "-m", kStories, "-c", "128", "--ordered",
                                          "--no-prefix-cache", "--deterministic"},
                                         &in);
    REQUIRE(whole.status == 0);
    const std::vector<json> w = json_lines(whole.out);
    REQUIRE(w.size() == 4);
    for (size_t i = 0; i < 4; i++) {
        CHECK(w[i]["cached_tokens"] == 0);
        CHECK(w[i]["text"] == out[i]["text"]);
    }
}

// The issue's "out of memory": a budget too small for every sequence's whole
// ring says so; the sequences share its blocks and answer every request as before.
TEST_CASE("batch: too little memory for --parallel whole caches shares the blocks, never aborts") {
    std::string in;
    for (int i = 0; i < 6; i++)
        in += json{{"prompt", "Once upon a time " + std::to_string(i)}, {"max_tokens", 8},
                   {"temperature", 0}}
                  .dump() +
              "\n";
    // -c 16384: 10 MiB a cache; 80 MiB available: half of it holds 4.
    const auto r = kvtest::run_binary(
        "/usr/bin/env", {"KVRUN_MEM_AVAILABLE=83886080", KVRUN_BINARY, "batch", "-m", kStories,
                         "-c", "16384", "--parallel", "6", "--ordered"},
        &in);
    REQUIRE(r.status == 0);
    CHECK(r.err.find("memory held KV blocks for 4.0 whole caches of 10.00 MiB, not 6") !=
          std::string::npos);
    CHECK(r.err.find("| 6 at once |") != std::string::npos);
    const auto one = kvtest::run_kvrun(
        {"batch", "-m", kStories, "-c", "16384", "--parallel", "1", "--ordered"}, &in);
    REQUIRE(one.status == 0);
    const std::vector<json> a = json_lines(r.out), b = json_lines(one.out);
    REQUIRE(a.size() == 6);
    REQUIRE(b.size() == 6);
    for (size_t i = 0; i < 6; i++) CHECK(a[i]["text"] == b[i]["text"]);
}

// Ctrl-C: what finished is printed, the running sequences end "interrupted",
// the ones never started get an error line each, and the status is 130.
TEST_CASE("batch: Ctrl-C answers every request (finished, interrupted or not run) and exits 130") {
    std::string in;
    for (int i = 0; i < 20; i++)
        in += json{{"id", i}, {"prompt", "Once upon a time " + std::to_string(i)},
                   {"max_tokens", i == 0 ? 4 : 3000}, {"ignore_eos", true}}
                  .dump() +
              "\n";
    TempFile f(in);
    int out_pipe[2];
    REQUIRE(pipe(out_pipe) == 0);
    const pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        dup2(out_pipe[1], 1);
        close(out_pipe[0]);
        close(out_pipe[1]);
        std::freopen("/dev/null", "w", stderr);
        execl(KVRUN_BINARY, KVRUN_BINARY, "batch", "-m", kStories.c_str(), "-f", f.path.c_str(),
              "-c", "4096", "--parallel", "2", "--temp", "0", static_cast<char*>(nullptr));
        _exit(127);
    }
    close(out_pipe[1]);
    std::string out;
    char buf[4096];
    bool signalled = false;
    for (ssize_t n; (n = read(out_pipe[0], buf, sizeof buf)) > 0;) {
        out.append(buf, static_cast<size_t>(n));
        // The first answer (4 tokens) is out: the others are running or queued.
        if (!signalled && out.find('\n') != std::string::npos) {
            kill(pid, SIGINT);
            signalled = true;
        }
    }
    close(out_pipe[0]);
    int st = 0;
    REQUIRE(waitpid(pid, &st, 0) == pid);
    REQUIRE(signalled);
    CHECK(WIFEXITED(st));
    CHECK(WEXITSTATUS(st) == 130);
    const std::vector<json> lines = json_lines(out);
    CHECK(lines.size() == 20); // every request answered, one way or another
    int finished = 0, interrupted = 0, not_run = 0;
    for (const json& j : lines) {
        if (j.contains("error")) {
            CHECK(j["error"] == "not run: interrupted");
            not_run++;
        } else if (j["finish_reason"] == "interrupted") {
            interrupted++;
        } else {
            finished++;
        }
    }
    CHECK(finished >= 1);
    CHECK(interrupted >= 1);
    CHECK(not_run >= 1);
}
