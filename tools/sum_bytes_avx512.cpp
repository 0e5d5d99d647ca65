// sum_bytes with AVX-512; compiled with GL_FLAGS_x86_avx512 and called only
// where the runtime's avx512 table is usable (sum_bytes.cpp).
#include <immintrin.h>

#include <cstdint>

namespace kvrun::lab {

namespace {
// As far ahead as the matrix kernels prefetch their weights (x86/avx512.cpp).
constexpr int64_t kPrefetchBytes = 8192;
} // namespace

// One load, one vpsadbw and one add per line, each line prefetched ahead: so
// few instructions that the read goes at the memory's pace (scalar 64-bit
// words: 8 loads and 8 adds a line, about 10% slower from DRAM here).
uint64_t sum_bytes_avx512(const void* p, int64_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    __m512i acc = _mm512_setzero_si512();
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        _mm_prefetch(reinterpret_cast<const char*>(b + i) + kPrefetchBytes, _MM_HINT_T0);
        acc = _mm512_add_epi64(acc,
                               _mm512_sad_epu8(_mm512_loadu_si512(b + i), _mm512_setzero_si512()));
    }
    // Lanes summed through memory: GCC 12's _mm512_reduce_add_epi64 trips a
    // false -Wuninitialized (GCC PR 105593), and this runs once per call.
    alignas(64) uint64_t lane[8];
    _mm512_store_si512(lane, acc);
    uint64_t s = 0;
    for (uint64_t v : lane) s += v;
    for (; i < n; i++) s += b[i];
    return s;
}

} // namespace kvrun::lab
