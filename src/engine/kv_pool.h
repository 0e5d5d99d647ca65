// The KV cache's memory: for each kind of layer (global; sliding-window), a
// fixed number of blocks of kBlockSlots slots, allocated once and never
// grown. A sequence's cache (KvCache) is a table of blocks over a pool: slot
// s of its ring lives in pool slot table[s / kBlockSlots] * kBlockSlots +
// s % kBlockSlots. A lone cache owns a pool of exactly its rings' blocks, in
// order (the table is the identity and the layout is the plain ring's); the
// sequences of `kvrun batch` share one pool, and a block of a prompt prefix
// that several hold is stored once (reference counts here; which prefix a
// block holds is KvCache's and the prefix index's business).
//
// Within a kind every layer that owns slots has its own K and V areas of
// pool_slots(kind) slots, laid out as a plain ring of that many slots would
// be (rows, or head-major: see KvCache::set_head_major), so a block of one
// layer is a contiguous stretch of each area (per KV head when head-major)
// and the attention kernels keep their inner loops (gl::AttentionArgs).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <list>
#include <span>
#include <unordered_map>
#include <vector>

#include "ggml-like/kv_layout.h"
#include "system_memory.h"

namespace kvrun {

struct KvCacheConfig;

class KvPool {
  public:
    // A multiple of gl::kKeyTile, so a block is whole key tiles.
    static constexpr int kBlockSlots = 32;
    // Kinds of layer: 0 global, 1 sliding-window.
    static constexpr int kKinds = 2;
    using Blocks = std::array<int, kKinds>;

    // `blocks[k]` blocks of kind k (unused where no layer is of that kind).
    // Throws Error (out of memory) when the bytes cannot be had.
    KvPool(const KvCacheConfig& cfg, Blocks blocks);
    KvPool(const KvPool&) = delete;
    KvPool& operator=(const KvPool&) = delete;

    // The blocks that hold one sequence's rings whole, and those its first
    // `tokens` positions take (a ring never more than whole).
    static Blocks ring_blocks(const KvCacheConfig& cfg);
    static Blocks blocks_for_tokens(const KvCacheConfig& cfg, int64_t tokens);
    // Bytes of one block of a kind: K and V of its slots in every layer of
    // that kind that owns slots.
    static size_t block_bytes_for(const KvCacheConfig& cfg, int kind);

    static int kind_of(const KvCacheConfig& cfg, int layer);
    int blocks(int kind) const { return blocks_[kind]; }
    int pool_slots(int kind) const { return blocks_[kind] * kBlockSlots; }
    size_t block_bytes(int kind) const { return block_bytes_[kind]; }
    size_t bytes() const { return bytes_; }

    // ---- layout (per layer that owns slots; a sharing layer reads its source's) ----
    bool head_major() const { return head_major_; }
    // Only while no block holds anything that matters: KvCache moves its
    // rows across (set_head_major) when its own pool holds some.
    void set_head_major(bool on) { head_major_ = on; }
    size_t row_bytes_k(int layer) const { return row_k_[layer]; }
    size_t row_bytes_v(int layer) const { return row_v_[layer]; }
    uint8_t* k_base(int layer) const { return mem_.get() + layer_at_[layer]; }
    uint8_t* v_base(int layer) const { return k_base(layer) + k_bytes_[layer]; }
    int layer_slots(int layer) const { return pool_slots(layer_kind_[layer]); }
    size_t slot_bytes_v(int layer) const;
    size_t head_bytes_k(int layer) const;
    size_t head_bytes_v(int layer) const;
    // One pool slot's K and V as rows, in and out (either layout); `copy`
    // writes bytes (a backend's copy may complete later: keys go element by
    // element, never through a staged row).
    template <class Copy>
    void put_row(int layer, int64_t ps, const uint8_t* k_row, const uint8_t* v_row,
                 Copy&& copy) const;
    void get_row(int layer, int64_t ps, uint8_t* k_row, uint8_t* v_row) const;

    // ---- blocks ----
    // A free block of `kind`, held once; -1 when none is free and no cached
    // prefix block is left to evict (the least recently used goes first).
    int32_t take(int kind);
    void hold(int kind, int32_t b);
    // One hold less. At none the block is free again, or, if it holds a
    // cached prefix (below), stays findable until its memory is needed.
    void release(int kind, int32_t b);
    int refs(int kind, int32_t b) const { return refs_[kind][b]; }
    // Blocks some sequence holds, and blocks take() can still give.
    int held_blocks(int kind) const { return held_[kind]; }
    int free_blocks(int kind) const { return blocks_[kind] - held_[kind]; }
    // The most bytes of blocks sequences held at once since the pool was made.
    size_t peak_held_bytes() const { return peak_held_bytes_; }

