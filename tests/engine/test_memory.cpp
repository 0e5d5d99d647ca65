// Memory-aware context sizing, the info memory plan, and --no-kv-cache.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test_util.h"

namespace {
// Runs kvrun as if the machine had `bytes` of MemAvailable (the child inherits it).
kvtest::RunResult with_memory(const std::string& bytes, const std::vector<std::string>& args) {
    setenv("KVRUN_MEM_AVAILABLE", bytes.c_str(), 1);
    auto r = kvtest::run_kvrun(args);
    unsetenv("KVRUN_MEM_AVAILABLE");
    return r;
}
const std::string kTiny =
    "models/synthetic/tiny-f16.gguf"; // 2 KiB of f16 KV per token, 38 MiB of weights

// The plan counts weights not yet in the page cache as memory the run still
// needs (src/engine/memory_plan.cpp), so tests that compare two plans keep the file
// resident: otherwise a file evicted by a build or a sanitizer run beside the
// tests makes one plan differ from the other (seen: 2 failures in 6 runs
// beside a build, and once in CI). The mapping is mlock()ed where the limit
// allows (pages of a locked mapping stay in the page cache the child process
// maps); elsewhere it is at least read in.
class ResidentFile {
  public:
    explicit ResidentFile(const std::string& path) {
        fd_ = open(path.c_str(), O_RDONLY);
        if (fd_ < 0) return;
        struct stat st {};
        if (fstat(fd_, &st) != 0 || st.st_size <= 0) return;
        n_ = static_cast<size_t>(st.st_size);
        p_ = mmap(nullptr, n_, PROT_READ, MAP_SHARED, fd_, 0);
        if (p_ == MAP_FAILED) {
            p_ = nullptr;
            return;
        }
        locked_ = mlock(p_, n_) == 0;
        volatile unsigned char sum = 0;
        for (size_t i = 0; i < n_; i += 4096) sum = sum + static_cast<const unsigned char*>(p_)[i];
    }
    ~ResidentFile() {
        if (p_) {
            if (locked_) munlock(p_, n_);
            munmap(p_, n_);
        }
        if (fd_ >= 0) close(fd_);
    }
    ResidentFile(const ResidentFile&) = delete;
    ResidentFile& operator=(const ResidentFile&) = delete;

  private:
    int fd_ = -1;
    void* p_ = nullptr;
    size_t n_ = 0;
    bool locked_ = false;
};
} // namespace

TEST_CASE("memory: a fixed -c that cannot fit fails with advice and exit 5") {
    // 60 MB: the weights are resident (page cache) after the first run, so
    // what is left goes to buffers and the cache; 32768 tokens need 64 MiB.
    kvtest::run_kvrun({"info", "-m", kvtest::shared(kTiny)});
    auto r = with_memory("120000000",
                         {"-m", kvtest::shared(kTiny), "-p", "Hello", "-n", "2", "-c", "32768"});
    CHECK(r.status == 5);
    CHECK(r.out.empty());
    CHECK(kvtest::lines(r.err).size() == 1);
    CHECK(r.err.find("would fit") != std::string::npos);
    CHECK(r.err.find("q8_0") != std::string::npos);
}

