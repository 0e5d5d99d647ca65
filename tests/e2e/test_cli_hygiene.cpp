// The command line's contract with a shell user: parse errors as one line
// with status 2, llama.cpp's spellings, a repeated option's last value,
// --version, NaN refused, seeds, --keep, stdin read only when asked or when
// it is the only prompt, a default run that ends, write errors on stdout,
// SIGPIPE and SIGINT statuses, and the small print of the stats line.
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <unistd.h>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "ggml-like/cpu/openblas.h"
#include "ggml-like/kernels.h"
#include "test_util.h"

using nlohmann::json;

namespace {

const std::string kStories = kvtest::shared("models/stories260K.gguf");
const std::string kText = kvtest::shared("text/stories260K-samples.txt");
const std::string kPrompt = "Once upon a time";

bool contains(const std::string& s, const std::string& n) {
    return s.find(n) != std::string::npos;
}
bool starts_with(const std::string& s, const std::string& p) {
    return s.rfind(p, 0) == 0;
}

std::string describe(const kvtest::RunResult& r) {
    return "status " + std::to_string(r.status) + "\n--- stdout:\n" + r.out.substr(0, 2000) +
           "\n--- stderr:\n" + r.err.substr(0, 2000);
}

kvtest::RunResult run(std::vector<std::string> args, const std::string* input = nullptr) {
    return kvtest::run_kvrun(args, input);
}

// A bash command line with $K (the binary) and $S (stories260K) set.
kvtest::RunResult sh(const std::string& script) {
    const std::string prelude =
        "K='" + std::string(KVRUN_BINARY) + "'; S='" + kStories + "'; T='" + kText + "'; ";
    return kvtest::run_binary("/bin/bash", {"-c", prelude + script});
}

// Status 2, nothing on stdout, one line `kvrun: error: ...`; the line.
std::string usage_line(const kvtest::RunResult& r) {
    INFO(describe(r));
    CHECK(r.status == 2);
    CHECK(r.out.empty());
    const auto lines = kvtest::lines(r.err);
    REQUIRE(lines.size() == 1);
    CHECK(starts_with(lines[0], "kvrun: error: "));
    return lines[0];
}

json run_json(std::vector<std::string> args) {
    args.insert(args.end(), {"--json", "-t", "1"});
    const auto r = run(args);
    INFO(describe(r));
    REQUIRE(r.status == 0);
    return json::parse(r.out);
}

} // namespace

TEST_CASE("cli args: every parse error is one line ending in (see --help), status 2") {
    const std::vector<std::vector<std::string>> cases = {
        {"-p", kPrompt},                                    // no -m
        {"-m", kStories, "-p", kPrompt, "--frobnicate"},    // unknown flag
        {"-m", kStories, "-p", kPrompt, "-n"},              // missing value
        {"tokenize", "-m", kStories, "-p", "x", "--bogus"}, // a subcommand's
        {"info"},
        {"bench", "-m", kStories, "-r", "x"},
    };
    for (const auto& a : cases) {
        CAPTURE(a.back());
        CHECK(contains(usage_line(run(a)), "--help)"));
    }
    // Text is "not a number", not "not in range".
    const std::string temp = usage_line(run({"-m", kStories, "-p", kPrompt, "--temp", "abc"}));
    CHECK(contains(temp, "--temp"));
    CHECK(contains(temp, "is not a number"));
    CHECK(contains(usage_line(run({"-m", kStories, "-p", kPrompt, "-n", "abc"})),
                   "is not a whole number"));
    CHECK(contains(usage_line(run({"-m", kStories, "-p", kPrompt, "-n"})),
                   "--n-predict needs a value"));
    CHECK(contains(usage_line(run({"-m", kStories})), "give a prompt")); // kvrun's own errors too
}

TEST_CASE("cli args: NaN and infinities are refused for every float option; --repeat-penalty > 0") {
    for (const char* opt : {"--temp", "--top-p", "--min-p", "--repeat-penalty"})
        for (const char* v : {"nan", "NaN", "-nan", "inf", "-inf", "1e999"}) {
            CAPTURE(opt);
            CAPTURE(v);
            const std::string line = usage_line(run({"-m", kStories, "-p", kPrompt, opt, v}));
            CHECK(contains(line, opt));
        }
    CHECK(contains(usage_line(run({"-m", kStories, "-p", kPrompt, "--repeat-penalty", "0"})),
                   "--repeat-penalty"));
    CHECK(run({"-m", kStories, "-p", kPrompt, "-n", "2", "--repeat-penalty", "0.5", "--quiet"})
              .status == 0);
    CHECK(
        contains(usage_line(run({"chat", "-m", kStories, "-p", "x", "--temp", "nan"})), "--temp"));
}

