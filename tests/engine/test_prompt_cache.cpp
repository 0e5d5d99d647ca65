// Prompt-cache files: reuse is exact, and every kind of mismatch or damage
// falls back to a full recompute with a warning, never wrong output.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "forward.h"
#include "gguf.h"
#include "gguf_writer.h"
#include "loader.h"
#include "prompt_cache.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace {

const std::string kPrompt = "The quick brown fox jumps over the lazy dog. The quick brown fox";
const std::string kLonger = kPrompt + " jumps again, and again";

struct TempDir {
    fs::path path;
    TempDir() {
        char tmpl[] = "/tmp/kvrun-pc-XXXXXX";
        path = mkdtemp(tmpl);
    }
    ~TempDir() { fs::remove_all(path); }
    std::string file(const std::string& name) const { return (path / name).string(); }
};

kvtest::RunResult gen(const std::string& model, const std::string& prompt,
                      std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {"-m",     kvtest::shared("models/synthetic/" + model),
                                     "-p",     prompt,
                                     "-n",     "16",
                                     "--temp", "0",
                                     "--quiet"};
    args.insert(args.end(), extra.begin(), extra.end());
    return kvtest::run_kvrun(args);
}

bool reused(const kvtest::RunResult& r) {
    return r.err.find("prompt cache: reused") != std::string::npos;
}

// "prompt cache: reused N of M prompt tokens": N, as a string for -b.
std::string reused_count(const kvtest::RunResult& r) {
    const size_t at = r.err.find("prompt cache: reused ");
    REQUIRE(at != std::string::npos);
    const size_t b = at + std::string("prompt cache: reused ").size();
    return r.err.substr(b, r.err.find(' ', b) - b);
}

// A run that reused N tokens evaluated the rest as one batch after them: a
// run without the file that takes the same batches (-b N) computes the same
// numbers, so their tokens must match. (Against a run with other batches,
// they match only where the prompt kernels are batch-invariant: the AMX
// tiles and OpenBLAS round differently from per-token dot products, and a
// random-weight model has near ties. --deterministic is the mode that
// promises that.)
kvtest::RunResult same_batches(const std::string& model, const kvtest::RunResult& reusing,
                               std::vector<std::string> extra = {}) {
    extra.insert(extra.end(), {"-b", reused_count(reusing)});
    return gen(model, kLonger, extra);
}
kvtest::RunResult same_batches_of(const std::string& model, const std::string& prompt,
                                  const kvtest::RunResult& reusing) {
    return gen(model, prompt, {"-b", reused_count(reusing), "--json"});
}
bool rejected(const kvtest::RunResult& r) {
    return r.err.find("not used") != std::string::npos;
}

} // namespace

TEST_CASE("prompt cache: a reused prefix gives the same greedy output") {
    TempDir d;
    const std::string pc = d.file("p.cache");
    auto first = gen("tiny-Q8_0.gguf", kPrompt, {"--prompt-cache", pc});
    REQUIRE(first.status == 0);
    CHECK(rejected(first)); // no file yet
    CHECK(fs::exists(pc));
    auto second = gen("tiny-Q8_0.gguf", kLonger, {"--prompt-cache", pc});
    REQUIRE(second.status == 0);
    REQUIRE(reused(second));
    CHECK(second.out == same_batches("tiny-Q8_0.gguf", second).out);
    // the same prompt again: all but the last token come from the file
    auto third = gen("tiny-Q8_0.gguf", kLonger, {"--prompt-cache", pc});
    REQUIRE(reused(third));
    CHECK(std::stoi(reused_count(third)) > std::stoi(reused_count(second)));

    // --deterministic: the batches do not matter, so every reuse gives the
    // tokens of the run without a file.
    const std::string dpc = d.file("det.cache");
    auto det_plain = gen("tiny-Q8_0.gguf", kLonger, {"--deterministic"});
    REQUIRE(det_plain.status == 0);
    REQUIRE(gen("tiny-Q8_0.gguf", kPrompt, {"--prompt-cache", dpc, "--deterministic"}).status == 0);
    for (int i = 0; i < 2; i++) { // a prefix, then all but the last token
        auto det = gen("tiny-Q8_0.gguf", kLonger, {"--prompt-cache", dpc, "--deterministic"});
        REQUIRE(reused(det));
        CHECK(det.out == det_plain.out);
    }
    // A cache from the other mode is not reused, and the warning names the
    // mode, not "a different model". Each run saves its own, so they alternate.
    auto plain = gen("tiny-Q8_0.gguf", kLonger, {"--prompt-cache", dpc});
    CHECK(!reused(plain));
    CHECK(plain.err.find("not used (made with --deterministic)") != std::string::npos);
    // Its save replaces the file for the mode, not for a shorter prefix ("shares 0").
    CHECK(plain.err.find("tokens could not be used (made with --deterministic); it now holds") !=
          std::string::npos);
    CHECK(plain.err.find("shares 0") == std::string::npos);
    auto det = gen("tiny-Q8_0.gguf", kLonger, {"--prompt-cache", dpc, "--deterministic"});
    CHECK(!reused(det));
    CHECK(det.err.find("not used (made without --deterministic)") != std::string::npos);
    CHECK(det.out == det_plain.out);
}

