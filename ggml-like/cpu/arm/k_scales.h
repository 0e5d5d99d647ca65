// Q4_K/Q5_K scale unpacking shared by the NEON k-quant files (neon_k.cpp,
// neon_chain.cpp). Scalar: eight bytes each, read once per super-block.
#pragma once

#include <cstdint>
#include <cstring>

namespace gl {
namespace {

// The eight 6-bit scales (sc) and mins (m) of a Q4_K/Q5_K block's 12 packed
// bytes at s, as in blocks_k.h.
inline void unpack_scales_k4(const uint8_t* s, uint8_t sc[8], uint8_t m[8]) {
    uint32_t w0, w1, w2;
    std::memcpy(&w0, s, 4);
    std::memcpy(&w1, s + 4, 4);
    std::memcpy(&w2, s + 8, 4);
    const uint32_t lo6 = 0x3f3f3f3f, lo4 = 0x0f0f0f0f, lo2 = 0x03030303;
    const uint32_t v[4] = {w0 & lo6, (w2 & lo4) | (((w0 >> 6) & lo2) << 4), w1 & lo6,
                           ((w2 >> 4) & lo4) | (((w1 >> 6) & lo2) << 4)};
    std::memcpy(sc, v, 8);
    std::memcpy(m, v + 2, 8);
}

} // namespace
} // namespace gl
