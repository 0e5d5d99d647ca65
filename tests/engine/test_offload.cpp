// Partial offload (-ngl): Forward runs each layer, and the head, on the
// backend its Placement names. Checked on the CPU with two distinct CPU
// backend instances behind a counting wrapper: the split must give the same
// logits as one backend, and each backend must really get its share of the
// work. Plus the -ngl / --device / --kv-gpu-window option rules.
#include <doctest/doctest.h>

#include <fmt/format.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cli/common.h"
#include "error.h"
#include "forward.h"
#include "ggml-like/backend.h"
#include "ggml-like/cuda/cuda_backend.h"
#include "kv_cache.h"
#include "loader.h"
#include "forward_util.h"
#include "forwarding_backend.h"
#include "test_util.h"

using namespace kvrun;

namespace {

// A CPU backend that counts the calls this test checks (everything else
// forwarded as is).
class CountingBackend final : public kvtest::ForwardingBackend {
  public:
    explicit CountingBackend(int threads) : ForwardingBackend(gl::make_cpu_backend(threads)) {}
    int matmuls = 0, attentions = 0, norms = 0;

    std::string name() const override { return "counting " + inner().name(); }
    // The row layout, as this double always had (the gl::Backend default):
    // the split here is checked on row-layout caches, and test_coherence's
    // fake device (which forwards the CPU's head-major layout) covers splits
    // over head-major ones.
    bool head_major_kv() const override { return false; }
    void matmul(const gl::Tensor& w, const float* x, int64_t n_tok, float* y) override {
        matmuls++;
        ForwardingBackend::matmul(w, x, n_tok, y);
    }
    void rmsnorm(const float* x, const float* w, int64_t n, int64_t rows, float eps,
                 float* out) override {
        norms++;
        ForwardingBackend::rmsnorm(x, w, n, rows, eps, out);
    }
    // The attention block's residual add with the FFN's norm (one norm).
    void add_rmsnorm(float* x, const float* y, const float* w, int64_t n, int64_t rows, float eps,
                     float* out) override {
        norms++;
        ForwardingBackend::add_rmsnorm(x, y, w, n, rows, eps, out);
    }
    void attention(const gl::AttentionArgs& a) override {
        attentions++;
        ForwardingBackend::attention(a);
    }
    void reset() { matmuls = attentions = norms = 0; }
};

} // namespace

TEST_CASE("offload: layers split across two backends give the same logits as one") {
    auto lm = LoadedModel::load(kvtest::shared("models/stories260K.gguf"));
    const int n_layer = lm->model.hp.n_layer;
    REQUIRE(n_layer >= 3);
    std::vector<int32_t> toks(60);
    std::mt19937 rng(11);
    for (auto& t : toks) t = static_cast<int32_t>(rng() % lm->model.hp.n_vocab);

    CountingBackend one(2);
    const std::vector<float> want = kvtest::logits_of_all(*lm, Placement::all(one, n_layer), toks);
    const int evals = 5 + (60 - 35); // 5 batches of 7 fill 35 slots, then 25 single tokens
    CHECK(one.matmuls == evals * (7 * n_layer + 1));
    CHECK(one.attentions == evals * n_layer);

    for (int k : {0, 1, n_layer - 1, n_layer}) {
        CAPTURE(k);
        CountingBackend a(2), b(2); // same thread count: bit-identical arithmetic
        const std::vector<float> got =
            kvtest::logits_of_all(*lm, Placement::split(a, b, k, n_layer), toks);
        REQUIRE(got.size() == want.size());
        size_t differ = 0;
        for (size_t i = 0; i < got.size(); i++) differ += got[i] != want[i];
        CHECK(differ == 0);
        // The first k layers (7 matrices each) on a, the rest on b; the head
        // (one matrix, one norm) on a only when a holds every layer.
        const int head_on_a = k == n_layer ? 1 : 0;
        CHECK(a.matmuls == evals * (7 * k + head_on_a));
        CHECK(b.matmuls == evals * (7 * (n_layer - k) + 1 - head_on_a));
        CHECK(a.attentions == evals * k);
        CHECK(b.attentions == evals * (n_layer - k));
        CHECK(a.norms == evals * (2 * k + head_on_a));
        CHECK(b.norms == evals * (2 * (n_layer - k) + 1 - head_on_a));
    }

    // The placement itself.
    CountingBackend a(1), b(1);
    const Placement p = Placement::split(a, b, 2, n_layer);
    CHECK(p.layers[0] == &a);
    CHECK(p.layers[1] == &a);
    CHECK(p.layers[2] == &b);
    CHECK(p.head == &b);
    CHECK(p.distinct().size() == 2);
    CHECK(Placement::all(a, n_layer).distinct().size() == 1);
}

