// Packing rows into the GEMM's panel layout (kernels.h, "weights kept in the
// GEMM's layout"): a byte shuffle done once at load, plain scalar code.
#include <algorithm>
#include <cstring>

#include "ggml-like/kernels.h"

namespace gl {

namespace {

constexpr size_t kWordBytes = 64;
constexpr size_t kScaleBytes = kPackedPanelRows * sizeof(uint16_t);

// The panel of `rows` rows (fewer than 16 at a matrix's end: the rest zero)
// of nb blocks, in pairs of blocks (kernels.h).
template <typename Block, int kWords, uint8_t kFlip>
void pack_panel(const uint8_t* w, size_t row_bytes, int rows, int64_t nb, uint8_t* dst) {
    constexpr size_t kBlockWords = kWords * kWordBytes;
    std::memset(dst, 0, static_cast<size_t>(nb) * (kBlockWords + kScaleBytes));
    for (int r = 0; r < rows; r++) {
        const auto* blocks = reinterpret_cast<const Block*>(w + r * row_bytes);
        for (int64_t b = 0; b < nb; b++) {
            uint8_t* pair = dst + (b / 2) * 2 * (kBlockWords + kScaleBytes);
            const bool lone = b % 2 == 0 && b + 1 == nb; // the last of an odd count
            uint8_t* words = pair + (b % 2) * kBlockWords;
            uint8_t* scales = pair + (lone ? 1 : 2) * kBlockWords + (b % 2) * kScaleBytes;
            const auto* qs = reinterpret_cast<const uint8_t*>(blocks[b].qs);
            for (int k = 0; k < kWords; k++) {
                uint8_t* lane = words + k * kWordBytes + 4 * r;
                for (int i = 0; i < 4; i++) lane[i] = static_cast<uint8_t>(qs[4 * k + i] ^ kFlip);
            }
            std::memcpy(scales + r * sizeof(uint16_t), &blocks[b].d, sizeof(uint16_t));
        }
    }
}

} // namespace

size_t packed_bytes(Type weight, int64_t n, int64_t n_rows) {
    const int64_t panels = (n_rows + kPackedPanelRows - 1) / kPackedPanelRows;
    return static_cast<size_t>(panels * kPackedPanelRows) * row_size(weight, n);
}

void pack_rows(Type weight, int64_t n, const void* w, size_t row_bytes, int64_t n_rows, void* dst) {
    const auto* src = static_cast<const uint8_t*>(w);
    auto* out = static_cast<uint8_t*>(dst);
    const size_t panel_bytes = kPackedPanelRows * row_size(weight, n);
    const int64_t nb = n / 32;
    for (int64_t r0 = 0; r0 < n_rows; r0 += kPackedPanelRows) {
        const int rows = static_cast<int>(std::min(kPackedPanelRows, n_rows - r0));
        uint8_t* panel = out + (r0 / kPackedPanelRows) * panel_bytes;
        switch (weight) {
        case Type::Q4_0:
            pack_panel<BlockQ4_0, 4, 0>(src + r0 * row_bytes, row_bytes, rows, nb, panel);
            break;
        case Type::Q8_0:
            pack_panel<BlockQ8_0, 8, 0x80>(src + r0 * row_bytes, row_bytes, rows, nb, panel);
            break;
        default:
            std::memset(panel, 0, panel_bytes); // not packable: callers check packable()
            break;
        }
    }
}

} // namespace gl
