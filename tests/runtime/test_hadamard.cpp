// The rotation of rotated keys (ggml-like/hadamard.h): the butterflies against
// the explicit matrix, its inverse, its orthonormality, and the CPU backend's op.
#include <doctest/doctest.h>

#include <cmath>
#include <random>
#include <vector>

#include "ggml-like/backend.h"
#include "ggml-like/hadamard.h"

namespace {
std::vector<float> random_row(size_t n, unsigned seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> d(0.0f, 2.0f);
    std::vector<float> v(n);
    for (float& x : v) x = d(rng);
    return v;
}

double worst_diff(const std::vector<float>& a, const std::vector<float>& b) {
    double w = 0;
    for (size_t i = 0; i < a.size(); i++)
        w = std::max(w, std::abs(static_cast<double>(a[i]) - b[i]));
    return w;
}
} // namespace

TEST_CASE(
    "hadamard: the butterflies equal the explicit matrix, odd row counts and every block size") {
    for (int block = 1; block <= gl::kHadamardMaxBlock; block *= 2)
        for (int64_t rows : {1, 3, 7})
            for (int64_t per_row : {1, 3}) {
                const int64_t n = block * per_row;
                const std::vector<float> x = random_row(static_cast<size_t>(rows * n), 11 + block);
                std::vector<float> fast = x, ref = x;
                gl::hadamard_rows(fast.data(), rows, n, block);
                gl::hadamard_rows_reference(ref.data(), rows, n, block);
                INFO("block ", block, " rows ", rows, " n ", n);
                // F32 butterflies vs a double sum: a few ulps of values of size ~ 2 sqrt(b).
                CHECK(worst_diff(fast, ref) < 1e-5 * std::sqrt(static_cast<double>(block)) + 1e-6);
                if (block > 1) CHECK(worst_diff(fast, x) > 0.1); // it did rotate
                // Orthonormal: each block keeps its length, and the inverse gives x back.
                for (int64_t at = 0; at < rows * n; at += block) {
                    double a = 0, b = 0;
                    for (int i = 0; i < block; i++) {
                        a += static_cast<double>(x[at + i]) * x[at + i];
                        b += static_cast<double>(fast[at + i]) * fast[at + i];
                    }
                    CHECK(b == doctest::Approx(a).epsilon(1e-5));
                }
                gl::hadamard_rows_inverse(fast.data(), rows, n, block);
                CHECK(worst_diff(fast, x) < 1e-5 * std::sqrt(static_cast<double>(block)));
            }
}

TEST_CASE(
    "hadamard: a dot product of rotated rows equals the plain one; a shared offset is spread") {
    const int block = 32, n = 64;
    const std::vector<float> q = random_row(n, 1), k = random_row(n, 2);
    std::vector<float> qr = q, kr = k;
    gl::hadamard_rows(qr.data(), 1, n, block);
    gl::hadamard_rows(kr.data(), 1, n, block);
    double plain = 0, rotated = 0;
    for (int i = 0; i < n; i++) {
        plain += static_cast<double>(q[i]) * k[i];
        rotated += static_cast<double>(qr[i]) * kr[i];
    }
    CHECK(rotated == doctest::Approx(plain).epsilon(1e-5));
    // A key that is one offset everywhere: the sign flips keep it from landing
    // on one element (a plain Hadamard would put all of it, sqrt(b), in
    // element 0); it comes out spread evenly, no element above sqrt(2).
    for (int b = 2; b <= gl::kHadamardMaxBlock; b *= 2) {
        std::vector<float> c(b, 1.0f);
        gl::hadamard_rows(c.data(), 1, b, b);
        float biggest = 0;
        for (float v : c) biggest = std::max(biggest, std::abs(v));
        CHECK_MESSAGE(biggest <= std::sqrt(2.0f) + 1e-5f, "block ", b);
    }
}

TEST_CASE("hadamard: the block for a head size") {
    CHECK(gl::hadamard_block(64) == 32);
    CHECK(gl::hadamard_block(256) == 32);
    CHECK(gl::hadamard_block(32) == 32);
    CHECK(gl::hadamard_block(80) == 16);
    CHECK(gl::hadamard_block(8) == 8);
    CHECK(gl::hadamard_block(96) == 32);
    CHECK(gl::hadamard_block(7) == 1);
}

TEST_CASE("hadamard: the CPU backend's op is gl::hadamard_rows") {
    for (bool deterministic : {false, true}) {
        auto be = gl::make_cpu_backend(2, deterministic);
        const std::vector<float> x = random_row(5 * 96, 3);
        std::vector<float> a = x, b = x;
        be->hadamard_rows(a.data(), 5, 96, 32);
        gl::hadamard_rows(b.data(), 5, 96, 32);
        CHECK(a == b);
    }
}
