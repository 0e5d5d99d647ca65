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

KvPool::Blocks KvPool::blocks_for_tokens(const KvCacheConfig& cfg, int64_t tokens) {
    Blocks b = ring_blocks(cfg);
    for (int& k : b)
        k = static_cast<int>(
            std::min<int64_t>(k, (std::max<int64_t>(tokens, 0) + kBlockSlots - 1) / kBlockSlots));
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
        hash_of_[k].assign(static_cast<size_t>(blocks_[k]), 0);
        indexed_[k].assign(static_cast<size_t>(blocks_[k]), 0);
        for (int32_t b = blocks_[k] - 1; b >= 0; b--) free_[k].push_back(b);
    }
    bytes_ = used;
    mem_ = allocate_huge(std::max<size_t>(used, 64));
    if (!mem_) fail(Exit::out_of_memory, "cannot allocate {} bytes for the KV cache", used);
    // No memset here: take() zeroes each block it gives, so a large shared
    // pool's pages become resident only as sequences use them.
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
    while (free_[kind].empty() && !lru_.empty()) drop_entry(lru_.front());
    // An entry one of whose blocks a sequence still holds (it copied the
    // other on write) is in no list, and its unheld block is free to take.
    for (int32_t b = 0; free_[kind].empty() && b < blocks_[kind]; b++)
        if (refs_[kind][b] == 0 && indexed(kind, b)) drop_entry(hash_of_[kind][b]);
    if (free_[kind].empty()) return -1;
    const int32_t b = free_[kind].back();
    free_[kind].pop_back();
    refs_[kind][b] = 1;
    held_[kind]++;
    note_held();
    copy_block(kind, *this, -1, b);
    return b;
}

void KvPool::hold(int kind, int32_t b) {
    if (refs_[kind][b]++ > 0) return;
    held_[kind]++; // an indexed block nobody held: out of the LRU list
    if (indexed(kind, b)) {
        Entry& e = index_.at(hash_of_[kind][b]);
        if (e.in_lru) lru_.erase(e.lru);
        e.in_lru = false;
    }
    note_held();
}

void KvPool::release(int kind, int32_t b) {
    KV_ASSERT(refs_[kind][b] > 0);
    if (--refs_[kind][b] > 0) return;
    held_[kind]--;
    if (!indexed(kind, b)) {
        free_[kind].push_back(b);
        return;
    }
    Entry& e = index_.at(hash_of_[kind][b]);
    if (!e.in_lru && unheld(e.p)) {
        e.lru = lru_.insert(lru_.end(), hash_of_[kind][b]);
        e.in_lru = true;
    }
}

bool KvPool::unheld(const Prefix& p) const {
    for (int k = 0; k < kKinds; k++)
        if (p.block[k] >= 0 && refs_[k][p.block[k]] > 0) return false;
    return true;
}

const KvPool::Prefix* KvPool::find(uint64_t hash, uint64_t parent,
                                   std::span<const int32_t> tokens) const {
    const auto it = index_.find(hash);
    if (it == index_.end() || it->second.p.parent != parent ||
        !std::equal(tokens.begin(), tokens.end(), it->second.p.tokens.begin(),
                    it->second.p.tokens.end()))
        return nullptr;
    return &it->second.p;
}

const KvPool::Prefix* KvPool::best_child(uint64_t parent, std::span<const int32_t> want,
                                         int& common) const {
    const Prefix* best = nullptr;
    common = 0;
    const auto [b, e] = children_.equal_range(parent);
    for (auto it = b; it != e; ++it) {
        const Prefix& p = index_.at(it->second).p;
        const auto n = static_cast<int>(
            std::mismatch(want.begin(), want.end(), p.tokens.begin(), p.tokens.end()).first -
            want.begin());
        if (n > common) best = &p, common = n;
    }
    return best;
}

bool KvPool::publish(uint64_t hash, Prefix p) {
    if (index_.count(hash)) return false;
    for (int k = 0; k < kKinds; k++)
        if (p.block[k] >= 0 && indexed(k, p.block[k])) return false;
    for (int k = 0; k < kKinds; k++)
        if (p.block[k] >= 0) {
            indexed_[k][p.block[k]] = 1;
            hash_of_[k][p.block[k]] = hash;
        }
    children_.emplace(p.parent, hash);
    Entry& e = index_[hash];
    e.p = std::move(p);
    if (unheld(e.p)) {
        e.lru = lru_.insert(lru_.end(), hash);
        e.in_lru = true;
    }
    return true;
}

void KvPool::forget(int kind, int32_t b) {
    if (indexed(kind, b)) drop_entry(hash_of_[kind][b]);
}

void KvPool::drop_entry(uint64_t hash) {
    const auto it = index_.find(hash);
    KV_ASSERT(it != index_.end());
    if (it->second.in_lru) lru_.erase(it->second.lru);
    const auto [cb, ce] = children_.equal_range(it->second.p.parent);
    for (auto c = cb; c != ce; ++c)
        if (c->second == hash) {
            children_.erase(c);
            break;
        }
    for (int k = 0; k < kKinds; k++) {
        const int32_t b = it->second.p.block[k];
        if (b < 0) continue;
        indexed_[k][b] = 0;
        if (refs_[k][b] == 0) free_[k].push_back(b);
    }
    index_.erase(it);
}

void KvPool::note_held() {
    size_t held = 0;
    for (int k = 0; k < kKinds; k++) held += static_cast<size_t>(held_[k]) * block_bytes_[k];
    peak_held_bytes_ = std::max(peak_held_bytes_, held);
}

// (from -1: zeroes block `to`.)
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
            uint8_t* k = k_base(li) + h * head_bytes_k(li) + to * k_span;
            uint8_t* v = v_base(li) + h * head_bytes_v(li) + to * v_span;
            if (from < 0) {
                std::memset(k, 0, k_span);
                std::memset(v, 0, v_span);
                continue;
            }
            std::memcpy(k, src.k_base(li) + h * src.head_bytes_k(li) + from * k_span, k_span);
            std::memcpy(v, src.v_base(li) + h * src.head_bytes_v(li) + from * v_span, v_span);
        }
    }
}

} // namespace kvrun