TEST_CASE("cli args: a repeated option takes its last value; --stop keeps collecting") {
    const json j = run_json(
        {"-m", kStories, "-p", kPrompt, "-n", "5", "-n", "12", "--temp", "0.9", "--temp", "0"});
    CHECK(j["tokens"]["generated"] == 12);
    const json greedy = run_json({"-m", kStories, "-p", kPrompt, "-n", "12", "--temp", "0"});
    CHECK(j["text"] == greedy["text"]);
    const std::string text = greedy["text"];
    REQUIRE(contains(text, "girl"));
    const json stopped = run_json({"-m", kStories, "-p", kPrompt, "-n", "12", "--temp", "0",
                                   "--stop", "zzz", "--stop", "girl"});
    CHECK(stopped["stop_string"] == "girl");
    CHECK(stopped["text"] == text.substr(0, text.find("girl")));
}

TEST_CASE("cli args: llama.cpp's multi-letter flags are aliases, not clusters of short options") {
    const std::vector<std::string> base = {"-m", kStories, "-p", kPrompt, "-n", "8", "--temp", "0"};
    auto with = [&](std::vector<std::string> extra) {
        std::vector<std::string> a = base;
        a.insert(a.end(), extra.begin(), extra.end());
        return run_json(a);
    };
    const json plain = with({});
    // -ctk / -ctv set the cache types.
    const json q8 = with({"-ctk", "q8_0", "-ctv", "q4_0"});
    CHECK(q8["cache"]["type_k"] == "q8_0");
    CHECK(q8["cache"]["type_v"] == "q4_0");
    // Accepted and without effect: -fa (attention is always fused), its
    // on/off value, -co, -no-cnv.
    for (std::vector<std::string> x : {std::vector<std::string>{"-fa"},
                                       {"-fa", "on"},
                                       {"--flash-attn", "off"},
                                       {"-co"},
                                       {"--color"},
                                       {"-no-cnv"}}) {
        CAPTURE(x[0]);
        CHECK(with(x)["text"] == plain["text"]);
    }
    // -r is --stop, -s is --seed, -sys is --system, -e processes escapes.
    const std::string text = plain["text"];
    REQUIRE(contains(text, "girl"));
    CHECK(with({"-r", "girl"})["stop_string"] == "girl");
    CHECK(run_json({"-m", kStories, "-p", kPrompt, "-n", "8", "-s", "7"})["seed"] == 7);
    const json sys =
        run_json({"-m", kStories, "-p", "Hi", "-n", "1", "--chat", "-sys", "Be brief."});
    const json system =
        run_json({"-m", kStories, "-p", "Hi", "-n", "1", "--chat", "--system", "Be brief."});
    const json none = run_json({"-m", kStories, "-p", "Hi", "-n", "1", "--chat"});
    CHECK(sys["tokens"]["prompt"] == system["tokens"]["prompt"]);
    CHECK(sys["tokens"]["prompt"] != none["tokens"]["prompt"]);
    // -md is --draft-model: the file it names is opened as a model.
    const auto md = run({"-m", kStories, "-p", kPrompt, "-md", "draft.gguf"});
    CHECK(md.status == 3);
    CHECK(contains(md.err, "cannot open model 'draft.gguf'"));
    // Not supported: said so.
    CHECK(contains(usage_line(run({"-m", kStories, "-p", kPrompt, "-nkvo"})), "-nkvo"));
    // Unknown words: named, with the long option when there is one.
    CHECK(contains(usage_line(run({"-m", kStories, "-p", kPrompt, "-verbose"})),
                   "unknown option -verbose (did you mean --verbose?)"));
    CHECK(
        contains(usage_line(run({"-m", kStories, "-p", kPrompt, "-xyz"})), "unknown option -xyz"));
    // A prompt that starts with a dash is a value, not an option.
    CHECK(run({"-m", kStories, "-p", "-xyz", "-n", "2", "--quiet"}).status == 0);
    // Short options with their value attached still work.
    CHECK(run_json({"-m", kStories, "-p", kPrompt, "-n3"})["tokens"]["generated"] == 3);
    // -dev is --device.
    CHECK(
        contains(usage_line(run({"-m", kStories, "-p", kPrompt, "-dev", "tpu"})), "--device tpu"));
    CHECK(with({"-dev", "cpu"})["text"] == plain["text"]);
    // bench's own -r (repetitions) is not --stop.
    CHECK(run({"bench", "-m", kStories, "-p", "8", "-n", "0", "-r", "1", "-t", "1"}).status == 0);
    // -cnv is the chat REPL, like -i: with no terminal and no message, status 2.
    CHECK(run({"-m", kStories, "-cnv"}).status == 2);
}

