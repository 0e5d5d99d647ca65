// How the KV cache lays out keys for the attention kernels: the cache writes
// this layout (src/engine/kv_cache.cpp), the kernels read it (cpu/attention.cpp,
// ref::dot_tile and each ISA's dot_tile).
#pragma once

#include <cstdint>

namespace gl {

// Key tiles: one attention head's n keys of head_dim elements stored kKeyTile
// keys at a time, dimension-major within a tile (the last tile holds the
// n mod kKeyTile keys left, if any). Scoring a tile against a query is then
// one 16-key vector times a broadcast query element per dimension, for
// several query heads at once, with no per-key horizontal sums; with rows,
// the sums and the widening of each key cost more than the products.
constexpr int kKeyTile = 16;
constexpr int kKeyTileHeads = 8; // most query heads one dot_tile call scores
// Keys in the tile that holds key s, of a head's n.
inline int key_tile_width(int64_t s, int64_t n) {
    const int64_t t0 = s / kKeyTile * kKeyTile;
    return static_cast<int>(n - t0 < kKeyTile ? n - t0 : kKeyTile);
}
// Index of element k of key s among the head's n * head_dim elements.
inline int64_t key_tile_index(int64_t s, int64_t k, int64_t head_dim, int64_t n) {
    const int64_t t0 = s / kKeyTile * kKeyTile;
    return t0 * head_dim + k * key_tile_width(s, n) + (s - t0);
}

} // namespace gl
