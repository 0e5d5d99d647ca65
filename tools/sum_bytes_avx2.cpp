// sum_bytes with AVX2; compiled with GL_FLAGS_x86_avx2 and called only where
// the runtime's avx2 table is usable (sum_bytes.cpp).
#include <immintrin.h>

#include <cstdint>

namespace kvrun::lab {

namespace {
// As far ahead as the matrix kernels prefetch their weights (x86/avx2.cpp),
// so the probe keeps as many misses in flight as they do.
constexpr int64_t kPrefetchBytes = 8192;
} // namespace

// Two loads, two vpsadbw and two adds per line, each line prefetched ahead
// (see sum_bytes_avx512.cpp).
uint64_t sum_bytes_avx2(const void* p, int64_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    const __m256i zero = _mm256_setzero_si256();
    __m256i a0 = zero, a1 = zero;
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        _mm_prefetch(reinterpret_cast<const char*>(b + i) + kPrefetchBytes, _MM_HINT_T0);
        a0 = _mm256_add_epi64(
            a0, _mm256_sad_epu8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + i)), zero));
        a1 = _mm256_add_epi64(
            a1, _mm256_sad_epu8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + i + 32)),
                                zero));
    }
    alignas(32) uint64_t lane[4];
    _mm256_store_si256(reinterpret_cast<__m256i*>(lane), _mm256_add_epi64(a0, a1));
    uint64_t s = lane[0] + lane[1] + lane[2] + lane[3];
    for (; i < n; i++) s += b[i];
    return s;
}

} // namespace kvrun::lab