TEST_CASE("cli args: llama.cpp options kvrun lacks are unknown options, named with the nearest "
          "flag; extra words keep their order; an unknown first word is an unknown subcommand") {
    const std::vector<std::string> base = {"-m", kStories, "-p", kPrompt, "-n", "2"};
    auto line = [&](std::vector<std::string> extra) {
        std::vector<std::string> a = base;
        a.insert(a.end(), extra.begin(), extra.end());
        return usage_line(run(a));
    };
    struct Case {
        std::vector<std::string> args;
        std::string says;
    };
    const std::vector<Case> cases = {
        {{"--ubatch-size", "16"}, "unknown option --ubatch-size (did you mean --batch-size?)"},
        {{"--top_k", "5"}, "unknown option --top_k (did you mean --top-k?)"},
        {{"--presence-penalty", "0.5"}, "unknown option --presence-penalty ("},
        {{"--mirostat", "2"}, "unknown option --mirostat ("},
        {{"--log-verbosity", "0"}, "unknown option --log-verbosity ("},
        {{"--frobnicate=3"}, "unknown option --frobnicate ("},
        {{"-top-k", "3"}, "unknown option -top-k (did you mean --top-k?)"},
        {{"--lora", "x.gguf"}, "--lora: LoRA adapters are not supported"},
        {{"extra", "words"}, "unexpected arguments 'extra' 'words' (a prompt goes after -p"},
    };
    for (const Case& c : cases) {
        CAPTURE(c.args[0]);
        const std::string l = line(c.args);
        CHECK(contains(l, c.says));
        if (c.args.size() > 1 && c.args[0].rfind("--", 0) == 0)
            CHECK(!contains(l, "unexpected argument " + c.args[1]));
    }
    // The same in a subcommand.
    CHECK(contains(usage_line(run({"chat", "-m", kStories, "-p", "x", "--n-predikt", "4"})),
                   "unknown option --n-predikt (did you mean --n-predict?)"));
    // llama-cli flags that ask for what kvrun does anyway: accepted.
    const json plain = run_json({"-m", kStories, "-p", kPrompt, "-n", "4", "--temp", "0"});
    for (std::vector<std::string> x : {std::vector<std::string>{"-fa", "1"},
                                       {"-fa", "0"},
                                       {"--mlock"},
                                       {"--no-mmap"},
                                       {"--no-warmup"}}) {
        CAPTURE(x[0]);
        std::vector<std::string> a = {"-m", kStories, "-p", kPrompt, "-n", "4", "--temp", "0"};
        a.insert(a.end(), x.begin(), x.end());
        CHECK(run_json(a)["text"] == plain["text"]);
    }
    // -fa with a value it does not take names -fa's values (it was "unexpected
    // argument '2' (a prompt goes after -p ...)").
    const std::string fa = usage_line(run({"-m", kStories, "-p", kPrompt, "-fa", "2"}));
    CHECK(contains(fa, "-fa 2: expected on, off or auto (or 1, 0)"));
    CHECK(!contains(fa, "-p"));
    // --ctk's error lists auto where auto is taken (run, chat), not elsewhere (bench).
    CHECK(contains(usage_line(run({"-m", kStories, "-p", kPrompt, "--ctk", "q5"})),
                   "(use auto, f32, f16"));
    CHECK(contains(usage_line(run({"bench", "-m", kStories, "--ctk", "q5"})), "(use f32, f16"));
    // -t above the CPUs this process may use: one warning.
    const auto many = run({"-m", kStories, "-p", kPrompt, "-n", "2", "-t", "1000", "--quiet"});
    CHECK(many.status == 0);
    CHECK(many.err.find("kvrun: warning: -t 1000 is more threads than the ") == 0);
    CHECK(kvtest::lines(many.err).size() == 1);
    CHECK(run({"-m", kStories, "-p", kPrompt, "-n", "2", "-t", "1", "--quiet"}).err.empty());
    // Subcommands kvrun lacks.
    for (const char* sub : {"pull", "list", "push"}) {
        CAPTURE(sub);
        const std::string l = usage_line(run({sub, "-m", kStories}));
        CHECK(contains(l, std::string("unknown subcommand '") + sub + "' (subcommands: "));
        CHECK(contains(l, "chat"));
    }
    CHECK(contains(usage_line(run({"model.gguf"})), "give the model with -m"));
    // run is the plain run by name, and documented.
    CHECK(run({"run", "-m", kStories, "-p", kPrompt, "-n", "2", "--quiet"}).status == 0);
    const std::string help = run({"--help"}).out;
    CHECK(contains(help, "run is this one, by name"));
    // --help lists auto for the cache types and the llama-cli spellings.
    CHECK(contains(help, "q4_0, or auto"));
    CHECK(contains(help, "-ngl = --n-gpu-layers"));
    CHECK(contains(help, "-md = --draft-model"));
    CHECK(contains(help, "Accepted, no effect: -fa"));
    for (const std::string& l : kvtest::lines(help)) CHECK(l.size() <= 250);
    CHECK(contains(run({"chat", "--help"}).out, "-sys = --system"));
}

