#include "prompt_cache.h"

#include <cstdio>
#include <algorithm>
#include <cstring>
#include <vector>

#include "error.h"
#include "file_io.h"
#include "weights_digest.h"
#include "ggml-like/cpu/ops.h"

namespace kvrun {

namespace {

constexpr char kMagic[8] = {'K', 'V', 'R', 'U', 'N', 'P', 'C', '\0'};
// 2: sliding-window rings saved slot by slot; 3: the digest covers the
// weights; 4: rotated keys with 4-bit values rotate the values too (older
// files of that kind hold unrotated values).
constexpr uint32_t kVersion = 4;

struct Header {
    char magic[8];
    uint32_t version;
    uint32_t type_k, type_v;
    uint32_t n_layer, n_head_kv, head_dim;
    uint32_t keep;
    uint32_t n_ctx;     // the context the sink copies were rotated for
    uint32_t swa_slots; // slots of a sliding-window layer's ring, 0 = none
    uint32_t k_rotate;  // KvCacheConfig::k_rotate (0: keys not rotated; before it, always 0),
                        // and v_rotate << 16
    uint64_t digest;
    uint64_t n_tokens;
};
static_assert(sizeof(Header) == 64);

// Slots a layer saved: those its ring filled by n tokens.
int64_t saved_slots(const KvCacheConfig& c, int layer, uint32_t swa_slots, uint64_t n) {
    const int64_t slots = c.is_swa(layer) ? swa_slots : c.n_ctx;
    return std::min<int64_t>(static_cast<int64_t>(n), slots);
}

uint64_t fnv1a(const uint8_t* p, size_t n, uint64_t h = 0xcbf29ce484222325ull) {
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

template <typename T> void append(std::string& out, const T* p, size_t n) {
    out.append(reinterpret_cast<const char*>(p), n * sizeof(T));
}

} // namespace

uint64_t model_digest(const GgufFile& f) {
    // The header region pins metadata, tensor names, shapes, types and
    // offsets; the weights digest (remembered per file identity, see
    // weights_digest.h) tells apart files whose headers are the same.
    return (fnv1a(f.bytes(), f.data_offset()) ^ f.file_size()) * 0x9e3779b97f4a7c15ull ^
           weights_digest(f);
}

bool is_prompt_cache_head(std::string_view head) {
    return head.size() >= sizeof kMagic && std::memcmp(head.data(), kMagic, sizeof kMagic) == 0;
}

void save_prompt_cache(const std::string& path, uint64_t digest, const KvCache& kv,
                       const std::vector<int32_t>& tokens) {
    const KvCacheConfig& c = kv.config();
    const int64_t n = static_cast<int64_t>(tokens.size());
    // A prompt longer than a sliding-window model's ring slid out of it: what
    // the ring holds is no prefix a later prompt could start from.
    if (n > c.n_ctx)
        fail(Exit::error,
             "the prompt ({} tokens) is longer than the cache ({} tokens, the model's sliding "
             "window)",
             n, c.n_ctx);
    KV_ASSERT(n == kv.n_past());
    Header h{};
    std::memcpy(h.magic, kMagic, 8);
    h.version = kVersion;
    h.type_k = static_cast<uint32_t>(c.type_k);
    h.type_v = static_cast<uint32_t>(c.type_v);
    h.n_layer = c.n_layer;
    h.n_head_kv = c.n_head_kv;
    h.head_dim = c.head_dim;
    h.keep = c.keep;
    h.n_ctx = c.n_ctx;
    h.swa_slots = c.swa_count() > 0 ? std::min(c.swa_window, c.n_ctx) : 0;
    h.k_rotate = static_cast<uint32_t>(c.k_rotate) | static_cast<uint32_t>(c.v_rotate) << 16;
    h.digest = digest;
    h.n_tokens = n;
    std::string out;
    append(out, &h, 1);
    append(out, tokens.data(), tokens.size());
    std::vector<uint8_t> k_rows(n * kv.max_row_bytes_k()), v_rows(n * kv.max_row_bytes_v());
    for (int l = 0; l < c.n_layer; l++) {
        if (!c.owns(l)) continue; // its slots are another layer's (Gemma 4)
        // Slot by slot (before a ring wraps, position p is in slot p); the
        // file holds rows whatever the cache's layout.
        const int64_t rows = saved_slots(c, l, h.swa_slots, n);
        kv.read_rows(l, static_cast<int>(rows), k_rows.data(), v_rows.data());
        append(out, k_rows.data(), rows * kv.row_bytes_k(l));
        append(out, v_rows.data(), rows * kv.row_bytes_v(l));
        if (c.keep_of(l) > 0)
            append(out, kv.sink_k(l), static_cast<size_t>(c.keep_of(l)) * kv.kv_dim(l));
    }
    // The recurrent layers' states after the last token (none: nothing).
    for (int l = 0; l < c.n_layer; l++)
        if (c.is_recurrent(l))
            append(out, kv.conv_state(l), static_cast<size_t>(c.conv_floats + c.ssm_floats));
    const uint64_t sum = fnv1a(reinterpret_cast<const uint8_t*>(out.data()), out.size());
    append(out, &sum, 1);

    AtomicFile f(path, "prompt cache", is_prompt_cache_head);
    f.write(out);
    f.commit();
}

int64_t prompt_cache_tokens(const std::string& path) {
    const ReadResult file = try_read_regular_file(path, sizeof(Header), sizeof(Header));
    if (file.data.size() < sizeof(Header)) return 0;
    Header h{};
    std::memcpy(&h, file.data.data(), sizeof h);
    if (std::memcmp(h.magic, kMagic, 8) != 0 || h.version != kVersion) return 0;
    return static_cast<int64_t>(std::min<uint64_t>(h.n_tokens, INT32_MAX));
}

PromptCacheLoad load_prompt_cache(const std::string& path, uint64_t digest, KvCache& kv,
                                  const std::vector<int32_t>& prompt, const Model& model) {
    PromptCacheLoad r;
    const KvCacheConfig& c = kv.config();
    // No file for this cache can be larger than a full context's worth: a
    // bound on what is read, whatever the path names.
    uint64_t most = sizeof(Header) + static_cast<uint64_t>(c.n_ctx) * 4 + 8;
    for (int l = 0; l < c.n_layer; l++)
        if (c.owns(l))
            most += static_cast<uint64_t>(c.n_ctx) * (kv.row_bytes_k(l) + kv.row_bytes_v(l)) +
                    static_cast<uint64_t>(c.keep_of(l)) * kv.kv_dim(l) * sizeof(float);
    most += KvCache::state_bytes_for(c);
    // Too large, its header still says why (another model, more tokens).
    const ReadResult file = try_read_regular_file(path, most, sizeof(Header));
    if (!file.ok && !file.too_large) {
        r.why = file.missing ? "no such file yet" : file.why;
        return r;
    }
    const std::string& data = file.data;
    Header h{};
    if (data.size() < sizeof(Header) + (file.ok ? 8 : 0))
        return r.why = file.ok ? "too short" : file.why, r;
    std::memcpy(&h, data.data(), sizeof h);
    if (std::memcmp(h.magic, kMagic, 8) != 0) return r.why = "not a kvrun prompt cache", r;
    if (h.version != kVersion) return r.why = "format version " + std::to_string(h.version), r;
    r.saved_digest = h.digest;
    r.held = static_cast<int64_t>(std::min<uint64_t>(h.n_tokens, INT64_MAX));
    if (h.digest != digest) return r.why = "made with a different model", r;
    if (h.type_k != static_cast<uint32_t>(c.type_k) || h.type_v != static_cast<uint32_t>(c.type_v))
        return r.why = "made with other cache types", r;
    const uint32_t k_rot = h.k_rotate & 0xffff, v_rot = h.k_rotate >> 16;
    if (k_rot != static_cast<uint32_t>(c.k_rotate))
        return r.why = k_rot == 0        ? "its keys are not rotated (this run has --k-rotate)"
                       : c.k_rotate == 0 ? "its keys are rotated (--k-rotate)"
                                         : "its keys are rotated in other blocks",
               r;
    // (The same types and key blocks give the same value blocks: only a file
    // kvrun did not write differs here.)
    if (v_rot != static_cast<uint32_t>(c.v_rotate))
        return r.why = "its values are rotated otherwise", r;
    if (h.n_layer != static_cast<uint32_t>(c.n_layer) ||
        h.n_head_kv != static_cast<uint32_t>(c.n_head_kv) ||
        h.head_dim != static_cast<uint32_t>(c.head_dim))
        return r.why = "cache dimensions differ", r;
    if (h.keep != static_cast<uint32_t>(c.keep)) return r.why = "made with another --keep", r;
    if (h.n_tokens > static_cast<uint64_t>(c.n_ctx))
        return r.why = "holds " + std::to_string(h.n_tokens) + " tokens, more than this context (" +
                       std::to_string(c.n_ctx) + ")",
               r;
    if (!file.ok) return r.why = file.why, r;
    const uint64_t n = h.n_tokens;
    const uint32_t swa_slots = c.swa_count() > 0 ? std::min(c.swa_window, c.n_ctx) : 0;
    if ((h.swa_slots == 0) != (swa_slots == 0)) return r.why = "cache dimensions differ", r;
    // A sliding-window ring of another size holds other positions in its
    // slots once either has wrapped.
    if (h.swa_slots != swa_slots && n > std::min(h.swa_slots, swa_slots))
        return r.why = "made with another context size (its sliding-window rings differ)", r;
    auto sink_bytes = [&](int l) {
        return static_cast<size_t>(c.keep_of(l)) * kv.kv_dim(l) * sizeof(float);
    };
    uint64_t want = sizeof(Header) + n * 4 + 8;
    for (int l = 0; l < c.n_layer; l++)
        if (c.owns(l))
            want += saved_slots(c, l, h.swa_slots, n) * (kv.row_bytes_k(l) + kv.row_bytes_v(l)) +
                    sink_bytes(l);
    want += KvCache::state_bytes_for(c);
    if (data.size() != want)
        return r.why = "truncated or padded (size " + std::to_string(data.size()) + ")", r;
    uint64_t sum;
    std::memcpy(&sum, data.data() + data.size() - 8, 8);
    if (sum != fnv1a(reinterpret_cast<const uint8_t*>(data.data()), data.size() - 8))
        return r.why = "checksum mismatch", r;

    std::vector<int32_t> tokens(n);
    if (n > 0) std::memcpy(tokens.data(), data.data() + sizeof(Header), n * 4);
    int64_t m = 0;
    while (m < static_cast<int64_t>(n) && m < static_cast<int64_t>(prompt.size()) &&
           tokens[m] == prompt[m])
        m++;
    m = std::min<int64_t>(m, static_cast<int64_t>(prompt.size()) - 1);
    if (m <= 0) return r.why = "no common prefix with this prompt", r;

    KV_ASSERT(kv.n_past() == 0);
    const char* p = data.data() + sizeof(Header) + n * 4;
    for (int l = 0; l < c.n_layer; l++) {
        if (!c.owns(l)) continue;
        const int64_t rows = saved_slots(c, l, h.swa_slots, n);
        const char* k = p;
        const char* v = k + rows * kv.row_bytes_k(l);
        const char* s = v + rows * kv.row_bytes_v(l);
        kv.restore_rows(l, static_cast<int>(rows), k, v);
        if (c.keep_of(l) > 0) {
            std::memcpy(kv.sink_k(l), s, sink_bytes(l));
            kv.reseat_sinks(l, static_cast<int64_t>(h.n_ctx), model.layer_rope(l, kv.n_ctx()));
        }
        p = s + sink_bytes(l);
    }
    for (int l = 0; l < c.n_layer; l++)
        if (c.is_recurrent(l)) {
            const size_t floats = static_cast<size_t>(c.conv_floats + c.ssm_floats);
            std::memcpy(kv.conv_state(l), p, floats * sizeof(float));
            p += floats * sizeof(float);
        }
    kv.restore_positions(static_cast<int64_t>(n));
    if (c.has_recurrent() && m < static_cast<int64_t>(n)) {
        kv.clear();
        return r.why = fmt::format("its recurrent layers' state is that after all {} of its "
                                   "tokens, and this prompt {} at token {}",
                                   n, m + 1 == static_cast<int64_t>(prompt.size()) ? "ends" : "parts from it",
                                   m),
               r;
    }
    if (!kv.truncate(m)) {
        kv.clear();
        return r.why = fmt::format(
                   "its sliding-window layers ({} positions) moved past token {}, where this "
                   "prompt parts from it",
                   c.swa_window, m),
               r;
    }
    r.ok = true;
    r.reused = m;
    return r;
}

} // namespace kvrun
