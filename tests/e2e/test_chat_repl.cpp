// The chat REPL driven through a pseudo-terminal (forkpty), as a person
// would: turns after the first evaluate only their new tokens, /undo rewinds
// the cache and the next greedy answer equals a fresh session's with the same
// history, Ctrl-C stops an answer and leaves a consistent cache.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <csignal>
#include <cstdlib>
#include <pty.h>
// GCC 12's <regex> trips a false -Wmaybe-uninitialized inside std::function
// once inlined under -fsanitize (fixed in GCC 13).
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <regex>
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic pop
#endif
#include <sys/wait.h>
#include <thread>
#include <poll.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace {

const std::string kStories = kvtest::shared("models/stories260K.gguf");

class Repl {
  public:
    // `env`: NAME=VALUE pairs set in the REPL's environment.
    // `chat`: false runs `kvrun ARGS` as given (not the chat REPL).
    explicit Repl(std::vector<std::string> args, int token_delay_ms = 0,
                  std::vector<std::pair<std::string, std::string>> env = {}, bool chat = true) {
        if (chat && std::find(args.begin(), args.end(), "-c") == args.end())
            args.insert(args.begin(), {"-c", "512"});
        if (chat) args.insert(args.begin(), {"chat", "-m", kStories, "--temp", "0"});
        winsize ws{};
        ws.ws_row = 40;
        ws.ws_col = 250;
        pid_ = forkpty(&fd_, nullptr, nullptr, &ws);
        if (pid_ == 0) {
            setenv("TERM", "dumb", 1);
            for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
            if (token_delay_ms > 0)
                setenv("KVRUN_TEST_TOKEN_DELAY_MS", std::to_string(token_delay_ms).c_str(), 1);
            std::vector<char*> argv;
            std::string bin = KVRUN_BINARY;
            argv.push_back(bin.data());
            for (auto& a : args) argv.push_back(a.data());
            argv.push_back(nullptr);
            execv(bin.c_str(), argv.data());
            _exit(127);
        }
    }
    ~Repl() {
        if (pid_ > 0) {
            kill(pid_, SIGKILL);
            waitpid(pid_, nullptr, 0);
        }
        if (fd_ >= 0) close(fd_);
    }
    // Read until `needle` appears after what was consumed; returns the text
    // before it and consumes through it.
    std::string until(const std::string& needle, int timeout_ms = 20000) {
        const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
        while (true) {
            const size_t at = buf_.find(needle);
            if (at != std::string::npos) {
                std::string before = buf_.substr(0, at);
                buf_.erase(0, at + needle.size());
                return before;
            }
            const int left = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                                  end - std::chrono::steady_clock::now())
                                                  .count());
            REQUIRE_MESSAGE(left > 0, "timed out waiting for '" << needle << "'; have: " << buf_);
            pollfd p{fd_, POLLIN, 0};
            if (poll(&p, 1, left) <= 0) continue;
            char b[4096];
            const ssize_t n = read(fd_, b, sizeof b);
            REQUIRE_MESSAGE(n > 0, "the REPL ended; output: " << buf_);
            buf_.append(b, n);
        }
    }
    void send(const std::string& s) {
        REQUIRE(write(fd_, s.data(), s.size()) == static_cast<ssize_t>(s.size()));
    }
    // A message and its answer (everything printed up to the next prompt).
    std::string say(const std::string& msg) {
        send(msg + "\n");
        until(msg + "\r\n"); // the terminal's echo
        std::string answer = until("\r\n> ");
        // Typed before libedit took the terminal, a line is echoed twice.
        while (answer.rfind(msg + "\r\n", 0) == 0) answer.erase(0, msg.size() + 2);
        return answer;
    }
    struct Stats {
        long reused, evaluated, generated, fill;
    };
    Stats stats() {
        const std::string s = say("/stats");
        std::smatch m;
        const std::regex re(
            R"(reused (\d+) tokens, evaluated (\d+), generated (\d+) \| cache (\d+)/)");
        REQUIRE_MESSAGE(std::regex_search(s, m, re), s);
        return {std::stol(m[1]), std::stol(m[2]), std::stol(m[3]), std::stol(m[4])};
    }
    // Everything printed until the REPL ends.
    std::string rest(int timeout_ms = 20000) {
        const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
        while (std::chrono::steady_clock::now() < end) {
            pollfd p{fd_, POLLIN, 0};
            if (poll(&p, 1, 100) <= 0) continue;
            char b[4096];
            const ssize_t n = read(fd_, b, sizeof b);
            if (n <= 0) break; // EIO: the other side closed
            buf_.append(b, n);
        }
        std::string all;
        all.swap(buf_);
        return all;
    }
    bool alive() const { return pid_ > 0 && waitpid(pid_, nullptr, WNOHANG) == 0; }
    // The exit status; a REPL still running after 30 s is killed (-1), so a
    // test that fails cannot hang the suite.
    int wait_exit() {
        int st = 0;
        for (int i = 0; i < 300 && waitpid(pid_, &st, WNOHANG) == 0; i++)
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
        if (waitpid(pid_, &st, WNOHANG) == 0) {
            kill(pid_, SIGKILL);
            waitpid(pid_, &st, 0);
            pid_ = -1;
            return -1;
        }
        pid_ = -1;
        return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    }
    // Reads until nothing has come for `quiet_ms`: the prompt is on screen
    // and libedit has the terminal in its own mode. A key typed while it
    // switches modes can be lost by the terminal (a real user's type-ahead
    // too), so keys that must arrive alone (Ctrl-D) wait for this.
    void settle(int quiet_ms = 300) {
        pollfd p{fd_, POLLIN, 0};
        while (poll(&p, 1, quiet_ms) > 0) {
            char b[4096];
            const ssize_t n = read(fd_, b, sizeof b);
            if (n <= 0) break;
            buf_.append(b, n);
        }
    }

  private:
    pid_t pid_ = -1;
    int fd_ = -1;
    std::string buf_;
};

