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

namespace {

// sum += w * y over n floats.
void add_scaled(float* sum, const float* y, float w, size_t n) {
    for (size_t i = 0; i < n; i++) sum[i] += w * y[i];
}

// The shared expert's weight for a token: sigmoid(g . x).
float shared_weight(const LayerWeights& L, const float* x, size_t n) {
    float g = 0;
    for (size_t j = 0; j < n; j++) g += L.shexp_gate_inp[j] * x[j];
    return 1.0f / (1.0f + std::exp(-g));
}

} // namespace

// out = down(silu(gate x) * up x) for `rows` rows of a batch of n_batch
// tokens (hb_, hb2_ hold the `width` wide rows between).
void Forward::swiglu(gl::Backend& be, const gl::Tensor& gate, const gl::Tensor& up,
                     const gl::Tensor& down, const float* x, int rows, int n_batch, int width,
                     float* out) {
    matmul_part(be, Op::ffn_gate, gate, x, rows, n_batch, hb_.data());
    matmul_part(be, Op::ffn_up, up, x, rows, n_batch, hb2_.data());
    {
        OpTimer t(profile_, Op::other);
        be.silu_mul(hb_.data(), hb2_.data(), static_cast<int64_t>(rows) * width);
    }
    matmul_part(be, Op::ffn_down, down, hb_.data(), rows, n_batch, out);
    be.host_read(out, sizeof(float) * rows * m_.hp.n_embd);
}

void Forward::experts_wrote(gl::Backend& be, gl::Backend& eb, size_t hidden_floats,
                            size_t out_floats) {
    if (&eb == &be) return;
    wrote(hb_.data(), sizeof(float) * hidden_floats);
    wrote(hb2_.data(), sizeof(float) * hidden_floats);
    wrote(expert_out_.data(), sizeof(float) * out_floats);
}

// One token (generation): every routed expert's gate and up rows, and the
// shared expert's, in one call of the backend, then their down rows in
// another. The CPU backend runs each as one parallel loop, where a loop per
// matrix would hand work to the threads 24 times a layer and restart their
// streams as often. Each product takes the bits of its one-token matmul, and
// the sum runs in the same order as in a batch: the experts ascending, then
// the shared one. Where the routed experts run on another backend than the
// layer (--n-cpu-moe), the shared expert runs on the layer's, after them.
void Forward::experts_one_token(gl::Backend& be, gl::Backend& eb, const LayerWeights& L) {
    const Hparams& hp = m_.hp;
    const size_t D = static_cast<size_t>(hp.n_embd), F = static_cast<size_t>(hp.n_ff_exp);
    int k = 0;
    for (int e = 0; e < hp.n_expert && k < hp.n_expert_used; e++) {
        if (routing_.count(e) == 0) continue;
        picked_[k] = e;
        picked_weight_[k++] = routing_.token_weights[routing_.offset[e]];
    }
    const bool shared_elsewhere = L.w_shexp_gate && &eb != &be;
    const bool shared = L.w_shexp_gate && !shared_elsewhere; // in eb's group
    // Routed expert j's hidden rows at j * F of hb_ and hb2_, the shared
    // expert's right after them: one SwiGLU call covers every slot.
    const size_t width = k * F + (shared ? static_cast<size_t>(hp.n_ff_shexp) : 0);
    std::vector<gl::MatvecJob>& jobs = group_jobs_;
    double bytes = 0;
    int n_jobs = 0;
    auto gate_up = [&](const gl::Tensor& gate, const gl::Tensor& up, size_t at) {
        jobs[n_jobs++] = {&gate, xb_.data(), hb_.data() + at};
        jobs[n_jobs++] = {&up, xb_.data(), hb2_.data() + at};
        bytes += static_cast<double>(gate.bytes() + up.bytes());
    };
    for (int j = 0; j < k; j++) gate_up(L.exp_gate[picked_[j]], L.exp_up[picked_[j]], j * F);
    if (shared) gate_up(L.w_shexp_gate, L.w_shexp_up, k * F);
    {
        OpTimer t(profile_, Op::ffn_gate_up, bytes);
        eb.matmul_group(jobs.data(), n_jobs);
    }
    {
        OpTimer t(profile_, Op::other);
        eb.silu_mul(hb_.data(), hb2_.data(), static_cast<int64_t>(width));
    }
    const int slots = k + (shared ? 1 : 0);
    n_jobs = 0;
    bytes = 0;
    for (int j = 0; j < slots; j++) {
        const gl::Tensor& down = j < k ? L.exp_down[picked_[j]] : L.w_shexp_down;
        jobs[n_jobs++] = {&down, hb_.data() + j * F, expert_out_.data() + j * D};
        bytes += static_cast<double>(down.bytes());
    }
    {
        OpTimer t(profile_, Op::ffn_down, bytes);
        eb.matmul_group(jobs.data(), n_jobs);
    }
    eb.host_read(expert_out_.data(), sizeof(float) * slots * D);
    experts_wrote(be, eb, width, slots * D);
    if (shared_elsewhere)
        swiglu(be, L.w_shexp_gate, L.w_shexp_up, L.w_shexp_down, xb_.data(), 1, 1, hp.n_ff_shexp,
               expert_out_.data() + k * D);
    OpTimer t(profile_, Op::other);
    for (int j = 0; j < k; j++)
        add_scaled(experts_sum_.data(), expert_out_.data() + j * D, picked_weight_[j], D);
    if (L.w_shexp_gate)
        add_scaled(experts_sum_.data(), expert_out_.data() + k * D, shared_weight(L, xb_.data(), D),
                   D);
}

