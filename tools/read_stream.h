// A plain streaming read: the sum of a buffer's 64-bit words, with a software
// prefetch kDistance bytes ahead (0 = none). The lab reads with it to measure
// the machine's read bandwidth and to stream weights and rings.
#pragma once

#include <cstdint>

namespace kvrun::lab {

template <int kDistance>
[[gnu::noinline]] uint64_t sum_stream(const uint64_t* b, const uint64_t* e) {
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    const uint64_t* p = b;
    for (; p + 16 <= e; p += 16) { // 128 bytes: two cache lines
        if constexpr (kDistance > 0) {
            __builtin_prefetch(reinterpret_cast<const char*>(p) + kDistance);
            __builtin_prefetch(reinterpret_cast<const char*>(p) + kDistance + 64);
        }
        for (int i = 0; i < 16; i += 4) {
            s0 += p[i];
            s1 += p[i + 1];
            s2 += p[i + 2];
            s3 += p[i + 3];
        }
    }
    for (; p < e; p++) s0 += *p;
    return s0 + s1 + s2 + s3;
}

} // namespace kvrun::lab