// Tokens of a template piece as the session tokenizes it (no BOS).
long n_tokens(const std::string& text) {
    const auto r = kvtest::run_kvrun({"tokenize", "-m", kStories, "-p", text, "--json"});
    REQUIRE(r.status == 0);
    auto ids = nlohmann::json::parse(r.out);
    return static_cast<long>(ids.size()) - 1; // less the BOS tokenize adds
}

} // namespace

TEST_CASE("chat repl: later turns evaluate only new tokens; /undo equals a fresh history") {
    Repl a({"-n", "16"});
    a.until("> ");
    const std::string a1 = a.say("Hello");
    CHECK(!a1.empty());
    const auto s1 = a.stats();
    CHECK(s1.reused == 0);
    CHECK(s1.generated == 16);
    // On the CPU /stats has no GPU memory line (with -ngl it has one: gpu-check).
    CHECK(a.say("/stats").find("GPU") == std::string::npos);
    // Turn 2: everything cached is reused; evaluated are the last reply
    // token, the end-of-turn glue and the new message with its glue only.
    const std::string a2 = a.say("Tell me a story");
    const auto s2 = a.stats();
    CHECK(s2.reused == s1.fill);
    // The plain fallback's glue: "\n" ends the reply, then "User: ...\nAssistant:".
    CHECK(s2.evaluated == n_tokens("\n") + n_tokens("User: Tell me a story\nAssistant:"));
    CHECK(s2.fill == s2.reused + s2.evaluated + s2.generated);
    a.say("Where is the cat");
    const auto s3 = a.stats();
    CHECK(s3.reused == s2.fill);
    CHECK(s3.evaluated == n_tokens("\n") + n_tokens("User: Where is the cat\nAssistant:"));

    // /undo drops turn 3; the cache keeps turns 1-2 (no recompute).
    CHECK(a.say("/undo").find("[undone]") != std::string::npos);
    const std::string after_undo = a.say("Where is the dog");
    const auto s4 = a.stats();
    CHECK(s4.reused == s2.fill + n_tokens("\n")); // turns 1-2 and turn 2's end stayed cached
    CHECK(s4.evaluated == n_tokens("User: Where is the dog\nAssistant:"));

    Repl b({"-n", "16"});
    b.until("> ");
    CHECK(b.say("Hello") == a1);
    CHECK(b.say("Tell me a story") == a2);
    CHECK(b.say("Where is the dog") == after_undo);

    // /retry regenerates the last answer: greedy, so the same text, from the
    // cache (only the last prompt token is evaluated again).
    CHECK(a.say("/retry") == after_undo);
    CHECK(a.stats().evaluated == 1);
    a.send("/exit\n");
    CHECK(a.wait_exit() == 0);
}