TEST_CASE("cli args: --version prints the version and the build, without -m") {
    for (std::vector<std::string> a :
         {std::vector<std::string>{"--version"}, {"tokenize", "--version"}}) {
        const auto r = run(a);
        INFO(describe(r));
        CHECK(r.status == 0);
        CHECK(starts_with(r.out, "kvrun "));
        CHECK(contains(r.out, "kernels"));
        CHECK(kvtest::lines(r.out).size() == 1);
        CHECK(r.err.empty());
    }
    CHECK(contains(run({"--help"}).out, "bench")); // the subcommand list names bench
}

TEST_CASE("cli kernels: OpenBLAS runs kernels chosen for this CPU, and --version, info and bench "
          "say which") {
    // What OpenBLAS does on its own here is this library's business (on a CPU
    // newer than it, the generic Prescott kernels): kvrun names the core
    // before the library loads, unless the user did.
    const std::string blas = gl::openblas::describe();
    if (contains(blas, "not found") || contains(blas, "without OpenBLAS")) {
        MESSAGE("skipped: " << blas);
        return;
    }
    const char* core = gl::openblas::core_for_this_cpu();
    const auto mine = sh("env -u OPENBLAS_CORETYPE \"$K\" --version");
    INFO(describe(mine));
    if (core) {
        CHECK(contains(mine.out, fmt::format("{} kernels chosen by kvrun for", core)));
        // OpenBLAS takes the types without an integer GEMM (F16 among them).
        CHECK(contains(mine.out, "openblas"));
    } else {
        CHECK(contains(mine.out, "kernels chosen by the library"));
    }
    // The user's choice stands, and is named as theirs.
    const auto theirs = sh("OPENBLAS_CORETYPE=Haswell \"$K\" --version");
    CHECK(contains(theirs.out, "Haswell kernels from $OPENBLAS_CORETYPE"));
    const auto info = sh("env -u OPENBLAS_CORETYPE \"$K\" info -m \"$S\"");
    CHECK(contains(info.out, "\nkernels:      " + std::string(gl::cpu::isa_name())));
    if (core) CHECK(contains(info.out, fmt::format("{} kernels chosen by kvrun for", core)));
    const auto bench = sh("env -u OPENBLAS_CORETYPE \"$K\" bench -m \"$S\" -p 16 -n 0 -r 1 -t 1");
    if (core) CHECK(contains(bench.err, fmt::format("{} kernels chosen by kvrun for", core)));
#if defined(__x86_64__)
    // The kernel table kvrun picked and the core it asks OpenBLAS for agree.
    if (std::string(gl::cpu::isa_name()) == "avx512") CHECK(core == std::string("SkylakeX"));
    if (std::string(gl::cpu::isa_name()) == "avx2") CHECK(core != nullptr);
#endif
}

TEST_CASE("cli args: --seed -1 is random and reported; other negative or huge seeds are refused") {
    const json a = run_json({"-m", kStories, "-p", kPrompt, "-n", "4", "--seed", "-1"});
    const json b = run_json({"-m", kStories, "-p", kPrompt, "-n", "4", "--seed", "-1"});
    CHECK(a["seed"] != b["seed"]); // 2^-32 odds of a false failure
    // The reported seed repeats the run.
    const json again = run_json({"-m", kStories, "-p", kPrompt, "-n", "4", "--seed",
                                 std::to_string(a["seed"].get<uint64_t>())});
    CHECK(again["text"] == a["text"]);
    CHECK(run_json({"-m", kStories, "-p", kPrompt, "-n", "1", "--seed",
                    "18446744073709551615"})["seed"] == 18446744073709551615ull);
    for (const char* bad : {"-2", "18446744073709551616", "-99999999999999999999", "1.5", "x"})
        CHECK(contains(usage_line(run({"-m", kStories, "-p", kPrompt, "--seed", bad})), "--seed"));
    const auto v = run({"-m", kStories, "-p", kPrompt, "-n", "1", "--seed", "-1", "-v"});
    CHECK(contains(v.err, "seed "));
}

TEST_CASE("cli args: --keep at or above -c is refused; a keep that leaves little to slide warns") {
    for (const char* k : {"64", "300"}) {
        const std::string line =
            usage_line(run({"-m", kStories, "-p", kPrompt, "-c", "64", "--keep", k}));
        CHECK(contains(line, "--keep"));
        CHECK(contains(line, "64"));
    }
    const auto w =
        run({"-m", kStories, "-p", kPrompt, "-c", "64", "--keep", "60", "-n", "2", "--temp", "0"});
    INFO(describe(w));
    CHECK(w.status == 0);
    CHECK(contains(w.err, "warning: --keep 60"));
    const auto ok =
        run({"-m", kStories, "-p", kPrompt, "-c", "64", "--keep", "8", "-n", "2", "--temp", "0"});
    CHECK(!contains(ok.err, "warning"));
}

