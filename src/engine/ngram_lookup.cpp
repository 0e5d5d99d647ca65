#include "ngram_lookup.h"

#include <algorithm>
#include <cstring>

namespace kvrun {

void NgramLookup::draft(std::span<const int32_t> history, int max,
                        std::vector<int32_t>& out) const {
    out.clear();
    const int64_t len = static_cast<int64_t>(history.size());
    if (max <= 0) return;
    const int64_t lo = std::max<int64_t>(0, len - horizon);
    for (int n = std::min<int64_t>(ngram_max, len - 1); n >= ngram_min && n >= 1; n--) {
        const int32_t* suffix = history.data() + len - n;
        // The latest match first: recent text predicts the next tokens best
        // (a loop being written out, the paragraph being quoted). A match
        // must leave at least one token after it before the suffix itself.
        for (int64_t at = len - n - 1; at >= lo; at--) {
            if (history[at] != suffix[0] ||
                std::memcmp(history.data() + at, suffix, sizeof(int32_t) * n) != 0)
                continue;
            const int64_t from = at + n;
            const int64_t take = std::min<int64_t>(max, len - from);
            out.assign(history.begin() + from, history.begin() + from + take);
            return;
        }
    }
}

} // namespace kvrun
