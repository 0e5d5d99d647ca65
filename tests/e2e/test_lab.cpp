// End-to-end tests of kvrun-lab, the lab tool built beside kvrun: its
// roofline, attention and matrices subcommands (JSON and markdown), and its
// usage errors. scripts/bench.sh reads the JSON.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "test_util.h"

using nlohmann::json;

namespace {

const std::string kStories = kvtest::shared("models/stories260K.gguf");

kvtest::RunResult lab(const std::vector<std::string>& args) {
    return kvtest::run_binary(KVRUN_LAB_BINARY, args);
}

std::string describe(const kvtest::RunResult& r) {
    return "status " + std::to_string(r.status) + "\n--- stdout:\n" + r.out.substr(0, 2000) +
           "\n--- stderr:\n" + r.err.substr(0, 2000);
}

// `kvrun-lab ARGS --json`, which must succeed: its rows.
json lab_json(std::vector<std::string> args) {
    args.push_back("--json");
    const auto r = lab(args);
    INFO(describe(r));
    REQUIRE(r.status == 0);
    return json::parse(r.out);
}

bool contains(const std::string& s, const std::string& n) {
    return s.find(n) != std::string::npos;
}

} // namespace

TEST_CASE("lab: roofline measures the read bandwidth and the hand-off cost per thread count") {
    // A 64 MiB buffer (the default 1 GiB is for real measurements): still
    // past this machine's caches, and quick.
    const json j = lab_json({"roofline", "-t", "1,2", "--buffer-mib", "64"});
    REQUIRE(j.size() == 2);
    for (int i = 0; i < 2; i++) {
        INFO(j[i].dump());
        CHECK(j[i]["test"] == "roofline");
        CHECK(j[i]["threads"] == i + 1);
        CHECK(j[i]["read_bandwidth_bytes_per_second"].get<double>() > 1e8);
        CHECK(j[i]["handoff_seconds"].get<double>() >= 0);
    }
    CHECK(j[0]["handoff_seconds"].get<double>() == 0); // one thread hands nothing off
    const auto m = lab({"roofline", "-t", "1", "--buffer-mib", "16"});
    INFO(describe(m));
    REQUIRE(m.status == 0);
    CHECK(contains(m.out, "| threads | read bandwidth | thread hand-off |"));
    CHECK(contains(m.out, "| 1 | "));
}

TEST_CASE("lab: attention times a decode step's attention at each depth") {
    // stories260K: 5 layers, 4 KV heads of 8 dimensions. The K/V bytes a
    // token reads at depth 64: 5 layers x 64 slots x (K + V) x 32 elements x
    // 2 bytes (F16); depth 0 is skipped.
    const json j = lab_json({"attention", "-m", kStories, "-d", "0,64", "-t", "1", "-r", "2"});
    REQUIRE(j.size() == 1);
    CHECK(j[0]["test"] == "attention@d64");
    CHECK(j[0]["ring_bytes_per_token"].get<double>() == 5.0 * 64 * 2 * 32 * 2);
    for (const char* k :
         {"ms_per_token_ring_from_dram", "ms_per_token_ring_in_cache", "ms_per_token_read_only"})
        CHECK(j[0][k].get<double>() > 0);
    // A q8_0 cache keeps rows: 34 bytes per 32 elements.
    const json jq = lab_json({"attention", "-m", kStories, "-d", "64", "-t", "1", "-r", "1",
                              "--ctk", "q8_0", "--ctv", "q8_0"});
    REQUIRE(jq.size() == 1);
    CHECK(jq[0]["ring_bytes_per_token"].get<double>() == 5.0 * 64 * 2 * 34);
    const auto m = lab({"attention", "-m", kStories, "-d", "64", "-t", "1", "-r", "1"});
    INFO(describe(m));
    REQUIRE(m.status == 0);
    CHECK(contains(m.out, "attention of one decode step"));
    CHECK(contains(m.out, "| stories260K.gguf | 1 | 64 | 0.0 MB |"));
}

TEST_CASE("lab: matrices streams a token's weight matrices, read and multiplied") {
    // stories260K (F32): per layer Q and O 64x64, K and V 32x64, gate, up and
    // down 172x64; the output matrix 512x64.
    const double bytes = 4.0 * (5 * (2 * 64 * 64 + 2 * 32 * 64 + 3 * 172 * 64) + 512 * 64);
    const json j = lab_json({"matrices", "-m", kStories, "-t", "2", "-r", "2"});
    REQUIRE(j.size() == 1);
    CHECK(j[0]["test"] == "matrices");
    CHECK(j[0]["matrix_bytes_per_token"].get<double>() == bytes);
    CHECK(j[0]["ms_per_token_read"].get<double>() > 0);
    CHECK(j[0]["ms_per_token_matmul"].get<double>() > 0);

    const auto t = lab({"matrices", "-m", kStories, "-t", "1", "-r", "1"});
    INFO(describe(t));
    REQUIRE(t.status == 0);
    CHECK(contains(t.out, "| stories260K.gguf | 1 | 1.0 MB |"));
}

TEST_CASE("lab: usage errors exit 2 with a short message") {
    for (const std::vector<std::string>& args :
         std::vector<std::vector<std::string>>{{},
                                               {"nonsense"},
                                               {"attention", "-m", kStories},
                                               {"attention", "-m", kStories, "-d", "0"},
                                               {"attention", "-m", kStories, "-d", "x"},
                                               {"matrices"},
                                               {"roofline", "--buffer-mib", "0"}}) {
        const auto r = lab(args);
        INFO(describe(r));
        CHECK(r.status == 2);
        CHECK(r.out.empty());
        CHECK(!r.err.empty());
        CHECK(kvtest::lines(r.err).size() <= 2);
    }
    const auto missing = lab({"matrices", "-m", "/nonexistent.gguf"});
    INFO(describe(missing));
    CHECK(missing.status == 3);
    CHECK(contains(missing.err, "kvrun-lab: error:"));
}
