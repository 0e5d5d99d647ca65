// Causal multi-head attention of a batch of queries over
//   (a) a set of cached key/value rows ("slots"), each tagged with the
//       absolute position it holds, and
//   (b) the batch's own new key/value rows,
// with grouped-query heads (n_head a multiple of n_head_kv).
//
// The slot set is a ring (see src/engine/kv_cache.h), but this operation only needs
// the rules, which are about positions:
//   - a query at position p sees keys at positions in [lo(p), p], where
//     lo(p) = p - window + 1 once p >= n_ctx (the window has slid), else 0;
//   - positions < n_sink are attention sinks, always seen. While p < n_ctx they
//     are ordinary keys. Once p >= n_ctx they must look as if they sat just
//     before the window (distance n_ctx - 1 - j for sink j), so the caller
//     supplies them pre-rotated by -(n_ctx - 1 - j) in `sink_k` and they are
//     dotted with the *unrotated* query (RoPE scores depend on distance only).
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>

#include "ggml-like/types.h"

namespace gl {

struct AttentionArgs {
    int n_tok = 0, n_head = 0, n_head_kv = 0, head_dim = 0;
    float scale = 1.0f;
    const float* q = nullptr;       // [n_tok][n_head][head_dim], rotated at each token's position
    const float* q_unrot = nullptr; // same, not rotated (needed only when a query is past n_ctx)
    const int64_t* pos = nullptr;   // [n_tok] absolute positions, consecutive

    // Types of the K and V rows below (F32, F16, BF16 or a block type such as
    // Q8_0 / Q4_0, whose blocks run along the whole row: a head may start
    // mid-block). Row bytes are for n_head_kv * head_dim elements.
    Type k_type = Type::F16, v_type = Type::F16;
    size_t k_row_bytes = 0, v_row_bytes = 0;
    int n_ctx = 0;                 // number of slots
    const void* k_slots = nullptr; // [n_ctx] rows
    const void* v_slots = nullptr;
    // Head-major slots (float types only): KV head h's keys as key tiles of
    // n_ctx keys (gl::key_tile_index) at k_slots + h * k_head_bytes, its value
    // of slot s at v_slots + h * v_head_bytes + s * v_slot_bytes. 0 = the row
    // layout above (K and V each on its own).
    size_t k_head_bytes = 0, v_slot_bytes = 0, v_head_bytes = 0;
    // Paged slots (src/engine/kv_pool.h). The layouts above then hold
    // pool_slots slots (a multiple of block_slots, key tiles laid over all of
    // them), and slot s of the ring is pool slot
    //     slot_block[s / block_slots] * block_slots + s % block_slots.
    // slot_block null: slot s is pool slot s (the ring's blocks in order).
    // pool_slots 0: n_ctx. block_slots is a multiple of kKeyTile, so a block
    // is whole key tiles.
    const int32_t* slot_block = nullptr;
    int block_slots = 0;
    int pool_slots = 0;
    int64_t pool_slot(int64_t s) const {
        return slot_block ? slot_block[s / block_slots] * int64_t{block_slots} + s % block_slots
                          : s;
    }
    int tiled_slots() const { return pool_slots ? pool_slots : n_ctx; }
    const int64_t* slot_pos = nullptr; // [n_ctx], position held by each slot, -1 = empty;
                                       // all are < pos[0] (the batch is written after)
    const void* k_new = nullptr;       // [n_tok] rows, the batch's own keys (rotated) and values
    const void* v_new = nullptr;

    int n_sink = 0;                // kept prefix length
    int64_t window = 0;            // n_ctx - n_sink
    const float* sink_k = nullptr; // [n_sink][n_head_kv*head_dim] F32, pre-rotated by -(n_ctx-1-j)

    // A generated token's decode step (n_tok 1): may take half-precision
    // products where attention_half_products(). Prompt tokens never do, so
    // that a prompt's results do not depend on how it was batched (a prompt
    // cache hit evaluates its tail apart from its head).
    bool half_ok = false;
    // --deterministic: each query's keys in position order, in chunks at
    // fixed positions, each chunk gathered as F32 rows from wherever its keys
    // are (ring slots or the batch's own rows), one work item per (token,
    // head group). The output then depends on the positions and values alone:
    // not on how the tokens were batched, the thread count, or whether the
    // earlier positions came from this call, an earlier one or a prompt-cache
    // file. Ignores half_ok; attention() only (not attention_partial).
    bool batch_invariant = false;