TEST_CASE("offload: -ngl, --device and --kv-gpu-window rules") {
    cli::CommonOptions o;
    CHECK(cli::resolve_gpu_layers(o, 22) == 0); // default: CPU
    o.device = "cuda";
    CHECK(cli::resolve_gpu_layers(o, 22) == 22); // --device cuda alone: everything
    o.n_gpu_layers = "7";
    CHECK(cli::resolve_gpu_layers(o, 22) == 7);
    o.n_gpu_layers = "99";
    CHECK(cli::resolve_gpu_layers(o, 22) == 22); // clamped
    o.n_gpu_layers = "all";
    CHECK(cli::resolve_gpu_layers(o, 22) == 22);
    o.n_gpu_layers = "0";
    CHECK(cli::resolve_gpu_layers(o, 22) == 0);
    o.device = "";
    o.n_gpu_layers = "3";
    CHECK(cli::resolve_gpu_layers(o, 22) == 3); // -ngl alone implies the GPU
    for (const char* junk : {"x", "-1", "3x"}) {
        o.n_gpu_layers = junk;
        CHECK_THROWS_AS(cli::resolve_gpu_layers(o, 22), Error);
    }
    o.device = "cpu";
    o.n_gpu_layers = "3";
    CHECK_THROWS_AS(cli::resolve_gpu_layers(o, 22), Error); // contradicts --device cpu
    o.n_gpu_layers = "0";
    CHECK(cli::resolve_gpu_layers(o, 22) == 0);
    o.device = "gpu";
    CHECK_THROWS_AS(cli::resolve_gpu_layers(o, 22), Error);

    // -ngl 0 and --device cpu need no GPU; a window without GPU layers is an error.
    o = {};
    o.n_gpu_layers = "0";
    Hparams five;
    five.n_layer = 5;
    cli::Backends b = cli::make_backends(o, 1, five);
    CHECK(!b.gpu);
    REQUIRE(b.cpu);
    CHECK(b.placement().distinct().size() == 1);
    o.kv_gpu_window = 64;
    CHECK_THROWS_AS(cli::make_backends(o, 1, five), Error);

    std::string why;
    if (!gl::cuda_available(&why)) {
        // -ngl alone falls back to the CPU (llama-cli's habit); --device cuda fails.
        o = {};
        o.n_gpu_layers = "2";
        const cli::Backends cpu_only = cli::make_backends(o, 1, five);
        CHECK(!cpu_only.gpu);
        CHECK(cpu_only.cpu);
        CHECK(cpu_only.n_gpu_layers == 0);
        // Every GPU flag falls back with -ngl: a window too (it failed, "needs layers on the GPU").
        o.kv_gpu_window = 64;
        CHECK(!cli::make_backends(o, 1, five).gpu);
        o.kv_gpu_window = 0;
        // --device cuda asks for the GPU, even with no layers on it.
        o.device = "cuda";
        o.n_gpu_layers = "0";
        CHECK_THROWS_AS(cli::make_backends(o, 1, five), Error);
        o.n_gpu_layers = "2";
        try {
            cli::make_backends(o, 1, five);
            FAIL("-ngl 2 --device cuda should fail without CUDA");
        } catch (const Error& e) {
            CHECK(e.code() == Exit::usage);
            CHECK(std::string(e.what()).find("-ngl 2") != std::string::npos);
            CHECK(std::string(e.what()).find(why) != std::string::npos);
        }
    }
}

