// The ring-buffer KV cache against a plain reference of the same algorithm:
// a list of per-token K/V with explicit eviction and explicit positions, no
// ring arithmetic, keys rotated on the fly at their (virtual) positions.
#include <doctest/doctest.h>

#include <cmath>
#include <deque>
#include <nlohmann/json.hpp>
#include <fstream>

#include "error.h"
#include "forward.h"
#include "ggml-like/quants.h"
#include "session.h"
#include "test_util.h"

using namespace kvrun;

namespace {

// Plain forward pass for one token at a time, in double precision.
class ReferenceModel {
  public:
    ReferenceModel(const Model& m, int n_ctx, int keep) : m_(m), n_ctx_(n_ctx), keep_(keep), layers_(m.hp.n_layer) {}

    int64_t max_distance_seen = 0;
    size_t max_entries_seen = 0;

    std::vector<double> step(int32_t token, int64_t pos) {
        const Hparams& hp = m_.hp;
        std::vector<double> x = row(m_.token_embd, token);
        const int64_t window = n_ctx_ - keep_;
        for (int l = 0; l < hp.n_layer; l++) {
            const LayerWeights& L = m_.layers[l];
            std::vector<double> xb = rmsnorm(x, L.attn_norm);
            Entry e{pos, matvec(L.wk, xb), matvec(L.wv, xb)};
            std::vector<double> q = matvec(L.wq, xb);
            auto& list = layers_[l];
            list.push_back(std::move(e));
            // explicit eviction: drop window tokens older than the window
            if (pos >= n_ctx_)
                for (auto it = list.begin(); it != list.end();)
                    it = (it->pos >= keep_ && it->pos < pos - window + 1) ? list.erase(it) : it + 1;
            max_entries_seen = std::max(max_entries_seen, list.size());
            rotate(q, hp.n_head, static_cast<double>(pos));
            std::vector<double> att(hp.q_dim(), 0.0);
            const int group = hp.n_head / hp.n_head_kv;
            for (int h = 0; h < hp.n_head; h++) {
                const int kvh = h / group;
                std::vector<double> scores;
                for (const Entry& en : list) {
                    // sinks sit just before the oldest window token once the window slid
                    const int64_t vpos = (pos >= n_ctx_ && en.pos < keep_) ? pos - (n_ctx_ - 1 - en.pos) : en.pos;
                    max_distance_seen = std::max(max_distance_seen, pos - vpos);
                    std::vector<double> k(en.k.begin() + kvh * hp.head_dim, en.k.begin() + (kvh + 1) * hp.head_dim);
                    rotate(k, 1, static_cast<double>(vpos));
                    double s = 0;
                    for (int d = 0; d < hp.head_dim; d++) s += q[h * hp.head_dim + d] * k[d];
                    scores.push_back(s / std::sqrt(static_cast<double>(hp.head_dim)));
                }
                double mx = -1e300, sum = 0;
                for (double s : scores) mx = std::max(mx, s);
                for (double& s : scores) sum += (s = std::exp(s - mx));
                for (size_t i = 0; i < list.size(); i++)
                    for (int d = 0; d < hp.head_dim; d++)
                        att[h * hp.head_dim + d] += scores[i] / sum * list[i].v[kvh * hp.head_dim + d];
            }
            add(x, matvec(L.wo, att));
            xb = rmsnorm(x, L.ffn_norm);
            std::vector<double> g = matvec(L.w_gate, xb), u = matvec(L.w_up, xb);
            for (size_t i = 0; i < g.size(); i++) g[i] = g[i] / (1 + std::exp(-g[i])) * u[i];
            add(x, matvec(L.w_down, g));
        }
        return matvec(m_.output, rmsnorm(x, m_.output_norm));
    }

  private:
    struct Entry {
        int64_t pos;
        std::vector<double> k, v; // k unrotated
    };

    static std::vector<double> row(const gl::Tensor& t, int64_t r) {
        std::vector<float> f(t.ne0);
        gl::ref::dequantize_row(t.type, t.row(r), f.data(), t.ne0);
        return {f.begin(), f.end()};
    }
    static std::vector<double> matvec(const gl::Tensor& w, const std::vector<double>& x) {
        std::vector<double> y(w.ne1);
        for (int64_t r = 0; r < w.ne1; r++) {
            std::vector<double> wr = row(w, r);
            double s = 0;
            for (int64_t i = 0; i < w.ne0; i++) s += wr[i] * x[i];
            y[r] = s;
        }
        return y;
    }
    std::vector<double> rmsnorm(const std::vector<double>& x, const std::vector<float>& w) const {
        double ss = 0;
        for (double v : x) ss += v * v;
        const double s = 1.0 / std::sqrt(ss / x.size() + m_.hp.rms_eps);
        std::vector<double> o(x.size());
        for (size_t i = 0; i < x.size(); i++) o[i] = x[i] * s * w[i];
        return o;
    }
    static void add(std::vector<double>& y, const std::vector<double>& x) {
        for (size_t i = 0; i < y.size(); i++) y[i] += x[i];
    }
    void rotate(std::vector<double>& v, int n_heads, double pos) const {
        const Hparams& hp = m_.hp;
        for (int h = 0; h < n_heads; h++)
            for (int i = 0; i < hp.rope_dims / 2; i++) {
                const int a = hp.rope_neox ? i : 2 * i, b = hp.rope_neox ? i + hp.rope_dims / 2 : 2 * i + 1;
                const double th = pos * m_.rope_inv_freq[i];
                double& x0 = v[h * hp.head_dim + a];
                double& x1 = v[h * hp.head_dim + b];
                const double r0 = x0 * std::cos(th) - x1 * std::sin(th), r1 = x0 * std::sin(th) + x1 * std::cos(th);
                x0 = r0;
                x1 = r1;
            }
    }

    const Model& m_;
    int n_ctx_, keep_;
    std::vector<std::deque<Entry>> layers_;
};

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
    ReferenceModel ref(lm->model, n_ctx, keep);
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
        std::vector<int64_t> held(kv.slot_pos(), kv.slot_pos() + kv.n_ctx());
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
    CHECK(kv.slot_pos()[5] == 5);
    CHECK(kv.slot_pos()[6] == -1);
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
