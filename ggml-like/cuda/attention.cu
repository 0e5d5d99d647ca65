// Attention over the KV ring (rules: attention.h), split along the keys.
//
// Keys of query token t are the n_slots device slots (the whole ring, or its
// hot part) followed by the batch's own rows 0..t: n_slots + n_tok "virtual"
// key indices, of which each query hides the
// ones attention.h says it must not see. The index range is cut into chunks
// of kAttnChunk keys; one 128-thread block handles one (chunk, head, token):
//   1. each warp scores one key at a time (lanes stride the head dimension,
//      coalesced, then a shuffle reduction); hidden keys score -inf;
//   2. the block takes the chunk's max m and the sum l of exp(score - m);
//   3. threads stride the head dimension and accumulate exp-weighted V rows,
//      writing the unnormalized partial (m, l, acc[head_dim]).
// A second kernel merges a (token, head)'s chunks by log-sum-exp:
//   M = max m_i,  out = sum_i e^(m_i - M) acc_i / sum_i e^(m_i - M) l_i,
// skipping chunks with l_i = 0 (every key hidden), and optionally records
// the log-sum-exp M + log L (for a merge with the CPU's cold partial,
// gl::attention_merge). This is flash-decoding:
// a decode step with a long context spreads over n_ctx / 256 blocks per head
// instead of one, and short contexts simply have one chunk.
//
// Sinks: once a query is past n_ctx (slid), a slot holding a sink position j
// is scored with the caller's pre-rotated copy sink_k[j] against the
// UNROTATED query, exactly as attention.cpp does.
#include <cmath>

#include "ggml-like/cuda/dequant.h"
#include "ggml-like/cuda/kernels.h"

namespace gl::cuda {

namespace {

constexpr int kAttnThreads = 128;
constexpr int kAttnWarps = kAttnThreads / 32;

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Every thread of the block gets the result.
template <bool Max> __device__ float block_reduce(float v, float* red) {
    v = Max ? warp_max(v) : warp_sum(v);
    __syncthreads(); // red may still be read from a previous reduction
    if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = v;
    __syncthreads();
    float r = red[0];
    for (int i = 1; i < kAttnWarps; i++) r = Max ? fmaxf(r, red[i]) : r + red[i];
    return r;
}

__global__ void __launch_bounds__(kAttnThreads)
    attn_partial_kernel(DevAttention a, int n_split, float* partial) {
    extern __shared__ float sh[]; // q[hd], q_unrot[hd], scores[kAttnChunk]
    __shared__ float red[kAttnWarps];
    const int split = blockIdx.x, h = blockIdx.y, t = blockIdx.z;
    const int hd = a.head_dim;
    const int kvd = a.n_head_kv * hd;
    const int kvh = h / (a.n_head / a.n_head_kv);
    const int64_t e0 = static_cast<int64_t>(kvh) * hd;
    const int64_t p = a.pos[t];
    const bool slid = p >= a.n_ctx;
    float* qs = sh;
    float* qus = sh + hd;
    float* sc = sh + 2 * hd;
    const int64_t qoff = (static_cast<int64_t>(t) * a.n_head + h) * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        qs[d] = a.q[qoff + d];
        qus[d] = (slid && a.q_unrot) ? a.q_unrot[qoff + d] : 0.0f;
    }
    __syncthreads();

    const int k_begin = split * kAttnChunk;
    const int k_end = min(k_begin + kAttnChunk, a.n_slots + a.n_tok);
    const int n_local = k_end - k_begin;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const auto* ks = static_cast<const uint8_t*>(a.k_slots);
    const auto* kn = static_cast<const uint8_t*>(a.k_new);

    // 1. scores (the kind is the same for the whole warp: one key per warp)
    for (int i = k_begin + warp; i < k_end; i += kAttnWarps) {
        int kind;
        const uint8_t* row = nullptr;
        const float* sk = nullptr;
        if (i < a.n_slots) {
            const int64_t sp = a.slot_pos[i];
            kind = slot_kind(sp, p, a.n_ctx, a.n_sink, a.window);
            if (kind == kShiftedSink) {
                if (a.sink_k && a.q_unrot)
                    sk = a.sink_k + sp * kvd + e0;
                else
                    kind = kHidden; // the host always supplies both when a query slid
            } else {
                row = ks + static_cast<int64_t>(i) * a.k_row_bytes;
            }
        } else {
            const int u = i - a.n_slots;
            kind = u <= t ? batch_kind(u, t, a.pos[u], p, a.n_ctx, a.n_sink, a.window) : kHidden;
            row = kn + static_cast<int64_t>(u) * a.k_row_bytes;
        }
        float s = -INFINITY;
        if (kind != kHidden) {
            float acc = 0.0f;
            if (kind == kShiftedSink) {
                for (int d = lane; d < hd; d += 32) acc = fmaf(sk[d], qus[d], acc);
            } else {
                for (int d = lane; d < hd; d += 32)
                    acc = fmaf(kv_elem(a.k_type, row, e0 + d), qs[d], acc);
            }
            s = warp_sum(acc) * a.scale;
        }
        if (lane == 0) sc[i - k_begin] = s;
    }
    __syncthreads();

