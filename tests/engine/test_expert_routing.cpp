// The router of a mixture of experts against its definition, computed the
// long way (a softmax over every expert in double, sorted, the top k
// renormalised), on random logits and on the edge cases: ties, NaN, k = all.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "expert_routing.h"

using kvrun::ExpertRouting;

namespace {

struct Choice {
    std::vector<int> ids;
    std::vector<double> weights;
};

Choice by_definition(const float* l, int E, int k) {
    std::vector<double> p(E);
    double mx = -INFINITY, sum = 0;
    for (int e = 0; e < E; e++) mx = std::max(mx, static_cast<double>(l[e]));
    for (int e = 0; e < E; e++) sum += p[e] = std::exp(l[e] - mx);
    for (double& x : p) x /= sum;
    std::vector<int> order(E);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return p[a] > p[b]; });
    Choice c;
    double top = 0;
    for (int j = 0; j < k; j++) top += p[order[j]];
    for (int j = 0; j < k; j++) {
        c.ids.push_back(order[j]);
        c.weights.push_back(p[order[j]] / top);
    }
    return c;
}

} // namespace

TEST_CASE("expert routing: the top k of the softmax, renormalised, grouped by expert") {
    std::mt19937 rng(7);
    std::normal_distribution<float> logit(0.0f, 3.0f);
    struct Shape {
        int E, k, n;
    };
    for (const auto& [E, k, n] : {Shape{8, 2, 1}, {6, 3, 37}, {128, 8, 19}, {5, 5, 4}, {1, 1, 3}}) {
        CAPTURE(E);
        CAPTURE(k);
        ExpertRouting r;
        r.reserve(E, k, 64);
        std::vector<float> l(static_cast<size_t>(n) * E);
        for (float& x : l) x = logit(rng);
        r.route(l.data(), n);
        std::vector<int> seen(E, 0);
        for (int t = 0; t < n; t++) {
            const Choice want = by_definition(l.data() + static_cast<size_t>(t) * E, E, k);
            for (int j = 0; j < k; j++) {
                CHECK(r.ids[static_cast<size_t>(t) * k + j] == want.ids[j]);
                CHECK(r.weights[static_cast<size_t>(t) * k + j] ==
                      doctest::Approx(want.weights[j]).epsilon(1e-6));
            }
        }
        // Every (token, expert) pair once under its expert, tokens ascending,
        // with the token's weight for it.
        CHECK(r.offset[0] == 0);
        CHECK(r.offset[E] == n * k);
        for (int e = 0; e < E; e++)
            for (int s = r.offset[e]; s < r.offset[e + 1]; s++) {
                const int t = r.tokens[s];
                if (s > r.offset[e]) CHECK(r.tokens[s - 1] < t);
                const int32_t* id = r.ids.data() + static_cast<size_t>(t) * k;
                const int j = static_cast<int>(std::find(id, id + k, e) - id);
                REQUIRE(j < k);
                CHECK(r.token_weights[s] == r.weights[static_cast<size_t>(t) * k + j]);
                seen[e]++;
            }
        CHECK(std::accumulate(seen.begin(), seen.end(), 0) == n * k);
    }
}

TEST_CASE("expert routing: ties go to the lower expert, NaN ranks last, weights stay finite") {
    ExpertRouting r;
    r.reserve(6, 3, 4);
    const float l[] = {
        1,         2,         2,   2,         0,         2,  // a four-way tie for 3 places
        NAN,       0.5f,      NAN, -1,        0.25f,     -2, // NaN never chosen over numbers
        -INFINITY, -INFINITY, 3,   -INFINITY, -INFINITY, -INFINITY,
        NAN,       NAN,       NAN, NAN,       NAN,       NAN}; // nothing to go by
    r.route(l, 4);
    CHECK(std::vector<int32_t>(r.ids.begin(), r.ids.begin() + 3) == std::vector<int32_t>{1, 2, 3});
    for (int j = 0; j < 3; j++) CHECK(r.weights[j] == doctest::Approx(1.0 / 3));
    CHECK(std::vector<int32_t>(r.ids.begin() + 3, r.ids.begin() + 6) ==
          std::vector<int32_t>{1, 4, 3});
    CHECK(r.ids[6] == 2);
    CHECK(r.weights[6] == 1.0f);
    CHECK(r.weights[7] == 0.0f);
    for (int j = 9; j < 12; j++) CHECK(r.weights[j] == doctest::Approx(1.0 / 3));
    // An infinite logit takes all the weight, shared among its equals.
    const float inf[] = {0, INFINITY, 5, INFINITY, -1, 2};
    r.route(inf, 1);
    CHECK(std::vector<int32_t>(r.ids.begin(), r.ids.begin() + 3) == std::vector<int32_t>{1, 3, 2});
    CHECK(r.weights[0] == 0.5f);
    CHECK(r.weights[1] == 0.5f);
    CHECK(r.weights[2] == 0.0f);
}