TEST_CASE("cli args: --system with --system-file is a usage error") {
    const std::string file = "/tmp/kvrun_sysfile_" + std::to_string(::getpid());
    sh("printf 'Be brief.' > " + file);
    CHECK(contains(usage_line(run({"-m", kStories, "--chat", "--system", "x", "--system-file", file,
                                   "-p", "Hi"})),
                   "use one"));
    CHECK(contains(usage_line(run({"chat", "-m", kStories, "--system-file", file, "--system", "x",
                                   "-p", "Hi"})),
                   "use one"));
    std::remove(file.c_str());
}

TEST_CASE("cli output: -n 0 and no sampled token report no first-token time and no rate") {
    const json j = run_json({"-m", kStories, "-p", kPrompt, "-n", "0"});
    CHECK(j["timings"]["first_token_ms"].is_null());
    CHECK(j["timings"]["generation_tok_s"].is_null());
    const auto r = run({"-m", kStories, "-p", kPrompt, "-n", "0"});
    INFO(describe(r));
    CHECK(r.status == 0);
    CHECK(contains(r.err, "generated 0 tok |"));
    CHECK(!contains(r.err, "first token"));
    CHECK(!contains(r.err, "-1000"));
}

TEST_CASE("cli output: the stats line and -v name both cache types when they differ") {
    const auto r =
        run({"-m", kStories, "-p", kPrompt, "-n", "2", "--ctk", "q8_0", "--ctv", "q4_0", "-v"});
    INFO(describe(r));
    CHECK(r.status == 0);
    CHECK(contains(r.err, "(q8_0/q4_0)"));
    CHECK(contains(r.err, "per token, q8_0/q4_0)"));
    // Rotated keys are named with both types, in -v and the stats line (4-bit values
    // rotated with them).
    const auto rot = run({"-m", kStories, "-p", kPrompt, "-n", "2", "--ctk", "q4_0", "--ctv",
                          "q4_0", "--k-rotate", "-v"});
    CHECK(rot.status == 0);
    CHECK(contains(rot.err, "per token, q4_0/q4_0, keys and values rotated)"));
    CHECK(contains(rot.err, "(q4_0/q4_0, keys and values rotated)"));
    // The stats line is not preceded by an empty line when stdout is not the terminal.
    const auto s = run({"-m", kStories, "-p", kPrompt, "-n", "2"});
    CHECK(starts_with(s.err, "[kvrun]"));
    // One prompt token is "1 token".
    const auto one = run({"-m", kStories, "-p", "", "-n", "1", "-v"});
    CHECK(contains(one.err, "prompt 1 token,"));
}

TEST_CASE("cli output: info gives quantized KV types' bytes per element with their fraction") {
    const auto r = run({"info", "-m", kStories, "--ctk", "q8_0", "--ctv", "q4_0"});
    INFO(describe(r));
    REQUIRE(r.status == 0);
    // 5 layers x 4 KV heads x 8 dims x (34/32 + 18/32) = 260 bytes.
    CHECK(contains(
        r.out, "KV per token: 260 B = 5 layers × 4 KV heads × 8 dims × (1.0625 + 0.5625 bytes)"));
    // --k-rotate: the same bytes, and the block of the rotation (the heads are 8 wide).
    const auto rot = run({"info", "-m", kStories, "--ctk", "q4_0", "--ctv", "q4_0", "--k-rotate"});
    CHECK(contains(
        rot.out,
        "(0.5625 + 0.5625 bytes) (q4_0/q4_0, keys and values rotated in Hadamard blocks of 8)"));
}

TEST_CASE(
    "cli output: --echo with --chat prints what the model reads; with --json, inside the object") {
    const auto chat =
        run({"-m", kStories, "--chat", "-p", "Hi", "-n", "6", "--temp", "0", "--quiet"});
    const auto echo =
        run({"-m", kStories, "--chat", "-p", "Hi", "-n", "6", "--temp", "0", "--quiet", "--echo"});
    INFO(describe(echo));
    REQUIRE(echo.status == 0);
    REQUIRE(echo.out.size() > chat.out.size());
    const std::string rendered = echo.out.substr(0, echo.out.size() - chat.out.size());
    CHECK(echo.out.substr(rendered.size()) == chat.out);
    CHECK(contains(rendered, "Hi"));
    CHECK(rendered != "Hi"); // the template's turn markers too
    const json j = run_json({"-m", kStories, "-p", kPrompt, "-n", "4", "--temp", "0", "--echo"});
    CHECK(j["prompt"] == kPrompt);
    const json c =
        run_json({"-m", kStories, "--chat", "-p", "Hi", "-n", "4", "--temp", "0", "--echo"});
    CHECK(c["prompt"] == rendered);
}

