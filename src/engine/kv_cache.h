// The KV cache: per layer, one K and one V buffer of a fixed number of rows
// ("slots") of n_head_kv * head_dim elements, allocated once and never grown.
//
// Each layer's slots are a ring with a pinned prefix. Position p lives in slot
//     p                                   if p < keep   (attention sinks)
//     keep + (p - keep) mod (slots - keep) otherwise,
// so once generation passes the ring every new token overwrites the oldest
// window token and goes on forever with no pause to shift or recompute.
// Window keys are stored rotated at their absolute positions. Each sink key is
// also kept once, in F32, pre-rotated by -(n_ctx - 1 - j): dotted with an
// unrotated query it scores as if the sink sat just before the oldest window
// token, so no query-key distance ever exceeds n_ctx - 1 (see gl::AttentionArgs).
//
// Most models have one kind of layer: every ring holds n_ctx slots and `keep`
// sinks. Models with sliding-window layers (Gemma 3) have two rings: their
// global layers as above, their sliding-window layers min(window, n_ctx)
// slots and no sinks, which is exactly what such a layer can see: a ring of
// W slots attends the last W positions.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "error.h"
#include "ggml-like/attention.h"
#include "ggml-like/types.h"
#include "kv_pool.h"
#include "model.h"
#include "system_memory.h"

namespace kvrun {

struct KvCacheConfig {
    int n_layer = 0, n_head_kv = 0, head_dim = 0;
    int n_ctx = 0;
    int keep = 4;
    gl::Type type_k = gl::Type::F16, type_v = gl::Type::F16;
    // Sliding-window layers (Hparams::swa_layers): [n_layer] flags, empty
    // for none, and the window they see.
    int swa_window = 0;
    std::vector<uint8_t> swa_layers = {};
    // Rotated keys (--k-rotate): 0 for none, else the block of the orthonormal
    // Hadamard transform (gl::hadamard_rows; a power of two dividing
    // head_dim, gl::hadamard_block) applied to every key after RoPE and
    // before it is stored, and to every query (the rotated and the unrotated
    // one that meets the sinks) the same way. q·k is unchanged; a 4-bit block
    // no longer has to hold a head's outlier channels at their full size.
    int k_rotate = 0;
    // Rotated values: 0 for none, else the block every value is rotated in
    // (R, as the keys) before it is stored; attention's output, a sum of
    // rotated values, is turned back by R^-1 per head. Set with k_rotate for
    // 4-bit values, where it helps (docs/kv-cache.md, "Rotated values").
    int v_rotate = 0;
    // Gemma 4 (Hparams): window layers' head size (0: head_dim), and the last
    // n_kv_shared layers, which store nothing and read an earlier layer's slots.
    int head_dim_swa = 0;
    int n_kv_shared = 0;
    // Recurrent layers (Qwen 3.5's Gated DeltaNet, Hparams::recurrent_layers):
    // no slots; a fixed state of conv_floats + ssm_floats F32 each instead.
    std::vector<uint8_t> recurrent = {};
    int64_t conv_floats = 0, ssm_floats = 0;

