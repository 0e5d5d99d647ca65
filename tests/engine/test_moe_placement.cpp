// Where a mixture of experts goes beside a GPU, planned from the file alone
// (plan_gpu, fit_gpu): --n-cpu-moe N keeps the first N layers' experts in
// host memory, and the fit for a free-memory figure puts every layer's
// attention and KV on the device first, then as many layers' experts as fit,
// the last layers' first. No GPU is needed: these are the plans.
#include <doctest/doctest.h>

#include "gguf.h"
#include "memory_plan.h"
#include "model.h"
#include "tensor_names.h"
#include "test_util.h"

using namespace kvrun;

namespace {

struct File {
    GgufFile f;
    Hparams hp;
    explicit File(const char* name)
        : f(GgufFile::open(kvtest::shared(std::string("models/next/") + name))),
          hp(read_hparams(f)) {}
    GpuPlan plan(int layers, int cpu_moe) const {
        return plan_gpu(f, hp, 512, 4, gl::Type::F16, gl::Type::F16, layers, 0, 64, cpu_moe);
    }
    GpuPlan fit(uint64_t free) const {
        return fit_gpu(f, hp, 512, 4, gl::Type::F16, gl::Type::F16, 0, 64, free);
    }
    // Bytes of layer l's expert tensors.
    uint64_t experts_of(int l) const {
        uint64_t n = 0;
        for (const GgufTensor& t : f.tensors())
            if (tensor_names::layer_of(t.name) == l && tensor_names::is_experts(t.name))
                n += t.nbytes;
        return n;
    }
};

} // namespace

TEST_CASE("moe placement: --n-cpu-moe keeps the first layers' experts on the host") {
    for (const char* name : {"tiny-qwen3moe-Q4_K_M.gguf", "tiny-qwen35moe-Q4_K_M.gguf"}) {
        CAPTURE(name);
        const File m(name);
        const int n = m.hp.n_layer;
        const GpuPlan all = m.plan(n, 0);
        uint64_t experts = 0;
        for (int l = 0; l < n; l++) experts += m.experts_of(l);
        REQUIRE(experts > 0);
        CHECK(all.experts_gpu == experts);
        CHECK(all.experts_host == 0);
        for (int k = 0; k <= n; k++) {
            CAPTURE(k);
            const GpuPlan g = m.plan(n, k);
            uint64_t host = 0;
            for (int l = 0; l < k; l++) host += m.experts_of(l);
            CHECK(g.n_cpu_moe == k);
            CHECK(g.experts_host == host);
            CHECK(g.experts_gpu == experts - host);
            // Only experts move: every byte is on one side, the KV and the
            // rest of the weights where -ngl puts them.
            CHECK(g.weights_gpu + g.weights_host == all.weights_gpu + all.weights_host);
            CHECK(g.weights_gpu == all.weights_gpu - host);
            CHECK(g.kv_gpu == all.kv_gpu);
        }
        // Layers left on the CPU keep their experts there whatever N says.
        const GpuPlan half = m.plan(2, 0);
        CHECK(half.experts_gpu == m.experts_of(0) + m.experts_of(1));
    }
    // A dense model has no experts to keep back.
    const File dense("tiny-qwen35-Q4_K_M.gguf");
    const GpuPlan d = dense.plan(dense.hp.n_layer, 3);
    CHECK(d.n_cpu_moe == 0);
    CHECK(d.experts_gpu + d.experts_host == 0);
}

TEST_CASE("moe placement: -ngl auto fills the free memory with attention and KV first, then the "
          "last layers' experts") {
    const File m("tiny-qwen3moe-Q4_K_M.gguf");
    const int n = m.hp.n_layer;
    const GpuPlan bare = m.plan(n, n);  // every layer, no expert on the GPU
    const GpuPlan whole = m.plan(n, 0); // everything
    REQUIRE(bare.gpu_total() < whole.gpu_total());
    // Room for everything: nothing stays on the host.
    CHECK(m.fit(whole.gpu_total()).n_cpu_moe == 0);
    CHECK(m.fit(whole.gpu_total()).n_gpu_layers == n);
    // Exactly the attention part: every layer on the GPU, every expert on the host.
    const GpuPlan tight = m.fit(bare.gpu_total());
    CHECK(tight.n_gpu_layers == n);
    CHECK(tight.n_cpu_moe == n);
    // Each layer's experts more: the last layers' go first.
    for (int k = 1; k <= n; k++) {
        CAPTURE(k);
        uint64_t extra = 0;
        for (int l = n - k; l < n; l++) extra += m.experts_of(l);
        const GpuPlan g = m.fit(bare.gpu_total() + extra);
        CHECK(g.n_gpu_layers == n);
        CHECK(g.n_cpu_moe == n - k);
        CHECK(g.gpu_total() <= bare.gpu_total() + extra);
        // One byte less and that layer's experts stay home.
        CHECK(m.fit(bare.gpu_total() + extra - 1).n_cpu_moe == n - k + 1);
    }
    // Less than the attention part: fewer layers, their experts on the host.
    const GpuPlan some = m.fit(bare.gpu_total() - 1);
    CHECK(some.n_gpu_layers < n);
    CHECK(some.gpu_total() <= bare.gpu_total() - 1);
    CHECK(some.experts_gpu == 0);
    CHECK(m.fit(0).n_gpu_layers == 0);
    // A dense model: as many whole layers as fit.
    const File dense("tiny-qwen35-Q4_K_M.gguf");
    const int nd = dense.hp.n_layer;
    const GpuPlan three = dense.plan(3, 0);
    CHECK(dense.fit(three.gpu_total()).n_gpu_layers == 3);
    CHECK(dense.fit(dense.plan(nd, 0).gpu_total()).n_gpu_layers == nd);
}
