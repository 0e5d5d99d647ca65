#include "prompt_cache.h"

#include <cstdio>
#include <algorithm>
#include <cstring>
#include <fstream>
#include <iterator>
#include <vector>
#include <unistd.h>

#include "error.h"
#include "ggml-like/cpu/ops.h"

namespace kvrun {

namespace {

constexpr char kMagic[8] = {'K', 'V', 'R', 'U', 'N', 'P', 'C', '\0'};
constexpr uint32_t kVersion = 2; // 2: sliding-window rings saved slot by slot

struct Header {
    char magic[8];
    uint32_t version;
    uint32_t type_k, type_v;
    uint32_t n_layer, n_head_kv, head_dim;
    uint32_t keep;
    uint32_t n_ctx; // the context the sink copies were rotated for
    uint32_t swa_slots; // slots of a sliding-window layer's ring, 0 = none
    uint32_t reserved;
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
    // The header region alone pins metadata, tensor names, shapes, types and
    // offsets; hashing the weights themselves would cost a full read.
    return fnv1a(f.bytes(), f.data_offset()) ^ f.file_size();
}

void save_prompt_cache(const std::string& path, uint64_t digest, const KvCache& kv,
                       const std::vector<int32_t>& tokens) {
    const KvCacheConfig& c = kv.config();
    const int64_t n = static_cast<int64_t>(tokens.size());
    KV_ASSERT(n == kv.n_past() && n <= c.n_ctx);
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
    h.digest = digest;
    h.n_tokens = n;
    std::string out;
    append(out, &h, 1);
    append(out, tokens.data(), tokens.size());
    std::vector<uint8_t> k_rows(n * kv.row_bytes_k()), v_rows(n * kv.row_bytes_v());
    for (int l = 0; l < c.n_layer; l++) {
        // Slot by slot (before a ring wraps, position p is in slot p); the
        // file holds rows whatever the cache's layout.
        const int64_t rows = saved_slots(c, l, h.swa_slots, n);
        kv.read_rows(l, static_cast<int>(rows), k_rows.data(), v_rows.data());
        append(out, k_rows.data(), rows * kv.row_bytes_k());
        append(out, v_rows.data(), rows * kv.row_bytes_v());
        append(out, kv.sink_k(l), static_cast<size_t>(c.keep_of(l)) * kv.kv_dim());
    }
    const uint64_t sum = fnv1a(reinterpret_cast<const uint8_t*>(out.data()), out.size());
    append(out, &sum, 1);

    const std::string tmp = path + ".tmp." + std::to_string(::getpid());
    FILE* f = std::fopen(tmp.c_str(), "wb");
    if (!f) fail(Exit::error, "cannot write prompt cache '{}': {}", tmp, std::strerror(errno));
    const bool ok = std::fwrite(out.data(), 1, out.size(), f) == out.size();
    if (std::fclose(f) != 0 || !ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
        std::remove(tmp.c_str());
        fail(Exit::error, "cannot write prompt cache '{}': {}", path, std::strerror(errno));
    }
}

PromptCacheLoad load_prompt_cache(const std::string& path, uint64_t digest, KvCache& kv,
                                  const std::vector<int32_t>& prompt, const Model& model) {
    PromptCacheLoad r;
    std::ifstream in(path, std::ios::binary);
    if (!in) {
        r.why = "no such file yet";
        return r;
    }
    const std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const KvCacheConfig& c = kv.config();
    Header h{};
    if (data.size() < sizeof(Header) + 8) return r.why = "too short", r;
    std::memcpy(&h, data.data(), sizeof h);
    if (std::memcmp(h.magic, kMagic, 8) != 0) return r.why = "not a kvrun prompt cache", r;
    if (h.version != kVersion) return r.why = "format version " + std::to_string(h.version), r;
    if (h.digest != digest) return r.why = "made with a different model", r;
    if (h.type_k != static_cast<uint32_t>(c.type_k) || h.type_v != static_cast<uint32_t>(c.type_v))
        return r.why = "made with other cache types", r;
    if (h.n_layer != static_cast<uint32_t>(c.n_layer) || h.n_head_kv != static_cast<uint32_t>(c.n_head_kv) ||
        h.head_dim != static_cast<uint32_t>(c.head_dim))
        return r.why = "cache dimensions differ", r;
    if (h.keep != static_cast<uint32_t>(c.keep)) return r.why = "made with another --keep", r;
    if (h.n_tokens > static_cast<uint64_t>(c.n_ctx))
        return r.why = "holds " + std::to_string(h.n_tokens) + " tokens, more than this context (" +
                       std::to_string(c.n_ctx) + ")",
               r;
    const uint64_t n = h.n_tokens;
    const uint32_t swa_slots = c.swa_count() > 0 ? std::min(c.swa_window, c.n_ctx) : 0;
    if ((h.swa_slots == 0) != (swa_slots == 0)) return r.why = "cache dimensions differ", r;
    // A sliding-window ring of another size holds other positions in its
    // slots once either has wrapped.
    if (h.swa_slots != swa_slots && n > std::min(h.swa_slots, swa_slots))
        return r.why = "made with another context size (its sliding-window rings differ)", r;
    auto sink_bytes = [&](int l) { return static_cast<size_t>(c.keep_of(l)) * kv.kv_dim() * sizeof(float); };
    uint64_t want = sizeof(Header) + n * 4 + 8;
    for (int l = 0; l < c.n_layer; l++)
        want += saved_slots(c, l, h.swa_slots, n) * (kv.row_bytes_k() + kv.row_bytes_v()) + sink_bytes(l);
    if (data.size() != want) return r.why = "truncated or padded (size " + std::to_string(data.size()) + ")", r;
    uint64_t sum;
    std::memcpy(&sum, data.data() + data.size() - 8, 8);
    if (sum != fnv1a(reinterpret_cast<const uint8_t*>(data.data()), data.size() - 8)) return r.why = "checksum mismatch", r;

    std::vector<int32_t> tokens(n);
    std::memcpy(tokens.data(), data.data() + sizeof(Header), n * 4);
    int64_t m = 0;
    while (m < static_cast<int64_t>(n) && m < static_cast<int64_t>(prompt.size()) && tokens[m] == prompt[m]) m++;
    m = std::min<int64_t>(m, static_cast<int64_t>(prompt.size()) - 1);
    if (m <= 0) return r.why = "no common prefix with this prompt", r;

    KV_ASSERT(kv.n_past() == 0);
    const char* p = data.data() + sizeof(Header) + n * 4;
    for (int l = 0; l < c.n_layer; l++) {
        const int64_t rows = saved_slots(c, l, h.swa_slots, n);
        const char* k = p;
        const char* v = k + rows * kv.row_bytes_k();
        const char* s = v + rows * kv.row_bytes_v();
        kv.restore_rows(l, static_cast<int>(rows), k, v);
        if (c.keep_of(l) > 0) {
            std::memcpy(kv.sink_k(l), s, sink_bytes(l));
            kv.reseat_sinks(l, static_cast<int64_t>(h.n_ctx), model.layer_rope(l, kv.n_ctx()));
        }
        p = s + sink_bytes(l);
    }
    kv.restore_positions(static_cast<int64_t>(n));
    if (!kv.truncate(m)) {
        kv.clear();
        return r.why = fmt::format("its sliding-window layers ({} positions) moved past token {}, where this "
                                   "prompt parts from it",
                                   c.swa_window, m),
               r;
    }
    r.ok = true;
    r.reused = m;
    return r;
}

} // namespace kvrun
