#include "ggml-like/attention.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "ggml-like/cpu/gemm.h"
#include "ggml-like/cpu/ops.h"
#include "ggml-like/kernels.h"
#include "ggml-like/cpu/thread_pool.h"

#if defined(__x86_64__)
#include "ggml-like/cpu/x86/amx.h"
#include "ggml-like/cpu/x86/fp16.h"
#define GL_HAVE_AMX 1
#define GL_HAVE_FP16 1
#endif

namespace gl {

bool attention_half_products() {
#if GL_HAVE_FP16
    static const bool on = [] {
        const char* v = std::getenv("KVRUN_ATTN_F16");
        return !(v && std::strcmp(v, "0") == 0) && fp16::cpu_supported();
    }();
    return on;
#else
    return false;
#endif
}

namespace {

// One head's slice of a K or V row, as something a float kernel can use.
// Float types are used in place; block types are dequantized (only the blocks
// that cover the head) into `tmp`.
struct HeadReader {
    Type type;
    int64_t head_dim;
    size_t elem_bytes; // F32/F16/BF16: bytes per element; 0 for block types
    int64_t block;     // elements per block
    size_t block_bytes;

    HeadReader(Type t, int64_t hd) : type(t), head_dim(hd) {
        const TypeInfo& ti = type_info(t);
        block = ti.block_size;
        block_bytes = ti.type_size;
        elem_bytes = block == 1 ? ti.type_size : 0;
    }
    bool in_place() const { return elem_bytes != 0; }
    // Pointer to the head's first element, in `type` if in_place(), else F32 in tmp.
    const void* head(const uint8_t* row, int kvh, float* tmp) const {
        const int64_t first = kvh * head_dim;
        if (in_place()) return row + first * elem_bytes;
        const int64_t b0 = first / block, b1 = (first + head_dim + block - 1) / block;
        cpu::dequantize_row(type, row + b0 * block_bytes, tmp, (b1 - b0) * block);
        return tmp + (first - b0 * block);
    }
};

// The keys a token sees, as runs of consecutive rows: computed once per
// token and shared by its heads, so the per-head work is proportional to the
// visible keys and goes to the row kernels one run at a time.
enum class RunKind : int32_t {
    Slots, // ring slots [b, e), rotated keys
    Sink,  // one sink slot b past the window's slide: dot its pre-rotated key with the unrotated
           // query
    Batch, // the batch's own keys [b, e)
};
struct KeyRun {
    int32_t b, e;
    RunKind kind;
};
static_assert(sizeof(KeyRun) == 3 * sizeof(float));

// The end of the run of slots from s (before `end`) whose positions lie in
// [lo, hi): eight at a time without branching on each, since a decode step
// scans the whole ring once per layer (at depth 4096, ~0.3 ms a token one
// slot at a time).
int run_end(const int64_t* sp, int s, int end, int64_t lo, int64_t hi) {
    for (; s + 8 <= end; s += 8) {
        bool all = true;
        for (int i = 0; i < 8; i++) all &= (sp[s + i] >= lo) & (sp[s + i] < hi);
        if (!all) break;
    }
    while (s < end && sp[s] >= lo && sp[s] < hi) s++;
    return s;
}

// How far a run's keys are from where its slot indices say (a run within
// one block, AttentionArgs::slot_block): added to the slots' base address.
int64_t pool_shift(const AttentionArgs& a, const KeyRun& run) {
    return run.kind == RunKind::Batch ? 0 : a.pool_slot(run.b) - run.b;
}

// The runs of keys token t sees. With cut_blocks, slot runs end at every
// block boundary (AttentionArgs::block_slots): each is then one stretch of
// pool slots wherever its block is, and a lone cache (blocks in order) gets
// the same runs, so the same sums, as a sequence of a shared pool.
int visible_runs(const AttentionArgs& a, const KeySubset& keys, int t, KeyRun* out,
                 bool cut_blocks) {
    const int64_t p = a.pos[t];
    const bool slid = p >= a.n_ctx;
    const int64_t lo = slid ? p - a.window + 1 : 0;
    auto in_subset = [&](int64_t kp) { return kp >= keys.pos_begin && kp < keys.pos_end; };
    // 0: not seen, 1: ordinary slot, 2: shifted sink
    auto slot_kind = [&](int s) {
        if (s < keys.slot_begin || s >= keys.slot_end || !a.slot_pos) return 0;
        const int64_t sp = a.slot_pos[s];
        if (sp < 0 || !in_subset(sp)) return 0;
        if (sp < a.n_sink) return slid ? 2 : 1;
        return sp >= lo ? 1 : 0;
    };
    int n = 0;
    // Only the subset's slots: a decode step split over threads would scan
    // the whole ring once per split and kv head otherwise.
    const int s_end = std::min(a.n_ctx, keys.slot_end);
    for (int s = std::max(0, keys.slot_begin); s < s_end;) {
        if (a.slot_pos && a.slot_pos[s] < 0) { // empty slots (a ring not yet full)
            s = run_end(a.slot_pos, s + 1, s_end, std::numeric_limits<int64_t>::min(), 0);
            continue;
        }
        const int k = slot_kind(s);
        if (k != 1) {
            if (k == 2) out[n++] = {s, s + 1, RunKind::Sink};
            s++;
            continue;
        }
        // Ordinary slots are those whose positions lie in [max(pos_begin,
        // lo), pos_end): once slid, lo > every sink's position; before, the
        // sinks are ordinary keys.
        const int e =
            run_end(a.slot_pos, s + 1, s_end, std::max<int64_t>(keys.pos_begin, lo), keys.pos_end);
        for (; s < e;) {
            const int bs = a.block_slots;
            const int c = cut_blocks && bs > 0 ? std::min(e, (s / bs + 1) * bs) : e;
            out[n++] = {s, c, RunKind::Slots};
            s = c;
        }
    }
    auto batch_seen = [&](int u) {
        const int64_t up = a.pos[u];
        return keys.with_new && (up >= lo || up < a.n_sink) && in_subset(up);
    };
    for (int u = 0; u <= t;) {
        if (!batch_seen(u)) {
            u++;
            continue;
        }
        int e = u + 1;
        while (e <= t && batch_seen(e)) e++;
        out[n++] = {u, e, RunKind::Batch};
        u = e;
    }
    return n;
}

// One query head of one token over the runs of keys it sees: scores,
// softmax, weighted sum of values. `sc` holds the per-thread scratch (slot
// scores at sc[s], batch scores at sc[n_ctx + u]). With lse, also writes the
// log-sum-exp of the visible scores (-inf, and a zero output, when none).
// Block-type K/V rows are dequantized one row at a time.
void attend_one(const AttentionArgs& a, int t, int h, const KeyRun* runs, int n_runs, float* sc,
                float* lse) {
    const int hd = a.head_dim;
    const int kvh = h / (a.n_head / a.n_head_kv);
    const float* q = a.q + (static_cast<int64_t>(t) * a.n_head + h) * hd;
    const float* qu =
        a.q_unrot ? a.q_unrot + (static_cast<int64_t>(t) * a.n_head + h) * hd : nullptr;
    const HeadReader kr(a.k_type, hd), vr(a.v_type, hd);
    float* tmp = sc + a.n_ctx + a.n_tok;
    float* vtmp = tmp + a.n_head_kv * hd + 256;
    const auto* k_slots = static_cast<const uint8_t*>(a.k_slots);
    const auto* k_new = static_cast<const uint8_t*>(a.k_new);
    const auto* v_slots = static_cast<const uint8_t*>(a.v_slots);
    const auto* v_new = static_cast<const uint8_t*>(a.v_new);
    auto score_rows = [&](const uint8_t* base, int b, int e, float* out) {
        if (kr.in_place()) {
            cpu::dot_rows(a.k_type, hd, base + b * a.k_row_bytes + kvh * hd * kr.elem_bytes,
                          a.k_row_bytes, e - b, q, a.scale, out + b);
        } else {
            for (int i = b; i < e; i++)
                out[i] =
                    cpu::vec_dot(Type::F32, hd, kr.head(base + i * a.k_row_bytes, kvh, tmp), q) *
                    a.scale;
        }
    };
    float* out = a.out + (static_cast<int64_t>(t) * a.n_head + h) * hd;
    std::memset(out, 0, sizeof(float) * hd);
    auto add_rows = [&](const uint8_t* base, const float* w, int b, int e) {
        if (vr.in_place()) {
            cpu::axpy_rows(a.v_type, hd, base + b * a.v_row_bytes + kvh * hd * vr.elem_bytes,
                           a.v_row_bytes, e - b, w + b, out);
        } else {
            for (int i = b; i < e; i++)
                cpu::axpy(Type::F32, hd, w[i], vr.head(base + i * a.v_row_bytes, kvh, vtmp), out);
        }
    };

    float* scn = sc + a.n_ctx;
    float mx = -INFINITY;
    for (int r = 0; r < n_runs; r++) {
        const KeyRun& run = runs[r];
        float* dst = run.kind == RunKind::Batch ? scn : sc;
        if (run.kind == RunKind::Sink) {
            const int64_t sp = a.slot_pos[run.b];
            const float* k = a.sink_k + sp * a.n_head_kv * hd + kvh * hd;
            sc[run.b] = cpu::vec_dot(Type::F32, hd, k, qu) * a.scale;
        } else {
            score_rows(run.kind == RunKind::Batch ? k_new
                                                  : k_slots + pool_shift(a, run) * a.k_row_bytes,
                       run.b, run.e, dst);
        }
        for (int i = run.b; i < run.e; i++) mx = dst[i] > mx ? dst[i] : mx;
    }
    float* lse_out = lse ? lse + static_cast<int64_t>(t) * a.n_head + h : nullptr;
    if (mx == -INFINITY) { // nothing visible (only possible for a subset)
        if (lse_out) *lse_out = -INFINITY;
        return;
    }
    float sum = 0;
    for (int r = 0; r < n_runs; r++) {
        float* dst = runs[r].kind == RunKind::Batch ? scn : sc;
        sum += cpu::exp_sum(dst + runs[r].b, runs[r].e - runs[r].b, mx);
    }
    if (lse_out) *lse_out = mx + std::log(sum);
    for (int r = 0; r < n_runs; r++) {
        const bool batch = runs[r].kind == RunKind::Batch;
        add_rows(batch ? v_new : v_slots + pool_shift(a, runs[r]) * a.v_row_bytes, batch ? scn : sc,
                 runs[r].b, runs[r].e);
    }
    const float inv = 1.0f / sum;
    for (int i = 0; i < hd; i++) out[i] *= inv;
}

// Heads of one GQA group that share a work item, and keys per chunk: each
// chunk's K and V rows are read from the cache once per group, converted to
// F32 once (an F16 row converted per head cost more than the products), and
// stay in L1 while every head of the sub-group uses them.
constexpr int kSubGroup = 8;
constexpr int kChunkKeys = 64;

// Heads [h0, h0 + nh) of token t before their first chunk: no max, no sum,
// a zero output, and where each one's query (rotated and not) and output are.
void begin_heads(const AttentionArgs& a, int t, int h0, int nh, float* m, float* l, float** out,
                 const float** q, const float** qu) {
    for (int j = 0; j < nh; j++) {
        const int64_t qi = (static_cast<int64_t>(t) * a.n_head + h0 + j) * a.head_dim;
        m[j] = -INFINITY;
        l[j] = 0;
        out[j] = a.out + qi;
        q[j] = a.q + qi;
        qu[j] = a.q_unrot ? a.q_unrot + qi : nullptr;
        std::memset(out[j], 0, sizeof(float) * a.head_dim);
    }
}

// One online-softmax step over a chunk for heads j < nh: the scores
// sc[j * kChunkKeys + i] of its n keys become weights against head j's
// running max m[j] (its output so far and sum l[j] rescaled when the max
// grows), and l[j] gains their sum.
void softmax_step(float* sc, int n, int nh, int hd, float* m, float* l, float* const* out) {
    for (int j = 0; j < nh; j++) {
        float* s = sc + j * kChunkKeys;
        const float cm = std::max(m[j], cpu::max_of(s, n));
        if (cm == -INFINITY) { // nothing visible yet: weights 0
            std::fill(s, s + n, 0.0f);
            continue;
        }
        if (cm > m[j]) {
            const float f = m[j] == -INFINITY ? 0.0f : std::exp(m[j] - cm);
            for (int d = 0; d < hd; d++) out[j][d] *= f;
            l[j] *= f;
            m[j] = cm;
        }
        l[j] += cpu::exp_sum(s, n, m[j]);
    }
}

// A chunk of K or V head slices as F32 rows the float kernels read: F32
// caches in place, others converted into `tile`.
struct RowsF32 {
    const float* p;
    size_t stride;
};
RowsF32 rows_f32(Type t, int64_t hd, const uint8_t* rows, size_t stride, int n, float* tile) {
    if (t == Type::F32) return {reinterpret_cast<const float*>(rows), stride};
    cpu::rows_to_f32(t, hd, rows, stride, n, tile);
    return {tile, sizeof(float) * static_cast<size_t>(hd)};
}

// Heads [h0, h0 + nh) of one KV head, float K and V: an online softmax over
// key chunks (running max m and sum l per head; the output is rescaled when
// the max grows), then normalised. Same results as attend_one up to rounding.
// `work` holds attention_work_floats() floats for the two converted chunks.
// `new_tiles`, if not null, holds the batch's own keys as key tiles.
void attend_heads(const AttentionArgs& a, const uint8_t* new_tiles, int t, int h0, int nh,
                  const KeyRun* runs, int n_runs, float* sc, float* work, float* lse) {
    const int hd = a.head_dim;
    const int kvh = h0 / (a.n_head / a.n_head_kv);
    const size_t ke = type_info(a.k_type).type_size, ve = type_info(a.v_type).type_size;
    // Chunks never cross a block (AttentionArgs::block_slots): each is read
    // from one address, and they are the same chunks whether the blocks are
    // in order (a lone cache) or anywhere in a shared pool, so the same sums.
    const int align = a.block_slots > 0 ? a.block_slots : kChunkKeys;
    const int chunk_keys = static_cast<int>(std::clamp<int64_t>(
        kAttentionTileFloats / (2 * static_cast<int64_t>(hd)), 1, std::min(align, kChunkKeys)));
    float* k_tile = work;
    float* v_tile = work + static_cast<int64_t>(chunk_keys) * hd;
    float m[kSubGroup], l[kSubGroup];
    float* out[kSubGroup];
    const float* q[kSubGroup];
    const float* qu[kSubGroup];
    begin_heads(a, t, h0, nh, m, l, out, q, qu);
#if GL_HAVE_FP16
    // A generated token's F16 keys in tiles and F16 values take
    // half-precision products where the CPU has them (x86/fp16.h): half the
    // FMAs, no widening.
    const bool half = a.half_ok && a.n_tok == 1 && attention_half_products() &&
                      nh <= fp16::kMaxHeads && hd <= fp16::kMaxHeadDim;
    const bool half_k = half && a.k_type == Type::F16 && hd % fp16::kSpanDims == 0;
    const bool half_v = half && a.v_type == Type::F16 && hd % 32 == 0;
    alignas(64) uint16_t q16[fp16::kMaxHeads * fp16::kMaxHeadDim];
    if (half_k) fp16::to_half(q[0], a.scale, static_cast<int64_t>(nh) * hd, q16);
#else
    constexpr bool half_k = false, half_v = false;
#endif
    // V rows go to axpy_heads as they are where it has a kernel for their
    // type: widened inside it rather than into an F32 tile first, which saves
    // the tile's stores and a third of L1 (TinyLlama Q4_0 at depth 4096:
    // attention 7.7 -> 6.8 ms a token). Elsewhere widened to the tile.
    const bool v_direct = a.v_type == Type::F32 || cpu::has_axpy_heads(a.v_type);
    // A prompt batch reads each KV head's keys and values once per token,
    // mostly from L2 or L3, where the hardware prefetchers keep up and
    // software prefetches only hold the line-fill buffers (TinyLlama Q4_0,
    // pp4096: 226.8/222.5 tok/s without them, 217.8/212.4 with).
    const bool prefetch = a.n_tok < kAttentionPromptBatch;
    // Scores sc[j * kChunkKeys + i] of n keys are in place; turn them into
    // softmax weights against each head's running max, then add the chunk's
    // n V rows (at `rows`, `stride` bytes apart) for all heads in one pass.
    // Where the half kernels run for a whole decode chunk, they prefetch
    // themselves, a line every few FMAs (see below): the scores the next
    // chunk's values, the value sums the keys of the chunk after that.
    struct Lines {
        const uint8_t* p = nullptr;
        int n = 0;
        int take(int most) {
            const int t = std::min(n, most);
            n -= t;
            p += 64 * t;
            return t;
        }
        void flush() {
            for (; n > 0; n--, p += 64) __builtin_prefetch(p);
        }
    } during_scores, during_values;
    auto fold = [&](const uint8_t* rows, size_t stride, int n) {
        softmax_step(sc, n, nh, hd, m, l, out);
        if (half_v) {
#if GL_HAVE_FP16
            for (int j0 = 0; j0 < nh; j0 += fp16::kMaxValueHeads) {
                const int g = std::min(fp16::kMaxValueHeads, nh - j0);
                const float* w = sc + j0 * kChunkKeys;
                const uint8_t* pf = during_values.p;
                const int pf_n = during_values.take(n * ((hd + 63) / 64));
                if (!fp16::add_values(hd, rows, stride, n, w, kChunkKeys, g, out + j0, pf, pf_n))
                    cpu::axpy_heads(a.v_type, hd, rows, stride, n, w, kChunkKeys, g, out + j0);
            }
#endif
        } else if (v_direct) {
            cpu::axpy_heads(a.v_type, hd, rows, stride, n, sc, kChunkKeys, nh, out);
        } else {
            const RowsF32 v = rows_f32(a.v_type, hd, rows, stride, n, v_tile);
            cpu::axpy_heads(Type::F32, hd, v.p, v.stride, n, sc, kChunkKeys, nh, out);
        }
    };
    for (int r = 0; r < n_runs; r++) {
        const KeyRun& run = runs[r];
        const bool batch = run.kind == RunKind::Batch;
        // Keys in rows or key tiles (of n_ctx slots or n_tok batch keys);
        // slot values in either layout, the batch's own values rows.
        const bool k_tiles = batch ? new_tiles != nullptr : a.k_head_bytes != 0;
        const bool v_hm = !batch && a.v_slot_bytes;
        const int tiled_keys = batch ? a.n_tok : a.tiled_slots();
        // Bytes from one key to the next in a row layout; in tiles, a chunk of
        // whole tiles from key c0 takes the same bytes as rows of hd elements
        // would (only the prefetch below uses this for them).
        const size_t k_stride = k_tiles ? hd * ke : a.k_row_bytes;
        const size_t v_stride = v_hm ? a.v_slot_bytes : a.v_row_bytes;
        const auto* k_base =
            k_tiles ? (batch ? new_tiles : static_cast<const uint8_t*>(a.k_slots)) +
                          kvh * (batch ? a.n_tok * hd * ke : a.k_head_bytes)
                    : static_cast<const uint8_t*>(batch ? a.k_new : a.k_slots) + kvh * hd * ke;
        const auto* v_base = static_cast<const uint8_t*>(batch ? a.v_new : a.v_slots) +
                             kvh * (v_hm ? a.v_head_bytes : hd * ve);
        // Key or value i of the run where it is: a batch row, or a slot's
        // pool slot (AttentionArgs::slot_block; a chunk is within one block).
        auto k_at = [&](int64_t i) { return k_base + (batch ? i : a.pool_slot(i)) * k_stride; };
        auto v_at = [&](int64_t i) { return v_base + (batch ? i : a.pool_slot(i)) * v_stride; };
        if (run.kind == RunKind::Sink) {
            const float* k = a.sink_k + a.slot_pos[run.b] * a.n_head_kv * hd + kvh * hd;
            for (int j = 0; j < nh; j++)
                sc[j * kChunkKeys] = cpu::vec_dot(Type::F32, hd, k, qu[j]) * a.scale;
            fold(v_at(run.b), v_stride, 1);
            continue;
        }
        int k_until = run.b; // keys prefetched by the half kernels' scheme, up to
        for (int c0 = run.b; c0 < run.e;) {
            int c1 = std::min({run.e, c0 + chunk_keys, (c0 / align + 1) * align});
            if (k_tiles && c1 < run.e && c1 / kKeyTile * kKeyTile > c0)
                c1 = c1 / kKeyTile * kKeyTile; // the next chunk starts on a tile
            const int n = c1 - c0;
            // The next chunk's K and V head slices are fetched while this one
            // is computed, a few keys between each step: issued all at once
            // they fill the line-fill buffers and the loop waits on them. Even
            // head-major, where each is one contiguous stream, the hardware
            // prefetchers alone leave a decode step's attention over 4096 keys
            // ~35% slower (7.8-8.3 vs 10.7-11.3 ms, TinyLlama shape). Not for
            // prompt batches (see `prefetch`).
            const int next_end = std::min(run.e, c1 + chunk_keys);
            int next = c1;
            const int steps = k_tiles ? (n + kKeyTile - 1) / kKeyTile + 2 : nh + 2;
            const int per_step = (chunk_keys + steps - 2) / (steps - 1);
            // Prefetches issued in a burst at each step stall on the line-fill
            // buffers; the half kernels spread them over their FMAs instead,
            // each stream a chunk or more ahead: the next chunk's values
            // during this one's scores, the keys of the chunk after next
            // during this one's value sums, into L2 (TinyLlama Q4_0 at depth
            // 4096, `kvrun-lab attention`: 3.4-3.7 ms against 4.3-4.6 in bursts
            // and 3.6-3.9 into L1).
            const bool pf_in_kernels =
                prefetch && half_k && half_v && k_tiles && v_hm && v_stride == hd * ve;
            if (pf_in_kernels) {
                const size_t kb = static_cast<size_t>(hd) * ke; // a key's bytes in tiles
                for (; k_until < next_end; k_until++)           // the next chunk's keys, once a run
                    for (size_t b = 0; b < kb; b += 64) __builtin_prefetch(k_at(k_until) + b);
                const int k_end = std::min(run.e, next_end + chunk_keys);
                // (Each a chunk, so within one block.)
                during_scores = {c1 < next_end ? v_at(c1) : nullptr,
                                 static_cast<int>((next_end - c1) * v_stride / 64)};
                during_values = {next_end < k_end ? k_at(next_end) : nullptr,
                                 static_cast<int>((k_end - next_end) * kb / 64)};
                k_until = k_end; // >= next_end, where the burst above stopped
            }
            auto prefetch_some = [&] {
                if (!prefetch || pf_in_kernels) return;
                for (int stop = std::min(next_end, next + per_step); next < stop; next++) {
                    const uint8_t* kp = k_at(next);
                    const uint8_t* vp = v_at(next);
                    for (int bb = 0; bb < hd * static_cast<int>(ke); bb += 64) {
                        __builtin_prefetch(kp + bb);
                        __builtin_prefetch(vp + bb);
                    }
                }
            };
            prefetch_some();
            if (k_tiles) {
                // All nh heads' scores per tile (q[j] are hd apart).
                for (int t0 = c0 / kKeyTile * kKeyTile; t0 < c1; t0 += kKeyTile) {
                    prefetch_some();
                    const int lo = std::max(c0, t0) - t0, hi = std::min(c1, t0 + kKeyTile) - t0;
#if GL_HAVE_FP16
                    // Two whole tiles at a time (32 keys, one half vector).
                    if (half_k && lo == 0 && t0 + 2 * kKeyTile <= c1 &&
                        key_tile_width(t0 + kKeyTile, tiled_keys) == kKeyTile) {
                        const auto* ta = reinterpret_cast<const uint16_t*>(k_at(t0));
                        const uint8_t* pf = during_scores.p;
                        const int pf_n = during_scores.take(hd);
                        if (fp16::score_tiles(hd, ta, ta + kKeyTile * hd, q16, nh, sc + (t0 - c0),
                                              kChunkKeys, pf, pf_n)) {
                            prefetch_some();
                            t0 += kKeyTile;
                            continue;
                        }
                    }
#endif
                    cpu::dot_tile(a.k_type, hd, k_at(t0), key_tile_width(t0, tiled_keys), lo, hi,
                                  q[0], nh, a.scale, sc + (t0 + lo - c0), kChunkKeys);
                }
            } else {
                const RowsF32 k = rows_f32(a.k_type, hd, k_at(c0), k_stride, n, k_tile);
                for (int j = 0; j < nh; j++) {
                    prefetch_some();
                    cpu::dot_rows(Type::F32, hd, k.p, k.stride, n, q[j], a.scale,
                                  sc + j * kChunkKeys);
                }
            }
            prefetch_some();
            fold(v_at(c0), v_stride, n);
            during_scores.flush();
            during_values.flush();
            c0 = c1;
        }
    }
    for (int j = 0; j < nh; j++) {
        float* lse_out = lse ? lse + static_cast<int64_t>(t) * a.n_head + h0 + j : nullptr;
        if (m[j] == -INFINITY) { // nothing visible (only possible for a subset)
            if (lse_out) *lse_out = -INFINITY;
            continue;
        }
        const float inv = 1.0f / l[j];
        for (int d = 0; d < hd; d++) out[j][d] *= inv;
        if (lse_out) *lse_out = m[j] + std::log(l[j]);
    }
}

// Decode steps on many threads: with fewer (token, group) work items than
// threads, cores sit idle in attention (TinyLlama has 4 KV heads,
// Qwen2.5-0.5B 2; a Jetson Orin has 12 cores). The ring's slots are then cut
// into S ranges attended separately and merged by log-sum-exp (as
// flash-decoding does on GPUs). Split s keeps its output and log-sum-exps in
// thread slot s's scores area, past the chunk scores of the grouped path
// (which uses the first kSubGroup * kChunkKeys floats); no split when that
// does not fit (short rings), and at least 256 slots per split.
constexpr int kMinSplitSlots = 256;
constexpr int kMaxSplits = 64;

int key_splits(const ThreadPool& pool, const AttentionArgs& a, bool grouped, int64_t items) {
    if (!grouped || items >= pool.size()) return 1;
    const int64_t by_threads = (pool.size() + items - 1) / items;
    const int64_t s = std::min<int64_t>({by_threads, a.n_ctx / kMinSplitSlots, kMaxSplits});
    const int64_t need = static_cast<int64_t>(a.n_tok) * a.n_head * (a.head_dim + 1);
    const int64_t room = attention_scores_floats(a.n_ctx, a.n_tok) - kSubGroup * kChunkKeys;
    return s > 1 && need <= room ? static_cast<int>(s) : 1;
}

// The batch's own keys (rows of elements E) as key tiles of n_tok keys, one
// KV head after another.
template <typename E> void tile_keys(const AttentionArgs& a, uint8_t* dst) {
    const int64_t hd = a.head_dim, n = a.n_tok;
    for (int h = 0; h < a.n_head_kv; h++)
        for (int64_t u = 0; u < n; u++) {
            const uint8_t* row =
                static_cast<const uint8_t*>(a.k_new) + u * a.k_row_bytes + h * hd * sizeof(E);
            uint8_t* head = dst + h * n * hd * sizeof(E);
            for (int64_t d = 0; d < hd; d++)
                std::memcpy(head + key_tile_index(u, d, hd, n) * sizeof(E), row + d * sizeof(E),
                            sizeof(E));
        }
}

#if GL_HAVE_AMX
// A prompt batch over F16 keys and values on AMX tiles (amx::attend_rows):
// work items are (KV head, run of tokens) with up to amx::kAttnRows query
// rows, so each converted block of keys serves many queries. Only where
// every rule is the plain causal one: the whole key set (no subset, no
// log-sum-exp), no query past the ring's slide, cached keys in tiles.
// Returns false, having done nothing, elsewhere.
template <typename Slot>
bool prompt_on_tiles(ThreadPool& pool, const AttentionArgs& a, const KeySubset& keys, float* lse,
                     const uint8_t* new_tiles, const Slot& slot) {
    const KeySubset all;
    const int hd = a.head_dim, n_rep = a.n_head / a.n_head_kv;
    if (lse || keys.slot_begin != all.slot_begin || keys.slot_end != all.slot_end ||
        keys.pos_begin != all.pos_begin || keys.pos_end != all.pos_end || !keys.with_new)
        return false;
    if (a.k_type != Type::F16 || a.v_type != Type::F16 || hd % 32 != 0 || hd > 256 ||
        n_rep > amx::kAttnRows || a.n_tok < kAttentionPromptBatch ||
        (a.slot_pos && !a.k_head_bytes) || a.pos[a.n_tok - 1] >= a.n_ctx ||
        (a.slot_block && a.block_slots % amx::kAttnBlockKeys != 0) || !gemm::amx_enabled())
        return false;
    const int tokens = amx::kAttnRows / n_rep; // per item
    const int64_t blocks = (a.n_tok + tokens - 1) / tokens;
    const size_t e = sizeof(uint16_t);
    pool.parallel_for(
        a.n_head_kv * blocks,
        [&](int64_t b, int64_t end, int ith) {
            amx::AttnRows rows;
            std::vector<amx::AttnKeys> segs;
            for (int64_t w = b; w < end; w++) {
                const int g = static_cast<int>(w / blocks);
                const int t0 = static_cast<int>(w % blocks) * tokens;
                const int t1 = std::min(a.n_tok, t0 + tokens);
                rows.n = 0;
                for (int t = t0; t < t1; t++)
                    for (int j = 0; j < n_rep; j++, rows.n++) {
                        const int64_t qi =
                            (static_cast<int64_t>(t) * a.n_head + g * n_rep + j) * hd;
                        rows.q[rows.n] = a.q + qi;
                        rows.out[rows.n] = a.out + qi;
                        rows.pos[rows.n] = a.pos[t];
                    }
                // The ring's slots: one segment, or one per held block
                // where the blocks are anywhere in a pool (each a step of
                // kAttnBlockKeys keys at the same positions: the same sums).
                segs.clear();
                const int bs = a.slot_block ? a.block_slots : std::max(a.n_ctx, 1);
                for (int b0 = 0; a.slot_pos && b0 < a.n_ctx; b0 += bs) {
                    if (a.slot_block && a.slot_block[b0 / bs] < 0) continue;
                    const int64_t shift = a.pool_slot(b0) - b0;
                    amx::AttnKeys& k = segs.emplace_back();
                    k.k = reinterpret_cast<const uint16_t*>(static_cast<const uint8_t*>(a.k_slots) +
                                                            g * a.k_head_bytes) +
                          shift * hd;
                    k.n_keys = a.tiled_slots();
                    k.begin = b0;
                    k.end = std::min(a.n_ctx, b0 + bs);
                    k.v_stride = a.v_slot_bytes ? a.v_slot_bytes : a.v_row_bytes;
                    k.v = static_cast<const uint8_t*>(a.v_slots) +
                          g * (a.v_slot_bytes ? a.v_head_bytes : hd * e) +
                          shift * static_cast<int64_t>(k.v_stride);
                    k.pos = a.slot_pos;
                }
                amx::AttnKeys& k = segs.emplace_back();
                k.k = reinterpret_cast<const uint16_t*>(new_tiles + g * a.n_tok * hd * e);
                k.n_keys = a.n_tok;
                k.end = t1;
                k.v = static_cast<const uint8_t*>(a.v_new) + g * hd * e;
                k.v_stride = a.v_row_bytes;
                k.pos = a.pos;
                amx::attend_rows(rows, hd, a.scale, segs.data(), static_cast<int>(segs.size()),
                                 slot(ith));
            }
        },
        static_cast<int64_t>(a.n_tok) * (a.n_ctx + a.n_tok) * a.n_head * hd * 2);
    return true;
}
#endif

// --deterministic (AttentionArgs::batch_invariant). Keys per chunk: a
// constant (never a function of the batch), small enough that a chunk's K
// and V as F32 plus one dequantized head fit the work area.
constexpr int kInOrderChunk = 32;

// Heads [h0, h0 + nh) of one KV head of token t over the keys it sees, in
// position order: the sinks one at a time (pre-rotated, with the unrotated
// query) once the window has slid, then the window in chunks of positions
// [c, c + kInOrderChunk) for c a multiple of kInOrderChunk. `at` (n_ctx
// ints) maps each position in view to where its key is: a slot (>= 0), the
// batch's row u (-(u + 2)) or nowhere (-1).
void attend_in_order(const AttentionArgs& a, int t, int h0, int nh, int32_t* at, float* sc,
                     float* work) {
    const int hd = a.head_dim, kv_dim = a.n_head_kv * hd;
    const int kvh = h0 / (a.n_head / a.n_head_kv);
    const int64_t p = a.pos[t];
    const bool slid = p >= a.n_ctx;
    const int64_t lo = slid ? p - a.window + 1 : 0;
    const int n_sink = slid ? a.n_sink : 0;
    // Position -> index in `at`: the sinks, then the window from lo.
    auto index = [&](int64_t q) -> int64_t {
        if (q > p) return -1;
        if (q < n_sink) return q;
        return q >= lo ? n_sink + (q - lo) : -1;
    };
    const int64_t n_at = n_sink + (p - lo + 1);
    std::fill(at, at + n_at, -1);
    for (int s = 0; a.slot_pos && s < a.n_ctx; s++) {
        const int64_t i = a.slot_pos[s] >= 0 ? index(a.slot_pos[s]) : -1;
        if (i >= 0) at[i] = static_cast<int32_t>(a.pool_slot(s));
    }
    for (int u = 0; u <= t; u++) {
        const int64_t i = index(a.pos[u]);
        if (i >= 0) at[i] = -(u + 2);
    }

    const HeadReader kr(a.k_type, hd), vr(a.v_type, hd);
    float* k_tile = work;
    float* v_tile = k_tile + kInOrderChunk * hd;
    float* tmp = v_tile + kInOrderChunk * hd; // one dequantized head (hd + 2 blocks)
    // Key or value of entry e as F32 at dst.
    auto gather = [&](const HeadReader& r, const void* slots, const void* batch, size_t row_bytes,
                      int32_t e, float* dst) {
        const uint8_t* row = e >= 0 ? static_cast<const uint8_t*>(slots) + e * row_bytes
                                    : static_cast<const uint8_t*>(batch) + (-e - 2) * row_bytes;
        if (r.in_place())
            cpu::rows_to_f32(r.type, hd, row + kvh * hd * r.elem_bytes, row_bytes, 1, dst);
        else
            std::memcpy(dst, r.head(row, kvh, tmp), sizeof(float) * hd);
    };

    float m[kSubGroup], l[kSubGroup];
    float* out[kSubGroup];
    const float* q[kSubGroup];
    const float* qu[kSubGroup];
    begin_heads(a, t, h0, nh, m, l, out, q, qu);
    // Scores sc[j * kChunkKeys + i] of the n keys whose values are in v_tile:
    // an online softmax step, as attend_heads takes.
    auto fold = [&](int n) {
        softmax_step(sc, n, nh, hd, m, l, out);
        cpu::axpy_heads(Type::F32, hd, v_tile, sizeof(float) * hd, n, sc, kChunkKeys, nh, out);
    };
    for (int i = 0; i < n_sink; i++) {
        if (at[i] < 0) continue; // a sink in the batch itself: seen as an ordinary key below
        const float* k = a.sink_k + static_cast<int64_t>(i) * kv_dim + kvh * hd;
        for (int j = 0; j < nh; j++)
            sc[j * kChunkKeys] = cpu::vec_dot(Type::F32, hd, k, qu[j]) * a.scale;
        gather(vr, a.v_slots, a.v_new, a.v_row_bytes, at[i], v_tile);
        fold(1);
    }
    // Consecutive slots (or batch rows) go to rows_to_f32 together: the same
    // exact conversion, one call for a run instead of one per key.
    auto gather_run = [&](const HeadReader& r, const void* slots, const void* batch,
                          size_t row_bytes, int32_t e, int len, float* dst) {
        if (!r.in_place()) {
            for (int i = 0; i < len; i++)
                gather(r, slots, batch, row_bytes, e >= 0 ? e + i : e - i, dst + i * hd);
            return;
        }
        const uint8_t* row = e >= 0 ? static_cast<const uint8_t*>(slots) + e * row_bytes
                                    : static_cast<const uint8_t*>(batch) + (-e - 2) * row_bytes;
        cpu::rows_to_f32(r.type, hd, row + kvh * hd * r.elem_bytes, row_bytes, len, dst);
    };
    auto gather_chunk = [&](int64_t c0, int64_t c1) {
        int n = 0;
        for (int64_t kp = c0; kp < c1;) {
            const int32_t e = at[index(kp)];
            if (e == -1) {
                kp++;
                continue;
            }
            // A run: slots e, e + 1, ... or batch rows u, u + 1, ... (e - 1, e - 2, ...)
            int len = 1;
            const int32_t step = e >= 0 ? 1 : -1;
            while (kp + len < c1 && at[index(kp + len)] == e + step * len &&
                   (e >= 0) == (e + step * len >= 0))
                len++;
            gather_run(kr, a.k_slots, a.k_new, a.k_row_bytes, e, len, k_tile + n * hd);
            gather_run(vr, a.v_slots, a.v_new, a.v_row_bytes, e, len, v_tile + n * hd);
            n += len;
            kp += len;
        }
        return n;
    };
    // Batch keys among the sinks (never in practice: a batch that reaches
    // past the window starts after the sinks) as ordinary keys.
    for (int i = 0; i < n_sink; i++)
        if (at[i] < -1) {
            gather(kr, a.k_slots, a.k_new, a.k_row_bytes, at[i], k_tile);
            gather(vr, a.v_slots, a.v_new, a.v_row_bytes, at[i], v_tile);
            for (int j = 0; j < nh; j++)
                cpu::dot_rows(Type::F32, hd, k_tile, sizeof(float) * hd, 1, q[j], a.scale,
                              sc + j * kChunkKeys);
            fold(1);
        }
    for (int64_t c = lo / kInOrderChunk * kInOrderChunk; c <= p; c += kInOrderChunk) {
        const int n = gather_chunk(std::max(c, lo), std::min(p + 1, c + kInOrderChunk));
        if (n == 0) continue;
        for (int j = 0; j < nh; j++)
            cpu::dot_rows(Type::F32, hd, k_tile, sizeof(float) * hd, n, q[j], a.scale,
                          sc + j * kChunkKeys);
        fold(n);
    }
    for (int j = 0; j < nh; j++) {
        if (m[j] == -INFINITY) continue; // nothing visible: a zero output
        const float inv = 1.0f / l[j];
        for (int d = 0; d < hd; d++) out[j][d] *= inv;
    }
}

void attend_all_in_order(ThreadPool& pool, const AttentionArgs& a) {
    // Row-layout slots only (a batch-invariant backend asks KvCache for rows),
    // and heads whose two F32 chunks and one dequantized head fit the work area.
    if (a.k_head_bytes || a.v_slot_bytes || a.head_dim > 256) std::abort();
    const int64_t per_thread =
        attention_scratch_per_thread(a.n_ctx, a.n_tok, a.n_head_kv * a.head_dim, a.head_dim);
    const int n_rep = a.n_head / a.n_head_kv;
    const int subs = (n_rep + kSubGroup - 1) / kSubGroup;
    const int per_tok = a.n_head_kv * subs;
    pool.parallel_for(
        static_cast<int64_t>(a.n_tok) * per_tok,
        [&](int64_t b, int64_t e, int ith) {
            const auto at0 = reinterpret_cast<uintptr_t>(a.scratch + ith * per_thread);
            float* sc = reinterpret_cast<float*>((at0 + 63) & ~uintptr_t{63});
            float* work = sc + attention_scores_floats(a.n_ctx, a.n_tok);
            auto* at = reinterpret_cast<int32_t*>(sc + per_thread -
                                                  kAttentionRunFloats * (a.n_ctx + a.n_tok));
            for (int64_t w = b; w < e; w++) {
                const int t = static_cast<int>(w / per_tok), i = static_cast<int>(w % per_tok);
                const int g = i / subs, sub = i % subs;
                attend_in_order(a, t, g * n_rep + sub * kSubGroup,
                                std::min(kSubGroup, n_rep - sub * kSubGroup), at, sc, work);
            }
        },
        static_cast<int64_t>(a.n_tok) * (a.n_ctx + a.n_tok) * a.n_head * a.head_dim * 2);
}

void attend_all(ThreadPool& pool, const AttentionArgs& a, const KeySubset& keys, float* lse) {
    const int64_t per_thread =
        attention_scratch_per_thread(a.n_ctx, a.n_tok, a.n_head_kv * a.head_dim, a.head_dim);
    const bool grouped = type_info(a.k_type).block_size == 1 && type_info(a.v_type).block_size == 1;
    if (!grouped && (a.k_head_bytes || a.v_slot_bytes))
        std::abort(); // head-major slots are for float caches (KvCache never makes others)
    // Work items: (token, sub-group of up to kSubGroup heads of one KV head)
    // for float caches; (token, head) for block-type caches; times the key
    // splits.
    const int n_rep = a.n_head / a.n_head_kv;
    const int subs = grouped ? (n_rep + kSubGroup - 1) / kSubGroup : 0;
    const int per_tok = grouped ? a.n_head_kv * subs : a.n_head;
    const int64_t items = static_cast<int64_t>(a.n_tok) * per_tok;
    const int splits = key_splits(pool, a, grouped, items);
    // 64-byte aligned (see attention_scratch_per_thread)
    auto slot = [&](int ith) {
        const auto at = reinterpret_cast<uintptr_t>(a.scratch + ith * per_thread);
        return reinterpret_cast<float*>((at + 63) & ~uintptr_t{63});
    };
    // Split s's output (split 0 writes a.out) and log-sum-exps.
    auto split_out = [&](int s) {
        return s == 0 ? a.out : slot(s) + kSubGroup * kChunkKeys + a.n_tok * a.n_head;
    };
    auto split_lse = [&](int s) { return splits == 1 ? lse : slot(s) + kSubGroup * kChunkKeys; };
    // Split boundaries in slot indices, at equal shares of the subset's
    // filled slots: equal shares of the ring left the upper splits' threads
    // idle while the ring was part full (a short prompt in a long context).
    int bound[kMaxSplits + 1] = {};
    if (splits > 1) {
        auto filled = [&](int sl) {
            const int64_t p = a.slot_pos ? a.slot_pos[sl] : -1;
            return sl >= keys.slot_begin && sl < keys.slot_end && p >= 0 && p >= keys.pos_begin &&
                   p < keys.pos_end;
        };
        int64_t total = 0;
        for (int sl = 0; sl < a.n_ctx; sl++) total += filled(sl);
        int64_t seen = 0;
        int next = 1;
        for (int sl = 0; sl < a.n_ctx && next < splits; sl++) {
            seen += filled(sl);
            while (next < splits && seen * splits >= total * next) bound[next++] = sl + 1;
        }
        for (; next <= splits; next++) bound[next] = a.n_ctx;
    }
    // A prompt batch's own keys as key tiles too, after the threads' areas:
    // as rows, every (token, head group) widened and dotted them one by one.
    const uint8_t* new_tiles = nullptr;
    if (grouped && a.n_tok > 1) {
        auto* dst = reinterpret_cast<uint8_t*>(slot(pool.size()));
        if (type_info(a.k_type).type_size == 2)
            tile_keys<uint16_t>(a, dst);
        else
            tile_keys<uint32_t>(a, dst);
        new_tiles = dst;
    }
#if GL_HAVE_AMX
    if (new_tiles && prompt_on_tiles(pool, a, keys, lse, new_tiles, slot)) return;
#endif
    pool.parallel_for(
        items * splits,
        [&](int64_t b, int64_t e, int ith) {
            float* sc = slot(ith);
            float* work = sc + attention_scores_floats(a.n_ctx, a.n_tok);
            auto* runs = reinterpret_cast<KeyRun*>(sc + per_thread -
                                                   kAttentionRunFloats * (a.n_ctx + a.n_tok));
            int64_t runs_of = -1;
            int n_runs = 0;
            for (int64_t w = b; w < e; w++) {
                const int split = static_cast<int>(w / items);
                const int64_t item = w % items;
                const int t = static_cast<int>(item / per_tok),
                          i = static_cast<int>(item % per_tok);
                if (w / per_tok != runs_of) { // a new (split, token)
                    KeySubset ks = keys;
                    if (splits > 1) {
                        ks.slot_begin = std::max(keys.slot_begin, bound[split]);
                        ks.slot_end = std::min(keys.slot_end, bound[split + 1]);
                        ks.with_new = keys.with_new && split == splits - 1;
                    }
                    n_runs = visible_runs(a, ks, t, runs, !grouped);
                    runs_of = w / per_tok;
                }
                if (grouped) {
                    AttentionArgs as = a;
                    as.out = split_out(split);
                    const int g = i / subs, sub = i % subs;
                    const int h0 = g * n_rep + sub * kSubGroup;
                    attend_heads(as, new_tiles, t, h0, std::min(kSubGroup, n_rep - sub * kSubGroup),
                                 runs, n_runs, sc, work, split_lse(split));
                } else {
                    attend_one(a, t, i, runs, n_runs, sc, lse);
                }
            }
        },
        items * (a.n_ctx + a.n_tok) * a.head_dim * 2 * (a.n_head / per_tok));
    if (splits == 1) return;
    float* lse0 = split_lse(0);
    for (int s = 1; s < splits; s++)
        attention_merge(a.n_tok, a.n_head, a.head_dim, a.out, lse0, split_out(s), split_lse(s));
    if (lse) std::memcpy(lse, lse0, sizeof(float) * a.n_tok * a.n_head);
}

} // namespace

void attention(ThreadPool& pool, const AttentionArgs& a) {
    if (a.batch_invariant) return attend_all_in_order(pool, a);
    attend_all(pool, a, KeySubset{}, nullptr);
}

void attention_partial(ThreadPool& pool, const AttentionArgs& a, const KeySubset& keys,
                       float* lse) {
    attend_all(pool, a, keys, lse);
}

void attention_merge(int64_t n_tok, int n_head, int head_dim, float* out, float* lse,
                     const float* out2, const float* lse2) {
    for (int64_t i = 0; i < n_tok * n_head; i++) {
        const float l1 = lse[i], l2 = lse2[i];
        if (l2 == -INFINITY) continue; // the second holds nothing for this query
        float* o = out + i * head_dim;
        const float* o2 = out2 + i * head_dim;
        if (l1 == -INFINITY) {
            std::memcpy(o, o2, sizeof(float) * head_dim);
            lse[i] = l2;
            continue;
        }
        const float m = l1 > l2 ? l1 : l2;
        const float w1 = std::exp(l1 - m), w2 = std::exp(l2 - m), inv = 1.0f / (w1 + w2);
        for (int d = 0; d < head_dim; d++) o[d] = (w1 * o[d] + w2 * o2[d]) * inv;
        lse[i] = m + std::log(w1 + w2);
    }
}

} // namespace gl
