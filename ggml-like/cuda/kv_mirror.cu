// The CUDA backend's attention and its KV mirror: the host ring stays the
// source of truth and each attention call brings a device mirror of it up to
// date by comparing slot position tags and row samples (no hook in KvCache);
// with --kv-gpu-window the mirror holds only the sinks and the newest window
// and the older ("cold") positions are attended on the CPU and merged by
// log-sum-exp. docs/cuda.md ("Design": The KV ring, Hot/cold KV) says why.
#include <cstdlib>
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "ggml-like/cuda/backend_impl.h"
#include "ggml-like/cuda/kernels.h"

namespace gl::cuda_impl {

namespace {

uint64_t row_sample(const uint8_t* k, size_t kb, const uint8_t* v, size_t vb) {
    uint64_t a = 0, b = 0;
    std::memcpy(&a, k, kb < 8 ? kb : 8);
    std::memcpy(&b, v, vb < 8 ? vb : 8);
    return mix(mix(0x51ed270b27e3f1a5ull, a), b);
}

} // namespace

// ---- attention -----------------------------------------------------------------

void CudaBackend::attend(const AttentionArgs& a) {
    // The mirror copies the ring's slots in order: one sequence's blocks in
    // order (a lone cache), never a shared pool's (kvrun batch refuses -ngl
    // with more than one sequence).
    if (a.slot_block) std::abort();
    const int64_t kvd = static_cast<int64_t>(a.n_head_kv) * a.head_dim;
    const size_t qb = sizeof(float) * static_cast<size_t>(a.n_tok) * a.n_head * a.head_dim;
    const int64_t n_q = static_cast<int64_t>(a.n_tok) * a.n_head;
    // pos is written by the host (Forward's host_wrote): its host copy is current.
    int64_t max_pos = 0;
    for (int i = 0; i < a.n_tok; i++) max_pos = a.pos[i] > max_pos ? a.pos[i] : max_pos;
    const bool any_slid = max_pos >= a.n_ctx;
    const bool use_unrot = any_slid && a.q_unrot != nullptr;
    const bool use_sinks = any_slid && a.n_sink > 0 && a.sink_k != nullptr;
    const bool have_ring = a.n_ctx > 0 && a.k_slots && a.v_slots;
    // Hot/cold: the device mirrors the sinks and the positions >= cut (the
    // newest window_ before this batch); older ones are attended here on
    // the CPU. Batches are consecutive, so pos[0] is the first new position.
    // A ring no longer than the window is mirrored whole.
    const int hot_window = window_ > 0 && window_ < a.window ? window_ : 0;
    const int64_t cut = a.pos[0] - hot_window;
    const bool split = have_ring && hot_window > 0 && cut > a.n_sink;
    const int n_dev = !have_ring ? 0 : hot_window > 0 ? a.n_sink + hot_window : a.n_ctx;

    if (split) {
        // The CPU part reads the queries on the host: bring them down now,
        // before the GPU part is queued, so the two then overlap.
        end_capture(true);
        coh_->host_read(a.q, qb);
        if (use_unrot) coh_->host_read(a.q_unrot, qb);
        sync();
    }

    // Scratch first (allocation may evict cached entries not used by this op).
    auto* dpart = static_cast<float*>(
        buf(kPartial,
            sizeof(float) * cuda::attention_partial_floats(a.n_tok, a.n_head, a.head_dim, n_dev)));
    float* dlse = split ? static_cast<float*>(buf(kLse, sizeof(float) * n_q)) : nullptr;
    int64_t* dslot = nullptr;
    const void* dks = nullptr;
    const void* dvs = nullptr;
    if (have_ring) {
        KvMirror& m = mirror(a, hot_window, cut);
        dks = m.k;
        dvs = m.v;
        dslot = m.dpos;
    } else {
        dslot = static_cast<int64_t*>(buf(kSlotPos, sizeof(int64_t)));
        GL_CUDA(cudaMemsetAsync(dslot, 0xff, sizeof(int64_t), s_)); // -1: no cached keys
    }
    const auto* dq = static_cast<const float*>(in(a.q, qb, kX));
    const auto* dqu = use_unrot ? static_cast<const float*>(in(a.q_unrot, qb, kQU)) : nullptr;
    const auto* dpos = static_cast<const int64_t*>(in(a.pos, sizeof(int64_t) * a.n_tok, kPos));
    const void* dkn = in(a.k_new, a.k_row_bytes * a.n_tok, kKNew);
    const void* dvn = in(a.v_new, a.v_row_bytes * a.n_tok, kVNew);
    const auto* dsink =
        use_sinks ? static_cast<const float*>(in(a.sink_k, sizeof(float) * a.n_sink * kvd, kSink))
                  : nullptr;
    const Out o = out(a.out, qb, kY);

    cuda::DevAttention d;
    d.n_tok = a.n_tok;
    d.n_head = a.n_head;
    d.n_head_kv = a.n_head_kv;
    d.head_dim = a.head_dim;
    d.scale = a.scale;
    d.q = dq;
    d.q_unrot = dqu;
    d.pos = dpos;
    d.k_type = a.k_type;
    d.v_type = a.v_type;
    d.k_row_bytes = a.k_row_bytes;
    d.v_row_bytes = a.v_row_bytes;
    d.n_ctx = a.n_ctx;
    d.n_slots = n_dev;
    d.k_slots = dks;
    d.v_slots = dvs;
    d.slot_pos = dslot;
    d.k_new = dkn;
    d.v_new = dvn;
    d.n_sink = a.n_sink;
    d.window = a.window;
    d.sink_k = dsink;
    d.out = static_cast<float*>(o.dev);
    d.lse = dlse;
    cuda::attention(d, dpart, s_);
    GL_CUDA(cudaGetLastError());
    if (!split) {
        finish({o});
        return;
    }
    // The cold partial on the CPU, from the host ring, while the GPU works
    // (before any copy back: into pageable memory those wait for the GPU).
    cold_out_.resize(static_cast<size_t>(n_q) * a.head_dim);
    cold_lse_.resize(static_cast<size_t>(n_q));
    const int64_t sc = attention_scratch_floats(cpu_pool_->size(), a.n_ctx, a.n_tok,
                                                static_cast<int>(kvd), a.head_dim);
    if (static_cast<int64_t>(cpu_scratch_.size()) < sc) cpu_scratch_.resize(sc);
    AttentionArgs c = a;
    c.out = cold_out_.data();
    c.scratch = cpu_scratch_.data();
    KeySubset cold;
    cold.pos_begin = a.n_sink;
    cold.pos_end = cut;
    cold.with_new = false;
    attention_partial(*cpu_pool_, c, cold, cold_lse_.data());
    hot_lse_.resize(static_cast<size_t>(n_q));
    GL_CUDA(cudaMemcpyAsync(a.out, o.dev, qb, cudaMemcpyDeviceToHost, s_));
    GL_CUDA(
        cudaMemcpyAsync(hot_lse_.data(), dlse, sizeof(float) * n_q, cudaMemcpyDeviceToHost, s_));
    note_download(qb + sizeof(float) * n_q);
    sync();
    attention_merge(a.n_tok, a.n_head, a.head_dim, a.out, hot_lse_.data(), cold_out_.data(),
                    cold_lse_.data());
    coh_->host_wrote(a.out, qb); // the merged result is on the host only
}

// ---- KV mirrors --------------------------------------------------------------------

void CudaBackend::free_mirror(KvMirror& m) {
    cudaFree(m.k);
    cudaFree(m.v);
    cudaFree(m.dpos);
}

CudaBackend::KvMirror& CudaBackend::mirror(const AttentionArgs& a, int window, int64_t cut) {
    const int rows = window > 0 ? a.n_sink + window : a.n_ctx;
    auto it = mirrors_.find(a.k_slots);
    if (it != mirrors_.end()) {
        KvMirror& m = it->second;
        if (m.host_v != a.v_slots || m.n_ctx != a.n_ctx || m.window != window || m.rows != rows ||
            m.rk != a.k_row_bytes || m.rv != a.v_row_bytes || m.tk != a.k_type ||
            m.tv != a.v_type) {
            sync();
            free_mirror(m);
            mirrors_.erase(it);
            it = mirrors_.end();
        }
    }
    if (it == mirrors_.end()) {
        KvMirror m;
        m.host_v = a.v_slots;
        m.n_ctx = a.n_ctx;
        m.window = window;
        m.rows = rows;
        m.rk = a.k_row_bytes;
        m.rv = a.v_row_bytes;
        m.tk = a.k_type;
        m.tv = a.v_type;
        m.last_use = tick_;
        m.pos.assign(rows, -1);
        m.sample.assign(rows, 0);
        try {
            m.k = alloc(m.rk * rows, "the KV cache");
            m.v = alloc(m.rv * rows, "the KV cache");
            m.dpos = static_cast<int64_t*>(alloc(sizeof(int64_t) * rows, "the KV cache"));
        } catch (...) {
            free_mirror(m);
            throw;
        }
        GL_CUDA(cudaMemsetAsync(m.dpos, 0xff, sizeof(int64_t) * rows, s_)); // all -1
        it = mirrors_.emplace(a.k_slots, std::move(m)).first;
    }
    KvMirror& m = it->second;
    m.last_use = tick_;
    sync_mirror(m, a, cut);
    return m;
}

// Make each device row hold what it should this call, uploading only rows
// whose position tag or row sample changed (coalesced into runs), and the
// span of position tags that changed. The whole ring: device row s
// mirrors host slot s. Hot/cold: a sink keeps its slot; a window position
// p >= cut (the newest m.window positions) goes to row
// n_sink + (p - n_sink) mod window -- consecutive positions, distinct
// rows, so the device part is a small ring of its own; older positions
// (cold) are not on the device at all.
void CudaBackend::sync_mirror(KvMirror& m, const AttentionArgs& a, int64_t cut) {
    const auto* hk = static_cast<const uint8_t*>(a.k_slots);
    const auto* hv = static_cast<const uint8_t*>(a.v_slots);
    want_.assign(m.rows, -1);
    from_.assign(m.rows, -1);
    for (int s = 0; s < m.n_ctx; s++) {
        const int64_t sp = a.slot_pos ? a.slot_pos[s] : -1;
        if (sp < 0) continue;
        int64_t d;
        if (m.window == 0)
            d = s;
        else if (sp < a.n_sink)
            d = sp;
        else if (sp >= cut)
            d = a.n_sink + (sp - a.n_sink) % m.window;
        else
            continue; // cold
        want_[d] = sp;
        from_[d] = s;
    }
    // The run being gathered: device rows [run_d, +run_n) <- host slots [run_s, +run_n).
    int run_d = 0, run_s = 0, run_n = 0;
    auto flush = [&] {
        if (run_n == 0) return;
        const size_t n = static_cast<size_t>(run_n);
        h2d(static_cast<uint8_t*>(m.k) + run_d * m.rk, hk + run_s * m.rk, n * m.rk);
        h2d(static_cast<uint8_t*>(m.v) + run_d * m.rv, hv + run_s * m.rv, n * m.rv);
        run_n = 0;
    };
    int tag_lo = m.rows, tag_hi = -1; // device rows whose position tag changed
    for (int d = 0; d < m.rows; d++) {
        const int64_t sp = want_[d];
        if (sp < 0) {
            if (m.pos[d] != -1) {
                m.pos[d] = -1; // hidden from every query: contents do not matter
                tag_lo = std::min(tag_lo, d);
                tag_hi = d;
            }
            continue;
        }
        const int s = static_cast<int>(from_[d]);
        const uint64_t smp = row_sample(hk + s * m.rk, m.rk, hv + s * m.rv, m.rv);
        if (m.pos[d] == sp && m.sample[d] == smp) continue;
        if (m.pos[d] != sp) {
            tag_lo = std::min(tag_lo, d);
            tag_hi = d;
        }
        m.pos[d] = sp;
        m.sample[d] = smp;
        if (run_n > 0 && d == run_d + run_n && s == run_s + run_n) {
            run_n++;
            continue;
        }
        flush();
        run_d = d;
        run_s = s;
        run_n = 1;
    }
    flush();
    if (tag_hi >= tag_lo)
        h2d(m.dpos + tag_lo, m.pos.data() + tag_lo,
            sizeof(int64_t) * static_cast<size_t>(tag_hi - tag_lo + 1));
}

} // namespace gl::cuda_impl
