// The ring-buffer KV cache against a plain reference of the same algorithm:
// a list of per-token K/V with explicit eviction and explicit positions, no
// ring arithmetic, keys rotated on the fly at their (virtual) positions.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <fstream>

#include "error.h"
#include "forward.h"
#include "ggml-like/kernels.h"
#include "loader.h"
#include "context.h"
#include "reference_model.h"
#include "test_util.h"

using namespace kvrun;

namespace {

std::vector<int32_t> long_story_tokens(size_t n) {
    std::ifstream in(kvtest::shared("golden/stories260K__long.json"));
    nlohmann::json j = nlohmann::json::parse(in);
    std::vector<int32_t> t = j["prompt_tokens"].get<std::vector<int32_t>>();
    t.resize(n);
    return t;
}

double max_abs_diff(const float* a, const std::vector<double>& b) {
    double m = 0;
    for (size_t i = 0; i < b.size(); i++) m = std::max(m, std::abs(a[i] - b[i]));
    return m;
}

} // namespace

TEST_CASE("kv ring: wrapping cache equals the explicit-eviction reference") {
    auto lm = LoadedModel::load(kvtest::shared("models/stories260K.gguf"));
    const Hparams& hp = lm->model.hp;
    const int n_ctx = 64, keep = 4, n_tok = 256; // wraps the 60-slot window four times
    const std::vector<int32_t> toks = long_story_tokens(n_tok);
    auto be = gl::make_cpu_backend(2);

    // Reference logits for every position.
    kvtest::ReferenceModel ref(lm->model, n_ctx, keep);
    std::vector<std::vector<double>> want;
    for (int i = 0; i < n_tok; i++) want.push_back(ref.step(toks[i], i));
    CHECK(ref.max_distance_seen == n_ctx - 1); // every query-key distance stays below n_ctx
    CHECK(ref.max_entries_seen == static_cast<size_t>(n_ctx));

    SUBCASE("one token at a time, F32 cache") {
        KvCache kv({hp.n_layer, hp.n_head_kv, hp.head_dim, n_ctx, keep, gl::Type::F32, gl::Type::F32});
        Forward fwd(lm->model, kv, *be, 1);
        double worst = 0;
        for (int i = 0; i < n_tok; i++) worst = std::max(worst, max_abs_diff(fwd.eval(&toks[i], 1, false), want[i]));
        MESSAGE("max |logit diff| vs reference: ", worst);
        CHECK(worst < 2e-3);
        CHECK(kv.n_past() == n_tok);
    }
    SUBCASE("batches of 7 that cross the wrap, F32 cache") {
        KvCache kv({hp.n_layer, hp.n_head_kv, hp.head_dim, n_ctx, keep, gl::Type::F32, gl::Type::F32});
        Forward fwd(lm->model, kv, *be, 7);
        double worst = 0;
        for (int i = 0; i < n_tok;) {
            const int n = std::min(7, n_tok - i);
            const float* rows = fwd.eval(&toks[i], n, true);
            for (int r = 0; r < n; r++) worst = std::max(worst, max_abs_diff(rows + r * hp.n_vocab, want[i + r]));
            i += n;
        }
        MESSAGE("max |logit diff| vs reference: ", worst);
        CHECK(worst < 2e-3);
    }
    SUBCASE("head-major and row slots, and a switch between them mid-stream, give the same logits") {
        // The CPU backend reads head-major slots; the CUDA backend rows.
        // The same values; only the order of each score's sum differs (key
        // tiles sum each dimension across keys, rows within a key), so the
        // logits agree to float rounding, amplified by this small model: up
        // to ~5e-3 measured (with double sums on both sides, as the scalar
        // kernels do, they are identical). A misplaced key or value, or one
        // lost in a switch, moves them by far more.
        KvCache kv1({hp.n_layer, hp.n_head_kv, hp.head_dim, n_ctx, keep, gl::Type::F16, gl::Type::F16});
        KvCache kv2({hp.n_layer, hp.n_head_kv, hp.head_dim, n_ctx, keep, gl::Type::F16, gl::Type::F16});
        Forward f1(lm->model, kv1, *be, 1), f2(lm->model, kv2, *be, 1);
        CHECK(kv1.head_major());
        kv2.set_head_major(false);
        CHECK_FALSE(kv2.head_major());
        double worst_ref = 0, worst_layout = 0;
        for (int i = 0; i < n_tok; i++) {
            if (i == 100) kv2.set_head_major(true); // ring wrapped once, slots hold data
            if (i == 170) kv2.set_head_major(false);
            const float* a = f1.eval(&toks[i], 1, false);
            const std::vector<float> la(a, a + hp.n_vocab);
            const float* b = f2.eval(&toks[i], 1, false);
            for (int v = 0; v < hp.n_vocab; v++)
                worst_layout = std::max(worst_layout, std::fabs(static_cast<double>(la[v]) - b[v]));
            worst_ref = std::max(worst_ref, max_abs_diff(la.data(), want[i]));
        }
        MESSAGE("max |logit diff| head-major vs rows: ", worst_layout);
        CHECK(worst_layout < 2e-2);
        CHECK(worst_ref < 0.1);
    }
    SUBCASE("F16 cache stays close") {
        KvCache kv({hp.n_layer, hp.n_head_kv, hp.head_dim, n_ctx, keep, gl::Type::F16, gl::Type::F16});
        Forward fwd(lm->model, kv, *be, 1);
        double worst = 0;
        for (int i = 0; i < n_tok; i++) worst = std::max(worst, max_abs_diff(fwd.eval(&toks[i], 1, false), want[i]));
        CHECK(worst < 0.1); // the goldens' tolerance for stories260K
    }
}

