// Forward's blocks of the late-2026 families: Gemma 4's per-layer token
// inputs and Qwen 3.5's Gated DeltaNet layers (the rest of the pass is
// forward.cpp's).
#include <algorithm>
#include <cmath>

#include "error.h"
#include "forward.h"
#include "ggml-like/cpu/delta_net.h"
#include "ggml-like/kernels.h"

namespace kvrun {

// PLI[l][t] = (rmsnorm(proj(x_t) / sqrt(n_embd), per layer) + embd_l(t) * sqrt(P)) / sqrt(2),
// for each layer l's slice of P of a token's per-layer row (x_t: the scaled
// token embedding).
void Forward::per_layer_inputs(gl::Backend& be, const int32_t* tokens, int n) {
    const Hparams& hp = m_.hp;
    const int P = hp.n_embd_per_layer, W = hp.n_layer * P;
    matmul(be, Op::other, m_.per_layer_model_proj, x_.data(), n, pl_proj_.data());
    be.host_read(pl_proj_.data(), sizeof(float) * static_cast<size_t>(n) * W);
    OpTimer t(profile_, Op::other);
    const float proj_scale = 1.0f / std::sqrt(static_cast<float>(hp.n_embd));
    for (size_t j = 0; j < static_cast<size_t>(n) * W; j++) pl_proj_[j] *= proj_scale;
    be.host_wrote(pl_proj_.data(), sizeof(float) * static_cast<size_t>(n) * W);
    be.rmsnorm(pl_proj_.data(), m_.per_layer_proj_norm.data(), P,
               static_cast<int64_t>(n) * hp.n_layer, hp.rms_eps, pl_normed_.data());
    be.host_read(pl_normed_.data(), sizeof(float) * static_cast<size_t>(n) * W);
    const float embd_scale = std::sqrt(static_cast<float>(P));
    const float half_scale = 1.0f / std::sqrt(2.0f);
    float* row = pl_proj_.data(); // free again: one token's embedding row
    for (int i = 0; i < n; i++) {
        gl::cpu::dequantize_row(m_.per_layer_token_embd.type, m_.per_layer_token_embd.row(tokens[i]),
                                row, W);
        for (int l = 0; l < hp.n_layer; l++) {
            float* out = pli_.data() + (static_cast<size_t>(l) * max_batch_ + i) * P;
            const float* normed = pl_normed_.data() + static_cast<size_t>(i) * W + l * P;
            for (int j = 0; j < P; j++)
                out[j] = (normed[j] + row[l * P + j] * embd_scale) * half_scale;
        }
    }
    wrote(pli_.data(), sizeof(float) * pli_.size());
}

void Forward::per_layer_input_block(int l, int n) {
    const Hparams& hp = m_.hp;
    const LayerWeights& L = m_.layers[l];
    gl::Backend& be = *place_.layers[l];
    const int P = hp.n_embd_per_layer;
    matmul(be, Op::other, L.w_inp_gate, x_.data(), n, pl_gate_.data());
    {
        OpTimer t(profile_, Op::other);
        be.gelu_mul(pl_gate_.data(), pli_.data() + static_cast<size_t>(l) * max_batch_ * P,
                    static_cast<int64_t>(n) * P);
    }
    matmul(be, Op::other, L.w_inp_proj, pl_gate_.data(), n, xb_.data());
    add_residual(be, n, L.inp_post_norm);
}

void Forward::recurrent_block(int l, int n) {
    const Hparams& hp = m_.hp;
    const LayerWeights& L = m_.layers[l];
    gl::Backend& be = *place_.layers[l];
    const int C = hp.ssm_conv_dim(), H = hp.ssm_n_v_heads, dk = hp.ssm_d_state,
              dv = hp.ssm_v_head_dim(), inner = hp.ssm_d_inner;
    const size_t N = static_cast<size_t>(n);
    rmsnorm(be, x_.data(), L.attn_norm, n, xb_.data());
    matmul(be, Op::attn_q, L.w_ssm_qkv, xb_.data(), n, ssm_qkv_.data());
    matmul(be, Op::attn_v, L.w_ssm_z, xb_.data(), n, ssm_z_.data());
    matmul(be, Op::other, L.w_ssm_beta, xb_.data(), n, ssm_beta_.data());
    matmul(be, Op::other, L.w_ssm_alpha, xb_.data(), n, ssm_g_.data());
    be.host_read(ssm_qkv_.data(), sizeof(float) * N * C);
    be.host_read(ssm_beta_.data(), sizeof(float) * N * H);
    be.host_read(ssm_g_.data(), sizeof(float) * N * H);
    {
        OpTimer t(profile_, Op::attention);
        // Write strength sigmoid(beta); decay exp(g), g = softplus(alpha + dt) * a <= 0.
        for (size_t i = 0; i < N; i++)
            for (int h = 0; h < H; h++) {
                float& b = ssm_beta_[i * H + h];
                b = 1.0f / (1.0f + std::exp(-b));
                const float x = ssm_g_[i * H + h] + L.ssm_dt_bias[h];
                ssm_g_[i * H + h] = (x > 20.0f ? x : std::log1p(std::exp(x))) * L.ssm_a[h];
            }
        // Each sequence's rows through its own states (one, but for kvrun batch).
        for (const Segment& s : segs_) {
            const size_t r0 = static_cast<size_t>(s.row0);
            if (s.kv == home_)
                if (const int64_t at = s.kv->checkpoint_offset(s.n); at >= 0)
                    log_recurrent_inputs(l, at, s.n, r0);
            gl::cpu::causal_conv1d_silu(s.kv->conv_state(l), ssm_qkv_.data() + r0 * C,
                                        L.ssm_conv.data(), s.n, C, hp.ssm_conv_kernel,
                                        ssm_conv_.data() + r0 * C);
        }
        // q and k per key head to unit length (they sit first in each row).
        for (size_t i = 0; i < N; i++)
            gl::cpu::l2_normalize(ssm_conv_.data() + i * C, 2 * hp.ssm_n_k_heads, dk, hp.rms_eps);
        for (const Segment& s : segs_) {
            const size_t r0 = static_cast<size_t>(s.row0);
            be.gated_delta_rule(s.kv->ssm_state(l), ssm_conv_.data() + r0 * C, C,
                                ssm_g_.data() + r0 * H, ssm_beta_.data() + r0 * H, s.n, H,
                                hp.ssm_n_k_heads, dk, dv, ssm_o_.data() + r0 * inner);
        }
    }
    wrote(ssm_o_.data(), sizeof(float) * N * inner);
    // Each head's output RMS-normed, gated by silu(z), projected back.
    be.rmsnorm(ssm_o_.data(), L.ssm_norm.data(), dv, static_cast<int64_t>(n) * H, hp.rms_eps,
               ssm_o2_.data());
    be.silu_mul(ssm_z_.data(), ssm_o2_.data(), static_cast<int64_t>(n) * inner);
    matmul(be, Op::attn_output, L.w_ssm_out, ssm_z_.data(), n, xb_.data());
    defer_residual(be, n, L.post_attn_norm); // added by the FFN's norm_residual
}

void Forward::log_recurrent_inputs(int l, int64_t at, int n, size_t row0) {
    const Hparams& hp = m_.hp;
    const size_t C = static_cast<size_t>(hp.ssm_conv_dim()), H = hp.ssm_n_v_heads;
    if (recurrent_log_.empty()) recurrent_log_.resize(hp.n_layer);
    RecurrentLog& g = recurrent_log_[l];
    const size_t end = static_cast<size_t>(at + n);
    if (g.beta.size() < end * H) {
        g.qkv.resize(end * C);
        g.beta.resize(end * H);
        g.g.resize(end * H);
    }
    std::copy_n(ssm_qkv_.data() + row0 * C, n * C, g.qkv.data() + at * C);
    std::copy_n(ssm_beta_.data() + row0 * H, n * H, g.beta.data() + at * H);
    std::copy_n(ssm_g_.data() + row0 * H, n * H, g.g.data() + at * H);
}

void Forward::replay_recurrent(int k) {
    const Hparams& hp = m_.hp;
    const int C = hp.ssm_conv_dim(), dk = hp.ssm_d_state;
    KV_ASSERT(k >= 0 && k <= max_batch_);
    if (k == 0) return;
    for (int l = 0; l < hp.n_layer; l++) {
        if (!hp.is_recurrent(l)) continue;
        const RecurrentLog& g = recurrent_log_.at(l);
        KV_ASSERT(g.beta.size() >= static_cast<size_t>(k) * hp.ssm_n_v_heads);
        gl::cpu::causal_conv1d_silu(home_->conv_state(l), g.qkv.data(), m_.layers[l].ssm_conv.data(),
                                    k, C, hp.ssm_conv_kernel, ssm_conv_.data());
        for (int i = 0; i < k; i++)
            gl::cpu::l2_normalize(ssm_conv_.data() + static_cast<size_t>(i) * C,
                                  2 * hp.ssm_n_k_heads, dk, hp.rms_eps);
        place_.layers[l]->gated_delta_rule(home_->ssm_state(l), ssm_conv_.data(), C, g.g.data(),
                                           g.beta.data(), k, hp.ssm_n_v_heads, hp.ssm_n_k_heads,
                                           dk, hp.ssm_v_head_dim(), ssm_o_.data());
    }
}

} // namespace kvrun
