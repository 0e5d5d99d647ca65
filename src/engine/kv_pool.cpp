#include "kv_pool.h"

#include <algorithm>
#include <cstring>

#include "error.h"
#include "ggml-like/types.h"
#include "kv_cache.h"

namespace kvrun {

int KvPool::kind_of(const KvCacheConfig& cfg, int layer) {
    return cfg.is_swa(layer) ? 1 : 0;
}

KvPool::Blocks KvPool::ring_blocks(const KvCacheConfig& cfg) {
    Blocks b{};
    for (int l = 0; l < cfg.n_layer; l++)
        if (cfg.owns(l)) b[kind_of(cfg, l)] = (cfg.slots(l) + kBlockSlots - 1) / kBlockSlots;
    return b;
}

size_t KvPool::block_bytes_for(const KvCacheConfig& cfg, int kind) {
    size_t n = 0;
    for (int l = 0; l < cfg.n_layer; l++)
        if (kind_of(cfg, l) == kind) n += cfg.slot_bytes(l);
    return n * kBlockSlots;
}

KvPool::KvPool(const KvCacheConfig& cfg, Blocks blocks) : blocks_(blocks) {
    n_head_kv_ = cfg.n_head_kv;
    elem_k_ = static_cast<int>(gl::type_info(cfg.type_k).type_size);
    // One allocation for every layer's K and V areas, each 64-byte aligned
    // (SIMD loads of a row never split a cache line needlessly), on huge
    // pages (allocate_huge): a decode step reads every layer's slots from
    // DRAM (`kvrun-lab attention`, TinyLlama Q4_0 at depth 4096: a plain
    // read of the ring 20.5 -> 27-28 GB/s, attention 7.0-7.4 -> 6.3-6.8 ms a
    // token).
    auto aligned = [](size_t n) { return (n + 63) / 64 * 64; };
    size_t used = 0;
    for (int l = 0; l < cfg.n_layer; l++) {
        const bool own = cfg.owns(l);
        const int kind = kind_of(cfg, l);
        layer_kind_.push_back(kind);
        head_dim_.push_back(cfg.head_dim_of(l));
        row_k_.push_back(own ? gl::row_size(cfg.type_k, cfg.kv_dim_of(l)) : 0);
        row_v_.push_back(own ? gl::row_size(cfg.type_v, cfg.kv_dim_of(l)) : 0);
        const size_t n = own ? static_cast<size_t>(pool_slots(kind)) : 0;
        layer_at_.push_back(used);
        k_bytes_.push_back(aligned(row_k_.back() * n));
        used += k_bytes_.back() + aligned(row_v_.back() * n);
    }
    for (int k = 0; k < kKinds; k++) {
        block_bytes_[k] = block_bytes_for(cfg, k);
        refs_[k].assign(static_cast<size_t>(blocks_[k]), 0);
        for (int32_t b = blocks_[k] - 1; b >= 0; b--) free_[k].push_back(b);
    }
    bytes_ = used;
    mem_ = allocate_huge(std::max<size_t>(used, 64));
    if (!mem_) fail(Exit::out_of_memory, "cannot allocate {} bytes for the KV cache", used);
    std::memset(mem_.get(), 0, used);
}

size_t KvPool::slot_bytes_v(int layer) const {
    return head_major_ ? row_v_[layer] / n_head_kv_ : row_v_[layer];
}

size_t KvPool::head_bytes_k(int layer) const {
    return head_major_ ? row_k_[layer] / n_head_kv_ * layer_slots(layer) : 0;
}

size_t KvPool::head_bytes_v(int layer) const {
    return head_major_ ? slot_bytes_v(layer) * layer_slots(layer) : 0;
}

void KvPool::get_row(int layer, int64_t ps, uint8_t* ko, uint8_t* vo) const {
    const uint8_t* kb = k_base(layer);
    const uint8_t* vb = v_base(layer);
    const size_t rk = row_k_[layer], rv = row_v_[layer];
    if (!head_major_) {
        std::memcpy(ko, kb + ps * rk, rk);
        std::memcpy(vo, vb + ps * rv, rv);
        return;
    }
    const size_t hv = slot_bytes_v(layer), e = static_cast<size_t>(elem_k_);
    const size_t hbk = head_bytes_k(layer), hbv = head_bytes_v(layer);
    const int hd = head_dim_[layer], n = layer_slots(layer);
    for (int h = 0; h < n_head_kv_; h++) {
        std::memcpy(vo + h * hv, vb + h * hbv + ps * hv, hv);
        for (int k = 0; k < hd; k++)
            std::memcpy(ko + (static_cast<size_t>(h) * hd + k) * e,
                        kb + h * hbk + gl::key_tile_index(ps, k, hd, n) * e, e);
    }
}

int32_t KvPool::take(int kind) {
    if (free_[kind].empty()) return -1;
    const int32_t b = free_[kind].back();
    free_[kind].pop_back();
    refs_[kind][b] = 1;
    note_held();
    return b;
}

void KvPool::release(int kind, int32_t b) {
    KV_ASSERT(refs_[kind][b] > 0);
    if (--refs_[kind][b] == 0) free_[kind].push_back(b);
}

void KvPool::note_held() {
    size_t held = 0;
    for (int k = 0; k < kKinds; k++) held += static_cast<size_t>(held_blocks(k)) * block_bytes_[k];
    peak_held_bytes_ = std::max(peak_held_bytes_, held);
}

void KvPool::copy_block(int kind, const KvPool& src, int32_t from, int32_t to) {
    KV_ASSERT(src.head_major_ == head_major_ && src.row_k_ == row_k_);
    // A block is a contiguous stretch of each area (per KV head when
    // head-major: a head's keys are whole tiles of its pool slots).
    const int64_t bs = kBlockSlots;
    for (size_t l = 0; l < row_k_.size(); l++) {
        if (layer_kind_[l] != kind || row_k_[l] == 0) continue;
        const int li = static_cast<int>(l);
        const int heads = head_major_ ? n_head_kv_ : 1;
        const size_t k_span = row_k_[l] / heads * bs, v_span = row_v_[l] / heads * bs;
        for (int h = 0; h < heads; h++) {
            std::memcpy(k_base(li) + h * head_bytes_k(li) + to * k_span,
                        src.k_base(li) + h * src.head_bytes_k(li) + from * k_span, k_span);
            std::memcpy(v_base(li) + h * head_bytes_v(li) + to * v_span,
                        src.v_base(li) + h * src.head_bytes_v(li) + from * v_span, v_span);
        }
    }
}

} // namespace kvrun
