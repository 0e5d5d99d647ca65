// KvCache::checkpoint and rollback: taking back the tokens of a speculative
// verification batch (src/engine/speculative.h) without losing what they overwrote.
#include <algorithm>
#include <cstring>

#include "error.h"
#include "kv_cache.h"

namespace kvrun {

void KvCache::checkpoint(int64_t pos0, int n) {
    KV_ASSERT(pos0 == n_past_ && n >= 0 && own_pool_); // a lone cache's (speculative decoding)
    // Two positions of the batch in one slot would save the slot twice and
    // restore the older copy last: a batch must fit every ring's window.
    for (const Ring& r : rings_) KV_ASSERT(n <= r.window() || pos0 + n <= r.slots);
    Checkpoint& c = checkpoint_;
    c.pos0 = pos0;
    c.n = n;
    c.state = state_; // the recurrent states at pos0 (none: empty)
    c.held.resize(rings_.size() * static_cast<size_t>(n));
    bool any_held = false;
    for (size_t ri = 0; ri < rings_.size(); ri++)
        for (int i = 0; i < n; i++) {
            const int64_t held = rings_[ri].pos[rings_[ri].slot_of(pos0 + i)];
            c.held[ri * n + i] = held;
            any_held = any_held || held >= 0;
        }
    // Before the ring wraps the slots are empty: their positions say so, and
    // their bytes are never read.
    if (!any_held) return;
    size_t bytes = 0; // n K rows then n V rows of each layer that owns slots
    for (int l = 0; l < cfg_.n_layer; l++)
        if (cfg_.owns(l)) bytes += static_cast<size_t>(n) * (row_bytes_k(l) + row_bytes_v(l));
    c.rows.resize(bytes); // grows to the largest batch once
    uint8_t* k = c.rows.data();
    for (int l = 0; l < cfg_.n_layer; l++) {
        if (!cfg_.owns(l)) continue;
        const size_t rk = row_bytes_k(l), rv = row_bytes_v(l);
        uint8_t* v = k + static_cast<size_t>(n) * rk;
        for (int i = 0; i < n; i++) get_row(l, slot_of(l, pos0 + i), k + i * rk, v + i * rv);
        k = v + static_cast<size_t>(n) * rv;
    }
}

void KvCache::save_slots(int layer, int64_t pos0, int n, std::vector<uint8_t>& out) const {
    const size_t rk = row_bytes_k(layer), rv = row_bytes_v(layer);
    out.resize(static_cast<size_t>(n) * (rk + rv));
    for (int i = 0; i < n; i++)
        get_row(layer, slot_of(layer, pos0 + i), out.data() + i * (rk + rv),
                out.data() + i * (rk + rv) + rk);
}

void KvCache::restore_slots(int layer, int64_t pos0, int n, const std::vector<uint8_t>& in) {
    const size_t rk = row_bytes_k(layer), rv = row_bytes_v(layer);
    KV_ASSERT(in.size() == static_cast<size_t>(n) * (rk + rv));
    const RowCopy copy = [](void* dst, const void* src, size_t bytes) {
        std::memcpy(dst, src, bytes);
    };
    // Two positions of the batch in one slot saved the same bytes twice.
    for (int i = 0; i < n; i++)
        put_row(layer, slot_of(layer, pos0 + i), in.data() + i * (rk + rv),
                in.data() + i * (rk + rv) + rk, copy);
}

void KvCache::rollback(int64_t m) {
    Checkpoint& c = checkpoint_;
    KV_ASSERT(can_rollback(m));
    if (m == n_past_) return;
    if (!state_.empty()) state_ = c.state; // at pos0: the caller replays pos0 .. m - 1
    const int n = c.n;
    bool any_held = false;
    for (size_t ri = 0; ri < rings_.size(); ri++) {
        Ring& r = rings_[ri];
        for (int64_t p = m; p < n_past_; p++) {
            const int64_t held = c.held[ri * n + (p - c.pos0)];
            r.pos[r.slot_of(p)] = held;
            any_held = any_held || held >= 0;
        }
    }
    if (any_held) {
        const RowCopy copy = [](void* dst, const void* src, size_t bytes) {
            std::memcpy(dst, src, bytes);
        };
        const uint8_t* k = c.rows.data();
        for (int l = 0; l < cfg_.n_layer; l++) {
            if (!cfg_.owns(l)) continue;
            const size_t rk = row_bytes_k(l), rv = row_bytes_v(l);
            const uint8_t* v = k + static_cast<size_t>(n) * rk;
            for (int64_t p = m; p < n_past_; p++) {
                const size_t i = static_cast<size_t>(p - c.pos0);
                put_row(l, slot_of(l, p), k + i * rk, v + i * rv, copy);
            }
            k = v + static_cast<size_t>(n) * rv;
        }
    }
    n_past_ = m;
    published_ = 0;
}

} // namespace kvrun