TEST_CASE("prompt cache: mismatches and damage fall back cleanly") {
    TempDir d;
    const std::string pc = d.file("p.cache");
    REQUIRE(gen("tiny-Q8_0.gguf", kPrompt, {"--prompt-cache", pc}).status == 0);
    const auto good = [&] {
        std::ifstream in(pc, std::ios::binary);
        return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    }();
    auto restore = [&](const std::string& bytes) { std::ofstream(pc, std::ios::binary) << bytes; };
    auto plain_q8 = gen("tiny-Q8_0.gguf", kLonger);

    SUBCASE("different model") {
        auto plain = gen("tiny-f16.gguf", kLonger);
        auto r = gen("tiny-f16.gguf", kLonger, {"--prompt-cache", pc});
        CHECK(rejected(r));
        CHECK(r.err.find("different model") != std::string::npos);
        CHECK(r.out == plain.out);
    }
    SUBCASE("different cache type") {
        auto plain = gen("tiny-Q8_0.gguf", kLonger, {"--ctk", "f32", "--ctv", "f32"});
        auto r =
            gen("tiny-Q8_0.gguf", kLonger, {"--prompt-cache", pc, "--ctk", "f32", "--ctv", "f32"});
        CHECK(rejected(r));
        CHECK(r.out == plain.out);
    }
    SUBCASE("rotated keys (--k-rotate) on one side only, then on both") {
        auto plain = gen("tiny-Q8_0.gguf", kLonger, {"--k-rotate"});
        auto r = gen("tiny-Q8_0.gguf", kLonger, {"--prompt-cache", pc, "--k-rotate"});
        CHECK(rejected(r));
        CHECK(r.err.find("not rotated") != std::string::npos);
        CHECK(r.out == plain.out);
        // r saved a rotated file: an unrotated run refuses it, a rotated one reuses it.
        auto u = gen("tiny-Q8_0.gguf", kLonger, {"--prompt-cache", pc});
        CHECK(rejected(u));
        CHECK(u.err.find("keys are rotated") != std::string::npos);
        CHECK(u.out == plain_q8.out);
        REQUIRE(gen("tiny-Q8_0.gguf", kPrompt, {"--prompt-cache", pc, "--k-rotate"}).status == 0);
        auto again = gen("tiny-Q8_0.gguf", kLonger, {"--prompt-cache", pc, "--k-rotate"});
        REQUIRE(reused(again));
        CHECK(again.out == same_batches("tiny-Q8_0.gguf", again, {"--k-rotate"}).out);
    }
    SUBCASE("truncated file") {
        restore(good.substr(0, good.size() / 2));
        auto r = gen("tiny-Q8_0.gguf", kLonger, {"--prompt-cache", pc});
        CHECK(rejected(r));
        CHECK(r.out == plain_q8.out);
    }
    SUBCASE("one flipped byte in the K/V data") {
        std::string bad = good;
        bad[bad.size() / 2] ^= 0x40;
        restore(bad);
        auto r = gen("tiny-Q8_0.gguf", kLonger, {"--prompt-cache", pc});
        CHECK(rejected(r));
        CHECK(r.err.find("checksum") != std::string::npos);
        CHECK(r.out == plain_q8.out);
    }
    SUBCASE("random bytes") {
        std::mt19937 rng(3);
        std::string junk(good.size(), '\0');
        for (char& c : junk) c = static_cast<char>(rng());
        restore(junk);
        auto r = gen("tiny-Q8_0.gguf", kLonger, {"--prompt-cache", pc});
        CHECK(r.status == 0);
        CHECK(rejected(r));
        CHECK(r.out == plain_q8.out);
    }
    SUBCASE("a file from a longer context") {
        std::string long_prompt;
        for (int i = 0; i < 40; i++) long_prompt += "The quick brown fox jumps over the lazy dog. ";
        REQUIRE(gen("tiny-Q8_0.gguf", long_prompt, {"--prompt-cache", pc}).status == 0);
        auto plain = gen("tiny-Q8_0.gguf", kPrompt, {"-c", "64"});
        auto r = gen("tiny-Q8_0.gguf", kPrompt, {"--prompt-cache", pc, "-c", "64"});
        CHECK(rejected(r));
        CHECK(r.err.find("more than this context") != std::string::npos);
        CHECK(r.out == plain.out);
    }
}

