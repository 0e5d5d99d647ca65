// Shared helper for tests that run Forward over a placement of backends.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "forward.h"
#include "kv_cache.h"
#include "loader.h"

namespace kvtest {

// Logits of every position of `toks`: batches of 7 (sinks included), then
// single tokens on a ring of 40 slots that slides, so attention over a
// wrapped ring with sinks is exercised. `each(n)` runs after each eval of n
// tokens.
template <class F>
std::vector<float> logits_of_all(const kvrun::LoadedModel& lm, kvrun::Placement p,
                                 const std::vector<int32_t>& toks, F&& each) {
    const kvrun::Hparams& hp = lm.model.hp;
    kvrun::KvCache kv({hp.n_layer, hp.n_head_kv, hp.head_dim, 40, 4, gl::Type::F16, gl::Type::F16});
    kvrun::Forward fwd(lm.model, kv, std::move(p), 7);
    std::vector<float> all;
    for (size_t i = 0; i < toks.size();) {
        const int n = kv.n_past() + 7 <= kv.n_ctx() ? 7 : 1;
        const float* rows = fwd.eval(&toks[i], n, true);
        all.insert(all.end(), rows, rows + static_cast<size_t>(n) * hp.n_vocab);
        each(n);
        i += n;
    }
    return all;
}

inline std::vector<float> logits_of_all(const kvrun::LoadedModel& lm, kvrun::Placement p,
                                        const std::vector<int32_t>& toks) {
    return logits_of_all(lm, std::move(p), toks, [](int) {});
}

// How many floats of a and b differ (a NaN in either counts); every one of
// the longer's extra floats where the sizes differ.
inline size_t differences(const std::vector<float>& a, const std::vector<float>& b) {
    if (a.size() != b.size()) return std::max(a.size(), b.size());
    size_t d = 0;
    for (size_t i = 0; i < a.size(); i++) d += !(a[i] == b[i]);
    return d;
}

} // namespace kvtest