    static KvCacheConfig for_model(const Hparams& hp, int n_ctx, int keep, gl::Type type_k,
                                   gl::Type type_v, int k_rotate = 0) {
        return {hp.n_layer,
                hp.n_head_kv,
                hp.head_dim,
                n_ctx,
                keep,
                type_k,
                type_v,
                hp.swa_window,
                hp.swa_layers,
                k_rotate,
                values_rotated_with(type_v, k_rotate),
                hp.head_dim_swa,
                hp.n_kv_shared,
                hp.recurrent_layers,
                hp.recurrent_layers.empty() ? 0 : hp.conv_state_floats(),
                hp.recurrent_layers.empty() ? 0 : hp.ssm_state_floats()};
    }
    // The v_rotate that goes with rotated keys: the keys' block for a 4-bit V.
    static int values_rotated_with(gl::Type type_v, int k_rotate) {
        return type_v == gl::Type::Q4_0 ? k_rotate : 0;
    }
    bool is_swa(int layer) const { return !swa_layers.empty() && swa_layers[layer] != 0; }
    int swa_count() const;
    int head_dim_of(int layer) const {
        return is_swa(layer) && head_dim_swa ? head_dim_swa : head_dim;
    }
    int kv_dim_of(int layer) const { return n_head_kv * head_dim_of(layer); }
    // The layer whose slots `layer` reads (itself unless it shares, Hparams::kv_source).
    int source(int layer) const {
        return Hparams::shared_kv_source(layer, n_layer, n_kv_shared, is_swa(layer));
    }
    bool is_recurrent(int layer) const { return !recurrent.empty() && recurrent[layer] != 0; }
    bool has_recurrent() const;
    bool owns(int layer) const { return source(layer) == layer && !is_recurrent(layer); }
    // K + V bytes of one slot of a layer that owns its slots.
    size_t slot_bytes(int layer) const;
    // A layer's ring: its slots and sinks.
    int slots(int layer) const { return is_swa(layer) ? std::min(swa_window, n_ctx) : n_ctx; }
    int keep_of(int layer) const { return is_swa(layer) ? 0 : keep; }
};

// Element types a cache can hold (blocks run along each row of kv_dim): the
// type table's GL_KV_TYPES, and their names ("f32, f16, ...") for messages.
bool kv_cache_type_ok(gl::Type t);
const char* kv_cache_type_names();

class KvCache {
  public:
    // A lone cache: a pool of its own holding its rings whole, every block
    // taken in order. Throws Error on an invalid config.
    explicit KvCache(const KvCacheConfig& cfg);
    // A sequence over a shared pool (made for the same config): it holds no
    // block until reserve() takes them.
    KvCache(const KvCacheConfig& cfg, std::shared_ptr<KvPool> pool);
    KvCache(const KvCache&) = delete;
    KvCache& operator=(const KvCache&) = delete;
    ~KvCache();
    KvPool& pool() const { return *pool_; }
    // Before positions pos0 .. pos0 + n - 1 are written (n_past() == pos0):
    // hold a block for every slot they map to, and copy first any block
    // another sequence also holds (copy on write). False when the pool has
    // no free block left (the blocks taken so far stay held).
    bool reserve(int64_t pos0, int n);
    // The blocks this cache holds, per kind.
    int held_blocks(int kind) const;

    // Shared prefixes (a cache over a shared pool; KvPool's prefix index).
    // attach_prefix, on an empty cache: hold the indexed blocks of the
    // longest run of whole blocks that begins `tokens`, at most all but its
    // last token (whose logits start an answer) and within every ring
    // before it wraps; the cache then holds those positions. Returns how
    // many (a multiple of kBlockSlots; 0 with recurrent layers, whose
    // states are not in blocks). publish_prefix: index this cache's whole
    // blocks of positions [0, n_past()) not indexed yet, while no ring has
    // wrapped; `tokens` holds (at least) the tokens at those positions.
    int64_t attach_prefix(std::span<const int32_t> tokens);
    void publish_prefix(std::span<const int32_t> tokens);
    const KvCacheConfig& config() const { return cfg_; }
    // The context: the global layers' ring (every layer's, for most models).
    int n_ctx() const { return cfg_.n_ctx; }
    int keep() const { return cfg_.keep; }
    int64_t window() const { return cfg_.n_ctx - cfg_.keep; }
    // A layer's row: n_head_kv heads of its head size.
    int kv_dim(int layer) const { return cfg_.kv_dim_of(layer); }
    int slots(int layer) const { return cfg_.slots(layer); }
    // The smallest ring's window (its slots past the sinks).
    int64_t min_window() const {
        int64_t w = rings_.front().window();
        for (const Ring& r : rings_) w = std::min(w, r.window());
        return w;
    }

    // Tokens evaluated so far; the next token goes at this position.
    int64_t n_past() const { return n_past_; }
    int slot_of(int layer, int64_t pos) const { return ring(layer).slot_of(pos); }

