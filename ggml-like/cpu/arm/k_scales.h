// K-quant scale unpacking shared by the NEON k-quant files (neon_k.cpp,
// neon_chain.cpp), read once per super-block. In an anonymous namespace like
// x86/k_scales.h.
#pragma once

#include <arm_neon.h>

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

// Q3_K's sixteen 6-bit scales (12 packed bytes at s, blocks_k.h) minus 32.
inline int8x16_t unpack_scales_k3(const uint8_t* s) {
    uint32_t w0, w1, w2;
    std::memcpy(&w0, s, 4);
    std::memcpy(&w1, s + 4, 4);
    std::memcpy(&w2, s + 8, 4);
    const uint32_t lo4 = 0x0f0f0f0f, lo2 = 0x03030303;
    const uint32_t v[4] = {(w0 & lo4) | ((w2 & lo2) << 4), (w1 & lo4) | (((w2 >> 2) & lo2) << 4),
                           ((w0 >> 4) & lo4) | (((w2 >> 4) & lo2) << 4),
                           ((w1 >> 4) & lo4) | (((w2 >> 6) & lo2) << 4)};
    return vsubq_s8(vreinterpretq_s8_u32(vld1q_u32(v)), vdupq_n_s8(32));
}

} // namespace
} // namespace gl
