// Two caches hold the same thing: the same positions in the same slots, the
// same bytes in every held slot, the same recurrent states (doctest REQUIREs).
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "kv_cache.h"

namespace kvtest {

inline void require_same_cache(const kvrun::KvCache& a, const kvrun::KvCache& b) {
    const kvrun::KvCacheConfig& cfg = a.config();
    REQUIRE(a.n_past() == b.n_past());
    REQUIRE(a.state_bytes() == b.state_bytes());
    for (int l = 0; l < cfg.n_layer; l++) {
        CAPTURE(l);
        if (cfg.is_recurrent(l)) {
            REQUIRE(std::memcmp(a.conv_state(l), b.conv_state(l),
                                sizeof(float) * cfg.conv_floats) == 0);
            REQUIRE(std::memcmp(a.ssm_state(l), b.ssm_state(l), sizeof(float) * cfg.ssm_floats) ==
                    0);
            continue;
        }
        const int slots = a.slots(l);
        REQUIRE(std::equal(a.slot_pos(l), a.slot_pos(l) + slots, b.slot_pos(l)));
        const size_t rk = a.row_bytes_k(l), rv = a.row_bytes_v(l);
        std::vector<uint8_t> ka(slots * rk), va(slots * rv), kb(ka.size()), vb(va.size());
        a.read_rows(l, slots, ka.data(), va.data());
        b.read_rows(l, slots, kb.data(), vb.data());
        for (int s = 0; s < slots; s++) {
            if (a.slot_pos(l)[s] < 0) continue;
            CAPTURE(s);
            REQUIRE(std::memcmp(ka.data() + s * rk, kb.data() + s * rk, rk) == 0);
            REQUIRE(std::memcmp(va.data() + s * rv, vb.data() + s * rv, rv) == 0);
        }
    }
}

} // namespace kvtest