    // Exactly the sum over layers that own slots of their slots × their K and
    // V row bytes (2 × n_layer × n_ctx × kv_dim × element bytes when every
    // layer is global and alike).
    size_t ring_bytes() const;
    // The sinks' pre-rotated F32 copies.
    size_t sink_bytes() const;
    // The one KV-bytes formula: every figure kvrun prints (info, the memory
    // plan, bench, the stats line) comes from these.
    static size_t ring_bytes_for(const KvCacheConfig& cfg);
    // The bytes of the slots a token at `depth` reads: per layer,
    // min(depth, slots) rows (ring_bytes_for at depth n_ctx).
    static size_t bytes_at_depth(const KvCacheConfig& cfg, int64_t depth);
    // The K and V row bytes of every layer that owns slots (n_ctx not counted).
    static size_t bytes_per_token(const KvCacheConfig& cfg);
    // The largest n_ctx whose rings fit in `bytes` (0 if none).
    static int64_t max_ctx_for_bytes(const KvCacheConfig& cfg, uint64_t bytes);
    // The recurrent layers' states (F32): the conv's last inputs and the
    // value heads' matrices of layer l (KvCacheConfig::recurrent), zero after
    // clear(). Positions cannot be taken back from a state: truncate() below
    // the end and drop() say no (callers evaluate again), and a speculative
    // rollback goes back only to its checkpoint.
    float* conv_state(int layer) { return state_.data() + state_at_[layer]; }
    float* ssm_state(int layer) { return conv_state(layer) + cfg_.conv_floats; }
    const float* conv_state(int layer) const { return state_.data() + state_at_[layer]; }
    const float* ssm_state(int layer) const { return conv_state(layer) + cfg_.conv_floats; }
    static size_t state_bytes_for(const KvCacheConfig& cfg);
    size_t state_bytes() const { return state_.size() * sizeof(float); }
    // Every recurrent layer's state, and truncate() with them put back as
    // they were at n (`states`: what states() held then, kept by the caller:
    // Session's snapshots). False, nothing changed, where a ring cannot.
    std::span<const float> states() const { return state_; }
    bool truncate_with_states(int64_t n, std::span<const float> states);
    size_t row_bytes_k(int layer) const { return pool_->row_bytes_k(cfg_.source(layer)); }
    size_t row_bytes_v(int layer) const { return pool_->row_bytes_v(cfg_.source(layer)); }
    // The largest rows of any layer (a batch's staging buffers).
    size_t max_row_bytes_k() const;
    size_t max_row_bytes_v() const;

    // A layer's K and V areas in the pool (pool_slots(layer) slots each).
    const void* k_slots(int layer) const { return pool_->k_base(cfg_.source(layer)); }
    const void* v_slots(int layer) const { return pool_->v_base(cfg_.source(layer)); }
    int pool_slots(int layer) const { return pool_->layer_slots(cfg_.source(layer)); }
    // Where slot s of a layer's ring is in its pool areas (its block held).
    int64_t pool_slot(int layer, int s) const {
        const Ring& r = ring(layer);
        const int32_t b = r.table[s / KvPool::kBlockSlots];
        KV_ASSERT(b >= 0);
        return int64_t{b} * KvPool::kBlockSlots + s % KvPool::kBlockSlots;
    }
    // Head-major slots instead of rows: per layer, each KV head's keys and
    // values are one contiguous stream, not a head_dim slice of every row
    // (TinyLlama shape, depth 4096: attention 8.9 instead of 11.7 ms per
    // token). Values are [kv head][slot][head_dim]; keys are [kv head] of
    // key tiles (gl::key_tile_index), which attention scores for a GQA
    // group's query heads at once without per-key sums. Only for float cache
    // types (a block may straddle heads), and only for backends that read it
    // (Forward asks; the CUDA backend mirrors rows). Switching moves any
    // cached tokens over. KV head h's tiles start at k_slots + h * head_bytes_k,
    // its values at v_slots + h * head_bytes_v, slot_bytes_v apart.
    // (In a pool the layout is the pool's: over pool_slots(layer) slots.)
    void set_head_major(bool on);
    bool head_major() const { return pool_->head_major(); }
    size_t slot_bytes_v(int layer) const { return pool_->slot_bytes_v(cfg_.source(layer)); }
    size_t head_bytes_k(int layer) const { return pool_->head_bytes_k(cfg_.source(layer)); }
    size_t head_bytes_v(int layer) const { return pool_->head_bytes_v(cfg_.source(layer)); }
    // A layer's cached slots for gl::attention: the cache fields of `a`
    // (types, row sizes, n_ctx, slots in either layout, the positions they
    // hold, the sinks); the caller fills the batch's own.
    void attention_slots(int layer, gl::AttentionArgs& a) const;
    // Copy slots [0, n) of a layer out as rows (either layout).
    void read_rows(int layer, int n, void* k_rows, void* v_rows) const;
    // The positions a layer's slots hold (-1: empty).
    const int64_t* slot_pos(int layer) const { return ring(layer).pos.data(); }
    float* sink_k(int layer) { return sink_k_.data() + sink_at_[cfg_.source(layer)]; }
    const float* sink_k(int layer) const { return sink_k_.data() + sink_at_[cfg_.source(layer)]; }

