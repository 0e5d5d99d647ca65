// Gated DeltaNet ops (linear attention with a delta-rule state, as in Qwen
// 3.5's recurrent layers), on the CPU, over a batch of consecutive tokens of
// one sequence. The recurrence is sequential in the tokens by nature; its
// step is a kernel-table entry (SIMD per ISA, ref::delta_rule the reference).
#pragma once

#include <cstdint>

namespace gl::cpu {

// Causal depthwise conv, then SiLU: for each of `channels` channels,
// out[t][c] = silu(sum_j window[t + j][c] * w[c][j]), window = the last
// kernel-1 input rows (state: [kernel-1][channels], oldest first) followed by
// x's n rows; tap kernel-1 meets the current input. state is left holding the
// last kernel-1 input rows. x, out: n rows of `channels` floats (out may not
// alias x).
void causal_conv1d_silu(float* state, const float* x, const float* w, int64_t n, int channels,
                        int kernel, float* out);

// rows runs of n floats, each scaled to x / sqrt(sum x^2 + eps) in place.
void l2_normalize(float* x, int64_t rows, int n, float eps);

// The gated delta rule, token by token. Per value head h (state S[h]: d_v
// rows of d_k, S[h][j][i], key index i contiguous) with key head h % n_k_heads
// and token t:
//   S = S * exp(g[t][h]);  d[j] = (v[j] - S[j] . k) * beta[t][h];
//   S[j] += d[j] * k;      out[j] = (S[j] . q) / sqrt(d_v)
// qkv: n rows of `stride` floats holding q (n_k_heads x d_k), then k (the
// same), then v (n_v_heads x d_v), q and k L2-normalised; g, beta: n rows of
// n_v_heads; out: n rows of n_v_heads x d_v.
// Value heads [h0, h1) only (threads split the heads: each head's tokens
// stay in order, so the result does not depend on the split). Each step is
// the active kernel table's delta_rule.
void gated_delta_rule(float* state, const float* qkv, int64_t stride, const float* g,
                      const float* beta, int64_t n, int n_v_heads, int n_k_heads, int d_k, int d_v,
                      float* out, int h0, int h1);

} // namespace gl::cpu