TEST_CASE("cli output: -c above the model's trained context warns once") {
    const auto r = run({"-m", kStories, "-p", kPrompt, "-c", "4096", "-n", "2", "--quiet"});
    INFO(describe(r));
    CHECK(r.status == 0);
    const auto lines = kvtest::lines(r.err);
    REQUIRE(lines.size() == 1);
    CHECK(contains(lines[0], "trained context of 2048"));
    CHECK(run({"-m", kStories, "-p", kPrompt, "-c", "2048", "-n", "2", "--quiet"}).err.empty());
}

TEST_CASE("cli stdin: read with -f - or as the only prompt; never behind -p") {
    // An open pipe that sends nothing: -p does not wait for it. (The idle
    // writer's stderr goes elsewhere: it would hold the harness's pipe open.)
    const auto idle = sh("timeout 20 \"$K\" -m \"$S\" -p 'Once upon a time' -n 3 --temp 0 --quiet "
                         "< <(sleep 40 2>/dev/null); echo \" rc=$?\"");
    INFO(describe(idle));
    CHECK(contains(idle.out, " rc=0"));
    const auto chat_idle = sh("timeout 20 \"$K\" chat -m \"$S\" -p Hello -n 3 --temp 0 < <(sleep "
                              "40 2>/dev/null) >/dev/null; echo \"rc=$?\"");
    CHECK(contains(chat_idle.out, "rc=0"));
    // A while-read loop keeps its input: one run per line.
    const auto loop = sh("printf 'Once upon a time\\nLily went to the park\\nThe dog barked\\n' | "
                         "while read -r line; do \"$K\" -m \"$S\" -p \"$line\" -n 3 --temp 0 "
                         "--quiet --echo; echo; done");
    INFO(describe(loop));
    const auto lines = kvtest::lines(loop.out);
    REQUIRE(lines.size() == 3);
    CHECK(starts_with(lines[0], "Once upon a time"));
    CHECK(starts_with(lines[1], "Lily went to the park"));
    CHECK(starts_with(lines[2], "The dog barked"));
    // stdin alone is the prompt; with -p it is left unread; -f - reads it after -p.
    const std::string doc = "The cat sat on the mat.";
    const auto alone = run({"-m", kStories, "-n", "8", "--temp", "0", "--quiet"}, &doc);
    CHECK(alone.out == run({"-m", kStories, "-p", doc, "-n", "8", "--temp", "0", "--quiet"}).out);
    const auto with_p =
        run({"-m", kStories, "-p", "Summarize:", "-n", "8", "--temp", "0", "--quiet"}, &doc);
    CHECK(with_p.out ==
          run({"-m", kStories, "-p", "Summarize:", "-n", "8", "--temp", "0", "--quiet"}).out);
    const auto dash = run(
        {"-m", kStories, "-p", "Summarize:", "-f", "-", "-n", "8", "--temp", "0", "--quiet"}, &doc);
    CHECK(
        dash.out ==
        run({"-m", kStories, "-p", "Summarize:\n" + doc, "-n", "8", "--temp", "0", "--quiet"}).out);
    // tokenize: the same rule.
    const auto tok = run({"tokenize", "-m", kStories}, &doc);
    CHECK(tok.status == 0);
    CHECK(tok.out == run({"tokenize", "-m", kStories, "-p", doc}).out);
    CHECK(run({"tokenize", "-m", kStories, "-p", "x"}, &doc).out ==
          run({"tokenize", "-m", kStories, "-p", "x"}).out);
}

TEST_CASE("cli stdin: a piped chat message loses the newline that ended its line") {
    const std::string line = "Hello there\n";
    const auto piped = run({"-m", kStories, "--chat", "-n", "4", "--temp", "0", "--json"}, &line);
    INFO(describe(piped));
    REQUIRE(piped.status == 0);
    const json typed =
        run_json({"-m", kStories, "--chat", "-p", "Hello there", "-n", "4", "--temp", "0"});
    CHECK(json::parse(piped.out)["tokens"]["prompt"] == typed["tokens"]["prompt"]);
    CHECK(json::parse(piped.out)["text"] == typed["text"]);
}

TEST_CASE("cli args: -e processes escapes in -p and --stop; without it they stay literal") {
    const json e =
        run_json({"-m", kStories, "-p", "Once upon a time\\nLily", "-e", "-n", "6", "--temp", "0"});
    const json real =
        run_json({"-m", kStories, "-p", "Once upon a time\nLily", "-n", "6", "--temp", "0"});
    const json literal =
        run_json({"-m", kStories, "-p", "Once upon a time\\nLily", "-n", "6", "--temp", "0"});
    CHECK(e["text"] == real["text"]);
    CHECK(e["tokens"]["prompt"] == real["tokens"]["prompt"]);
    CHECK(literal["tokens"]["prompt"] != real["tokens"]["prompt"]);
}

