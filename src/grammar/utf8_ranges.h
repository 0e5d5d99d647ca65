// Code point ranges as UTF-8 byte patterns: a character class such as
// [^"\\] becomes a few sequences of byte ranges ([00-21], [C2-DF][80-BF],
// [E0][A0-BF][80-BF], ...) that together match exactly the UTF-8 spellings
// of its characters, so a grammar can be matched a byte at a time.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace kvrun {

using CodepointRange = std::pair<uint32_t, uint32_t>; // inclusive
using ByteRange = std::pair<uint8_t, uint8_t>;        // inclusive

// Sorted, merged, surrogates (D800-DFFF) and anything above 10FFFF removed.
std::vector<CodepointRange> normalize_ranges(std::vector<CodepointRange> r);
// The complement within 0..10FFFF (surrogates excluded), of normalized ranges.
std::vector<CodepointRange> complement_ranges(const std::vector<CodepointRange>& r);
// Byte-range sequences matching exactly the UTF-8 encodings of the code
// points in normalized ranges; no two sequences match the same bytes.
std::vector<std::vector<ByteRange>> utf8_sequences(const std::vector<CodepointRange>& r);
// The UTF-8 encoding of one code point (<= 10FFFF).
void append_utf8(std::vector<uint8_t>& out, uint32_t cp);

} // namespace kvrun