TEST_CASE(
    "chat repl: Ctrl-C stops an answer and returns to the prompt; the cache stays consistent") {
    Repl r({"-n", "300"}, 20);
    r.until("> ");
    r.send("Hello\n");
    r.until("Hello\r\n");
    r.until(" "); // the answer is streaming
    r.send("\x03");
    r.until("[interrupted]");
    r.until("\r\n> ");
    const auto s = r.stats();
    CHECK(s.generated > 0);
    CHECK(s.generated < 300);
    // The next turn reuses the whole cache: what it holds is what the session thinks it holds.
    const std::string next = r.say("Tell me more");
    (void)next;
    const auto t = r.stats();
    CHECK(t.reused == s.fill);
    // Ctrl-C twice at an empty prompt leaves; the first one alone does not.
    r.send("\x03");
    r.until("(Ctrl-C again to exit)");
    CHECK(r.alive());
    r.send("\x03");
    CHECK(r.wait_exit() == 0);
}

// --deterministic: a turn's answer is the same whether the history before it
// sat in the cache from earlier turns, was evaluated in one batch from a
// loaded conversation (its cache file gone), or token by token on one thread.
TEST_CASE("chat repl: --deterministic answers do not depend on the history's path") {
    char dir[] = "/tmp/kvrun-det-chat-XXXXXX";
    REQUIRE(mkdtemp(dir) != nullptr);
    const std::string save = std::string(dir) + "/conv";
    Repl a({"-n", "24", "--deterministic"});
    a.until("> ");
    const std::string a1 = a.say("Hello");
    a.say("/save " + save);
    const std::string a2 = a.say("Tell me a story about a cat");
    const std::string a3 = a.say("What did the cat eat");
    CHECK(!a3.empty());

    Repl b({"-n", "24", "--deterministic", "-b", "1", "-t", "1"});
    b.until("> ");
    CHECK(b.say("Hello") == a1);
    CHECK(b.say("Tell me a story about a cat") == a2);
    CHECK(b.say("What did the cat eat") == a3);

    std::remove(save.c_str()); // the K/V file: /load evaluates the history afresh
    Repl c({"-n", "24", "--deterministic", "-b", "7"});
    c.until("> ");
    CHECK(c.say("/load " + save).find("loaded") != std::string::npos);
    CHECK(c.say("Tell me a story about a cat") == a2);
    CHECK(c.say("What did the cat eat") == a3);
    std::remove((save + ".json").c_str());
    rmdir(dir);
}

TEST_CASE("chat repl: non-ASCII text typed at the prompt reaches the model unchanged") {
    // LC_ALL=C: the worst case (no UTF-8 locale in the environment).
    for (const char* lc : {"C", "C.UTF-8"}) {
        CAPTURE(lc);
        Repl r({"-n", "4"}, 0, {{"LC_ALL", lc}});
        r.until("> ");
        const std::string msg = "h\xc3\xa9llo \xe6\x97\xa5\xe6\x9c\xac"; // héllo 日本
        r.say(msg);
        const std::string path = "chat_utf8_" + std::to_string(::getpid()) + "_" + lc;
        CHECK(r.say("/save " + path).find("[saved") != std::string::npos);
        std::ifstream in(path + ".json");
        REQUIRE(in);
        const auto j = nlohmann::json::parse(in);
        CHECK(j.at("turns").at(0).at("user").get<std::string>() == msg);
        std::remove(path.c_str());
        std::remove((path + ".json").c_str());
        r.send("/exit\n");
        CHECK(r.wait_exit() == 0);
    }
}