    // The sink rule. Sink j's key (j < keep) is kept once, in F32, rotated by
    // -(n_ctx - 1 - j) from its unrotated form, so that dotted with an
    // unrotated query it scores as if it sat just before the oldest window
    // token (see the top of this file). Computed in double-precision angles,
    // once per sink: nothing accumulates. With k_rotate the copy is then
    // Hadamard-rotated like every stored key (the query it meets is too).
    // store_sinks: from the unrotated keys of a batch at positions pos0 ..
    // pos0 + n - 1 (rows of kv_dim floats), those that are sinks.
    void store_sinks(int layer, int64_t pos0, int n, const float* k_unrot, const Rope& rope);
    // reseat_sinks: layer's sink copies were made for a ring of n_ctx_then
    // slots (a prompt-cache file): rotate them by the difference.
    void reseat_sinks(int layer, int64_t n_ctx_then, const Rope& rope);

    // Copy a batch's K/V rows (already in the cache types) for one layer into
    // the slots of positions pos0 .. pos0 + n - 1.
    void write(int layer, int64_t pos0, int n, const void* k_rows, const void* v_rows);
    // The same, each row copied by copy(dst, src, bytes): Forward passes its
    // backend's copy_to_host, so rows a GPU computed land without a wait.
    using RowCopy = std::function<void(void* dst, const void* src, size_t bytes)>;
    void write(int layer, int64_t pos0, int n, const void* k_rows, const void* v_rows,
               const RowCopy& copy);
    // One row of a batch not committed yet, at position pos >= n_past()
    // (Forward::eval_verify writes its tokens one at a time).
    void write_row(int layer, int64_t pos, const void* k_row, const void* v_row);
    // The rows of the slots positions pos0 .. pos0 + n - 1 map to in layer's
    // ring, out (appended to `out`), and back in: a layer sharing the ring
    // (Gemma 4) sees it as it was before the batch was written.
    void save_slots(int layer, int64_t pos0, int n, std::vector<uint8_t>& out) const;
    void restore_slots(int layer, int64_t pos0, int n, const std::vector<uint8_t>& in);
    // After all layers are written: record the positions the slots now hold.
    void commit(int64_t pos0, int n);

    // Forget everything.
    void clear();
    // Keep only the first n tokens; possible while every slot a query at
    // position n would attend still holds its position (returns false
    // otherwise, and the caller must clear).
    bool truncate(int64_t n);

    // Drop positions [from, to) and move the later ones down by d = to - from
    // without evaluating anything: each moved key is re-rotated by -d in
    // place (RoPE is a rotation: R(p - d) = R(-d) R(p)), with the layer's own
    // RoPE (its base on sliding-window layers, LongRoPE's factors), in the
    // cache's own type (quantized rows: dequantized, rotated, quantized
    // again); values move as they are. The moved tokens keep the K/V they
    // were computed with, the dropped span in view, as a context shift does.
    // Possible when from >= keep and every ring still holds each position a
    // query at the new end would attend (a sliding-window ring that wrapped
    // past the kept prefix does not); returns false otherwise, and nothing
    // changed.
    bool drop(int64_t from, int64_t to, const Model& m);

    // Speculative decoding (src/engine/speculative.h) evaluates tokens that may be
    // taken back. A batch that crosses the ring's wrap overwrites slots whose
    // keys are still in view of the positions before it, so truncate() alone
    // could not undo it: checkpoint(pos0, n), before positions pos0 .. pos0 +
    // n - 1 are written, keeps what their slots hold (rows and positions, in
    // every layer); rollback(m), for pos0 <= m <= n_past(), puts the slots of
    // positions m .. n_past() - 1 back as they were and leaves the cache
    // holding exactly the first m tokens, the ring invariant intact (no slot
    // a query at m attends was lost). One checkpoint at a time; a new one
    // replaces it, and clear(), truncate() or a drop() ends it.
    //
    // A recurrent state cannot be rewound: checkpoint() keeps the states at
    // pos0, rollback(m < n_past()) puts them back, and the caller steps them
    // through positions pos0 .. m - 1 again (Forward::replay_recurrent, from
    // the inputs it logged while the checkpoint was open); Session::take_back
    // does both.
    void checkpoint(int64_t pos0, int n);
    bool can_rollback(int64_t m) const {
        return checkpoint_.pos0 >= 0 && m >= checkpoint_.pos0 && m <= n_past_ &&
               n_past_ <= checkpoint_.pos0 + checkpoint_.n;
    }
    void rollback(int64_t m);
    int64_t checkpoint_pos0() const { return checkpoint_.pos0; }
    // Where a batch of n tokens at n_past() starts among the open
    // checkpoint's positions (-1: not all inside them).
    int64_t checkpoint_offset(int n) const {
        const Checkpoint& c = checkpoint_;
        return c.pos0 >= 0 && n_past_ >= c.pos0 && n_past_ + n <= c.pos0 + c.n ? n_past_ - c.pos0
                                                                               : -1;
    }

