// Forward's mixture-of-experts FFN (qwen3moe, qwen35moe). A token reads only
// the experts it is routed to, and each expert's weights are read once per
// batch for all the tokens sent to it (its rows gathered, multiplied as one
// batch, scattered back). Each token's sum runs over its experts in
// ascending order whatever else is in the batch, so that with a
// batch-invariant backend (--deterministic) a token's output does not depend
// on which other tokens share its experts.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "forward.h"

namespace kvrun {

void Forward::experts_block(int l, int n) {
    const Hparams& hp = m_.hp;
    const LayerWeights& L = m_.layers[l];
    gl::Backend& be = *place_.layers[l];
    const size_t D = static_cast<size_t>(hp.n_embd), N = static_cast<size_t>(n);
    const int ff = hp.n_ff_exp;

    rmsnorm(be, x_.data(), L.ffn_norm, n, xb_.data());
    matmul(be, Op::ffn_router, L.w_router, xb_.data(), n, router_.data());
    be.host_read(router_.data(), sizeof(float) * N * hp.n_expert);
    be.host_read(xb_.data(), sizeof(float) * N * D);
    {
        OpTimer t(profile_, Op::other);
        routing_.route(router_.data(), n);
        std::fill_n(experts_sum_.data(), N * D, 0.0f);
    }
    for (int e = 0; e < hp.n_expert; e++) {
        const int c = routing_.count(e);
        if (c == 0) continue;
        const int32_t* tokens = routing_.tokens.data() + routing_.offset[e];
        const float* weights = routing_.token_weights.data() + routing_.offset[e];
        // The expert's tokens' rows, gathered unless they are the whole batch.
        const float* in = xb_.data();
        if (c < n) {
            OpTimer t(profile_, Op::other);
            for (int j = 0; j < c; j++)
                std::memcpy(expert_in_.data() + j * D, xb_.data() + tokens[j] * D,
                            D * sizeof(float));
            wrote(expert_in_.data(), sizeof(float) * c * D);
            in = expert_in_.data();
        }
        matmul_part(be, Op::ffn_gate, L.exp_gate[e], in, c, n, hb_.data());
        matmul_part(be, Op::ffn_up, L.exp_up[e], in, c, n, hb2_.data());
        {
            OpTimer t(profile_, Op::other);
            be.silu_mul(hb_.data(), hb2_.data(), static_cast<int64_t>(c) * ff);
        }
        matmul_part(be, Op::ffn_down, L.exp_down[e], hb_.data(), c, n, expert_out_.data());
        be.host_read(expert_out_.data(), sizeof(float) * c * D);
        OpTimer t(profile_, Op::other);
        for (int j = 0; j < c; j++) {
            float* sum = experts_sum_.data() + tokens[j] * D;
            const float* y = expert_out_.data() + j * D;
            const float w = weights[j];
            for (size_t i = 0; i < D; i++) sum[i] += w * y[i];
        }
    }
    if (L.w_shexp_gate) {
        // The shared expert, always on, scaled per token by sigmoid(g . x).
        matmul(be, Op::ffn_gate, L.w_shexp_gate, xb_.data(), n, hb_.data());
        matmul(be, Op::ffn_up, L.w_shexp_up, xb_.data(), n, hb2_.data());
        {
            OpTimer t(profile_, Op::other);
            be.silu_mul(hb_.data(), hb2_.data(), static_cast<int64_t>(n) * hp.n_ff_shexp);
        }
        matmul(be, Op::ffn_down, L.w_shexp_down, hb_.data(), n, expert_out_.data());
        be.host_read(expert_out_.data(), sizeof(float) * N * D);
        OpTimer t(profile_, Op::other);
        for (size_t i = 0; i < N; i++) {
            const float* x = xb_.data() + i * D;
            float g = 0;
            for (size_t j = 0; j < D; j++) g += L.shexp_gate_inp[j] * x[j];
            g = 1.0f / (1.0f + std::exp(-g));
            float* sum = experts_sum_.data() + i * D;
            const float* y = expert_out_.data() + i * D;
            for (size_t j = 0; j < D; j++) sum[j] += g * y[j];
        }
    }
    std::memcpy(xb_.data(), experts_sum_.data(), sizeof(float) * N * D);
    wrote(xb_.data(), sizeof(float) * N * D);
    add_residual(be, n, L.post_ffn_norm);
}

} // namespace kvrun