TEST_CASE("prompt cache: concurrent writers never leave a file a reader accepts half-written") {
    TempDir d;
    const std::string pc = d.file("shared.cache");
    std::vector<std::thread> writers;
    std::vector<int> status(4, -1);
    // --deterministic: the winner's prefix was evaluated in a batch of its
    // own length, so only that mode promises the answer of a run without it.
    for (int i = 0; i < 4; i++)
        writers.emplace_back([&, i] {
            status[i] = gen("tiny-Q8_0.gguf", kPrompt + std::string(i, '!'),
                            {"--prompt-cache", pc, "--deterministic"})
                            .status;
        });
    for (auto& t : writers) t.join();
    for (int s : status) CHECK(s == 0);
    auto r = gen("tiny-Q8_0.gguf", kLonger, {"--prompt-cache", pc, "--deterministic"});
    CHECK(reused(r)); // whichever writer won, its file is whole
    CHECK(r.out == gen("tiny-Q8_0.gguf", kLonger, {"--deterministic"}).out);
    int leftovers = 0;
    for (const auto& e : fs::directory_iterator(d.path))
        leftovers += e.path().filename() != "shared.cache";
    CHECK(leftovers == 0);
}

// LongRoPE (phi3 128k files): the keys depend on which factors the context
// picks, so a cache made with the short ones is not reused with the long ones.
TEST_CASE("prompt cache: a LongRoPE file's cache is reused only with the same factors") {
    TempDir d;
    const std::string model = d.file("phi3-longrope.gguf"), pc = d.file("p.cache");
    {
        kvrun::GgufFile f =
            kvrun::GgufFile::open(kvtest::shared("models/families/tiny-phi3-Q4_K_M.gguf"));
        kvrun::GgufWriter w;
        for (const auto& [k, v] : f.metadata()) w.copy_kv(k, v);
        w.set_u32("phi3.rope.scaling.original_context_length", 256);
        w.set_f32("phi3.rope.scaling.attn_factor", 1.19f);
        for (const auto& t : f.tensors())
            w.add_tensor(t.name, t.type, std::vector<int64_t>(t.ne, t.ne + t.n_dims), t.data,
                         t.nbytes);
        std::vector<float> lng(12), shrt(12);
        for (int i = 0; i < 12; i++) lng[i] = 1.0f + 3.0f * i, shrt[i] = 1.0f + 0.05f * i;
        w.add_tensor("rope_factors_long.weight", gl::Type::F32, {12}, lng.data(), lng.size() * 4);
        w.add_tensor("rope_factors_short.weight", gl::Type::F32, {12}, shrt.data(),
                     shrt.size() * 4);
        w.write(model);
    }
    auto run = [&](const std::string& prompt, const char* ctx,
                   std::vector<std::string> extra = {}) {
        std::vector<std::string> args = {"-m",     model, "-p",      prompt, "-n", "16",
                                         "--temp", "0",   "--quiet", "-c",   ctx};
        args.insert(args.end(), extra.begin(), extra.end());
        return kvtest::run_kvrun(args);
    };
    const auto info = kvtest::run_kvrun({"info", "-m", model, "-c", "512"});
    CHECK(info.out.find(
              "LongRoPE:     short factors up to 256 tokens, long ones past it (long at -c 512)") !=
          std::string::npos);
    // The factors reach the keys: the logits of the same prompt move when -c
    // picks the long ones. (Not the greedy text: a random-weight model may
    // write the same 16 tokens under both, as it does on some CPUs.)
    auto logits = [&](const char* ctx) {
        const auto r = kvtest::run_kvrun({"logits", "-m", model, "-p", kLonger, "-c", ctx});
        REQUIRE(r.status == 0);
        return nlohmann::json::parse(r.out);
    };
    // The largest change of a top logit (by token id) between two runs.
    auto moved = [](const nlohmann::json& a, const nlohmann::json& b) {
        REQUIRE(a.size() == b.size());
        double most = 0;
        for (size_t i = 0; i < a.size(); i++)
            for (const auto& x : a[i]["top"])
                for (const auto& y : b[i]["top"])
                    if (x[0] == y[0])
                        most = std::max(most, std::abs(x[1].get<double>() - y[1].get<double>()));
        return most;
    };
    const auto short_rows = logits("256");
    REQUIRE(short_rows.size() > 8);
    // -c 128 picks the short factors too: the same numbers, whatever the
    // ring's size; -c 512 the long ones, and the logits move.
    const double same = moved(short_rows, logits("128")),
                 factors = moved(short_rows, logits("512"));
    CHECK_MESSAGE(same < 1e-4, "short factors at -c 128 vs -c 256: max |logit change| " << same);
    CHECK_MESSAGE(factors > 0.02, "short vs long factors: max |logit change| " << factors);
    const auto long_plain = run(kLonger, "512");
    REQUIRE(long_plain.status == 0);
    REQUIRE(run(kPrompt, "256", {"--prompt-cache", pc}).status == 0);
    // (Reused, the tail runs as its own batch: on this Q4_K file that moves
    // logits by a few hundredths, as for every quantized file, enough to flip
    // this random model's near ties; so only the reuse is checked here.)
    CHECK(reused(run(kLonger, "256", {"--prompt-cache", pc})));
    const auto other = run(kLonger, "512", {"--prompt-cache", pc});
    CHECK(rejected(other));
    CHECK(other.out == long_plain.out);
}

