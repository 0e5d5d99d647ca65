#include "utf8_ranges.h"

#include <algorithm>

namespace kvrun {

namespace {
constexpr uint32_t kMaxCodepoint = 0x10FFFF;
constexpr uint32_t kSurrogateLo = 0xD800, kSurrogateHi = 0xDFFF;

int utf8_length(uint32_t cp) {
    return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
}

// lo..hi encode to the same length. Split until every byte position of the
// encodings spans one contiguous range, the classic way: a range whose low
// end is not at the start of a block of continuation bytes (or high end not
// at its end) is cut at the block's edge.
void split(uint32_t lo, uint32_t hi, std::vector<std::vector<ByteRange>>& out) {
    const int n = utf8_length(lo);
    for (int i = 1; i < n; i++) {
        const uint32_t m = (uint32_t{1} << (6 * i)) - 1; // the lower i continuation bytes
        if ((lo & ~m) == (hi & ~m)) continue;
        if ((lo & m) != 0) {
            split(lo, lo | m, out);
            split((lo | m) + 1, hi, out);
            return;
        }
        if ((hi & m) != m) {
            split(lo, (hi & ~m) - 1, out);
            split(hi & ~m, hi, out);
            return;
        }
    }
    std::vector<uint8_t> a, b;
    append_utf8(a, lo);
    append_utf8(b, hi);
    std::vector<ByteRange> seq;
    for (size_t i = 0; i < a.size(); i++) seq.emplace_back(a[i], b[i]);
    out.push_back(std::move(seq));
}
} // namespace

void append_utf8(std::vector<uint8_t>& out, uint32_t cp) {
    if (cp < 0x80) {
        out.push_back(static_cast<uint8_t>(cp));
    } else if (cp < 0x800) {
        out.push_back(static_cast<uint8_t>(0xC0 | (cp >> 6)));
        out.push_back(static_cast<uint8_t>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
        out.push_back(static_cast<uint8_t>(0xE0 | (cp >> 12)));
        out.push_back(static_cast<uint8_t>(0x80 | ((cp >> 6) & 0x3F)));
        out.push_back(static_cast<uint8_t>(0x80 | (cp & 0x3F)));
    } else {
        out.push_back(static_cast<uint8_t>(0xF0 | (cp >> 18)));
        out.push_back(static_cast<uint8_t>(0x80 | ((cp >> 12) & 0x3F)));
        out.push_back(static_cast<uint8_t>(0x80 | ((cp >> 6) & 0x3F)));
        out.push_back(static_cast<uint8_t>(0x80 | (cp & 0x3F)));
    }
}

std::vector<CodepointRange> normalize_ranges(std::vector<CodepointRange> r) {
    std::vector<CodepointRange> cut;
    for (auto [lo, hi] : r) {
        if (lo > hi || lo > kMaxCodepoint) continue;
        hi = std::min(hi, kMaxCodepoint);
        if (lo < kSurrogateLo && hi >= kSurrogateLo) cut.emplace_back(lo, kSurrogateLo - 1);
        if (hi > kSurrogateHi && lo <= kSurrogateHi) cut.emplace_back(kSurrogateHi + 1, hi);
        if (hi < kSurrogateLo || lo > kSurrogateHi) cut.emplace_back(lo, hi);
    }
    std::sort(cut.begin(), cut.end());
    std::vector<CodepointRange> out;
    for (const auto& c : cut) {
        if (!out.empty() && c.first <= out.back().second + 1)
            out.back().second = std::max(out.back().second, c.second);
        else
            out.push_back(c);
    }
    return out;
}

std::vector<CodepointRange> complement_ranges(const std::vector<CodepointRange>& r) {
    std::vector<CodepointRange> out;
    uint32_t next = 0;
    for (const auto& [lo, hi] : r) {
        if (lo > next) out.emplace_back(next, lo - 1);
        next = hi + 1;
    }
    if (next <= kMaxCodepoint) out.emplace_back(next, kMaxCodepoint);
    return normalize_ranges(std::move(out));
}

std::vector<std::vector<ByteRange>> utf8_sequences(const std::vector<CodepointRange>& r) {
    static constexpr uint32_t kLengthEnds[] = {0x7F, 0x7FF, 0xFFFF, kMaxCodepoint};
    std::vector<std::vector<ByteRange>> out;
    for (auto [lo, hi] : r) {
        for (uint32_t end : kLengthEnds) { // one encoded length at a time
            if (lo > hi) break;
            if (lo > end) continue;
            const uint32_t top = std::min(hi, end);
            split(lo, top, out);
            lo = top + 1;
        }
    }
    return out;
}

} // namespace kvrun
