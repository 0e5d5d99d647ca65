#include "ggml-like/attention.h"

#include <cmath>
#include <cstring>

#include "ggml-like/ops.h"
#include "ggml-like/quants.h"
#include "ggml-like/thread_pool.h"

namespace gl {

namespace {

// One head's slice of a K or V row, as something a float kernel can use.
// Float types are used in place; block types are dequantized (only the blocks
// that cover the head) into `tmp`.
struct HeadReader {
    Type type;
    int64_t head_dim;
    size_t elem_bytes;    // F32/F16/BF16: bytes per element; 0 for block types
    int64_t block;        // elements per block
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

// One query head of one token: scores over the visible slots and batch keys
// of `keys`, softmax, weighted sum of values; returns the log-sum-exp of the
// visible scores (-inf, with a zero output, when there are none). `sc` holds
// the per-thread scratch.
float attend_one(const AttentionArgs& a, const KeySubset& keys, int t, int h, float* sc) {
    const int hd = a.head_dim;
    const int kvh = h / (a.n_head / a.n_head_kv);
    const int64_t p = a.pos[t];
    const bool slid = p >= a.n_ctx;
    const int64_t lo = slid ? p - a.window + 1 : 0;
    const float* q = a.q + (static_cast<int64_t>(t) * a.n_head + h) * hd;
    const float* qu = a.q_unrot ? a.q_unrot + (static_cast<int64_t>(t) * a.n_head + h) * hd : nullptr;
    const auto* ks = static_cast<const uint8_t*>(a.k_slots);
    const auto* kn = static_cast<const uint8_t*>(a.k_new);
    const HeadReader kr(a.k_type, hd), vr(a.v_type, hd);
    const Type k_dot = kr.in_place() ? a.k_type : Type::F32;
    const Type v_acc = vr.in_place() ? a.v_type : Type::F32;
    float* tmp = sc + a.n_ctx + a.n_tok;
    auto key_score = [&](const uint8_t* row) { return cpu::vec_dot(k_dot, hd, kr.head(row, kvh, tmp), q) * a.scale; };

    auto in_keys = [&](int64_t kp) { return kp >= keys.pos_begin && kp < keys.pos_end; };
    // Scores; -inf marks keys this query must not see (or outside the subset).
    float mx = -INFINITY;
    for (int s = 0; s < a.n_ctx; s++) {
        const int64_t sp = a.slot_pos ? a.slot_pos[s] : -1;
        float v = -INFINITY;
        if (sp >= 0 && s >= keys.slot_begin && s < keys.slot_end && in_keys(sp)) {
            if (sp < a.n_sink && slid) {
                const float* k = a.sink_k + static_cast<int64_t>(sp) * a.n_head_kv * hd + kvh * hd;
                v = cpu::vec_dot(Type::F32, hd, k, qu) * a.scale;
            } else if (sp < a.n_sink || sp >= lo) {
                v = key_score(ks + s * a.k_row_bytes);
            }
        }
        sc[s] = v;
        mx = v > mx ? v : mx;
    }
    for (int u = 0; u <= t; u++) {
        float v = -INFINITY;
        const int64_t up = a.pos[u];
        if (keys.with_new && in_keys(up) && (up >= lo || up < a.n_sink))
            v = key_score(kn + u * a.k_row_bytes);
        sc[a.n_ctx + u] = v;
        mx = v > mx ? v : mx;
    }
    // Softmax over the visible keys (in a whole attention the query sees
    // itself, so mx is finite; a subset may hold none of its keys).
    float* out = a.out + (static_cast<int64_t>(t) * a.n_head + h) * hd;
    std::memset(out, 0, sizeof(float) * hd);
    if (mx == -INFINITY) return -INFINITY;
    double sum = 0;
    const int n = a.n_ctx + t + 1;
    for (int i = 0; i < n; i++) {
        const float e = sc[i] == -INFINITY ? 0.0f : std::exp(sc[i] - mx);
        sc[i] = e;
        sum += e;
    }
    const float inv = static_cast<float>(1.0 / sum);
    const auto* vs = static_cast<const uint8_t*>(a.v_slots);
    const auto* vn = static_cast<const uint8_t*>(a.v_new);
    float* vtmp = tmp + a.n_head_kv * hd + 256;
    auto add_value = [&](const uint8_t* row, float w) { cpu::axpy(v_acc, hd, w, vr.head(row, kvh, vtmp), out); };
    for (int s = 0; s < a.n_ctx; s++)
        if (sc[s] != 0.0f) add_value(vs + s * a.v_row_bytes, sc[s] * inv);
    for (int u = 0; u <= t; u++)
        if (sc[a.n_ctx + u] != 0.0f) add_value(vn + u * a.v_row_bytes, sc[a.n_ctx + u] * inv);
    return mx + static_cast<float>(std::log(sum));
}

void attend_all(ThreadPool& pool, const AttentionArgs& a, const KeySubset& keys, float* lse) {
    const int64_t n_work = static_cast<int64_t>(a.n_tok) * a.n_head;
    pool.parallel_for(n_work, [&](int64_t b, int64_t e, int ith) {
        float* sc = a.scratch + ith * attention_scratch_per_thread(a.n_ctx, a.n_tok, a.n_head_kv * a.head_dim);
        for (int64_t w = b; w < e; w++) {
            const float l = attend_one(a, keys, static_cast<int>(w / a.n_head),
                                       static_cast<int>(w % a.n_head), sc);
            if (lse) lse[w] = l;
        }
    }, n_work * (a.n_ctx + a.n_tok) * a.head_dim * 2);
}

} // namespace

void attention(ThreadPool& pool, const AttentionArgs& a) {
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