TEST_CASE("chat repl: Ollama's habits: the -p message in the transcript, \"\"\" blocks, /?, "
          "/clear, /bye") {
    char tmpl[] = "/tmp/kvrun-repl-XXXXXX";
    const std::string dir = mkdtemp(tmpl);
    Repl r({"-n", "4", "-p", "Hello there"});
    // The first message is shown as if typed, before its answer.
    r.until("> Hello there\r\n");
    r.until("\r\n> ");
    r.settle();
    // A """ block is one message, its lines kept.
    r.send("\"\"\"first line\n");
    r.until(". ");
    r.send("second line\n");
    r.until(". ");
    r.send("end\"\"\"\n");
    r.until("\r\n> ");
    const std::string save = dir + "/s";
    r.say("/save " + save);
    const auto j = nlohmann::json::parse(std::ifstream(save + ".json"));
    REQUIRE(j.at("turns").size() == 2);
    CHECK(j["turns"][0]["user"] == "Hello there");
    CHECK(j["turns"][1]["user"] == "first line\nsecond line\nend");
    CHECK(r.say("/?").find("/bye") != std::string::npos);
    CHECK(r.say("/clear").find("[conversation cleared]") != std::string::npos);
    CHECK(r.stats().fill < 10); // the turns are gone (BOS and glue may stay)
    r.send("/bye\n");
    CHECK(r.wait_exit() == 0);
    std::filesystem::remove_all(dir);
}

TEST_CASE("chat repl: Ollama's /set parameter and /set system work; the rest says what kvrun has") {
    Repl r({"-n", "8", "--temp", "0"});
    r.until("> ");
    const std::string greedy = r.say("Hello");
    // The reply length of the next answers (-n).
    CHECK(r.say("/set parameter num_predict 3").find("[num_predict 3 (-n)]") != std::string::npos);
    r.say("Tell me a story");
    CHECK(r.stats().generated == 3);
    CHECK(r.say("/set parameter num_predict 8").find("[num_predict 8") != std::string::npos);
    r.say("/undo");
    // Sampling: a seed set again gives the same draw; temperature 0 is greedy again.
    CHECK(r.say("/set parameter temperature 2").find("[temperature 2]") != std::string::npos);
    r.say("/set parameter seed 7");
    const std::string hot = r.say("/retry");
    r.say("/set parameter seed 7");
    CHECK(r.say("/retry") == hot);
    CHECK(hot != greedy); // 8 tokens drawn at temperature 2 (top-k 40) are not the argmax's
    r.say("/set parameter temperature 0");
    CHECK(r.say("/retry") == greedy);
    // Refused with what kvrun has, the session unchanged.
    CHECK(r.say("/set parameter temperature hot").find("expected a number") != std::string::npos);
    CHECK(r.say("/set parameter num_ctx 4096").find("-c N") != std::string::npos);
    CHECK(r.say("/set parameter mirostat 2").find("unknown parameter mirostat") !=
          std::string::npos);
    CHECK(r.say("/set verbose").find("/set verbose is not supported here") != std::string::npos);
    CHECK(r.say("/retry") == greedy);
    CHECK(r.say("/set parameter seed 1e3").find("expected a whole number") != std::string::npos);
    // /set system is /system.
    CHECK(r.say("/set system You are a cat.").find("[system prompt set]") != std::string::npos);
    CHECK(r.say("/system").find("[system] You are a cat.") != std::string::npos);
    r.send("/bye\n");
    CHECK(r.wait_exit() == 0);
    // With a draft model, greedy then sampled: the drafter samples with the
    // new settings (it kept the greedy ones and the verification aborted).
    Repl d({"-n", "24", "--temp", "0", "--draft-model", kStories});
    d.until("> ");
    CHECK(!d.say("Hello").empty());
    d.say("/set parameter temperature 0.8");
    CHECK(!d.say("Tell me a story").empty());
    CHECK(d.stats().generated == 24);
    d.send("/bye\n");
    CHECK(d.wait_exit() == 0);
}