TEST_CASE("prompt cache: -c auto makes room for a cached document, so a shorter prompt sharing "
          "it reuses it; a replaced cache says so; the stats separate reused from evaluated") {
    TempDir d;
    const std::string pc = d.file("doc.cache");
    std::string doc;
    for (int i = 0; i < 40; i++) doc += "Sentence " + std::to_string(i) + " of the document. ";
    const std::string half = doc.substr(0, doc.size() / 2) + " What is it about?";
    // The whole document first: its cache holds more tokens than -c auto
    // would give the short prompt alone (256).
    auto whole = gen("tiny-Q8_0.gguf", doc, {"--prompt-cache", pc});
    REQUIRE(whole.status == 0);
    auto again = gen("tiny-Q8_0.gguf", doc, {"--prompt-cache", pc, "--json"});
    REQUIRE(again.status == 0);
    const auto j = nlohmann::json::parse(again.out);
    const int64_t held = j["tokens"]["prompt"].get<int64_t>();
    REQUIRE(held > 256);
    CHECK(j["tokens"]["reused"] == held - 1);
    CHECK(j["tokens"]["evaluated"] == 1);
    // The stats line (gen passes --quiet: run without) says what was reused and what evaluated.
    const auto stats =
        kvtest::run_kvrun({"-m", kvtest::shared("models/synthetic/tiny-Q8_0.gguf"), "-p", doc, "-n",
                           "4", "--temp", "0", "--prompt-cache", pc});
    REQUIRE(stats.status == 0);
    CHECK(stats.err.find(fmt::format("prompt {} tok ({} reused, 1 evaluated)", held, held - 1)) !=
          std::string::npos);
    // The short prompt: -c auto holds the file, the shared prefix is reused.
    auto shorter = gen("tiny-Q8_0.gguf", half, {"--prompt-cache", pc, "--json"});
    REQUIRE(shorter.status == 0);
    CHECK(reused(shorter));
    const auto js = nlohmann::json::parse(shorter.out);
    CHECK(js["cache"]["n_ctx"].get<int64_t>() >= held);
    CHECK(js["tokens"]["reused"].get<int64_t>() > 100);
    // Its save replaces the longer cache, and says so.
    CHECK(shorter.err.find("prompt cache " + pc + " replaced: it held " + std::to_string(held) +
                           " tokens") != std::string::npos);
    // The same answer as without the file, with the same batches.
    CHECK(nlohmann::json::parse(same_batches_of("tiny-Q8_0.gguf", half, shorter).out)["text"] ==
          js["text"]);
}
// With the batch-invariant arithmetic a prefix reused from a file gives the
// logits of a run without it, bit for bit; a prompt that parts from the file
// earlier than the file can serve is refused with the reason (`why`).
static void check_reuse(const std::string& model, const std::string& why) {
    using namespace kvrun;
    CAPTURE(model);
    TempDir d;
    const std::string pc = d.file("p.cache");
    const auto lm = LoadedModel::load(kvtest::shared(model));
    const Model& m = lm->model;
    auto be = gl::make_cpu_backend(2, true);
    const KvCacheConfig cfg = KvCacheConfig::for_model(m.hp, 128, 4, gl::Type::F16, gl::Type::F16);
    std::mt19937 rng(5);
    std::vector<int32_t> longer(50);
    for (auto& t : longer) t = static_cast<int32_t>(rng() % m.hp.n_vocab);
    const std::vector<int32_t> prefix(longer.begin(), longer.begin() + 40);
    const size_t nv = static_cast<size_t>(m.hp.n_vocab);
    std::vector<float> want(nv);
    {
        KvCache kv(cfg);
        Forward fwd(m, kv, *be, 64);
        std::memcpy(want.data(), fwd.eval(longer.data(), 50, false), sizeof(float) * nv);
    }
    {
        KvCache kv(cfg);
        Forward fwd(m, kv, *be, 64);
        fwd.eval(prefix.data(), 17, false); // the window rings wrap twice
        fwd.eval(prefix.data() + 17, 23, false);
        save_prompt_cache(pc, 1234, kv, prefix);
    }
    KvCache kv(cfg);
    const PromptCacheLoad r = load_prompt_cache(pc, 1234, kv, longer, m);
    REQUIRE_MESSAGE(r.ok, r.why);
    CHECK(r.reused == 40);
    Forward fwd(m, kv, *be, 64);
    const float* got = fwd.eval(longer.data() + 40, 10, false);
    CHECK(std::memcmp(got, want.data(), sizeof(float) * nv) == 0);
    // A shorter shared prefix than the file's: the window rings wrapped past
    // it, so the file cannot serve it, and says why.
    std::vector<int32_t> other(prefix.begin(), prefix.begin() + 30);
    other.push_back(7);
    KvCache kv2(cfg);
    const PromptCacheLoad r2 = load_prompt_cache(pc, 1234, kv2, other, m);
    CHECK_FALSE(r2.ok);
    CHECK(r2.why.find(why) != std::string::npos);
}

// Gemma 4: only the layers with K/V of their own are saved (rows of 32 on
// window layers, 64 on global ones); the two sharing layers read them back.
TEST_CASE("prompt cache: Gemma 4's own and shared K/V come back exactly") {
    check_reuse("models/next/tiny-gemma4-Q4_K_M.gguf", "sliding-window");
}

// Qwen 3.5: the recurrent layers' states after the file's last token come
// back with the attention layers' slots; a prompt that parts from the file
// before its end cannot use them (a state holds every token it saw).
TEST_CASE("prompt cache: Qwen 3.5's recurrent states come back with the K/V") {
    check_reuse("models/next/tiny-qwen35-Q4_K_M.gguf", "recurrent layers' state");
}