TEST_CASE("cli generation: the default -n -1 ends at a full context; -n N slides past it") {
    const json j =
        run_json({"-m", kStories, "-p", kPrompt, "-c", "64", "--temp", "0", "--ignore-eos"});
    CHECK(j["stop"] == "context full");
    CHECK(j["tokens"]["generated"].get<int>() <= 64);
    CHECK(j["tokens"]["generated"].get<int>() >= 64 - 5 - 1);
    const auto r = run({"-m", kStories, "-p", kPrompt, "-c", "64", "--temp", "0", "--ignore-eos"});
    INFO(describe(r));
    CHECK(r.status == 0);
    CHECK(contains(r.err, "stop: context full"));
    CHECK(contains(r.err, "-n N"));
    const json n = run_json(
        {"-m", kStories, "-p", kPrompt, "-c", "64", "-n", "150", "--temp", "0", "--ignore-eos"});
    CHECK(n["tokens"]["generated"] == 150);
    CHECK(n["stop"] == "length");
}

TEST_CASE(
    "cli output: a failed write on stdout is one error line and status 1 in every subcommand") {
    const std::vector<std::string> commands = {
        "\"$K\" -m \"$S\" -p 'Once upon a time' -n 20 --temp 0",
        "\"$K\" -m \"$S\" -p 'Once upon a time' -n 20 --temp 0 --json",
        "\"$K\" -m \"$S\" --chat -p Hi -n 20 --temp 0",
        "\"$K\" chat -m \"$S\" -p Hi -n 20 --temp 0",
        "\"$K\" tokenize -m \"$S\" -p 'Once upon a time'",
        "\"$K\" logits -m \"$S\" --tokens 1,2,3",
        "\"$K\" info -m \"$S\"",
        "\"$K\" perplexity -m \"$S\" -f \"$T\" -c 64 --chunks 1",
        "\"$K\" bench -m \"$S\" -p 8 -n 2 -r 1 -t 1",
    };
    for (const std::string& c : commands)
        for (const char* redirect : {" > /dev/full", " >&-"}) {
            CAPTURE(c);
            CAPTURE(redirect);
            const auto r = sh(c + redirect + " < /dev/null");
            INFO(describe(r));
            CHECK(r.status == 1);
            const auto lines = kvtest::lines(r.err);
            REQUIRE(!lines.empty());
            CHECK(lines.back().rfind("kvrun: error: cannot write to stdout", 0) == 0);
            CHECK(lines.size() <= 2); // bench's kernel line may come first
        }
}

TEST_CASE(
    "cli output: with SIGPIPE ignored by the parent, a closed pipe still ends kvrun quietly") {
    const std::vector<std::string> commands = {
        "\"$K\" -m \"$S\" -p 'Once upon a time' -n 100000 -c 64 --ignore-eos --temp 0",
        "\"$K\" tokenize -m \"$S\" -f \"$T\"",
        "\"$K\" tokenize -m \"$S\" -f \"$T\" --pieces",
        "\"$K\" logits -m \"$S\" -p \"$(head -c 3000 \"$T\")\" --top-k 500",
    };
    for (const std::string& c : commands) {
        CAPTURE(c);
        const auto r = sh("trap '' PIPE; " + c +
                          " < /dev/null | head -c 1 > /dev/null; echo \"rc=${PIPESTATUS[0]}\"");
        INFO(describe(r));
        CHECK((contains(r.out, "rc=141") || contains(r.out, "rc=0")));
        CHECK(r.err.empty());
    }
}

TEST_CASE("cli signals: bench on SIGINT exits 130") {
    const auto r =
        sh("\"$K\" bench -m \"$S\" -p 64 -n 64 -r 1000 -t 1 > /dev/null 2>&1 & pid=$!; sleep 1.5; "
           "kill -INT $pid; wait $pid; echo \"rc=$?\"");
    INFO(describe(r));
    CHECK(contains(r.out, "rc=130"));
}

namespace {
// Runs COMMAND (writing TARGET through a temporary) in the background, waits
// for its temporary to appear, freezes it there (SIGSTOP), sends SIG and lets
// it go on: "rc=STATUS caught=1|0 left=N", N the temporaries still there.
// caught=0 when the write was over before it could be caught.
kvtest::RunResult signal_mid_write(const std::string& sig, const std::string& target,
                                   const std::string& command) {
    return sh("t='" + target + "'; " + command + " > /dev/null 2>&1 & pid=$!; caught=0; " +
              R"SH(while [ $SECONDS -lt 60 ]; do
                   read -r st < /proc/$pid/stat 2> /dev/null || break
                   s=${st##*) }; [ "${s%% *}" = Z ] && break
                   if compgen -G "$t.tmp.*" > /dev/null; then
                     kill -STOP $pid
                     if compgen -G "$t.tmp.*" > /dev/null; then caught=1; kill -)SH" +
              sig + R"SH( $pid; fi
                     kill -CONT $pid; break
                   fi
                 done
                 wait $pid; rc=$?
                 echo "rc=$rc caught=$caught left=$(compgen -G "$t.tmp.*" | wc -l)")SH");
}
} // namespace

