#include "forward.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <stdexcept>

#include "error.h"
#include "ggml-like/cpu/gemm.h"
#include "ggml-like/cpu/ops.h"
#include "ggml-like/kernels.h"

namespace kvrun {

Placement Placement::all(gl::Backend& be, int n_layer) {
    return split(be, be, n_layer, n_layer);
}

Placement Placement::split(gl::Backend& first, gl::Backend& rest, int n_first, int n_layer) {
    KV_ASSERT(n_layer >= 0 && n_first >= 0 && n_first <= n_layer);
    Placement p;
    for (int l = 0; l < n_layer; l++) p.layers.push_back(l < n_first ? &first : &rest);
    p.experts = p.layers;
    p.head = n_first == n_layer ? &first : &rest;
    return p;
}

Placement& Placement::experts_on(gl::Backend& host, int n) {
    KV_ASSERT(n >= 0 && static_cast<size_t>(n) <= experts.size());
    for (int l = 0; l < n; l++) experts[l] = &host;
    return *this;
}

std::vector<gl::Backend*> Placement::distinct() const {
    std::vector<gl::Backend*> v;
    auto note = [&](gl::Backend* b) {
        if (std::find(v.begin(), v.end(), b) == v.end()) v.push_back(b);
    };
    for (gl::Backend* b : layers) note(b);
    for (gl::Backend* b : experts) note(b);
    note(head);
    return v;
}

Forward::Forward(const Model& m, KvCache& kv, gl::Backend& be, int max_batch)
    : Forward(m, kv, Placement::all(be, m.hp.n_layer), max_batch) {}

Forward::Forward(const Model& m, KvCache& kv, Placement placement, int max_batch)
    : m_(m), home_(&kv), place_(std::move(placement)), max_batch_(max_batch) {
    const Hparams& hp = m.hp;
    KV_ASSERT(max_batch >= 1);
    KV_ASSERT(place_.layers.size() == static_cast<size_t>(hp.n_layer) && place_.head);
    KV_ASSERT(place_.experts.size() == place_.layers.size());
    for (gl::Backend* b : place_.layers) KV_ASSERT(b);
    for (gl::Backend* b : place_.experts) KV_ASSERT(b);
    KV_ASSERT(kv.config().n_layer == hp.n_layer);
    int max_q = 0, max_kv = 0;
    for (int l = 0; l < hp.n_layer; l++) {
        KV_ASSERT(kv.kv_dim(l) == hp.layer_kv_dim(l) && kv.config().source(l) == hp.kv_source(l));
        max_q = std::max(max_q, hp.layer_q_dim(l));
        max_kv = std::max(max_kv, hp.layer_kv_dim(l));
    }
    // The cache layout every backend here reads (head-major is the faster one).
    const std::vector<gl::Backend*> backends = place_.distinct();
    kv.set_head_major(std::all_of(backends.begin(), backends.end(),
                                  [](const gl::Backend* b) { return b->head_major_kv(); }));
    const size_t B = max_batch;
    x_.resize(B * hp.n_embd);
    xb_.resize(B * hp.n_embd);
    q_.resize(B * max_q);
    q_unrot_.resize(B * max_q);
    k_.resize(B * max_kv);
    v_.resize(B * max_kv);
    kc_.resize(B * kv.max_row_bytes_k());
    vc_.resize(B * kv.max_row_bytes_v());
    att_.resize(B * max_q);
    hb_.resize(B * hp.n_ff);
    hb2_.resize(B * std::max(hp.n_ff, hp.n_embd)); // also the block output norms' rows
    cos_.resize(B * hp.rope_dims / 2);
    sin_.resize(B * hp.rope_dims / 2);
    if (!m.rope_inv_freq_swa.empty()) {
        const int half_swa = m.rope(1, true).dims / 2;
        cos_swa_.resize(B * half_swa);
        sin_swa_.resize(B * half_swa);
    }
    if (const int P = hp.n_embd_per_layer; P > 0) {
        pli_.resize(static_cast<size_t>(hp.n_layer) * B * P);
        pl_proj_.resize(B * hp.n_layer * P);
        pl_normed_.resize(B * hp.n_layer * P);
        pl_gate_.resize(B * P);
    }
    if (m.v_norm) ones_.assign(hp.max_head_dim(), 1.0f);
    if (hp.attn_output_gate) {
        qg_.resize(2 * B * max_q);
        gate_.resize(B * max_q);
    }
    if (hp.is_moe()) {
        router_.resize(B * hp.n_expert);
        expert_in_.resize(B * hp.n_embd);
        expert_out_.resize(B * hp.n_embd);
        experts_sum_.resize(B * hp.n_embd);
        // A generated token's experts side by side, the shared one too
        // (Forward::experts_one_token).
        const size_t side = static_cast<size_t>(hp.n_expert_used) + 1;
        hb_.resize(std::max(hb_.size(), side * hp.n_ff));
        hb2_.resize(std::max(hb2_.size(), side * hp.n_ff));
        expert_out_.resize(std::max(expert_out_.size(), side * hp.n_embd));
        picked_.resize(static_cast<size_t>(hp.n_expert_used));
        picked_weight_.resize(static_cast<size_t>(hp.n_expert_used));
        group_jobs_.resize(2 * side);
        routing_.reserve(hp.n_expert, hp.n_expert_used, max_batch);
    }
    if (!hp.recurrent_layers.empty()) {
        ssm_qkv_.resize(B * hp.ssm_conv_dim());
        ssm_conv_.resize(B * hp.ssm_conv_dim());
        ssm_z_.resize(B * hp.ssm_d_inner);
        ssm_o_.resize(B * hp.ssm_d_inner);
        ssm_o2_.resize(B * hp.ssm_d_inner);
        ssm_beta_.resize(B * hp.ssm_n_v_heads);
        ssm_g_.resize(B * hp.ssm_n_v_heads);
    }
    for (int l = 0; l < hp.n_layer; l++) {
        if (hp.owns_kv(l)) continue;
        SharedKv* s = shared_of(hp.kv_source(l));
        if (!s) {
            shared_kv_.push_back({});
            s = &shared_kv_.back();
            s->source = hp.kv_source(l);
            s->k_new.resize(B * kv.row_bytes_k(s->source));
            s->v_new.resize(B * kv.row_bytes_v(s->source));
        }
        s->last_reader = l;
    }
    pos_.resize(B);
    logits_.resize(static_cast<size_t>(hp.n_vocab)); // grown once if all rows are asked for

    // Each backend reserves scratch for the matrices it multiplies, with its own threads.
    for (gl::Backend* be : place_.distinct()) {
        size_t mm = 0;
        bool attends = false;
        auto need = [&](const gl::Tensor& w) {
            mm = std::max(mm, gl::ops::matmul_scratch_bytes(w.type, w.ne0, B, be->n_threads()));
        };
        for (int l = 0; l < hp.n_layer; l++) {
            const LayerWeights& L = m.layers[l];
            if (place_.experts[l] == be)
                for (const gl::Tensor* w : L.expert_matrices()) need(*w);
            if (place_.layers[l] != be) continue;
            for (const gl::Tensor* w : L.matrices()) need(*w);
            attends = true;
        }
        if (m.per_layer_model_proj && (place_.layers.empty() ? place_.head : place_.layers[0]) == be)
            need(m.per_layer_model_proj);
        if (place_.head == be) need(m.output);
        be->reserve(mm, attends ? gl::attention_scratch_floats(be->n_threads(), kv.n_ctx(),
                                                               max_batch, max_kv, hp.max_head_dim())
                                : 0);
    }
    backends_ = place_.distinct();
    track_all();
}

Forward::~Forward() {
    untrack_all();
}

std::vector<std::pair<void*, size_t>> Forward::buffers() {
    auto f = [](std::vector<float>& v) {
        return std::pair<void*, size_t>(v.data(), sizeof(float) * v.size());
    };
    return {f(x_),
            f(xb_),
            f(q_),
            f(q_unrot_),
            f(k_),
            f(v_),
            {kc_.data(), kc_.size()},
            {vc_.data(), vc_.size()},
            f(att_),
            f(hb_),
            f(hb2_),
            f(cos_),
            f(sin_),
            f(cos_swa_),
            f(sin_swa_),
            {pos_.data(), sizeof(int64_t) * pos_.size()},
            f(logits_),
            f(router_),
            f(expert_in_),
            f(expert_out_),
            f(experts_sum_)};
}

void Forward::track_all() {
    for (gl::Backend* be : backends_)
        for (auto [p, bytes] : buffers())
            if (bytes > 0) be->track(p, bytes);
}

void Forward::untrack_all() {
    for (gl::Backend* be : backends_)
        for (auto [p, bytes] : buffers())
            if (bytes > 0) be->untrack(p);
}

void Forward::wrote(const void* p, size_t bytes) {
    for (gl::Backend* be : backends_) be->host_wrote(p, bytes);
}

void Forward::cross(gl::Backend* from, gl::Backend* to, int n) {
    const size_t bytes = sizeof(float) * static_cast<size_t>(n) * m_.hp.n_embd;
    from->host_read(x_.data(), bytes);
    to->host_wrote(x_.data(), bytes);
}

const float* Forward::eval(const int32_t* tokens, int n, bool all_logits) {
    return run(tokens, n, all_logits ? 0 : n - 1, Pass::prompt);
}

const float* Forward::eval_rows(const int32_t* tokens, int n, int first) {
    KV_ASSERT(first >= 0 && first < n);
    return run(tokens, n, first, Pass::prompt);
}

const float* Forward::eval_generated(int32_t token) {
    return run(&token, 1, 0, Pass::generated);
}

// Rows exact for one pass only, also when it throws.
struct Forward::RowsExact {
    const std::vector<gl::Backend*>& backends;
    explicit RowsExact(const std::vector<gl::Backend*>& b) : backends(b) {
        for (gl::Backend* be : backends) be->set_rows_exact(true);
    }
    ~RowsExact() {
        for (gl::Backend* be : backends) be->set_rows_exact(false);
    }
};

const float* Forward::eval_verify(const int32_t* tokens, int n) {
    KV_ASSERT(n <= kMaxVerify);
    RowsExact exact(backends_);
    return run(tokens, n, 0, Pass::verify);
}

const float* Forward::eval(KvCache& kv, const int32_t* tokens, int n, bool all_logits) {
    KV_ASSERT(kv.config().n_ctx == home_->n_ctx() && kv.head_major() == home_->head_major());
    segs_.assign(1, Segment{&kv, 0, n, kv.n_past()});
    return run_segments(tokens, n, all_logits ? 0 : n - 1, Pass::prompt);
}

void Forward::adopt(KvCache& kv) const {
    const KvCacheConfig& a = kv.config();
    const KvCacheConfig& b = home_->config();
    KV_ASSERT(a.n_layer == b.n_layer && a.n_ctx == b.n_ctx && a.keep == b.keep &&
              a.type_k == b.type_k && a.type_v == b.type_v && a.k_rotate == b.k_rotate &&
              a.v_rotate == b.v_rotate && a.swa_window == b.swa_window &&
              a.recurrent == b.recurrent && kv.state_bytes() == home_->state_bytes());
    for (int l = 0; l < a.n_layer; l++)
        KV_ASSERT(a.is_swa(l) == b.is_swa(l) && a.source(l) == b.source(l));
    kv.set_head_major(home_->head_major());
}

const float* Forward::eval_generated(std::span<const SeqToken> seqs) {
    const int n = static_cast<int>(seqs.size());
    KV_ASSERT(n >= 1 && n <= max_batch_);
    segs_.clear();
    seq_tokens_.clear();
    for (int i = 0; i < n; i++) {
        KV_ASSERT(seqs[i].kv->head_major() == home_->head_major());
        for (int j = 0; j < i; j++) KV_ASSERT(seqs[j].kv != seqs[i].kv);
        segs_.push_back(Segment{seqs[i].kv, i, 1, seqs[i].kv->n_past()});
        seq_tokens_.push_back(seqs[i].token);
    }
    RowsExact exact(backends_);
    return run_segments(seq_tokens_.data(), n, 0, Pass::generated);
}

const float* Forward::run(const int32_t* tokens, int n, int first, Pass pass) {
    segs_.assign(1, Segment{home_, 0, n, home_->n_past()});
    return run_segments(tokens, n, first, pass);
}

const float* Forward::run_segments(const int32_t* tokens, int n, int first, Pass pass) {
    const Hparams& hp = m_.hp;
    KV_ASSERT(n >= 1 && n <= max_batch_);
    for (const Segment& g : segs_) {
        // A batch holding sink positions must end before the window slides, so
        // that no query in it needs the sinks' shifted form (attention.h).
        KV_ASSERT(g.pos0 >= g.kv->keep() || g.pos0 + g.n <= g.kv->n_ctx());
    }
    // Several sequences: one generated token each (their logits, every row).
    KV_ASSERT(segs_.size() == 1 || (pass == Pass::generated && first == 0));
    for (int i = 0; i < n; i++) KV_ASSERT(tokens[i] >= 0 && tokens[i] < hp.n_vocab);
    const int rows = n - first;
    if (logits_.size() < static_cast<size_t>(rows) * hp.n_vocab) {
        for (gl::Backend* be : backends_) be->untrack(logits_.data());
        logits_.resize(static_cast<size_t>(rows) * hp.n_vocab);
        for (gl::Backend* be : backends_) be->track(logits_.data(), sizeof(float) * logits_.size());
    }
    // A device backend may record the step and launch it at its end; if that
    // fails the step's work is lost and is done again, eagerly. Nothing the
    // step writes on the host is read before it is rewritten (the KV rows
    // land in the same slots), and the positions are committed only after.
    for (int attempt = 0;; attempt++) {
        for (gl::Backend* be : backends_) be->begin_step(n);
        step(tokens, n, first, pass);
        bool ok = true;
        for (gl::Backend* be : backends_) ok = be->end_step() && ok;
        if (ok) break;
        if (attempt > 0) throw std::runtime_error("backend: a step was lost twice");
    }
    for (const Segment& g : segs_) g.kv->commit(g.pos0, g.n);
    return logits_.data();
}

void Forward::step(const int32_t* tokens, int n, int first, Pass pass) {
    const Hparams& hp = m_.hp;
    const int half = hp.rope_dims / 2;
    const Rope rope = m_.rope(home_->n_ctx()); // every cache has its n_ctx (adopt)
    const int half_swa = cos_swa_.empty() ? 0 : m_.rope(home_->n_ctx(), true).dims / 2;
    residual_pending_ = nullptr; // a step that threw mid-layer left no add for this one
    for (const Segment& g : segs_)
        for (int i = 0; i < g.n; i++) pos_[g.row0 + i] = g.pos0 + i;
    {
        OpTimer t(profile_, Op::other);
        for (int i = 0; i < n; i++) {
            float* x = x_.data() + static_cast<size_t>(i) * hp.n_embd;
            gl::cpu::dequantize_row(m_.token_embd.type, m_.token_embd.row(tokens[i]), x, hp.n_embd);
            if (m_.embed_scale != 1.0f)
                for (int j = 0; j < hp.n_embd; j++) x[j] *= m_.embed_scale;
            const size_t at = static_cast<size_t>(i) * half;
            gl::ops::rope_angles(static_cast<double>(pos_[i]), half, rope.inv_freq,
                                 cos_.data() + at, sin_.data() + at);
            if (!cos_swa_.empty())
                gl::ops::rope_angles(static_cast<double>(pos_[i]), half_swa,
                                     m_.rope_inv_freq_swa.data(),
                                     cos_swa_.data() + static_cast<size_t>(i) * half_swa,
                                     sin_swa_.data() + static_cast<size_t>(i) * half_swa);
        }
        if (rope.attn_factor != 1.0) // LongRoPE: the rotated dims of Q and K scaled
            for (size_t j = 0; j < static_cast<size_t>(n) * half; j++) {
                cos_[j] *= static_cast<float>(rope.attn_factor);
                sin_[j] *= static_cast<float>(rope.attn_factor);
            }
        wrote(x_.data(), sizeof(float) * static_cast<size_t>(n) * hp.n_embd);
        wrote(cos_.data(), sizeof(float) * static_cast<size_t>(n) * half);
        wrote(sin_.data(), sizeof(float) * static_cast<size_t>(n) * half);
        if (!cos_swa_.empty()) {
            wrote(cos_swa_.data(), sizeof(float) * static_cast<size_t>(n) * half_swa);
            wrote(sin_swa_.data(), sizeof(float) * static_cast<size_t>(n) * half_swa);
        }
        wrote(pos_.data(), sizeof(int64_t) * static_cast<size_t>(n));
    }

    gl::Backend* cur = place_.layers.empty() ? place_.head : place_.layers[0];
    if (hp.n_embd_per_layer > 0) per_layer_inputs(*cur, tokens, n);
    for (int l = 0; l < hp.n_layer; l++) {
        if (place_.layers[l] != cur) {
            cross(cur, place_.layers[l], n);
            cur = place_.layers[l];
        }
        layer(l, n, pass);
    }
    if (place_.head != cur) cross(cur, place_.head, n);

    const int rows = n - first;
    float* xn = xb_.data();
    gl::Backend& be = *place_.head;
    rmsnorm(be, x_.data() + static_cast<size_t>(first) * hp.n_embd, m_.output_norm, rows, xn);
    matmul(be, Op::output, m_.output, xn, rows, logits_.data());
    be.host_read(logits_.data(), sizeof(float) * static_cast<size_t>(rows) * hp.n_vocab);
    if (const float cap = hp.final_softcap; cap > 0) { // Gemma 4: cap * tanh(logit / cap)
        OpTimer t(profile_, Op::other);
        for (size_t j = 0; j < static_cast<size_t>(rows) * hp.n_vocab; j++)
            logits_[j] = cap * std::tanh(logits_[j] / cap);
    }
}

Forward::SharedKv* Forward::shared_of(int source) {
    for (SharedKv& s : shared_kv_)
        if (s.source == source) return &s;
    return nullptr;
}

void Forward::layer(int l, int n, Pass pass) {
    if (m_.hp.is_recurrent(l))
        recurrent_block(l, n);
    else
        attention_block(l, n, pass);
    if (m_.hp.is_moe())
        experts_block(l, n);
    else
        ffn_block(l, n);
    KV_ASSERT(!residual_pending_);
    if (m_.hp.n_embd_per_layer > 0) per_layer_input_block(l, n);
    if (const float s = m_.layers[l].output_scale; s != 1.0f) {
        gl::Backend& be = *place_.layers[l];
        const size_t count = static_cast<size_t>(n) * m_.hp.n_embd;
        be.host_read(x_.data(), sizeof(float) * count);
        OpTimer t(profile_, Op::other);
        for (size_t j = 0; j < count; j++) x_[j] *= s;
        be.host_wrote(x_.data(), sizeof(float) * count);
    }
}

// x += Wo · attention(RoPE(Wq · norm(x)), the ring with RoPE(Wk · norm(x)), Wv · norm(x))
void Forward::attention_block(int l, int n, Pass pass) {
    const Hparams& hp = m_.hp;
    const LayerWeights& L = m_.layers[l];
    gl::Backend& be = *place_.layers[l];
    const int hd = hp.layer_head_dim(l), qd = hp.layer_q_dim(l), kvd = hp.layer_kv_dim(l);
    const int rope_dims = hp.layer_rope_dims(l);
    // A layer sharing another's slots (Gemma 4) computes only its queries.
    const bool own_kv = hp.owns_kv(l);

    rmsnorm(be, x_.data(), L.attn_norm, n, xb_.data());
    if (hp.attn_output_gate) {
        // Qwen 3.5: per head, the query then its gate.
        matmul(be, Op::attn_q, L.wq, xb_.data(), n, qg_.data());
        be.host_read(qg_.data(), sizeof(float) * static_cast<size_t>(n) * 2 * qd);
        for (int i = 0; i < n; i++)
            for (int h = 0; h < hp.n_head; h++) {
                const float* src = qg_.data() + (static_cast<size_t>(i) * hp.n_head + h) * 2 * hd;
                const size_t at = static_cast<size_t>(i) * qd + static_cast<size_t>(h) * hd;
                std::memcpy(q_.data() + at, src, sizeof(float) * hd);
                std::memcpy(gate_.data() + at, src + hd, sizeof(float) * hd);
            }
        wrote(q_.data(), sizeof(float) * static_cast<size_t>(n) * qd);
    } else {
        matmul(be, Op::attn_q, L.wq, xb_.data(), n, q_.data());
    }
    if (own_kv) {
        matmul(be, Op::attn_k, L.wk, xb_.data(), n, k_.data());
        if (L.v_is_k) // Gemma 4 without attn_v: the keys before their norm
            be.convert_rows(gl::Type::F32, k_.data(), kvd, n, v_.data());
        else
            matmul(be, Op::attn_v, L.wv, xb_.data(), n, v_.data());
    }
    std::optional<OpTimer> other(std::in_place, profile_, Op::other);
    if (!L.bq.empty())
        for (int i = 0; i < n; i++) {
            be.add(q_.data() + static_cast<size_t>(i) * qd, L.bq.data(), qd);
            be.add(k_.data() + static_cast<size_t>(i) * kvd, L.bk.data(), kvd);
            be.add(v_.data() + static_cast<size_t>(i) * kvd, L.bv.data(), kvd);
        }

    // Per-head norms (qwen3): each head of Q and K normed over head_dim. Out
    // of place through att_ (free until attention writes it) and copied back,
    // so no backend needs an in-place norm.
    if (!L.q_norm.empty()) {
        be.rmsnorm(q_.data(), L.q_norm.data(), hd, static_cast<int64_t>(n) * hp.n_head,
                   hp.rms_eps, att_.data());
        be.convert_rows(gl::Type::F32, att_.data(), qd, n, q_.data());
    }
    if (!L.k_norm.empty()) {
        be.rmsnorm(k_.data(), L.k_norm.data(), hd, static_cast<int64_t>(n) * hp.n_head_kv,
                   hp.rms_eps, att_.data());
        be.convert_rows(gl::Type::F32, att_.data(), kvd, n, k_.data());
    }
    if (own_kv && m_.v_norm) { // Gemma 4: each head of V normed, no weight
        be.rmsnorm(v_.data(), ones_.data(), hd, static_cast<int64_t>(n) * hp.n_head_kv,
                   hp.rms_eps, att_.data());
        be.convert_rows(gl::Type::F32, att_.data(), kvd, n, v_.data());
    }
    // Sinks keep their unrotated keys, re-rotated for queries past the window
    // (sliding-window layers have none: their ring is what they see).
    const bool sinks = home_->config().keep_of(l) > 0;
    bool any_slid = false;
    for (const Segment& g : segs_) {
        if (own_kv && sinks && g.pos0 < g.kv->keep()) {
            be.host_read(k_.data(), sizeof(float) * static_cast<size_t>(n) * kvd);
            g.kv->store_sinks(l, g.pos0, g.n, k_.data() + static_cast<size_t>(g.row0) * kvd,
                              m_.layer_rope(l, g.kv->n_ctx()));
        }
        any_slid = any_slid || (sinks && g.pos0 + g.n - 1 >= g.kv->slots(l));
    }
    // A copy (F32 "conversion"), so that it stays on the backend's device.
    if (any_slid) be.convert_rows(gl::Type::F32, q_.data(), qd, n, q_unrot_.data());

    const bool own_base = hp.is_swa(l) && !cos_swa_.empty();
    const float* cs = own_base ? cos_swa_.data() : cos_.data();
    const float* sn = own_base ? sin_swa_.data() : sin_.data();
    be.rope(q_.data(), n, hp.n_head, hd, rope_dims, cs, sn, hp.rope_neox);
    if (own_kv) be.rope(k_.data(), n, hp.n_head_kv, hd, rope_dims, cs, sn, hp.rope_neox);
    // Rotated keys: keys (after RoPE, before their cache type) and queries
    // through the same orthonormal Hadamard blocks, so every q·k is as it
    // was (the sinks' copies are rotated in store_sinks; V is untouched).
    const KvCacheConfig& kc = home_->config(); // every cache's (adopt)
    if (const int rot = kc.k_rotate; rot > 0) {
        be.hadamard_rows(q_.data(), n, qd, rot);
        if (own_kv) be.hadamard_rows(k_.data(), n, kvd, rot);
        if (any_slid) be.hadamard_rows(q_unrot_.data(), n, qd, rot);
    }
    // Rotated values (4-bit V): stored rotated; the output, a weighted sum of
    // them, is turned back below.
    const int v_rot = kc.v_rotate;
    if (own_kv) {
        if (v_rot > 0) be.hadamard_rows(v_.data(), n, kvd, v_rot);
        be.convert_rows(kc.type_k, k_.data(), kvd, n, kc_.data());
        be.convert_rows(kc.type_v, v_.data(), kvd, n, vc_.data());
    }
    other.reset();

    // Shared slots: this layer is a source others read, or a reader.
    const size_t rk = home_->row_bytes_k(l), rv = home_->row_bytes_v(l);
    SharedKv* source = own_kv ? shared_of(l) : nullptr;
    SharedKv* reader = own_kv ? nullptr : shared_of(hp.kv_source(l));
    if (source) {
        be.host_read(kc_.data(), static_cast<size_t>(n) * rk);
        be.host_read(vc_.data(), static_cast<size_t>(n) * rv);
        std::memcpy(source->k_new.data(), kc_.data(), static_cast<size_t>(n) * rk);
        std::memcpy(source->v_new.data(), vc_.data(), static_cast<size_t>(n) * rv);
        source->overwritten.resize(segs_.size());
    }
    const uint8_t* k_rows = reader ? reader->k_new.data() : kc_.data();
    const uint8_t* v_rows = reader ? reader->v_new.data() : vc_.data();

    // Each sequence attends its own cache and writes its rows there.
    for (size_t si = 0; si < segs_.size(); si++) {
        const Segment& g = segs_[si];
        KvCache& kv = *g.kv;
        const size_t r0 = static_cast<size_t>(g.row0);
        if (source) kv.save_slots(l, g.pos0, g.n, source->overwritten[si]);
        const bool slid = sinks && g.pos0 + g.n - 1 >= kv.slots(l);
        gl::AttentionArgs a;
        a.n_tok = g.n;
        a.n_head = hp.n_head;
        a.n_head_kv = hp.n_head_kv;
        a.head_dim = hd;
        a.scale = m_.attn_scale();
        a.q = q_.data() + r0 * qd;
        a.q_unrot = slid ? q_unrot_.data() + r0 * qd : nullptr;
        a.pos = pos_.data() + r0;
        kv.attention_slots(l, a);
        a.k_new = k_rows + r0 * rk;
        a.v_new = v_rows + r0 * rv;
        a.out = att_.data() + r0 * qd;
        a.half_ok = pass == Pass::generated;
        if (pass == Pass::verify && be.reads_host_kv()) {
            attend_each(kv, a, l, g.n, g.pos0, slid);
        } else {
            // The slots in view (the batch's own keys included), K and V.
            const double kv_bytes =
                static_cast<double>(std::min<int64_t>(g.pos0 + g.n, kv.slots(l))) *
                static_cast<double>(rk + rv);
            OpTimer t(profile_, Op::attention, kv_bytes);
            be.attention(a);
            kv.write(l, g.pos0, g.n, a.k_new, a.v_new,
                     [&be](void* dst, const void* src, size_t bytes) {
                         be.copy_to_host(src, dst, bytes);
                     });
        }
        // The ring as the source found it for the next reader; the last
        // leaves the batch written.
        if (source) kv.restore_slots(l, g.pos0, g.n, source->overwritten[si]);
        if (reader && reader->last_reader != l)
            kv.restore_slots(reader->source, g.pos0, g.n, reader->overwritten[si]);
    }

    if (v_rot > 0) {
        // Each query head's output is a sum of its KV head's rotated values:
        // R^-1 on the same blocks gives the sum of the values.
        OpTimer t(profile_, Op::other);
        be.hadamard_rows_inverse(att_.data(), n, qd, v_rot);
    }
    if (hp.attn_output_gate) { // each head's output times sigmoid(its gate)
        const size_t count = static_cast<size_t>(n) * qd;
        be.host_read(att_.data(), sizeof(float) * count);
        OpTimer t(profile_, Op::other);
        for (size_t j = 0; j < count; j++) att_[j] /= 1.0f + std::exp(-gate_[j]);
        be.host_wrote(att_.data(), sizeof(float) * count);
    }
    matmul(be, Op::attn_output, L.wo, att_.data(), n, xb_.data());
    defer_residual(be, n, L.post_attn_norm); // added by the FFN's norm_residual
}

void Forward::attend_each(KvCache& kv, gl::AttentionArgs a, int l, int n, int64_t pos0,
                          bool any_slid) {
    gl::Backend& be = *place_.layers[l];
    const Hparams& hp = m_.hp;
    const int qd = hp.layer_q_dim(l);
    const int n_slots = kv.slots(l);
    const int64_t* held = kv.slot_pos(l);
    staged_pos_.assign(held, held + n_slots);
    const size_t rk = kv.row_bytes_k(l), rv = kv.row_bytes_v(l);
    const double kv_bytes = static_cast<double>(std::min<int64_t>(pos0 + n, n_slots)) *
                            static_cast<double>(rk + rv);
    const auto* k_rows = static_cast<const uint8_t*>(a.k_new);
    const auto* v_rows = static_cast<const uint8_t*>(a.v_new);
    OpTimer t(profile_, Op::attention, kv_bytes * n);
    a.n_tok = 1;
    a.half_ok = true;
    a.slot_pos = staged_pos_.data();
    for (int i = 0; i < n; i++) {
        const int64_t p = pos0 + i;
        a.q = q_.data() + static_cast<size_t>(i) * qd;
        a.q_unrot =
            any_slid && p >= n_slots ? q_unrot_.data() + static_cast<size_t>(i) * qd : nullptr;
        a.pos = pos_.data() + i;
        a.k_new = k_rows + i * rk;
        a.v_new = v_rows + i * rv;
        a.out = att_.data() + static_cast<size_t>(i) * qd;
        be.attention(a);
        kv.write_row(l, p, a.k_new, a.v_new);
        staged_pos_[kv.slot_of(l, p)] = p;
    }
}

// x += W_down · (act(W_gate · norm(x)) * (W_up · norm(x))), act = SiLU
// (SwiGLU) or GELU (gemma3)
void Forward::ffn_block(int l, int n) {
    const Hparams& hp = m_.hp;
    const LayerWeights& L = m_.layers[l];
    gl::Backend& be = *place_.layers[l];
    norm_residual(be, L.ffn_norm, n, xb_.data()); // the attention block's add, then the norm
    matmul(be, Op::ffn_gate, L.w_gate, xb_.data(), n, hb_.data());
    matmul(be, Op::ffn_up, L.w_up, xb_.data(), n, hb2_.data());
    {
        OpTimer t(profile_, Op::other);
        const int64_t count = static_cast<int64_t>(n) * hp.layer_n_ff(l);
        if (m_.gelu_ffn)
            be.gelu_mul(hb_.data(), hb2_.data(), count);
        else
            be.silu_mul(hb_.data(), hb2_.data(), count);
    }
    matmul(be, Op::ffn_down, L.w_down, hb_.data(), n, xb_.data());
    add_residual(be, n, L.post_ffn_norm);
}

void Forward::matmul(gl::Backend& be, Op op, const gl::Tensor& w, const float* x, int n, float* y) {
    OpTimer t(profile_, op, static_cast<double>(w.bytes()));
    be.matmul(w, x, n, y);
}

void Forward::matmul_part(gl::Backend& be, Op op, const gl::Tensor& w, const float* x, int n,
                          int n_batch, float* y) {
    OpTimer t(profile_, op, static_cast<double>(w.bytes()));
    be.matmul_part(w, x, n, n_batch, y);
}

void Forward::rmsnorm(gl::Backend& be, const float* x, const std::vector<float>& w, int rows,
                      float* out) {
    OpTimer t(profile_, Op::norms);
    be.rmsnorm(x, w.data(), m_.hp.n_embd, rows, m_.hp.rms_eps, out);
}

void Forward::add_residual(gl::Backend& be, int n, const std::vector<float>& post) {
    defer_residual(be, n, post);
    OpTimer t(profile_, Op::other);
    be.add(x_.data(), residual_pending_, static_cast<int64_t>(n) * m_.hp.n_embd);
    residual_pending_ = nullptr;
}

void Forward::defer_residual(gl::Backend& be, int n, const std::vector<float>& post) {
    KV_ASSERT(!residual_pending_);
    residual_pending_ = xb_.data();
    if (!post.empty()) {
        // Into hb2_: free by now (the FFN's up rows are consumed), and at
        // least n_embd wide.
        rmsnorm(be, xb_.data(), post, n, hb2_.data());
        residual_pending_ = hb2_.data();
    }
}

void Forward::norm_residual(gl::Backend& be, const std::vector<float>& w, int n, float* out) {
    if (!residual_pending_) return rmsnorm(be, x_.data(), w, n, out);
    OpTimer t(profile_, Op::norms);
    be.add_rmsnorm(x_.data(), residual_pending_, w.data(), m_.hp.n_embd, n, m_.hp.rms_eps, out);
    residual_pending_ = nullptr;
}

} // namespace kvrun