    // A saved state back (prompt-cache files): slots [0, n) of a layer from
    // rows, then restore_positions(n) once every layer is written: the cache
    // holds n tokens in the slots a run of n tokens leaves them in.
    void restore_rows(int layer, int n, const void* k_rows, const void* v_rows);
    void restore_positions(int64_t n);

  private:
    // The slot bookkeeping shared by the layers of one kind (ring i is pool
    // kind i).
    struct Ring {
        int slots = 0, keep = 0;
        std::vector<int64_t> pos;   // [slots], -1 = empty
        std::vector<int32_t> table; // [ceil(slots / kBlockSlots)] pool blocks, -1 = none held
        bool in_order = false;      // table[i] == i for every i (a lone cache's)
        int64_t window() const { return slots - keep; }
        int slot_of(int64_t p) const {
            return p < keep ? static_cast<int>(p) : static_cast<int>(keep + (p - keep) % window());
        }
        // The first window position a query at p attends (sinks aside).
        int64_t lowest_seen(int64_t p) const { return p >= slots ? p - window() + 1 : 0; }
    };
    const Ring& ring(int layer) const { return rings_[KvPool::kind_of(cfg_, layer)]; }

    KvCacheConfig cfg_;
    std::shared_ptr<KvPool> pool_;
    bool own_pool_ = false; // a lone cache's: every block held in order, for good
    // Blocks [0, published_) are indexed (by this cache or another);
    // chain_ is the hash at the end of the last of them.
    int64_t published_ = 0;
    uint64_t chain_ = 0;
    uint64_t chain_seed() const;
    // Positions a prefix can cover: before any ring wraps.
    int64_t unwrapped() const;
    void init_rings();
    void release_blocks();
    void note_order(size_t ri); // sets rings_[ri].in_order from its table
    // Hold a block of its own for ring ri's table entry j (a copy of the one
    // it shares, if any). False when the pool has none free.
    bool own_block(size_t ri, size_t j);
    void put_row(int layer, int slot, const uint8_t* k_row, const uint8_t* v_row,
                 const RowCopy& copy);
    // put_row with any callable (a plain memcpy inlines: head-major keys are
    // copied element by element).
    template <class Copy>
    void put_row_with(int layer, int slot, const uint8_t* k_row, const uint8_t* v_row, Copy&& copy);
    // One slot's K and V out as rows (either layout).
    void get_row(int layer, int slot, uint8_t* k_row, uint8_t* v_row) const;
    // RoPE by (cs, sn) of one stored key row of kv_dim floats (a window key
    // being moved by drop, a sink copy being reseated), through the Hadamard
    // basis when keys are rotated.
    // truncate's rings part: n < n_past_; false where a ring lost a slot.
    bool truncate_rings(int64_t n);
    bool rings_hold(int64_t n) const; // every position a query at n attends is in its slot
    void rope_stored(int layer, float* k, const Rope& rope, const float* cs, const float* sn) const;
    // The position a ring's slots should hold after a drop of d positions at
    // `from`: p itself before the span, p + d after it.
    static int64_t held_before_drop(int64_t p, int64_t from, int64_t d) {
        return p < from ? p : p + d;
    }
    // checkpoint(): positions pos0 .. pos0 + n - 1's slots as they were, per
    // layer n K rows then n V rows, and per ring the n positions they held.
    struct Checkpoint {
        int64_t pos0 = -1; // -1: none
        int n = 0;
        std::vector<uint8_t> rows;
        std::vector<int64_t> held; // [ring][n]
        std::vector<float> state;  // the recurrent states at pos0
    } checkpoint_;
    std::vector<Ring> rings_;     // [0]: global layers; [1]: sliding-window layers, if any
    std::vector<float> sink_k_;   // per global layer that owns slots: [keep][kv_dim]
    std::vector<size_t> sink_at_; // [n_layer] where a layer's sinks start in sink_k_
    std::vector<float> state_;    // the recurrent layers' states, state_at_[l] each
    std::vector<size_t> state_at_;
    int64_t n_past_ = 0;
};

} // namespace kvrun
