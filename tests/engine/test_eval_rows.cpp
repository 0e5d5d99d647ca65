// Session::eval's on_rows from EvalHooks::rows_from on (perplexity scores a
// chunk's second half): the rows before it are neither computed nor handed
// over, and the rows after it are the logits an every-row evaluation gives,
// bit for bit on the batch-invariant backend, whatever batch they fall in.
#include <doctest/doctest.h>

#include <map>
#include <vector>

#include "forward.h"
#include "loader.h"
#include "session.h"
#include "test_util.h"

using namespace kvrun;

TEST_CASE("session eval: rows_from hands over the logits from that token on, the same bits") {
    const auto lm = LoadedModel::load(kvtest::shared("models/stories260K.gguf"));
    const int nv = lm->model.hp.n_vocab;
    auto be = gl::make_cpu_backend(2, true);
    std::vector<int32_t> tokens;
    for (int i = 0; i < 40; i++) tokens.push_back((i * 37 + 11) % nv);
    const KvCacheConfig cfg =
        KvCacheConfig::for_model(lm->model.hp, 64, 0, gl::Type::F16, gl::Type::F16);

    // Rows by token position, and the last row's logits, for one rows_from.
    struct Out {
        std::map<int64_t, std::vector<float>> rows;
        std::vector<float> last;
    };
    auto run = [&](int64_t rows_from) {
        Session s(*lm, cfg, Placement::all(*be, lm->model.hp.n_layer), 16);
        Out o;
        EvalHooks hooks;
        hooks.rows_from = rows_from;
        hooks.on_rows = [&](int64_t first, int n, const float* rows) {
            for (int r = 0; r < n; r++) {
                CHECK(o.rows.count(first + r) == 0);
                o.rows[first + r].assign(rows + static_cast<size_t>(r) * nv,
                                         rows + static_cast<size_t>(r + 1) * nv);
            }
        };
        REQUIRE(s.eval(tokens, hooks));
        o.last.assign(s.logits(), s.logits() + nv);
        return o;
    };
    const Out all = run(0);
    REQUIRE(all.rows.size() == tokens.size());
    // Batches of 16: from the first token, mid-batch, a batch's first and
    // second token, and the last token alone.
    for (int64_t from : {int64_t{5}, int64_t{16}, int64_t{17}, int64_t{39}}) {
        INFO("rows_from ", from);
        const Out got = run(from);
        CHECK(got.rows.size() == tokens.size() - static_cast<size_t>(from));
        for (const auto& kv : got.rows) {
            const int64_t pos = kv.first;
            INFO("token ", pos);
            CHECK(pos >= from);
            CHECK(kv.second == all.rows.at(pos));
        }
        CHECK(got.last == all.last);
    }
}
