// Prompt lookup (n-gram) drafting: the tokens that followed the most recent
// earlier occurrence of the sequence's last n tokens, tried from the longest
// n down. No second model: drafts come from the text itself, which is where
// a summary, a quotation, an extraction or a rewrite of the input gets most
// of its words.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace kvrun {

struct NgramLookup {
    int ngram_min = 1, ngram_max = 4;
    // How far back a match is looked for (the search is linear in it).
    int64_t horizon = 16384;

    // Up to `max` tokens into `out` (cleared first): the continuation of the
    // latest earlier match of history's last n tokens, for the largest n in
    // [ngram_min, ngram_max] that matches. Empty when none does.
    void draft(std::span<const int32_t> history, int max, std::vector<int32_t>& out) const;
};

} // namespace kvrun
