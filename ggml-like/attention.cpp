#include "ggml-like/attention.h"

#include <cmath>
#include <cstring>

#include "ggml-like/ops.h"
#include "ggml-like/quants.h"
#include "ggml-like/thread_pool.h"

namespace gl {

namespace {

// One query head of one token: scores over visible slots and batch keys,
// softmax, weighted sum of values. `sc` holds n_ctx + n_tok floats.
void attend_one(const AttentionArgs& a, int t, int h, float* sc) {
    const int hd = a.head_dim;
    const int kvh = h / (a.n_head / a.n_head_kv);
    const size_t head_off = static_cast<size_t>(kvh) * hd * (a.kv_type == Type::F32 ? 4 : 2);
    const int64_t p = a.pos[t];
    const bool slid = p >= a.n_ctx;
    const int64_t lo = slid ? p - a.window + 1 : 0;
    const float* q = a.q + (static_cast<int64_t>(t) * a.n_head + h) * hd;
    const float* qu = a.q_unrot ? a.q_unrot + (static_cast<int64_t>(t) * a.n_head + h) * hd : nullptr;
    const auto* ks = static_cast<const uint8_t*>(a.k_slots);
    const auto* kn = static_cast<const uint8_t*>(a.k_new);

    // Scores; -inf marks keys this query must not see.
    float mx = -INFINITY;
    for (int s = 0; s < a.n_ctx; s++) {
        const int64_t sp = a.slot_pos ? a.slot_pos[s] : -1;
        float v = -INFINITY;
        if (sp >= 0) {
            if (sp < a.n_sink && slid) {
                const float* k = a.sink_k + static_cast<int64_t>(sp) * a.n_head_kv * hd + kvh * hd;
                v = cpu::vec_dot(Type::F32, hd, k, qu) * a.scale;
            } else if (sp < a.n_sink || sp >= lo) {
                v = cpu::vec_dot(a.kv_type, hd, ks + s * a.kv_row_bytes + head_off, q) * a.scale;
            }
        }
        sc[s] = v;
        mx = v > mx ? v : mx;
    }
    for (int u = 0; u <= t; u++) {
        float v = -INFINITY;
        const int64_t up = a.pos[u];
        if (up >= lo || up < a.n_sink)
            v = cpu::vec_dot(a.kv_type, hd, kn + u * a.kv_row_bytes + head_off, q) * a.scale;
        sc[a.n_ctx + u] = v;
        mx = v > mx ? v : mx;
    }
    // Softmax over the visible keys (the query always sees itself, so mx is finite).
    double sum = 0;
    const int n = a.n_ctx + t + 1;
    for (int i = 0; i < n; i++) {
        const float e = sc[i] == -INFINITY ? 0.0f : std::exp(sc[i] - mx);
        sc[i] = e;
        sum += e;
    }
    const float inv = static_cast<float>(1.0 / sum);
    float* out = a.out + (static_cast<int64_t>(t) * a.n_head + h) * hd;
    std::memset(out, 0, sizeof(float) * hd);
    const auto* vs = static_cast<const uint8_t*>(a.v_slots);
    const auto* vn = static_cast<const uint8_t*>(a.v_new);
    for (int s = 0; s < a.n_ctx; s++)
        if (sc[s] != 0.0f) cpu::axpy(a.kv_type, hd, sc[s] * inv, vs + s * a.kv_row_bytes + head_off, out);
    for (int u = 0; u <= t; u++)
        if (sc[a.n_ctx + u] != 0.0f)
            cpu::axpy(a.kv_type, hd, sc[a.n_ctx + u] * inv, vn + u * a.kv_row_bytes + head_off, out);
}

} // namespace

void attention(ThreadPool& pool, const AttentionArgs& a) {
    const int64_t n_work = static_cast<int64_t>(a.n_tok) * a.n_head;
    pool.parallel_for(n_work, [&](int64_t b, int64_t e, int ith) {
        float* sc = a.scratch + static_cast<int64_t>(ith) * (a.n_ctx + a.n_tok);
        for (int64_t w = b; w < e; w++) attend_one(a, static_cast<int>(w / a.n_head), static_cast<int>(w % a.n_head), sc);
    });
}

} // namespace gl
