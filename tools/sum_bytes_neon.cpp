// sum_bytes with NEON; compiled with GL_FLAGS_arm_neon and called only where
// the runtime's neon table is usable (sum_bytes.cpp).
#include <arm_neon.h>

#include <algorithm>
#include <cstdint>

namespace kvrun::lab {

// Pairwise adds into 16-bit lanes, widened every 2 KiB, before 128 adds of
// at most 2 x 255 can wrap them.
uint64_t sum_bytes_neon(const void* p, int64_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    uint64x2_t total = vdupq_n_u64(0);
    int64_t i = 0;
    while (i + 64 <= n) {
        uint16x8_t a = vdupq_n_u16(0);
        for (const int64_t stop = std::min(n, i + 2048); i + 64 <= stop; i += 64) {
            __builtin_prefetch(b + i + 2048);
            a = vpadalq_u8(a, vld1q_u8(b + i));
            a = vpadalq_u8(a, vld1q_u8(b + i + 16));
            a = vpadalq_u8(a, vld1q_u8(b + i + 32));
            a = vpadalq_u8(a, vld1q_u8(b + i + 48));
        }
        total = vpadalq_u32(total, vpaddlq_u16(a));
    }
    uint64_t s = vgetq_lane_u64(total, 0) + vgetq_lane_u64(total, 1);
    for (; i < n; i++) s += b[i];
    return s;
}

} // namespace kvrun::lab
