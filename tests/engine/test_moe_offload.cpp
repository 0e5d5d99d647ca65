// Experts beside a GPU (--cpu-moe, --n-cpu-moe), checked on the CPU with the
// fake device of the CUDA tests (tests/support/fake_device.h): a layer's
// attention, router and shared expert run on a backend that keeps its outputs
// in device twins and poisons the host copies with NaN, the layer's routed
// experts on a CPU backend from host memory. A missing host_read where the
// normed rows and router logits come down, or a missing host_wrote where the
// experts' sum goes back up, would change the logits; they must equal the
// plain CPU backend's bit for bit, in prompt batches (experts grouped) and
// one generated token at a time (the experts' one parallel call).
#include <doctest/doctest.h>

#include <random>
#include <string>
#include <vector>

#include "fake_device.h"
#include "forward.h"
#include "forward_util.h"
#include "kv_cache.h"
#include "loader.h"
#include "test_util.h"

using namespace kvrun;

namespace {

// Logits of every position of `toks`: a batch of 9, then one token at a time.
// `each(n)` runs after each eval of n tokens.
template <class F>
std::vector<float> logits_of(const LoadedModel& lm, Placement p, const std::vector<int32_t>& toks,
                             F&& each) {
    const Hparams& hp = lm.model.hp;
    KvCache kv(KvCacheConfig::for_model(hp, 64, 4, gl::Type::F16, gl::Type::F16));
    Forward fwd(lm.model, kv, std::move(p), 9);
    std::vector<float> all;
    for (size_t i = 0; i < toks.size();) {
        const int n = i == 0 ? 9 : 1;
        const float* rows = fwd.eval(&toks[i], n, true);
        all.insert(all.end(), rows, rows + static_cast<size_t>(n) * hp.n_vocab);
        each(n);
        i += n;
    }
    return all;
}

} // namespace

using kvtest::differences;

TEST_CASE("moe offload: routed experts on the host beside device layers give the CPU's logits "
          "bit for bit") {
    for (const char* name : {"tiny-qwen3moe", "tiny-qwen35moe"}) {
        CAPTURE(name);
        const auto lm =
            LoadedModel::load(kvtest::shared(std::string("models/next/") + name + "-Q4_K_M.gguf"));
        const Hparams& hp = lm->model.hp;
        const int n_layer = hp.n_layer;
        REQUIRE(hp.is_moe());
        const bool shared = static_cast<bool>(lm->model.layers[0].w_shexp_gate);
        CHECK(shared == (std::string(name) == "tiny-qwen35moe"));
        std::vector<int32_t> toks(20);
        std::mt19937 rng(11);
        for (auto& t : toks) t = static_cast<int32_t>(rng() % hp.n_vocab);

        auto cpu = gl::make_cpu_backend(2);
        const std::vector<float> want =
            logits_of(*lm, Placement::all(*cpu, n_layer), toks, [](int) {});

        // Matrix products the device runs for one generated token, experts on
        // it or not.
        int device_matmuls_all = 0;
        {
            kvtest::FakeDeviceBackend fake(2);
            const std::vector<float> got =
                logits_of(*lm, Placement::all(fake, n_layer), toks, [&](int n) {
                    if (n == 1) device_matmuls_all = fake.matmuls;
                    fake.matmuls = 0;
                });
            CHECK(differences(got, want) == 0);
        }
        for (int host_layers : {1, n_layer - 1, n_layer}) {
            CAPTURE(host_layers);
            kvtest::FakeDeviceBackend fake(2);
            auto host = gl::make_cpu_backend(2);
            Placement p = Placement::all(fake, n_layer);
            p.experts_on(*host, host_layers);
            int decode_steps = 0;
            const std::vector<float> got = logits_of(*lm, std::move(p), toks, [&](int n) {
                if (n == 1) {
                    decode_steps++;
                    // Each host layer's k routed experts (gate, up, down) left
                    // the device; the shared expert stayed.
                    CHECK(fake.matmuls == device_matmuls_all - host_layers * 3 * hp.n_expert_used);
                }
                fake.matmuls = 0;
            });
            CHECK(differences(got, want) == 0);
            CHECK(decode_steps == 11);
        }
        // -ngl 2 --n-cpu-moe 1: layer 0's experts on the host, layer 1 whole
        // on the device, the rest and the head on the CPU.
        {
            kvtest::FakeDeviceBackend fake(2);
            auto rest = gl::make_cpu_backend(2);
            Placement p = Placement::split(fake, *rest, 2, n_layer);
            p.experts_on(*rest, 1);
            CHECK(p.distinct().size() == 2);
            const std::vector<float> got = logits_of(*lm, std::move(p), toks, [](int) {});
            CHECK(differences(got, want) == 0);
        }
    }
}
