#include "expert_routing.h"

#include <algorithm>
#include <cmath>

#include "error.h"

namespace kvrun {

void ExpertRouting::reserve(int n_expert_, int k_, int max_tok) {
    KV_ASSERT(n_expert_ >= 1 && k_ >= 1 && k_ <= n_expert_ && max_tok >= 1);
    n_expert = n_expert_;
    k = k_;
    const size_t slots = static_cast<size_t>(max_tok) * k;
    ids.resize(slots);
    weights.resize(slots);
    offset.resize(static_cast<size_t>(n_expert) + 1);
    tokens.resize(slots);
    token_weights.resize(slots);
}

void ExpertRouting::route(const float* logits, int n) {
    KV_ASSERT(static_cast<size_t>(n) * k <= ids.size());
    for (int t = 0; t < n; t++) {
        const float* l = logits + static_cast<size_t>(t) * n_expert;
        int32_t* id = ids.data() + static_cast<size_t>(t) * k;
        float* w = weights.data() + static_cast<size_t>(t) * k;
        // The k largest logits by insertion (k is small: 2 to 10), the
        // earlier expert first among equals; a NaN ranks last.
        auto val = [l](int e) { return std::isnan(l[e]) ? -INFINITY : l[e]; };
        int m = 0;
        for (int e = 0; e < n_expert; e++) {
            const float x = val(e);
            if (m == k) {
                if (!(x > val(id[k - 1]))) continue;
                m--; // the last chosen drops out
            }
            int at = m++;
            for (; at > 0 && x > val(id[at - 1]); at--) id[at] = id[at - 1];
            id[at] = e;
        }
        // softmax(l)[i] / sum over the chosen of softmax(l)[j] =
        // exp(l_i - l_top) / sum over the chosen of exp(l_j - l_top); an
        // infinite top takes all the weight (shared among its equals).
        const float top = val(id[0]);
        float sum = 0;
        for (int j = 0; j < k; j++)
            sum += w[j] = std::isinf(top) && top > 0 ? (val(id[j]) == top ? 1.0f : 0.0f)
                                                     : std::exp(val(id[j]) - top);
        const bool ok = std::isfinite(sum) && sum > 0;
        for (int j = 0; j < k; j++) w[j] = ok ? w[j] / sum : 1.0f / static_cast<float>(k);
    }
    // Counting sort by expert; each expert's tokens stay in token order.
    std::fill(offset.begin(), offset.end(), 0);
    for (size_t s = 0; s < static_cast<size_t>(n) * k; s++) offset[ids[s] + 1]++;
    for (int e = 0; e < n_expert; e++) offset[e + 1] += offset[e];
    // A cursor per expert in offset while filling.
    for (int t = 0; t < n; t++)
        for (int j = 0; j < k; j++) {
            const int e = ids[static_cast<size_t>(t) * k + j];
            const int32_t slot = offset[e]++;
            tokens[slot] = t;
            token_weights[slot] = weights[static_cast<size_t>(t) * k + j];
        }
    // The cursors ended at each expert's end: shift back to the starts.
    for (int e = n_expert; e > 0; e--) offset[e] = offset[e - 1];
    offset[0] = 0;
}

} // namespace kvrun
