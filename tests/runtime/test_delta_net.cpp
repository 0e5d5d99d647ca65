// Gated DeltaNet ops (cpu/delta_net.h): every kernel table's delta-rule step
// against the scalar reference on odd sizes; the conv and the recurrence give
// the same bits over a batch as token by token (the state carried), and
// whatever split of the heads the threads take.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "ggml-like/backend.h"
#include "ggml-like/cpu/delta_net.h"
#include "ggml-like/kernels.h"
#include "test_util.h"

namespace {

float max_rel(const std::vector<float>& a, const std::vector<float>& b) {
    float worst = 0;
    for (size_t i = 0; i < a.size(); i++)
        worst = std::max(worst, std::fabs(a[i] - b[i]) / (1.0f + std::fabs(b[i])));
    return worst;
}

} // namespace

TEST_CASE("delta rule: every table's step against the reference, odd sizes") {
    for (int t = 0; t < gl::kernel_table_count(); t++) {
        const gl::KernelTable& kt = gl::kernel_table(t);
        if (!kt.delta_rule) continue;
        CAPTURE(kt.isa);
        for (int64_t d_k : {1, 7, 8, 15, 16, 17, 33, 128}) {
            for (int64_t d_v : {1, 5, 32}) {
                CAPTURE(d_k);
                CAPTURE(d_v);
                const uint32_t seed = static_cast<uint32_t>(d_k * 100 + d_v);
                std::vector<float> s = kvtest::random_floats(d_v * d_k, seed, 0.5f);
                std::vector<float> k = kvtest::random_floats(d_k, seed + 1);
                std::vector<float> q = kvtest::random_floats(d_k, seed + 2);
                std::vector<float> v = kvtest::random_floats(d_v, seed + 3);
                std::vector<float> s_ref = s, o(d_v), o_ref(d_v);
                // Several steps: the state each leaves is the next one's.
                for (int step = 0; step < 3; step++) {
                    kt.delta_rule(s.data(), d_v, d_k, k.data(), q.data(), v.data(), 0.9f, 0.7f,
                                  0.125f, o.data());
                    gl::ref::delta_rule(s_ref.data(), d_v, d_k, k.data(), q.data(), v.data(),
                                        0.9f, 0.7f, 0.125f, o_ref.data());
                    CHECK(max_rel(o, o_ref) < 1e-5f);
                    CHECK(max_rel(s, s_ref) < 1e-5f);
                }
            }
        }
    }
}

TEST_CASE("delta net: a batch gives the bits of its tokens one at a time, whatever the head split") {
    const int n = 9, K = 4, n_k = 2, n_v = 6, d = 16;
    const int C = 2 * n_k * d + n_v * d;
    const std::vector<float> x = kvtest::random_floats(n * C, 1);
    const std::vector<float> w = kvtest::random_floats(C * K, 2, 0.5f);
    std::vector<float> g = kvtest::random_floats(n * n_v, 3, 0.3f), beta(n * n_v);
    for (float& v : g) v = -std::fabs(v);
    for (size_t i = 0; i < beta.size(); i++) beta[i] = 0.2f + 0.05f * static_cast<float>(i % 13);

    // The conv over the batch against a plain sum over the zero-padded history.
    std::vector<float> state(static_cast<size_t>(C) * (K - 1), 0.0f), conv(n * C);
    gl::cpu::causal_conv1d_silu(state.data(), x.data(), w.data(), n, C, K, conv.data());
    for (int t = 0; t < n; t++)
        for (int c = 0; c < C; c++) {
            double acc = 0;
            for (int j = 0; j < K; j++) {
                const int src = t - (K - 1) + j;
                if (src >= 0) acc += static_cast<double>(x[src * C + c]) * w[c * K + j];
            }
            const double want = acc / (1 + std::exp(-acc));
            CHECK(std::fabs(conv[t * C + c] - want) < 1e-5 * (1 + std::fabs(want)));
        }
    // Token by token, the state carried: the same bits, and the same state.
    std::vector<float> state1(state.size(), 0.0f), conv1(n * C);
    for (int t = 0; t < n; t++)
        gl::cpu::causal_conv1d_silu(state1.data(), x.data() + t * C, w.data(), 1, C, K,
                                    conv1.data() + t * C);
    CHECK(std::memcmp(conv.data(), conv1.data(), sizeof(float) * conv.size()) == 0);
    CHECK(std::memcmp(state.data(), state1.data(), sizeof(float) * state.size()) == 0);

    for (int i = 0; i < n; i++) gl::cpu::l2_normalize(conv.data() + i * C, 2 * n_k, d, 1e-6f);
    std::vector<float> S(static_cast<size_t>(n_v) * d * d, 0.0f), out(n * n_v * d);
    gl::cpu::gated_delta_rule(S.data(), conv.data(), C, g.data(), beta.data(), n, n_v, n_k, d, d,
                              out.data(), 0, n_v);
    std::vector<float> S1(S.size(), 0.0f), out1(out.size());
    for (int t = 0; t < n; t++)
        for (int h0 : {0, 1, 4}) { // heads in three ranges: [0,1), [1,4), [4,6)
            const int h1 = h0 == 0 ? 1 : h0 == 1 ? 4 : n_v;
            gl::cpu::gated_delta_rule(S1.data(), conv.data() + t * C, C, g.data() + t * n_v,
                                      beta.data() + t * n_v, 1, n_v, n_k, d, d,
                                      out1.data() + t * n_v * d, h0, h1);
        }
    CHECK(std::memcmp(out.data(), out1.data(), sizeof(float) * out.size()) == 0);
    CHECK(std::memcmp(S.data(), S1.data(), sizeof(float) * S.size()) == 0);
    // The CPU backend on 3 threads: the same bits again.
    std::vector<float> S3(S.size(), 0.0f), out3(out.size());
    auto be = gl::make_cpu_backend(3);
    be->gated_delta_rule(S3.data(), conv.data(), C, g.data(), beta.data(), n, n_v, n_k, d, d,
                         out3.data());
    CHECK(std::memcmp(out.data(), out3.data(), sizeof(float) * out.size()) == 0);
}
