// Memory-aware context sizing, the info memory plan, and --no-kv-cache.
#include <doctest/doctest.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "test_util.h"

namespace {
// Runs kvrun as if the machine had `bytes` of MemAvailable (the child inherits it).
kvtest::RunResult with_memory(const std::string& bytes, const std::vector<std::string>& args) {
    setenv("KVRUN_MEM_AVAILABLE", bytes.c_str(), 1);
    auto r = kvtest::run_kvrun(args);
    unsetenv("KVRUN_MEM_AVAILABLE");
    return r;
}
const std::string kTiny = "models/synthetic/tiny-f16.gguf"; // 2 KiB of f16 KV per token, 38 MiB of weights

// The plan counts weights not yet in the page cache as memory the run still
// needs (src/memory_plan.cpp), so tests that compare two plans read the file
// first: otherwise a file half evicted by a build beside the tests makes the
// first plan differ from the second (seen: 2 failures in 6 runs).
void make_resident(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    std::vector<char> buf(1 << 20);
    while (f.read(buf.data(), static_cast<std::streamsize>(buf.size())) || f.gcount() > 0) {
    }
}
} // namespace

TEST_CASE("memory: a fixed -c that cannot fit fails with advice and exit 5") {
    // 60 MB: the weights are resident (page cache) after the first run, so
    // what is left goes to buffers and the cache; 32768 tokens need 64 MiB.
    kvtest::run_kvrun({"info", "-m", kvtest::shared(kTiny)});
    auto r = with_memory("120000000", {"-m", kvtest::shared(kTiny), "-p", "Hello", "-n", "2", "-c", "32768"});
    CHECK(r.status == 5);
    CHECK(r.out.empty());
    CHECK(kvtest::lines(r.err).size() == 1);
    CHECK(r.err.find("would fit") != std::string::npos);
    CHECK(r.err.find("q8_0") != std::string::npos);
}

TEST_CASE("memory: -c auto shrinks to what fits, and says so; info --json shows the plan") {
    // What the run needs besides the cache, read from the plan itself.
    make_resident(kvtest::shared(kTiny));
    auto probe = with_memory("1000000000", {"info", "-m", kvtest::shared(kTiny), "--json"});
    REQUIRE(probe.status == 0);
    const auto pj = nlohmann::json::parse(probe.out);
    const uint64_t per_token = pj["kv"]["bytes_per_token"].get<uint64_t>();
    CHECK(per_token == 4u * 2 * 4 * 32 * 2); // layers × (K, V) × KV heads × head dim × f16 bytes
    const uint64_t other = 1000000000u - pj["memory"]["max_ctx_that_fits"].get<uint64_t>() * per_token;
    const std::string room_for_600 = std::to_string(other + 600 * per_token + per_token / 2);

    // -n 700 asks for 768 slots; 600 fit, so the cache is cut to 512 and generation slides.
    auto r = with_memory(room_for_600, {"-m", kvtest::shared(kTiny), "-p", "Hello", "-n", "700", "--ignore-eos",
                                        "--temp", "0", "-v"});
    CHECK(r.status == 0);
    CHECK(r.err.find("reduced to 512") != std::string::npos);
    CHECK(r.err.find("generated 700 tok") != std::string::npos);

    auto info = with_memory(room_for_600, {"info", "-m", kvtest::shared(kTiny), "-c", "2048", "--json"});
    REQUIRE(info.status == 0);
    const auto j = nlohmann::json::parse(info.out);
    CHECK(std::to_string(j["memory"]["available_bytes"].get<uint64_t>()) == room_for_600);
    CHECK(j["kv"]["bytes"].get<uint64_t>() == 2048 * per_token);
    CHECK_FALSE(j["memory"]["fits"].get<bool>());
    const int64_t fit = j["memory"]["max_ctx_that_fits"].get<int64_t>();
    CHECK((fit == 600 || fit == 601)); // the probe floors once
}

TEST_CASE("--no-kv-cache gives the same greedy tokens as the cache") {
    const std::vector<std::string> base = {"-m", kvtest::shared("models/stories260K.gguf"), "-p", "Once upon a time",
                                           "-n", "40", "--temp", "0", "--quiet"};
    auto cached = kvtest::run_kvrun(base);
    auto args = base;
    args.push_back("--no-kv-cache");
    auto recomputed = kvtest::run_kvrun(args);
    REQUIRE(cached.status == 0);
    REQUIRE(recomputed.status == 0);
    CHECK(recomputed.out == cached.out);
    CHECK(cached.out.size() > 100);
}