TEST_CASE("kv ring: the slots hold exactly the sinks and the newest window") {
    KvCache kv({1, 1, 2, 16, 3, gl::Type::F32, gl::Type::F32});
    std::vector<float> row(2, 0.0f);
    for (int64_t p = 0; p < 100; p++) {
        kv.write(0, p, 1, row.data(), row.data());
        kv.commit(p, 1);
        std::vector<int64_t> held(kv.slot_pos(0), kv.slot_pos(0) + kv.n_ctx());
        std::sort(held.begin(), held.end());
        std::vector<int64_t> expect;
        for (int64_t q = 0; q <= p; q++)
            if (q < 3 || q > p - 13 || p < 16) expect.push_back(q);
        while (expect.size() < 16) expect.insert(expect.begin(), -1);
        REQUIRE(held == expect);
    }
    CHECK(kv.ring_bytes() == 2u * 1 * 16 * 1 * 2 * 4);
    CHECK_FALSE(kv.truncate(50)); // wrapped: old slots are gone
}

TEST_CASE("kv ring: exact memory formula and truncate before wrapping") {
    KvCacheConfig c{22, 4, 64, 2048, 4, gl::Type::F16, gl::Type::F16};
    CHECK(KvCache::ring_bytes_for(c) == 2ull * 22 * 2048 * 4 * 64 * 2);
    KvCache kv({2, 2, 4, 32, 4, gl::Type::F16, gl::Type::F16});
    std::vector<uint16_t> rows(8 * 10, 0);
    for (int l = 0; l < 2; l++) kv.write(l, 0, 10, rows.data(), rows.data());
    kv.commit(0, 10);
    CHECK(kv.truncate(6));
    CHECK(kv.n_past() == 6);
    CHECK(kv.slot_pos(0)[5] == 5);
    CHECK(kv.slot_pos(0)[6] == -1);
}

TEST_CASE("context sizing: -c auto and fixed -c") {
    CHECK(auto_context(5, 100, 2048) == 256);
    CHECK(auto_context(5, -1, 2048) == 768);    // 5 + max(10, 512) = 517 -> 768
    CHECK(auto_context(300, -1, 4096) == 1024); // 300 + 600 = 900 -> 1024
    CHECK(auto_context(200, 56, 2048) == 256);  // exactly a multiple
    CHECK(auto_context(1000, 5000, 2048) == 2048); // capped at the model's context
    CHECK_THROWS_AS(auto_context(3000, 10, 2048), Error);
    CHECK_NOTHROW(check_prompt_fits(64, 64));
    try {
        check_prompt_fits(65, 64);
        FAIL("no error");
    } catch (const Error& e) {
        CHECK(e.code() == Exit::context_overflow);
        CHECK(std::string(e.what()).find("65") != std::string::npos);
    }
    CHECK_THROWS_AS(KvCache({1, 1, 2, 16, 16, gl::Type::F16, gl::Type::F16}), Error); // keep must leave a window
}