TEST_CASE("cli signals: SIGTERM and SIGINT in the middle of a write leave no temporary file") {
    char tmpl[] = "/tmp/kvrun-sig-XXXXXX";
    const std::string dir = mkdtemp(tmpl);
    const std::string f16 = kvtest::shared("models/synthetic/tiny-f16.gguf");
    const std::string q8 = kvtest::shared("models/synthetic/tiny-Q8_0.gguf");
    std::string doc;
    // About 1600 tokens: a 3 MiB cache file, whose write the polling loop
    // below must catch (a 1 MiB one was missed ten times in a row on a busy
    // 2-core machine).
    for (int i = 0; i < 180; i++) doc += "Sentence " + std::to_string(i) + " of the document. ";
    for (const auto& [sig, status] : {std::pair<std::string, int>{"TERM", 143}, {"INT", 130}}) {
        CAPTURE(sig);
        // quantize writes its output at the end, where nothing polls: the
        // signal ends it at once, and its temporary goes with it.
        const std::string out = dir + "/q.gguf";
        bool caught = false;
        for (int attempt = 0; attempt < 10 && !caught; attempt++) {
            const auto r =
                signal_mid_write(sig, out, "\"$K\" quantize '" + f16 + "' \"$t\" Q8_0 -t 1");
            INFO(describe(r));
            caught = contains(r.out, "caught=1");
            if (!caught) continue;
            CHECK(contains(r.out, fmt::format("rc={} ", status)));
            CHECK(contains(r.out, "left=0"));
            CHECK(!std::filesystem::exists(out));
        }
        CHECK(caught);
        // A run saving its prompt cache finishes the write, then stops with
        // the signal's status: the file is whole, the next run reuses it.
        const std::string pc = dir + "/p.cache";
        caught = false;
        for (int attempt = 0; attempt < 20 && !caught; attempt++) {
            std::filesystem::remove(pc);
            const auto r = signal_mid_write(sig, pc,
                                            "\"$K\" -m '" + q8 + "' -p '" + doc +
                                                "' -n 1 --temp 0 --prompt-cache \"$t\"");
            INFO(describe(r));
            caught = contains(r.out, "caught=1");
            if (!caught) continue;
            CHECK(contains(r.out, fmt::format("rc={} ", status)));
            CHECK(contains(r.out, "left=0"));
            const auto again =
                run({"-m", q8, "-p", doc, "-n", "1", "--temp", "0", "--prompt-cache", pc});
            CHECK(contains(again.err, "prompt cache: reused"));
        }
        CHECK(caught);
    }
    std::filesystem::remove_all(dir);
}

TEST_CASE("cli signals: SIGTERM stops a generation cleanly with 143") {
    const auto r =
        sh("\"$K\" -m \"$S\" -p 'Once upon a time' -n 100000 -c 64 --ignore-eos "
           "> /dev/null 2> \"${TMPDIR:-/tmp}/kvrun-term.$$\" & pid=$!; sleep 1; kill -TERM $pid; "
           "wait $pid; echo \"rc=$?\"; cat \"${TMPDIR:-/tmp}/kvrun-term.$$\"; "
           "rm -f \"${TMPDIR:-/tmp}/kvrun-term.$$\"");
    INFO(describe(r));
    CHECK(contains(r.out, "rc=143"));
    CHECK(contains(r.out, "stop: interrupted")); // the stats line: a stop, not a kill
}

TEST_CASE("cli args: perplexity --chunks 0 says what it takes") {
    const std::string line =
        usage_line(run({"perplexity", "-m", kStories, "-f", kText, "--chunks", "0"}));
    CHECK(contains(line, "--chunks"));
    CHECK(contains(line, "-1 for all"));
}

TEST_CASE("cli args: tokenize --json --pieces is refused rather than ignoring --pieces") {
    CHECK(contains(usage_line(run({"tokenize", "-m", kStories, "-p", "x", "--json", "--pieces"})),
                   "--pieces"));
}

TEST_CASE("cli args: quantize refuses an already-quantized model without --allow-requantize") {
    const std::string src = kvtest::shared("models/synthetic/tiny-Q4_0.gguf");
    const std::string out = "/tmp/kvrun_requant_" + std::to_string(::getpid()) + ".gguf";
    CHECK(contains(usage_line(run({"quantize", src, out, "Q8_0"})), "--allow-requantize"));
    const auto ok = run({"quantize", src, out, "Q8_0", "--allow-requantize", "-t", "1"});
    INFO(describe(ok));
    CHECK(ok.status == 0);
    std::remove(out.c_str());
}
