// Gated DeltaNet ops (linear attention with a delta-rule state, as in Qwen
// 3.5's recurrent layers), on the CPU, over a batch of consecutive tokens of
// one sequence. Plain loops over contiguous rows: the compiler vectorises the
// inner ones; the recurrence is sequential in the tokens by nature.
#pragma once

#include <cstdint>

namespace gl::cpu {

// Causal depthwise conv, then SiLU: for each of `channels` channels,
// out[t][c] = silu(sum_j window[c][t + j] * w[c][j]), window = the channel's
// last kernel-1 inputs (state[c], oldest first) followed by x[0..n)[c]; tap
// kernel-1 meets the current input. state is left holding the last kernel-1
// inputs. x, out: n rows of `channels` floats (out may not alias x).
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
void gated_delta_rule(float* state, const float* qkv, int64_t stride, const float* g,
                      const float* beta, int64_t n, int n_v_heads, int n_k_heads, int d_k, int d_v,
                      float* out);

} // namespace gl::cpu