    // ---- the prefix index ----
    // A full block of a prompt prefix, found by a hash chained over every
    // token up to its end (KvCache computes it; its seed covers the cache's
    // config) and checked against its own tokens and its parent's hash, so
    // a collision can only serve a wrong block if two 64-bit chains collide
    // with the same last tokens. One block per kind (-1 where the pool has
    // no layer of that kind) holds the positions; the first block of a chain
    // also keeps the sinks' pre-rotated copies (KvCache::sink_k).
    struct Prefix {
        uint64_t parent = 0;
        std::vector<int32_t> tokens; // kBlockSlots
        std::array<int32_t, kKinds> block{-1, -1};
        std::vector<float> sinks;
    };
    // The entry for `hash` whose tokens and parent match, or null.
    const Prefix* find(uint64_t hash, uint64_t parent, std::span<const int32_t> tokens) const;
    // Of the entries that follow `parent`, the one whose tokens begin with
    // the longest run of `want` (its length in `common`); null for none.
    const Prefix* best_child(uint64_t parent, std::span<const int32_t> want, int& common) const;
    // Index blocks held by the caller under `hash` (false, nothing done,
    // where the hash is indexed already or a block is indexed under another).
    bool publish(uint64_t hash, Prefix p);
    // Take a block out of the index (its holder is about to write it).
    void forget(int kind, int32_t b);
    bool indexed(int kind, int32_t b) const { return indexed_[kind][b] != 0; }
    // Whether take() would give a block without evicting an indexed one.
    bool spare(int kind) const { return !free_[kind].empty(); }
    size_t prefixes() const { return index_.size(); }
    // Every layer's K and V of block `from` of `src` (a pool of the same
    // config and layout; this one for a copy on write) into block `to`;
    // `from` -1: zeroes it.
    void copy_block(int kind, const KvPool& src, int32_t from, int32_t to);

  private:
    Blocks blocks_{};
    std::array<size_t, kKinds> block_bytes_{};
    int n_head_kv_ = 0, elem_k_ = 0;
    bool head_major_ = false;
    std::vector<int> layer_kind_, head_dim_;
    std::vector<size_t> row_k_, row_v_, layer_at_, k_bytes_;
    HugeBytes mem_;
    size_t bytes_ = 0;
    std::array<std::vector<int32_t>, kKinds> free_; // taken from the back: lowest first
    std::array<std::vector<int32_t>, kKinds> refs_;
    std::array<int, kKinds> held_{};
    size_t peak_held_bytes_ = 0;
    void note_held();
    // The index: entries by hash; for each block, the hash it is indexed
    // under (indexed_: whether it is); entries none of whose blocks is held,
    // least recently used first.
    struct Entry {
        Prefix p;
        bool in_lru = false;
        std::list<uint64_t>::iterator lru;
    };
    std::unordered_map<uint64_t, Entry> index_;
    std::unordered_multimap<uint64_t, uint64_t> children_; // parent hash -> entry hash
    std::array<std::vector<uint64_t>, kKinds> hash_of_;
    std::array<std::vector<uint8_t>, kKinds> indexed_;
    std::list<uint64_t> lru_;
    bool unheld(const Prefix& p) const;
    void drop_entry(uint64_t hash); // its blocks that nobody holds become free
};

template <class Copy>
void KvPool::put_row(int layer, int64_t ps, const uint8_t* kr, const uint8_t* vr,
                     Copy&& copy) const {
    uint8_t* kb = k_base(layer);
    uint8_t* vb = v_base(layer);
    const size_t rk = row_k_[layer], rv = row_v_[layer];
    if (!head_major_) {
        copy(kb + ps * rk, kr, rk);
        copy(vb + ps * rv, vr, rv);
        return;
    }
    const size_t hv = slot_bytes_v(layer), hbk = head_bytes_k(layer), hbv = head_bytes_v(layer);
    for (int h = 0; h < n_head_kv_; h++) copy(vb + h * hbv + ps * hv, vr + h * hv, hv);
    // Keys element by element into their tiles: a key's elements are a tile
    // width apart.
    const size_t e = static_cast<size_t>(elem_k_);
    const int hd = head_dim_[layer], n = layer_slots(layer);
    for (int h = 0; h < n_head_kv_; h++)
        for (int k = 0; k < hd; k++)
            copy(kb + h * hbk + gl::key_tile_index(ps, k, hd, n) * e,
                 kr + (static_cast<size_t>(h) * hd + k) * e, e);
}

} // namespace kvrun