// A batch of n tokens: each expert that has tokens multiplies all of them at
// once (their rows gathered unless they are the whole batch), then the shared
// expert the whole batch (on the layer's backend).
void Forward::experts_batch(gl::Backend& be, gl::Backend& eb, const LayerWeights& L, int n) {
    const Hparams& hp = m_.hp;
    const size_t D = static_cast<size_t>(hp.n_embd), N = static_cast<size_t>(n);
    const int ff = hp.n_ff_exp;
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
        swiglu(eb, L.exp_gate[e], L.exp_up[e], L.exp_down[e], in, c, n, ff, expert_out_.data());
        experts_wrote(be, eb, static_cast<size_t>(c) * ff, c * D);
        OpTimer t(profile_, Op::other);
        for (int j = 0; j < c; j++)
            add_scaled(experts_sum_.data() + tokens[j] * D, expert_out_.data() + j * D, weights[j],
                       D);
    }
    if (L.w_shexp_gate) {
        // The shared expert, always on, scaled per token by sigmoid(g . x).
        swiglu(be, L.w_shexp_gate, L.w_shexp_up, L.w_shexp_down, xb_.data(), n, n, hp.n_ff_shexp,
               expert_out_.data());
        OpTimer t(profile_, Op::other);
        for (size_t i = 0; i < N; i++)
            add_scaled(experts_sum_.data() + i * D, expert_out_.data() + i * D,
                       shared_weight(L, xb_.data() + i * D, D), D);
    }
}

void Forward::experts_block(int l, int n) {
    const Hparams& hp = m_.hp;
    const LayerWeights& L = m_.layers[l];
    gl::Backend& be = *place_.layers[l];
    const size_t D = static_cast<size_t>(hp.n_embd), N = static_cast<size_t>(n);

    norm_residual(be, L.ffn_norm, n, xb_.data()); // the attention block's add, then the norm
    matmul(be, Op::ffn_router, L.w_router, xb_.data(), n, router_.data());
    be.host_read(router_.data(), sizeof(float) * N * hp.n_expert);
    be.host_read(xb_.data(), sizeof(float) * N * D);
    {
        OpTimer t(profile_, Op::other);
        routing_.route(router_.data(), n);
        std::fill_n(experts_sum_.data(), N * D, 0.0f);
    }
    gl::Backend& eb = *place_.experts[l];
    if (n == 1)
        experts_one_token(be, eb, L);
    else
        experts_batch(be, eb, L, n);
    std::memcpy(xb_.data(), experts_sum_.data(), sizeof(float) * N * D);
    wrote(xb_.data(), sizeof(float) * N * D);
    add_residual(be, n, L.post_ffn_norm);
}

} // namespace kvrun