TEST_CASE("run: -f - on a terminal says it is reading, then reads to Ctrl-D") {
    Repl r({"-m", kStories, "-f", "-", "-n", "3", "--temp", "0"}, 0, {}, false);
    r.until("reading the prompt from the terminal");
    r.settle();
    r.send("Once upon a time\n");
    r.settle();
    r.send("\x04");
    const std::string rest = r.rest();
    CHECK(rest.find("[kvrun] prompt") != std::string::npos);
    CHECK(r.wait_exit() == 0);
}

TEST_CASE("run: Ctrl-C during a long prompt stops it and the stats say how far it got") {
    Repl r({"-m", kStories, "-f", kvtest::shared("text/stories260K-samples.txt"), "-n", "4",
            "--temp", "0", "-b", "8", "-c", "32768"},
           0, {}, false);
    r.until("[kvrun] prompt 8"); // the progress line: a few batches in
    r.send("\x03");
    const std::string rest = r.rest();
    std::smatch m;
    REQUIRE_MESSAGE(
        std::regex_search(rest, m, std::regex(R"(prompt (\d+)/(\d+) tok \(interrupted\))")), rest);
    CHECK(std::stol(m[1]) > 0);
    CHECK(std::stol(m[1]) < std::stol(m[2]));
    CHECK(rest.find("stop: interrupted") != std::string::npos);
    CHECK(r.wait_exit() == 130);
}

TEST_CASE("chat repl: leaving with Ctrl-D or Ctrl-C twice ends the line") {
    {
        Repl r({"-n", "4"});
        r.until("> ");
        r.say("Hello");
        r.settle();
        r.send("\x04");
        CHECK(r.rest().find('\n') != std::string::npos);
        CHECK(r.wait_exit() == 0);
    }
    {
        Repl r({"-n", "4"});
        r.until("> ");
        r.say("Hello"); // libedit has the terminal by now
        r.send("\x03");
        r.until("(Ctrl-C again to exit)");
        r.until("> ");
        r.settle();
        r.send("\x03");
        CHECK(r.rest().find('\n') != std::string::npos);
        CHECK(r.wait_exit() == 0);
    }
}

TEST_CASE(
    "chat repl: a full window evicts turns in place, says so each time, and goes down to half") {
    Repl r({"-n", "24", "-c", "160", "-v"});
    r.until("> ");
    const char* msgs[] = {"Tell me about the cat", "Where did the dog go", "What is the sun",
                          "Who is the girl",       "Why is the sky blue",  "What did the boy eat",
                          "Where is the park",     "Tell me a story",      "What is a tree"};
    long evicted_before = 0;
    int evictions = 0, moved = 0;
    bool evicted_last = false;
    for (const char* m : msgs) {
        const std::string answer = r.say(m);
        const std::string st = r.say("/stats");
        std::smatch sm;
        REQUIRE(std::regex_search(st, sm, std::regex(R"(turns (\d+) \((\d+) evicted\))")));
        const long evicted = std::stol(sm[2]);
        const auto s = r.stats();
        const bool evicts = evicted > evicted_before;
        // The notice on every eviction, naming what went.
        CHECK((answer.find("the context is full (-c 160): dropped the") != std::string::npos) ==
              evicts);
        if (evicts) {
            evictions++;
            // Moved, not evaluated again: this turn evaluated its own text
            // only (at most: the glue of the last, evicted reply is not).
            moved += answer.find("cached tokens moved down") != std::string::npos;
            CHECK(s.evaluated <=
                  n_tokens("\n") + n_tokens(std::string("User: ") + m + "\nAssistant:"));
            CHECK(s.fill <= 80 + 24);
            CHECK_FALSE(evicted_last); // down to half: the next turn has room
        }
        evicted_last = evicts;
        evicted_before = evicted;
    }
    CHECK(evictions >= 2);
    CHECK(moved >= 1);
    r.send("/exit\n");
    CHECK(r.wait_exit() == 0);
}