TEST_CASE("memory: -c auto shrinks to what fits, and says so; info --json shows the plan") {
    // What the run needs besides the cache, read from the plan itself.
    const ResidentFile resident(kvtest::shared(kTiny));
    auto probe = with_memory("1000000000", {"info", "-m", kvtest::shared(kTiny), "--json"});
    REQUIRE(probe.status == 0);
    const auto pj = nlohmann::json::parse(probe.out);
    const uint64_t per_token = pj["kv"]["bytes_per_token"].get<uint64_t>();
    CHECK(per_token == 4u * 2 * 4 * 32 * 2); // layers × (K, V) × KV heads × head dim × f16 bytes
    const uint64_t other =
        1000000000u - pj["memory"]["max_ctx_that_fits"].get<uint64_t>() * per_token;
    const std::string room_for_600 = std::to_string(other + 600 * per_token + per_token / 2);

    // -n 700 asks for 768 slots; 600 fit, so the cache is cut to 512 and generation slides.
    auto r = with_memory(room_for_600, {"-m", kvtest::shared(kTiny), "-p", "Hello", "-n", "700",
                                        "--ignore-eos", "--temp", "0", "-v"});
    CHECK(r.status == 0);
    CHECK(r.err.find("reduced to 512") != std::string::npos);
    CHECK(r.err.find("generated 700 tok") != std::string::npos);

    auto info =
        with_memory(room_for_600, {"info", "-m", kvtest::shared(kTiny), "-c", "2048", "--json"});
    REQUIRE(info.status == 0);
    const auto j = nlohmann::json::parse(info.out);
    CHECK(std::to_string(j["memory"]["available_bytes"].get<uint64_t>()) == room_for_600);
    CHECK(j["kv"]["bytes"].get<uint64_t>() == 2048 * per_token);
    CHECK_FALSE(j["memory"]["fits"].get<bool>());
    // kvrun batch: a cache per sequence in half the memory available.
    CHECK(j["batch"]["bytes_per_sequence"].get<uint64_t>() == 2048 * per_token);
    CHECK(j["batch"]["sequences_that_fit"].get<uint64_t>() ==
          std::stoull(room_for_600) / 2 / (2048 * per_token));
    // Its pool: the same bytes in blocks of 32 tokens, taken as sequences
    // grow, so more short sequences fit than whole caches.
    const auto& pool = j["batch"]["pool"];
    CHECK(pool["block_slots"] == 32);
    REQUIRE(pool["kinds"].size() == 1);
    CHECK(pool["kinds"][0]["block_bytes"].get<uint64_t>() == 32 * per_token);
    CHECK(pool["kinds"][0]["blocks_per_sequence"] == 64);
    const double rings = std::stoull(room_for_600) / 2.0 / static_cast<double>(2048 * per_token);
    CHECK(pool["kinds"][0]["blocks"].get<int64_t>() == static_cast<int64_t>(rings * 64));
    CHECK(pool["sequences_of_length"]["512"].get<int64_t>() ==
          static_cast<int64_t>(rings * 64) / 16);
    CHECK(pool["sequences_of_length"]["2048"].get<int64_t>() ==
          static_cast<int64_t>(rings * 64) / 64);
    // The probe floors once, so 600 or 601 if the page cache held as much of
    // the model as at the probe. Weights not resident count as memory still
    // needed, and a busy machine (a build, a sanitizer run) can evict pages
    // between the two plans (seen in CI): shift by the difference.
    const int64_t fit = j["memory"]["max_ctx_that_fits"].get<int64_t>();
    const double drift =
        (static_cast<double>(pj["memory"]["weights_resident_bytes"].get<uint64_t>()) -
         static_cast<double>(j["memory"]["weights_resident_bytes"].get<uint64_t>())) /
        static_cast<double>(per_token);
    INFO("fit ", fit, " drift ", drift, " tokens");
    auto at_least_0 = [](double v) {
        return std::max<int64_t>(0, static_cast<int64_t>(std::floor(v)));
    };
    CHECK(fit >= at_least_0(600.5 - drift));
    CHECK(fit <= at_least_0(601.5 - drift));
}

