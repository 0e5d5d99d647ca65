#include "kv_cache.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "error.h"
#include "ggml-like/cpu/ops.h"
#include "ggml-like/hadamard.h"
#include "ggml-like/kernels.h"

namespace kvrun {

bool kv_cache_type_ok(gl::Type t) {
    return gl::type_info(t).kv_cache;
}

const char* kv_cache_type_names() {
    return gl::kv_type_names();
}

int KvCacheConfig::swa_count() const {
    int n = 0;
    for (int l = 0; l < n_layer; l++) n += is_swa(l);
    return n;
}

bool KvCacheConfig::has_recurrent() const {
    return std::any_of(recurrent.begin(), recurrent.end(), [](uint8_t r) { return r != 0; });
}

size_t KvCache::state_bytes_for(const KvCacheConfig& c) {
    size_t n = 0;
    for (int l = 0; l < c.n_layer; l++)
        if (c.is_recurrent(l)) n += static_cast<size_t>(c.conv_floats + c.ssm_floats);
    return n * sizeof(float);
}

size_t KvCacheConfig::slot_bytes(int layer) const {
    if (!owns(layer)) return 0;
    const int64_t kvd = kv_dim_of(layer);
    return gl::row_size(type_k, kvd) + gl::row_size(type_v, kvd);
}

namespace {
// One slot's bytes summed over the global layers and over the window ones.
std::pair<uint64_t, uint64_t> slot_bytes_by_kind(const KvCacheConfig& c) {
    uint64_t global = 0, swa = 0;
    for (int l = 0; l < c.n_layer; l++) (c.is_swa(l) ? swa : global) += c.slot_bytes(l);
    return {global, swa};
}
} // namespace

size_t KvCache::bytes_per_token(const KvCacheConfig& c) {
    auto [global, swa] = slot_bytes_by_kind(c);
    return global + swa;
}

size_t KvCache::bytes_at_depth(const KvCacheConfig& c, int64_t depth) {
    auto [global, swa] = slot_bytes_by_kind(c);
    const int64_t swa_rows = std::min<int64_t>(depth, std::min(c.swa_window, c.n_ctx));
    return static_cast<size_t>(global * std::min<int64_t>(depth, c.n_ctx) + swa * swa_rows);
}

size_t KvCache::ring_bytes_for(const KvCacheConfig& c) {
    return bytes_at_depth(c, c.n_ctx);
}

int64_t KvCache::max_ctx_for_bytes(const KvCacheConfig& c, uint64_t bytes) {
    auto [global, swa] = slot_bytes_by_kind(c);
    if (global + swa == 0) return 0;
    // Below the window every layer grows with n_ctx; above it only the global ones.
    const int64_t below = static_cast<int64_t>(bytes / (global + swa));
    if (swa == 0 || below < c.swa_window) return below;
    if (global == 0) return int64_t{1} << 30; // the rings stop growing at the window
    return static_cast<int64_t>((bytes - swa * static_cast<uint64_t>(c.swa_window)) / global);
}

namespace {
// Throws Error where the config cannot make a cache.
void check_config(const KvCacheConfig& cfg) {
    if (cfg.n_ctx < 2) fail(Exit::usage, "context size {} is too small (at least 2)", cfg.n_ctx);
    KV_ASSERT(cfg.swa_layers.empty() ||
              (static_cast<int>(cfg.swa_layers.size()) == cfg.n_layer && cfg.swa_window >= 1));
    if (cfg.keep < 0 || cfg.keep >= cfg.n_ctx)
        fail(Exit::usage, "--keep {} must be at least 0 and smaller than the context ({})",
             cfg.keep, cfg.n_ctx);
    KV_ASSERT(cfg.n_kv_shared >= 0 && cfg.n_kv_shared + 2 <= std::max(cfg.n_layer, 2));
    for (gl::Type t : {cfg.type_k, cfg.type_v}) {
        if (!kv_cache_type_ok(t))
            fail(Exit::usage, "KV cache type {} is not supported (use {})", gl::type_name(t),
                 kv_cache_type_names());
        for (int l = 0; l < cfg.n_layer; l++)
            if (!gl::row_size_ok(t, cfg.kv_dim_of(l)))
                fail(Exit::usage,
                     "KV cache type {} needs rows that are a multiple of {} elements; this "
                     "model's are {}",
                     gl::type_name(t), gl::type_info(t).block_size, cfg.kv_dim_of(l));
    }
    for (const int rot : {cfg.k_rotate, cfg.v_rotate})
        for (int l = 0; l < cfg.n_layer; l++)
            KV_ASSERT(rot == 0 || (rot <= gl::kHadamardMaxBlock && (rot & (rot - 1)) == 0 &&
                                   cfg.head_dim_of(l) % rot == 0));
}

std::shared_ptr<KvPool> pool_for(const KvCacheConfig& cfg) {
    check_config(cfg);
    return std::make_shared<KvPool>(cfg, KvPool::ring_blocks(cfg));
}
} // namespace

KvCache::KvCache(const KvCacheConfig& cfg) : cfg_(cfg), pool_(pool_for(cfg)), own_pool_(true) {
    init_rings();
    // Every block, in order: the table is the identity and the pool's
    // layout is exactly a plain ring's.
    for (size_t ri = 0; ri < rings_.size(); ri++) {
        if (pool_->blocks(static_cast<int>(ri)) == 0) continue; // no layer of that kind owns slots
        for (int32_t& b : rings_[ri].table) b = pool_->take(static_cast<int>(ri));
        for (size_t j = 0; j < rings_[ri].table.size(); j++)
            KV_ASSERT(rings_[ri].table[j] == static_cast<int32_t>(j));
        rings_[ri].in_order = true;
    }
}

KvCache::KvCache(const KvCacheConfig& cfg, std::shared_ptr<KvPool> pool)
    : cfg_(cfg), pool_(std::move(pool)) {
    check_config(cfg);
    init_rings();
}

KvCache::~KvCache() {
    release_blocks();
}

void KvCache::init_rings() {
    const int bs = KvPool::kBlockSlots;
    auto table = [&](int slots) { return std::vector<int32_t>((slots + bs - 1) / bs, -1); };
    rings_.push_back(
        Ring{cfg_.n_ctx, cfg_.keep, std::vector<int64_t>(cfg_.n_ctx, -1), table(cfg_.n_ctx)});
    if (cfg_.swa_count() > 0) {
        const int s = std::min(cfg_.swa_window, cfg_.n_ctx);
        rings_.push_back(Ring{s, 0, std::vector<int64_t>(s, -1), table(s)});
    }
    size_t sinks = 0;
    for (int l = 0; l < cfg_.n_layer; l++) {
        sink_at_.push_back(sinks);
        if (cfg_.owns(l)) sinks += static_cast<size_t>(cfg_.keep_of(l)) * cfg_.kv_dim_of(l);
    }
    sink_k_.assign(sinks, 0.0f);
    size_t states = 0;
    for (int l = 0; l < cfg_.n_layer; l++) {
        state_at_.push_back(states);
        if (cfg_.is_recurrent(l)) states += static_cast<size_t>(cfg_.conv_floats + cfg_.ssm_floats);
    }
    state_.assign(states, 0.0f);
}

void KvCache::release_blocks() {
    for (size_t ri = 0; ri < rings_.size(); ri++) {
        // Last block first: a free list given back in this order hands the
        // next sequence its blocks in order again (take() pops the lowest).
        std::vector<int32_t>& t = rings_[ri].table;
        for (auto it = t.rbegin(); it != t.rend(); ++it)
            if (*it >= 0) pool_->release(static_cast<int>(ri), std::exchange(*it, -1));
        note_order(ri);
    }
}

void KvCache::note_order(size_t ri) {
    // In order: table entry j, where held, is block j, and the pool has a
    // block j for every entry (the attention kernels and the CUDA mirror
    // then read the ring as one stretch of slots).
    Ring& r = rings_[ri];
    bool in_order = pool_->blocks(static_cast<int>(ri)) >= static_cast<int>(r.table.size());
    for (size_t j = 0; j < r.table.size() && in_order; j++)
        in_order = r.table[j] < 0 || r.table[j] == static_cast<int32_t>(j);
    r.in_order = in_order;
}

int KvCache::held_blocks(int kind) const {
    if (kind >= static_cast<int>(rings_.size())) return 0;
    const std::vector<int32_t>& t = rings_[kind].table;
    return static_cast<int>(std::count_if(t.begin(), t.end(), [](int32_t b) { return b >= 0; }));
}

bool KvCache::own_block(size_t ri, size_t j) {
    int32_t& b = rings_[ri].table[j];
    const int kind = static_cast<int>(ri);
    // Its own: written in place, out of the index, unless it is an indexed
    // prefix and a block is spare: then copied, so the prefix stays findable
    // (a window ring wrapping over a system prompt's blocks).
    if (b >= 0 && pool_->refs(kind, b) == 1 && !(pool_->indexed(kind, b) && pool_->spare(kind))) {
        pool_->forget(kind, b); // about to change: no longer the prefix it was indexed as
        return true;
    }
    const int32_t fresh = pool_->take(kind);
    if (fresh < 0) return false;
    if (b >= 0) { // shared: copy on write
        pool_->copy_block(kind, *pool_, b, fresh);
        pool_->release(kind, b);
    }
    b = fresh;
    note_order(ri);
    return true;
}

namespace {
uint64_t mix64(uint64_t x) { // splitmix64's finalizer
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

// The chained hash after one more block of tokens.
uint64_t chain_next(uint64_t h, std::span<const int32_t> block) {
    for (const int32_t id : block) h = mix64(h ^ static_cast<uint32_t>(id));
    return h;
}
} // namespace

uint64_t KvCache::chain_seed() const {
    // Blocks are only ever shared within one pool, whose caches share a
    // config; the seed keeps chains of other configs apart all the same.
    uint64_t h = 0x6b7672756e;
    for (const int64_t v :
         {int64_t{cfg_.n_layer}, int64_t{cfg_.n_ctx}, int64_t{cfg_.keep},
          static_cast<int64_t>(cfg_.type_k), static_cast<int64_t>(cfg_.type_v),
          int64_t{cfg_.k_rotate}, int64_t{cfg_.v_rotate}, int64_t{cfg_.swa_window}})
        h = mix64(h ^ static_cast<uint64_t>(v));
    return h;
}

int64_t KvCache::unwrapped() const {
    int64_t n = cfg_.n_ctx;
    for (const Ring& r : rings_) n = std::min<int64_t>(n, r.slots);
    return n;
}

int64_t KvCache::attach_prefix(std::span<const int32_t> tokens) {
    KV_ASSERT(n_past_ == 0 && !own_pool_);
    if (!state_.empty() || tokens.empty()) return 0;
    const int bs = KvPool::kBlockSlots;
    const int64_t most = std::min<int64_t>(static_cast<int64_t>(tokens.size()) - 1, unwrapped());
    uint64_t h = chain_seed();
    int64_t j = 0;
    for (; (j + 1) * bs <= most; j++) {
        const std::span<const int32_t> t = tokens.subspan(static_cast<size_t>(j * bs), bs);
        const uint64_t next = chain_next(h, t);
        const KvPool::Prefix* p = pool_->find(next, h, t);
        if (!p) break;
        for (size_t ri = 0; ri < rings_.size(); ri++) {
            const int32_t b = p->block[ri];
            if (b < 0) continue; // no layer of that kind owns slots
            KV_ASSERT(rings_[ri].table[j] < 0);
            pool_->hold(static_cast<int>(ri), b);
            rings_[ri].table[j] = b;
        }
        if (j == 0 && !p->sinks.empty()) sink_k_ = p->sinks;
        h = next;
    }
    // Then part of the next block: a copy of an indexed block that follows
    // the same chain and begins with the same tokens (a shared system prompt
    // seldom ends on a block boundary). The copy is this cache's own: its
    // slots past the common tokens are written over as it goes on.
    int common = 0;
    const int64_t rest = std::min<int64_t>(bs, most - j * bs);
    const KvPool::Prefix* p =
        rest > 0 ? pool_->best_child(h, tokens.subspan(static_cast<size_t>(j * bs), rest), common)
                 : nullptr;
    if (p) {
        const KvPool::Prefix from = *p; // (a take() below may evict it from the index)
        for (size_t ri = 0; ri < rings_.size(); ri++) // not evicted while copied
            if (from.block[ri] >= 0) pool_->hold(static_cast<int>(ri), from.block[ri]);
        bool all = true;
        for (size_t ri = 0; ri < rings_.size() && all; ri++) {
            if (from.block[ri] < 0) continue;
            const int32_t fresh = pool_->take(static_cast<int>(ri));
            all = fresh >= 0;
            if (all) {
                pool_->copy_block(static_cast<int>(ri), *pool_, from.block[ri], fresh);
                rings_[ri].table[j] = fresh;
            }
        }
        for (size_t ri = 0; ri < rings_.size(); ri++) {
            if (from.block[ri] >= 0) pool_->release(static_cast<int>(ri), from.block[ri]);
            if (!all && rings_[ri].table[j] >= 0)
                pool_->release(static_cast<int>(ri), std::exchange(rings_[ri].table[j], -1));
        }
        if (!all) common = 0;
        if (all && j == 0 && !from.sinks.empty())
            sink_k_ = from.sinks; // those past `common`: written again
    }
    for (size_t ri = 0; ri < rings_.size(); ri++) note_order(ri);
    const int64_t n = j * bs + common;
    for (Ring& r : rings_)
        for (int64_t q = 0; q < n; q++) r.pos[r.slot_of(q)] = q;
    n_past_ = n;
    published_ = j;
    chain_ = h;
    checkpoint_.pos0 = -1;
    return n;
}

void KvCache::publish_prefix(std::span<const int32_t> tokens) {
    if (own_pool_ || !state_.empty() || n_past_ > unwrapped()) return;
    KV_ASSERT(static_cast<int64_t>(tokens.size()) >= n_past_);
    const int bs = KvPool::kBlockSlots;
    if (published_ == 0) chain_ = chain_seed();
    // Block 0 carries the sinks' copies: only once every sink is there.
    for (int64_t j = published_; (j + 1) * bs <= n_past_ && n_past_ >= cfg_.keep; j++) {
        const std::span<const int32_t> t = tokens.subspan(static_cast<size_t>(j * bs), bs);
        const uint64_t next = chain_next(chain_, t);
        KvPool::Prefix p;
        p.parent = chain_;
        p.tokens.assign(t.begin(), t.end());
        for (size_t ri = 0; ri < rings_.size(); ri++) p.block[ri] = rings_[ri].table[j];
        if (j == 0) p.sinks = sink_k_;
        pool_->publish(next, std::move(p)); // false: indexed already (another copy)
        chain_ = next;
        published_ = j + 1;
    }
}

bool KvCache::reserve(int64_t pos0, int n) {
    KV_ASSERT(pos0 == n_past_ && n >= 0);
    if (own_pool_) return true; // every block held, never shared
    const int bs = KvPool::kBlockSlots;
    for (size_t ri = 0; ri < rings_.size(); ri++) {
        if (pool_->blocks(static_cast<int>(ri)) == 0) continue; // no layer of that kind owns slots
        const Ring& r = rings_[ri];
        // Positions past the window's worth of the batch are never written (write()).
        const int64_t first = n > r.window() ? pos0 + n - r.window() : pos0;
        int last_block = -1;
        for (int64_t p = pos0; p < pos0 + n; p++) {
            if (p < first && p >= r.keep) continue;
            const int j = r.slot_of(p) / bs;
            if (j == last_block) continue;
            last_block = j;
            if (!own_block(ri, static_cast<size_t>(j))) return false;
        }
    }
    return true;
}

size_t KvCache::max_row_bytes_k() const {
    size_t m = 0;
    for (int l = 0; l < cfg_.n_layer; l++) m = std::max(m, row_bytes_k(l));
    return m;
}

size_t KvCache::max_row_bytes_v() const {
    size_t m = 0;
    for (int l = 0; l < cfg_.n_layer; l++) m = std::max(m, row_bytes_v(l));
    return m;
}

size_t KvCache::ring_bytes() const {
    return ring_bytes_for(cfg_);
}

void KvCache::attention_slots(int layer, gl::AttentionArgs& a) const {
    a.k_type = cfg_.type_k;
    a.v_type = cfg_.type_v;
    a.k_row_bytes = row_bytes_k(layer);
    a.v_row_bytes = row_bytes_v(layer);
    const Ring& r = ring(layer);
    a.n_ctx = r.slots;
    a.k_slots = k_slots(layer);
    a.v_slots = v_slots(layer);
    a.pool_slots = pool_slots(layer);
    a.block_slots = KvPool::kBlockSlots;
    a.slot_block = r.in_order ? nullptr : r.table.data();
    // 0 = rows (see gl::AttentionArgs)
    a.k_head_bytes = head_bytes_k(layer);
    a.v_slot_bytes = head_major() ? slot_bytes_v(layer) : 0;
    a.v_head_bytes = head_bytes_v(layer);
    a.slot_pos = r.pos.data();
    a.n_sink = r.keep;
    a.window = r.window();
    a.sink_k = r.keep > 0 ? sink_k(layer) : nullptr;
}

size_t KvCache::sink_bytes() const {
    return sink_k_.size() * sizeof(float);
}

namespace {
void copy_bytes(void* dst, const void* src, size_t bytes) {
    std::memcpy(dst, src, bytes);
}
} // namespace

void KvCache::write(int layer, int64_t pos0, int n, const void* k_rows, const void* v_rows) {
    write(layer, pos0, n, k_rows, v_rows, copy_bytes);
}

void KvCache::write(int layer, int64_t pos0, int n, const void* k_rows, const void* v_rows,
                    const RowCopy& copy) {
    KV_ASSERT(layer >= 0 && layer < cfg_.n_layer && pos0 == n_past_);
    // When the batch is longer than the window only its newest tokens survive;
    // skip the ones that would be overwritten within the same batch.
    const Ring& r = ring(layer);
    const int first =
        n > r.window() ? static_cast<int>(n - r.window()) : 0; // sinks are never skipped (below)
    for (int i = 0; i < n; i++) {
        const int64_t p = pos0 + i;
        if (i < first && p >= r.keep) continue;
        const int s = r.slot_of(p);
        put_row(layer, s, static_cast<const uint8_t*>(k_rows) + i * row_bytes_k(layer),
                static_cast<const uint8_t*>(v_rows) + i * row_bytes_v(layer), copy);
    }
}

void KvCache::write_row(int layer, int64_t pos, const void* k_row, const void* v_row) {
    KV_ASSERT(layer >= 0 && layer < cfg_.n_layer && pos >= n_past_);
    put_row(layer, slot_of(layer, pos), static_cast<const uint8_t*>(k_row),
            static_cast<const uint8_t*>(v_row), copy_bytes);
}

void KvCache::set_head_major(bool on) {
    on = on && gl::type_info(cfg_.type_k).block_size == 1 &&
         gl::type_info(cfg_.type_v).block_size == 1;
    if (on == head_major()) return;
    // A shared pool's layout is every sequence's: it may change only while
    // this cache is all it holds (Forward sets it on fresh caches).
    for (int k = 0; k < KvPool::kKinds; k++) KV_ASSERT(pool_->held_blocks(k) == held_blocks(k));
    if (n_past_ == 0) { // nothing cached to move
        pool_->set_head_major(on);
        return;
    }
    KV_ASSERT(own_pool_); // moves every slot: a lone cache's
    // Each layer out as rows in the old layout, back in the new one.
    std::vector<uint8_t> k(cfg_.n_ctx * max_row_bytes_k()), v(cfg_.n_ctx * max_row_bytes_v());
    for (int l = 0; l < cfg_.n_layer; l++) {
        if (!cfg_.owns(l)) continue;
        pool_->set_head_major(!on);
        read_rows(l, slots(l), k.data(), v.data());
        pool_->set_head_major(on);
        restore_rows(l, slots(l), k.data(), v.data());
    }
}

void KvCache::put_row(int layer, int s, const uint8_t* kr, const uint8_t* vr, const RowCopy& copy) {
    put_row_with(layer, s, kr, vr, copy);
}

template <class Copy>
void KvCache::put_row_with(int layer, int s, const uint8_t* kr, const uint8_t* vr, Copy&& copy) {
    const Ring& r = ring(layer);
    KV_ASSERT(pool_->refs(KvPool::kind_of(cfg_, layer), r.table[s / KvPool::kBlockSlots]) == 1);
    pool_->put_row(cfg_.source(layer), pool_slot(layer, s), kr, vr, std::forward<Copy>(copy));
}

void KvCache::get_row(int layer, int s, uint8_t* ko, uint8_t* vo) const {
    pool_->get_row(cfg_.source(layer), pool_slot(layer, s), ko, vo);
}

void KvCache::read_rows(int layer, int n, void* k_rows, void* v_rows) const {
    KV_ASSERT(layer >= 0 && layer < cfg_.n_layer && n >= 0 && n <= slots(layer));
    auto* ko = static_cast<uint8_t*>(k_rows);
    auto* vo = static_cast<uint8_t*>(v_rows);
    // n may be 0 with null buffers (an empty save): no row, no memcpy.
    const size_t rk = row_bytes_k(layer), rv = row_bytes_v(layer);
    for (int s = 0; s < n; s++) get_row(layer, s, ko + s * rk, vo + s * rv);
}

void KvCache::restore_rows(int layer, int n, const void* k_rows, const void* v_rows) {
    KV_ASSERT(layer >= 0 && layer < cfg_.n_layer && n >= 0 && n <= slots(layer));
    const size_t rk = row_bytes_k(layer), rv = row_bytes_v(layer);
    for (int s = 0; s < n; s++)
        put_row(layer, s, static_cast<const uint8_t*>(k_rows) + s * rk,
                static_cast<const uint8_t*>(v_rows) + s * rv, copy_bytes);
}

void KvCache::restore_positions(int64_t n) {
    KV_ASSERT(n_past_ == 0 && n >= 0);
    for (Ring& r : rings_) {
        std::fill(r.pos.begin(), r.pos.end(), -1);
        for (int64_t p = 0; p < n; p++)
            if (p < r.keep || p >= n - r.window()) r.pos[r.slot_of(p)] = p;
    }
    n_past_ = n;
}

void KvCache::commit(int64_t pos0, int n) {
    KV_ASSERT(pos0 == n_past_);
    for (Ring& r : rings_)
        for (int i = 0; i < n; i++) r.pos[r.slot_of(pos0 + i)] = pos0 + i;
    n_past_ = pos0 + n;
}

void KvCache::clear() {
    checkpoint_.pos0 = -1;
    published_ = 0;
    if (!own_pool_) release_blocks();
    std::fill(state_.begin(), state_.end(), 0.0f);
    for (Ring& r : rings_) std::fill(r.pos.begin(), r.pos.end(), -1);
    n_past_ = 0;
}

bool KvCache::truncate(int64_t n) {
    if (n >= n_past_) return n == n_past_;
    if (!state_.empty()) return false; // a recurrent state holds every position it saw
    return truncate_rings(n);
}

bool KvCache::truncate_with_states(int64_t n, std::span<const float> states) {
    KV_ASSERT(states.size() == state_.size());
    if (n > n_past_ || (n < n_past_ && !truncate_rings(n))) return false;
    std::copy(states.begin(), states.end(), state_.begin());
    checkpoint_.pos0 = -1;
    published_ = 0; // rehashed from the start when next published
    return true;
}

bool KvCache::rings_hold(int64_t n) const {
    // A query at n attends the sinks and positions lowest_seen(n) .. n - 1:
    // each must still be in its slot (a wrapped ring has overwritten the
    // oldest of them with later tokens).
    for (const Ring& r : rings_)
        for (int64_t p = std::max<int64_t>(r.keep, r.lowest_seen(n)); p < n; p++)
            if (r.pos[r.slot_of(p)] != p) return false;
    return true;
}

bool KvCache::truncate_rings(int64_t n) {
    if (!rings_hold(n)) return false;
    checkpoint_.pos0 = -1;
    published_ = 0; // rehashed from the start when next published
    for (Ring& r : rings_)
        for (int64_t& p : r.pos)
            if (p >= n) p = -1;
    n_past_ = n;
    return true;
}

bool KvCache::drop(int64_t from, int64_t to, const Model& m) {
    KV_ASSERT(from >= 0 && from <= to && to <= n_past_);
    const int64_t d = to - from, n = n_past_ - d;
    if (d == 0) return true;
    KV_ASSERT(own_pool_);               // moves rows in place: a lone cache's, never shared blocks
    if (from < cfg_.keep) return false; // the sinks' copies are fixed by position
    if (!state_.empty()) return false;  // nor can a recurrent state forget a span
    checkpoint_.pos0 = -1;
    published_ = 0; // rehashed from the start when next published
    // After the drop a ring holds what a run of n tokens leaves in it
    // (restore_positions' rule); each of those must be in the ring now.
    auto held_after = [n](const Ring& r, int64_t p) { return p < r.keep || p >= n - r.window(); };
    for (const Ring& r : rings_)
        for (int64_t p = 0; p < n; p++) {
            if (!held_after(r, p)) continue;
            const int64_t old = held_before_drop(p, from, d);
            if (r.pos[r.slot_of(old)] != old) return false;
        }
    // Per layer: the moved rows out (every one, before any slot is written:
    // in a wrapped ring a destination can be another row's source), their
    // keys rotated, then in at their new slots.
    std::vector<uint8_t> ks, vs;
    std::vector<float> f, cs, sn;
    for (int l = 0; l < cfg_.n_layer; l++) {
        if (!cfg_.owns(l)) continue;
        const Ring& r = ring(l);
        const int64_t lo = std::max(from, std::max<int64_t>(r.keep, n - r.window()));
        const int64_t count = std::max<int64_t>(0, n - lo);
        const int kvd = kv_dim(l);
        const size_t rk = row_bytes_k(l), rv = row_bytes_v(l);
        ks.resize(count * rk);
        vs.resize(count * rv);
        f.resize(kvd);
        // Rotation only, without LongRoPE's attn_factor: the stored keys carry it already.
        const Rope rope = m.layer_rope(l, cfg_.n_ctx);
        const int half = rope.dims / 2;
        cs.resize(half);
        sn.resize(half);
        gl::ops::rope_angles(-static_cast<double>(d), half, rope.inv_freq, cs.data(), sn.data());
        for (int64_t i = 0; i < count; i++) {
            uint8_t* kr = ks.data() + i * rk;
            get_row(l, r.slot_of(lo + i + d), kr, vs.data() + i * rv);
            gl::cpu::dequantize_row(cfg_.type_k, kr, f.data(), kvd);
            rope_stored(l, f.data(), rope, cs.data(), sn.data());
            gl::cpu::quantize_row(cfg_.type_k, f.data(), kr, kvd);
        }
        for (int64_t i = 0; i < count; i++)
            put_row_with(
                l, r.slot_of(lo + i), ks.data() + i * rk, vs.data() + i * rv,
                [](void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); });
    }
    for (Ring& r : rings_) {
        std::fill(r.pos.begin(), r.pos.end(), -1);
        for (int64_t p = 0; p < n; p++)
            if (held_after(r, p)) r.pos[r.slot_of(p)] = p;
    }
    n_past_ = n;
    return true;
}

void KvCache::store_sinks(int layer, int64_t pos0, int n, const float* k_unrot, const Rope& rope) {
    const int kvd = kv_dim(layer), half = rope.dims / 2;
    std::vector<float> cs(half), sn(half);
    KV_ASSERT(!cfg_.is_swa(layer) && cfg_.owns(layer));
    for (int i = 0; i < n && pos0 + i < cfg_.keep; i++) {
        const int64_t j = pos0 + i;
        float* dst = sink_k(layer) + j * kvd;
        std::memcpy(dst, k_unrot + static_cast<size_t>(i) * kvd, sizeof(float) * kvd);
        gl::ops::rope_angles(-static_cast<double>(cfg_.n_ctx - 1 - j), half, rope.inv_freq,
                             cs.data(), sn.data());
        if (rope.attn_factor != 1.0) { // the query they meet is unrotated: both factors here
            const float f2 = static_cast<float>(rope.attn_factor * rope.attn_factor);
            for (int p = 0; p < half; p++) {
                cs[p] *= f2;
                sn[p] *= f2;
            }
        }
        gl::ops::rope(dst, cfg_.n_head_kv, cfg_.head_dim_of(layer), rope.dims, cs.data(), sn.data(),
                      rope.neox);
        if (cfg_.k_rotate > 0) gl::hadamard_rows(dst, 1, kvd, cfg_.k_rotate);
    }
}

void KvCache::reseat_sinks(int layer, int64_t n_ctx_then, const Rope& rope) {
    const int half = rope.dims / 2;
    std::vector<float> cs(half), sn(half);
    // Stored rotated by -(n_ctx_then - 1 - j); wanted -(n_ctx - 1 - j).
    gl::ops::rope_angles(static_cast<double>(n_ctx_then - cfg_.n_ctx), half, rope.inv_freq,
                         cs.data(), sn.data());
    float* dst = sink_k(layer);
    for (int j = 0; j < cfg_.keep; j++)
        rope_stored(layer, dst + static_cast<size_t>(j) * kv_dim(layer), rope, cs.data(),
                    sn.data());
}

void KvCache::rope_stored(int layer, float* k, const Rope& rope, const float* cs,
                          const float* sn) const {
    // Out of the Hadamard basis, RoPE, back in.
    const int kvd = kv_dim(layer);
    if (cfg_.k_rotate > 0) gl::hadamard_rows_inverse(k, 1, kvd, cfg_.k_rotate);
    gl::ops::rope(k, cfg_.n_head_kv, cfg_.head_dim_of(layer), rope.dims, cs, sn, rope.neox);
    if (cfg_.k_rotate > 0) gl::hadamard_rows(k, 1, kvd, cfg_.k_rotate);
}

} // namespace kvrun
