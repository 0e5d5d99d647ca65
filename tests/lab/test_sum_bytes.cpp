// The lab's read kernel (tools/sum_bytes*): every variant usable here against
// the scalar definition. Built into the aarch64 cross tests too, for NEON.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "ggml-like/kernels.h"
#include "tools/sum_bytes.h"

TEST_CASE("sum_bytes: every variant gives the scalar sum, at any length and alignment") {
    const std::vector<kvrun::lab::SumBytesVariant> variants = kvrun::lab::sum_bytes_variants();
    REQUIRE(!variants.empty());
    CHECK(std::strcmp(variants.back().isa, "scalar") == 0);
    // The best variant is the runtime's best table's: the lab reads as the
    // kernels it is compared with.
    CHECK(std::strcmp(variants.front().isa, gl::kernel_table(0).isa) == 0);
    // Lengths around one line and each lane width, and past 2 KiB (where
    // NEON's 16-bit lanes are widened); all bytes 0xff is the largest sum
    // the lanes must hold. Starting 1-3 bytes into the buffer: misaligned.
    std::mt19937 rng(1400);
    for (bool ones : {false, true})
        for (int64_t n : {0, 1, 15, 31, 63, 64, 65, 127, 129, 2047, 2048, 2049, 5000, 70001})
            for (int64_t start : {0, 1, 3}) {
                INFO("n ", n, " start ", start, " all 0xff ", ones);
                std::vector<uint8_t> buf(static_cast<size_t>(n + start));
                for (uint8_t& b : buf) b = ones ? 0xff : static_cast<uint8_t>(rng());
                const uint8_t* p = buf.data() + start;
                const uint64_t want = kvrun::lab::sum_bytes_scalar(p, n);
                if (ones) CHECK(want == 255u * static_cast<uint64_t>(n));
                for (const kvrun::lab::SumBytesVariant& v : variants) {
                    INFO(std::string(v.isa));
                    CHECK(v.fn(p, n) == want);
                }
                CHECK(kvrun::lab::sum_bytes(p, n) == want);
            }
}