TEST_CASE(
    "memory: --ctk auto takes a smaller cache type when the context does not fit, and says so") {
    const ResidentFile resident(kvtest::shared(kTiny));
    // The plan's buffers at -c 1024 (attention scratch grows with the context).
    auto probe =
        with_memory("1000000000", {"info", "-m", kvtest::shared(kTiny), "-c", "1024", "--json"});
    REQUIRE(probe.status == 0);
    const auto pj = nlohmann::json::parse(probe.out);
    const uint64_t f16_token = pj["kv"]["bytes_per_token"].get<uint64_t>(); // 2048
    const uint64_t other =
        1000000000u - pj["memory"]["max_ctx_that_fits"].get<uint64_t>() * f16_token;
    // Room for `tokens` tokens of an f16 cache; -c 1024 asked for. Per token:
    // f16 2048 bytes, q8_0/q8_0 1088, q8_0/q4_0 832, q4_0/q4_0 576; smaller
    // types also need smaller batch buffers, so each fits from (in f16
    // tokens of room): f16 1024, q8_0/q8_0 424, q8_0/q4_0 264, q4_0/q4_0 104.
    auto run = [&](uint64_t tokens, std::vector<std::string> extra) {
        std::vector<std::string> args = {
            "-m",    kvtest::shared(kTiny), "-p", "Hello", "-n", "4", "-c", "1024", "--temp", "0",
            "--json"};
        args.insert(args.end(), extra.begin(), extra.end());
        return with_memory(std::to_string(other + tokens * f16_token), args);
    };
    struct Case {
        uint64_t room; // f16 tokens
        const char *k, *v;
        int k_rotate;
    };
    for (const Case c : {Case{2000, "f16", "f16", 0}, Case{700, "q8_0", "q8_0", 0},
                         Case{350, "q8_0", "q4_0", 0}, Case{180, "q4_0", "q4_0", 32}}) {
        CAPTURE(c.room);
        const auto r = run(c.room, {"--ctk", "auto", "--ctv", "auto"});
        REQUIRE(r.status == 0);
        const auto j = nlohmann::json::parse(r.out);
        CHECK(j["cache"]["type_k"] == std::string(c.k));
        CHECK(j["cache"]["type_v"] == std::string(c.v));
        CHECK(j["cache"]["k_rotate"] == c.k_rotate);
        CHECK(j["cache"]["n_ctx"] == 1024);
        // One line when it had to choose, none when f16 fit.
        const bool chose = c.room < 2000;
        CHECK((r.err.find("--ctk auto: a 1024-token f16 cache needs 2.00 MiB") !=
               std::string::npos) == chose);
        CHECK(kvtest::lines(r.err).size() == (chose ? 1u : 0u));
    }
    // "auto" in any case, like the type names.
    const auto upper = run(700, {"--ctk", "AUTO", "--ctv", "Auto", "-c", "AUTO"});
    REQUIRE(upper.status == 0);
    CHECK(nlohmann::json::parse(upper.out)["cache"]["auto"] == true);
    const auto upper_fixed = run(700, {"--ctk", "AUTO", "--ctv", "Auto"});
    REQUIRE(upper_fixed.status == 0);
    CHECK(nlohmann::json::parse(upper_fixed.out)["cache"]["type_v"] == "q8_0");
    // When one side alone cannot fit, the error says what it tried and that
    // auto on both sides would fit.
    const auto k_only = run(300, {"--ctk", "auto"});
    CHECK(k_only.status == 5);
    CHECK(k_only.err.find("--ctk auto tried down to q4_0/f16, keys rotated") != std::string::npos);
    CHECK(k_only.err.find("--ctk auto --ctv auto would fit 1024 tokens (q8_0/q4_0)") !=
          std::string::npos);
    const auto none_auto = run(300, {});
    CHECK(none_auto.status == 5);
    CHECK(none_auto.err.find("--ctk auto --ctv auto would fit 1024 tokens") != std::string::npos);
    // Only --ctv auto: the keys stay f16, the values go to q8_0 (fits from
    // 724), then q4_0 (from 564).
    const auto v = run(900, {"--ctv", "auto"});
    REQUIRE(v.status == 0);
    CHECK(nlohmann::json::parse(v.out)["cache"]["type_k"] == "f16");
    CHECK(nlohmann::json::parse(v.out)["cache"]["type_v"] == "q8_0");
    CHECK(v.err.find("--ctv auto") != std::string::npos);
    // Without auto the same room is an error with advice (exit 5); with too
    // little room for any type, auto fails the same way.
    CHECK(run(180, {}).status == 5);
    CHECK(run(50, {"--ctk", "auto", "--ctv", "auto"}).status == 5);
    // Elsewhere auto is no cache type.
    const auto p =
        kvtest::run_kvrun({"perplexity", "-m", kvtest::shared(kTiny), "-f", "-", "--ctk", "auto"});
    CHECK(p.status != 0);
    CHECK(p.err.find("unsupported KV cache type") != std::string::npos);
}

// --deterministic: the recompute evaluates every step as a prompt batch, the
// cached run one token at a time; only that mode makes them the same numbers.
TEST_CASE("--no-kv-cache gives the same greedy tokens as the cache") {
    const std::vector<std::string> base = {"-m",      kvtest::shared("models/stories260K.gguf"),
                                           "-p",      "Once upon a time",
                                           "-n",      "40",
                                           "--temp",  "0",
                                           "--quiet", "--deterministic"};
    auto cached = kvtest::run_kvrun(base);
    auto args = base;
    args.push_back("--no-kv-cache");
    auto recomputed = kvtest::run_kvrun(args);
    REQUIRE(cached.status == 0);
    REQUIRE(recomputed.status == 0);
    CHECK(recomputed.out == cached.out);
    CHECK(cached.out.size() > 100);
}