TEST_CASE("chat: an answer cut by a full window or by -n says so") {
    // One-shot (stdin not a terminal): the window fills during the answer.
    const std::string none;
    const auto full = kvtest::run_kvrun(
        {"chat", "-m", kStories, "--temp", "0", "-c", "40", "-p", "Once upon a time"}, &none);
    CHECK(full.status == 0);
    CHECK(full.err.find("kvrun: stopped at a full context (40 tokens, -c)") != std::string::npos);
    // The REPL marks -n.
    Repl r({"-n", "5"});
    r.until("> ");
    CHECK(r.say("Hello").find("[answer cut at -n 5 tokens]") != std::string::npos);
}

TEST_CASE("chat repl: --lookup and --draft-model answers are the plain ones, through evictions; "
          "/stats counts drafts") {
    // -c 160 and 60-token answers: the window fills and turns are evicted.
    Repl plain({"-c", "160", "-n", "60"});
    Repl lookup({"-c", "160", "-n", "60", "--lookup", "6"});
    Repl draft({"-c", "160", "-n", "60", "-md", kStories});
    plain.until("> ");
    lookup.until("> ");
    draft.until("> ");
    for (const char* msg :
         {"Hello", "Tell me a story", "What happened next?", "And then?", "The end"}) {
        CAPTURE(msg);
        const std::string want = plain.say(msg);
        CHECK(lookup.say(msg) == want);
        CHECK(draft.say(msg) == want);
    }
    // Turns were evicted (the window filled), the same ones in each.
    const std::string st = lookup.say("/stats");
    std::smatch m;
    REQUIRE(std::regex_search(st, m, std::regex(R"(\((\d+) evicted\))")));
    CHECK(std::stol(m[1]) > 0);
    CHECK(st.find(m[0].str()) != std::string::npos);
    CHECK(plain.say("/stats").find(m[0].str()) != std::string::npos);
    CHECK(st.find("[stats] session | lookup: ") != std::string::npos);
    CHECK(draft.say("/stats").find("[stats] session | draft model stories260K.gguf: ") !=
          std::string::npos);
}

TEST_CASE("chat repl: /grammar sets what the next answers follow (GBNF or a JSON schema); off lifts it") {
    Repl r({"-n", "60", "--temp", "1.0", "--seed", "5"});
    r.until("> ");
    CHECK(r.say("/grammar").find("[no grammar]") != std::string::npos);
    CHECK(r.say(R"(/grammar root ::= ("yes" | "no") "!")").find("[the answers follow the grammar]") !=
          std::string::npos);
    for (int i = 0; i < 3; i++) {
        const std::string a = r.say("Hello");
        CHECK((a.find("yes!") != std::string::npos || a.find("no!") != std::string::npos));
    }
    CHECK(r.say(R"(/grammar {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["n"], "additionalProperties": false})")
              .find("[the answers follow the JSON schema]") != std::string::npos);
    const std::string j = r.say("Hello");
    CAPTURE(j);
    const auto doc = nlohmann::json::parse(j.substr(0, j.rfind('}') + 1));
    CHECK(doc["n"].is_number_integer());
    CHECK(r.say("/grammar root ::= x").find("rule 'x' is not defined; unchanged]") != std::string::npos);
    CHECK(r.say("/grammar").find("JSON schema") != std::string::npos);
    CHECK(r.say("/grammar off").find("[no grammar]") != std::string::npos);
    CHECK(r.say("Hello").find('{') == std::string::npos);
    r.send("/bye\n");
    CHECK(r.wait_exit() == 0);
}