    // 2. chunk max and sum of exponentials
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < n_local; j += blockDim.x) mx = fmaxf(mx, sc[j]);
    mx = block_reduce<true>(mx, red);
    float sum = 0.0f;
    for (int j = threadIdx.x; j < n_local; j += blockDim.x) {
        const float e = sc[j] == -INFINITY ? 0.0f : expf(sc[j] - mx);
        sc[j] = e;
        sum += e;
    }
    sum = block_reduce<false>(sum, red); // its barriers also publish sc[]

    // 3. weighted values
    const auto* vs = static_cast<const uint8_t*>(a.v_slots);
    const auto* vn = static_cast<const uint8_t*>(a.v_new);
    float* part = partial + ((static_cast<int64_t>(t) * a.n_head + h) * n_split + split) * (hd + 2);
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float acc = 0.0f;
        for (int j = 0; j < n_local; j++) {
            const float wgt = sc[j];
            if (wgt == 0.0f) continue;
            const int i = k_begin + j;
            const uint8_t* row = i < a.n_slots
                                     ? vs + static_cast<int64_t>(i) * a.v_row_bytes
                                     : vn + static_cast<int64_t>(i - a.n_slots) * a.v_row_bytes;
            acc = fmaf(wgt, kv_elem(a.v_type, row, e0 + d), acc);
        }
        part[2 + d] = acc;
    }
    if (threadIdx.x == 0) {
        part[0] = mx;
        part[1] = sum;
    }
}

__global__ void __launch_bounds__(kAttnThreads)
    attn_merge_kernel(int n_head, int hd, int n_split, const float* __restrict__ partial,
                      float* __restrict__ out, float* __restrict__ lse) {
    const int h = blockIdx.x, t = blockIdx.y;
    const int64_t th = static_cast<int64_t>(t) * n_head + h;
    const float* base = partial + th * n_split * (hd + 2);
    float M = -INFINITY;
    for (int s = 0; s < n_split; s++)
        if (base[s * (hd + 2) + 1] > 0.0f) M = fmaxf(M, base[s * (hd + 2)]);
    float L = 0.0f;
    for (int s = 0; s < n_split; s++) {
        const float l = base[s * (hd + 2) + 1];
        if (l > 0.0f) L += l * expf(base[s * (hd + 2)] - M);
    }
    // The query always sees itself, so L >= 1 here.
    const float inv = 1.0f / L;
    if (lse && threadIdx.x == 0) lse[th] = M + logf(L);
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float acc = 0.0f;
        for (int s = 0; s < n_split; s++) {
            const float* p = base + s * (hd + 2);
            if (p[1] > 0.0f) acc = fmaf(p[2 + d], expf(p[0] - M), acc);
        }
        out[th * hd + d] = acc * inv;
    }
}

} // namespace

void attention(const DevAttention& a, float* partial, cudaStream_t s) {
    if (a.n_tok <= 0) return;
    const int n_split = attention_splits(a.n_slots, a.n_tok);
    const size_t shmem = sizeof(float) * (2 * static_cast<size_t>(a.head_dim) + kAttnChunk);
    const dim3 grid(static_cast<unsigned>(n_split), static_cast<unsigned>(a.n_head),
                    static_cast<unsigned>(a.n_tok));
    attn_partial_kernel<<<grid, kAttnThreads, shmem, s>>>(a, n_split, partial);
    const dim3 mgrid(static_cast<unsigned>(a.n_head), static_cast<unsigned>(a.n_tok));
    attn_merge_kernel<<<mgrid, kAttnThreads, 0, s>>>(a.n_head, a.head_dim, n_split, partial, a.out,
                                                     a.lse);
}

} // namespace gl::cuda