TEST_CASE("kv ring: head-major slots hold each row's head slices (keys in tiles), and switching layouts keeps them") {
    struct Case {
        int n_head_kv, head_dim;
        gl::Type tk, tv;
        bool head_major; // what set_head_major(true) yields
    };
    const Case cases[] = {
        {3, 5, gl::Type::F16, gl::Type::F16, true},
        {2, 8, gl::Type::F32, gl::Type::BF16, true},
        {1, 7, gl::Type::BF16, gl::Type::F32, true},
        {2, 32, gl::Type::Q8_0, gl::Type::F16, false}, // a block type keeps rows
    };
    for (const Case& c : cases) {
        INFO("heads ", c.n_head_kv, " hd ", c.head_dim);
        // The lone cache's pool rounds the ring up to whole blocks (64 slots):
        // its key tiles are all whole, laid over the pool's slots.
        const int n_ctx = 37, keep = 2, n_layer = 2;
        KvCache rows({n_layer, c.n_head_kv, c.head_dim, n_ctx, keep, c.tk, c.tv});
        KvCache heads({n_layer, c.n_head_kv, c.head_dim, n_ctx, keep, c.tk, c.tv});
        heads.set_head_major(true);
        CHECK(heads.head_major() == c.head_major);
        CHECK_FALSE(rows.head_major());
        const size_t rk = rows.row_bytes_k(0), rv = rows.row_bytes_v(0);
        uint32_t seed = 7;
        // 120 tokens in batches of 3 through a ring of 35 window slots: wraps thrice.
        for (int64_t p = 0; p < 120; p += 3) {
            std::vector<uint8_t> k(3 * rk), v(3 * rv);
            for (auto& b : k) b = static_cast<uint8_t>((seed = seed * 1103515245u + 12345u) >> 24);
            for (auto& b : v) b = static_cast<uint8_t>((seed = seed * 1103515245u + 12345u) >> 24);
            for (int l = 0; l < n_layer; l++) {
                rows.write(l, p, 3, k.data(), v.data());
                heads.write(l, p, 3, k.data(), v.data());
            }
            rows.commit(p, 3);
            heads.commit(p, 3);
        }
        for (int l = 0; l < n_layer; l++) {
            std::vector<uint8_t> k1(n_ctx * rk), v1(n_ctx * rv), k2(n_ctx * rk), v2(n_ctx * rv);
            rows.read_rows(l, n_ctx, k1.data(), v1.data());
            heads.read_rows(l, n_ctx, k2.data(), v2.data());
            CHECK(k1 == k2);
            CHECK(v1 == v2);
            // The row layout is the plain one; head h of slot s sits where
            // the accessors say in either layout.
            CHECK(std::memcmp(k1.data(), rows.k_slots(l), k1.size()) == 0);
            if (heads.head_major()) {
                const auto* hk = static_cast<const uint8_t*>(heads.k_slots(l));
                const auto* hv = static_cast<const uint8_t*>(heads.v_slots(l));
                const size_t sv = heads.slot_bytes_v(l), e = gl::type_info(c.tk).type_size;
                CHECK(sv * c.n_head_kv == rv);
                const int n_pool = heads.pool_slots(l);
                CHECK(n_pool == 64);
                CHECK(heads.head_bytes_k(l) * c.n_head_kv == n_pool * rk);
                int wrong = 0;
                for (int s = 0; s < n_ctx; s++)
                    for (int h = 0; h < c.n_head_kv; h++) {
                        for (int d = 0; d < c.head_dim; d++)
                            wrong += std::memcmp(hk + h * heads.head_bytes_k(l) +
                                                     gl::key_tile_index(s, d, c.head_dim, n_pool) * e,
                                                 k1.data() + s * rk + (h * c.head_dim + d) * e, e) != 0;
                        wrong += std::memcmp(hv + h * heads.head_bytes_v(l) + s * sv,
                                             v1.data() + s * rv + h * sv, sv) != 0;
                    }
                CHECK(wrong == 0);
            }
            // Back to rows (and again to heads): the same bytes.
            heads.set_head_major(false);
            CHECK(std::memcmp(heads.k_slots(l), rows.k_slots(l), n_ctx * rk) == 0);
            CHECK(std::memcmp(heads.v_slots(l), rows.v_slots(l), n_ctx * rv) == 0);
            heads.set_head_major(true);
        }
    }
}