    float* out = nullptr;     // [n_tok][n_head][head_dim]
    float* scratch = nullptr; // attention_scratch_floats(...)
};

class ThreadPool;
void attention(ThreadPool& pool, const AttentionArgs& a);

// Whether F16 keys and values are attended with half-precision products
// (AVX512-FP16: 32 products a 512-bit FMA, summed in F16 over spans of 16
// dimensions or keys, the spans in F32; see ggml-like/cpu/x86/fp16.h). On
// where the CPU has them, unless KVRUN_ATTN_F16=0; only for calls with
// AttentionArgs::half_ok.
bool attention_half_products();

// ---- partial attention (hot/cold KV) -------------------------------------------------
// The keys of one call split into disjoint subsets, each attended on its own
// and the results merged, equal the whole attention. For one (token, head) a
// subset's result is its softmax-normalised output o and the log-sum-exp L of
// its visible scores (L = -inf and o = 0 when the query sees none of its
// keys); two results merge as
//   M = max(L1, L2),  w_i = exp(L_i - M),  o = (w1 o1 + w2 o2) / (w1 + w2),
//   L = M + log(w1 + w2).
// Used by --kv-gpu-window: the GPU attends the sinks, the newest slots and the
// batch's own keys; the CPU the older slots, from host memory.
struct KeySubset {
    // A cached slot belongs when its index is in [slot_begin, slot_end) and
    // the position it holds in [pos_begin, pos_end); a batch key when
    // with_new and its position is in [pos_begin, pos_end).
    int slot_begin = 0, slot_end = std::numeric_limits<int>::max();
    int64_t pos_begin = std::numeric_limits<int64_t>::min();
    int64_t pos_end = std::numeric_limits<int64_t>::max();
    bool with_new = true;
};
// Writes a.out (normalised over the subset) and lse[n_tok][n_head].
void attention_partial(ThreadPool& pool, const AttentionArgs& a, const KeySubset& keys, float* lse);
// (out, lse) := merge of (out, lse) and (out2, lse2), per (token, head);
// out rows are [n_tok][n_head][head_dim].
void attention_merge(int64_t n_tok, int n_head, int head_dim, float* out, float* lse,
                     const float* out2, const float* lse2);
// Batches of at least this many tokens count as prompt batches (no software
// prefetches; on AMX, the prompt tile path).
constexpr int kAttentionPromptBatch = 16;
// Scratch floats attention needs, per thread, in this order:
//  - scores: of all keys for one head, or of a chunk of keys for up to 8 heads;
//  - a work area: room to dequantize one head's K and V (and the blocks
//    around it), or the grouped path's K and V chunks converted to F32
//    (2 x 64 keys x a head of up to 256 elements; longer heads take shorter
//    chunks);
//  - the runs of visible keys (at most one per key, three ints each);
// and after all threads' areas, shared, room for the batch's own keys as key
// tiles (n_tok x kv_dim elements of up to 4 bytes). For a prompt batch the
// scores and work area together also hold the AMX path's query, output and
// key/value tiles (attention_prompt_floats).
// Scores, work area and key tiles start on 64-byte boundaries (16 floats of
// slack): 512-bit loads and stores that straddle two cache lines cost twice.
constexpr int64_t kAttentionRunFloats = 3;
constexpr int64_t kAttentionTileFloats = 2 * 64 * 256;
constexpr int64_t kAttentionAlignFloats = 16;
inline int64_t attention_scores_floats(int n_ctx, int n_tok) {
    const int64_t n = std::max<int64_t>(static_cast<int64_t>(n_ctx) + n_tok, 8 * 64);
    return (n + kAttentionAlignFloats - 1) / kAttentionAlignFloats * kAttentionAlignFloats;
}
// The AMX prompt path's area for 128 query rows (see amx::attend_rows).
inline int64_t attention_prompt_floats(int head_dim) {
    return 320 * static_cast<int64_t>(head_dim) + 1280;
}
inline int64_t attention_work_floats(int kv_dim, int head_dim, int n_tok) {
    const int64_t grouped = std::max<int64_t>(
        2 * (static_cast<int64_t>(kv_dim) + 256),
        std::min<int64_t>(kAttentionTileFloats, 2 * 64 * static_cast<int64_t>(kv_dim)));
    return n_tok >= kAttentionPromptBatch ? std::max(grouped, attention_prompt_floats(head_dim))
                                          : grouped;
}
inline int64_t attention_scratch_per_thread(int n_ctx, int n_tok, int kv_dim, int head_dim) {
    return kAttentionAlignFloats + attention_scores_floats(n_ctx, n_tok) +
           attention_work_floats(kv_dim, head_dim, n_tok) + kAttentionRunFloats * (n_ctx + n_tok);
}
inline int64_t attention_scratch_floats(int n_threads, int n_ctx, int n_tok, int kv_dim,
                                        int head_dim) {
    return n_threads * attention_scratch_per_thread(n_ctx, n_tok, kv_dim, head_dim) +
           kAttentionAlignFloats + static_cast<int64_t>(n_tok) * kv_dim;
}

} // namespace gl
