// The block-chain GEMMs of the kernel tables (KernelTable::gemm; kernels.h's
// block_chain types), one set per ISA file: x86/avx512_chain.cpp,
// x86/avxvnni_chain.cpp, x86/avx2_chain.cpp, arm/neon_chain.cpp. Each file
// defines the whole set in its namespace (KVRUN_CHAIN_GEMMS lists it), and
// its table (avx512.cpp, avx2.cpp, neon.cpp) points at them.
#pragma once

#include <cstdint>

#include "ggml-like/kernels.h"

// X(name, Type, tile) for every block-chain type's GEMM; `tile` names the
// tile type each ISA file defines for it (the same names in every file).
#define KVRUN_CHAIN_GEMMS(X)                                                                   \
    X(gemm_q4_0, Q4_0, Block32<Q4>)                                                            \
    X(gemm_q4_1, Q4_1, Block32<Q41>)                                                           \
    X(gemm_q5_0, Q5_0, Block32<Q5>)                                                            \
    X(gemm_q5_1, Q5_1, Block32<Q51>)                                                           \
    X(gemm_q8_0, Q8_0, Block32<Q8>)                                                            \
    X(gemm_iq4_nl, IQ4_NL, Block32<IQ4>)                                                       \
    X(gemm_q2_K, Q2_K, SuperTile<Q2K>)                                                         \
    X(gemm_q3_K, Q3_K, SuperTile<Q3K>)                                                         \
    X(gemm_q4_K, Q4_K, SuperTile<Q4K>)                                                         \
    X(gemm_q5_K, Q5_K, SuperTile<Q5K>)                                                         \
    X(gemm_q6_K, Q6_K, SuperTile<Q6K>)

#define KVRUN_DECLARE_CHAIN_GEMM(name, type, ...) GemmFn name;
// In an ISA file's namespace: each GEMM is its gemm_panels over its tile.
#define KVRUN_DEFINE_CHAIN_GEMM(name, type, ...)                                               \
    void name(int64_t n, const void* w, size_t row_bytes, int64_t n_rows, const Q8Tokens& a,  \
              float* y, size_t y_stride, void* scratch) {                                      \
        gemm_panels<__VA_ARGS__>(n, w, row_bytes, n_rows, a, y, y_stride, scratch);            \
    }
// Sets table t's GEMMs to those of namespace ns.
#define KVRUN_SET_CHAIN_GEMM(name, type, ...) t.gemm[static_cast<uint32_t>(Type::type)] = ns::name;
#define KVRUN_SET_CHAIN_GEMMS(t, ns_)                                                          \
    do {                                                                                       \
        namespace ns = ns_;                                                                    \
        KVRUN_CHAIN_GEMMS(KVRUN_SET_CHAIN_GEMM)                                                \
    } while (0)

namespace gl {

namespace avx512_chain {
KVRUN_CHAIN_GEMMS(KVRUN_DECLARE_CHAIN_GEMM)
// The GEMMs on packed weights (kernels.h's packable types).
PackedGemmFn gemm_packed_q4_0, gemm_packed_q8_0;
}
namespace avxvnni_chain {
KVRUN_CHAIN_GEMMS(KVRUN_DECLARE_CHAIN_GEMM)
PackedGemmFn gemm_packed_q4_0, gemm_packed_q8_0;
}
namespace avx2_chain {
KVRUN_CHAIN_GEMMS(KVRUN_DECLARE_CHAIN_GEMM)
PackedGemmFn gemm_packed_q4_0, gemm_packed_q8_0;
}
namespace neon_chain {
KVRUN_CHAIN_GEMMS(KVRUN_DECLARE_CHAIN_GEMM)
}

// The panels' start in a GEMM's scratch (gemm_scratch_bytes, any
// alignment): its first 64-byte boundary.
inline uint8_t* panel_scratch(void* scratch) {
    auto* s = static_cast<uint8_t*>(scratch);
    return s + (64 - reinterpret_cast<uintptr_t>(s) % 64) % 64;
}

// Token tiles of a GEMM: tile.template operator()<NT>(t0) for NT = 4 while
// four tokens remain, then once for the one to three left.
template <typename Tile> void by_token_tiles(int64_t n_tok, Tile&& tile) {
    int64_t t0 = 0;
    for (; t0 + 4 <= n_tok; t0 += 4) tile.template operator()<4>(t0);
    switch (n_tok - t0) {
    case 3:
        return tile.template operator()<3>(t0);
    case 2:
        return tile.template operator()<2>(t0);
    case 1:
        return tile.template operator()<1>(t0);
    default:
        return;
    }
}

} // namespace gl