TEST_CASE("offload: kvrun -ngl on the command line") {
    const std::string model = kvtest::shared("models/stories260K.gguf");
    // -ngl 0 runs on the CPU in any build.
    auto r = kvtest::run_kvrun({"-m", model, "-p", "Once", "-n", "3", "--temp", "0", "-ngl", "0"});
    CHECK(r.status == 0);
    std::string why;
    if (!gl::cuda_available(&why)) {
        // Without a GPU, -ngl N warns once and runs on the CPU (as llama-cli
        // does, so launchers that always pass -ngl 99 work); the tokens are the CPU's.
        const auto cpu = kvtest::run_kvrun(
            {"-m", model, "-p", "Once", "-n", "3", "--temp", "0", "-ngl", "0", "--quiet"});
        for (const char* n : {"1", "99", "all"}) {
            CAPTURE(n);
            r = kvtest::run_kvrun(
                {"-m", model, "-p", "Once", "-n", "3", "--temp", "0", "-ngl", n, "--quiet"});
            CHECK(r.status == 0);
            CHECK(r.out == cpu.out);
            CHECK(r.err ==
                  fmt::format("kvrun: warning: -ngl {}: {}; running on the CPU\n", n, why));
#ifndef KVRUN_HAS_CUDA
            CHECK(r.err.find("kvrun was built without CUDA") != std::string::npos);
#endif
        }
        // An explicit --device cuda is an error.
        for (std::vector<std::string> dev :
             {std::vector<std::string>{"--device", "cuda"}, {"--device", "cuda", "-ngl", "99"}}) {
            std::vector<std::string> a = {"-m", model, "-p", "Once", "-n", "3"};
            a.insert(a.end(), dev.begin(), dev.end());
            r = kvtest::run_kvrun(a);
            CHECK(r.status == 2);
            CHECK(r.err.find(why) != std::string::npos);
        }
        // A launcher written for a GPU machine: the hot/cold window falls back
        // with the layers, one warning naming both.
        r = kvtest::run_kvrun({"-m", model, "-p", "Once", "-n", "3", "--temp", "0", "-ngl", "99",
                               "--kv-gpu-window", "64", "--quiet"});
        CHECK(r.status == 0);
        CHECK(r.out == cpu.out);
        CHECK(r.err ==
              fmt::format("kvrun: warning: -ngl 99 --kv-gpu-window 64: {}; running on the CPU\n",
                          why));
        // -ngl 0 --device cuda fails as --device cuda does (it ran silently).
        r = kvtest::run_kvrun(
            {"-m", model, "-p", "Once", "-n", "3", "-ngl", "0", "--device", "cuda"});
        CHECK(r.status == 2);
        CHECK(r.err.find(why) != std::string::npos);
        r = kvtest::run_kvrun({"bench", "-m", model, "-p", "8", "-n", "2", "-r", "1", "-ngl", "1"});
        CHECK(r.status == 0);
        CHECK(r.err.find("running on the CPU") != std::string::npos);
    }
    r = kvtest::run_kvrun({"-m", model, "-p", "Once", "-n", "3", "-ngl", "x"});
    CHECK(r.status == 2);
    r = kvtest::run_kvrun({"-m", model, "-p", "Once", "-n", "3", "--kv-gpu-window", "16"});
    CHECK(r.status == 2);
    CHECK(r.err.find("--kv-gpu-window") != std::string::npos);
}

TEST_CASE("offload: the GPU memory summary of the stats line and chat's /stats") {
    gl::MemoryUse u; // a CPU run: no device
    CHECK(cli::gpu_memory_summary(u, 0, 22, 1 << 20).empty());
    u.device = true;
    u.weights = 600ull << 20;
    u.kv = 44ull << 20;
    u.scratch = 3ull << 19;
    CHECK(cli::gpu_memory_summary(u, 22, 22, 88ull << 20) ==
          "GPU 22/22 layers: weights 600.00 MiB, KV 44.00 MiB (host 88.00 MiB), scratch 1.50 MiB");
    u.weights = 0;
    u.weights_mapped = 2ull << 30; // Jetson: read in place
    CHECK(cli::gpu_memory_summary(u, 11, 22, 1024) ==
          "GPU 11/22 layers: weights 0 B + 2.00 GiB mapped, KV 44.00 MiB (host 1.0 KiB), scratch "
          "1.50 MiB");
}
