// The block-chain types (kernels.h's block_chain): every
// table's GEMM gives the scalar reference's bits for any number of tokens,
// on shapes that leave partial row groups, panels and token tiles; and
// ops::matmul in its batch-invariant mode gives a token the same bits
// whatever its batch, its place in it and the thread count.
#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ggml-like/blocks_k.h"
#include "ggml-like/cpu/ops.h"
#include "ggml-like/cpu/thread_pool.h"
#include "ggml-like/kernels.h"
#include "test_util.h"

namespace {

using gl::Type;

// Where a block keeps its fp16 scales: d, then (for a second one) m or dmin.
struct ScaleFields {
    size_t d, second;
};
ScaleFields scale_fields(Type t) {
    switch (t) {
    case Type::Q4_1:
        return {offsetof(gl::BlockQ4_1, d), offsetof(gl::BlockQ4_1, m)};
    case Type::Q5_1:
        return {offsetof(gl::BlockQ5_1, d), offsetof(gl::BlockQ5_1, m)};
    case Type::Q2_K:
        return {offsetof(gl::BlockQ2_K, d), offsetof(gl::BlockQ2_K, dmin)};
    case Type::Q3_K:
        return {offsetof(gl::BlockQ3_K, d), SIZE_MAX};
    case Type::Q4_K:
        return {offsetof(gl::BlockQ4_K, d), offsetof(gl::BlockQ4_K, dmin)};
    case Type::Q5_K:
        return {offsetof(gl::BlockQ5_K, d), offsetof(gl::BlockQ5_K, dmin)};
    case Type::Q6_K:
        return {offsetof(gl::BlockQ6_K, d), SIZE_MAX};
    default: // Q4_0, Q5_0, Q8_0, IQ4_NL: d first
        return {0, SIZE_MAX};
    }
}

// Rows of random blocks: every byte value (Q8_0's -128, a K-quant's largest
// scales and mins, Q6_K's scale -128 included), fp16 scales over two
// decades, so the float chain rounds at almost every step. Every other seed
// (bit 1) gives K-quant rows from the reference quantizer instead (scales as
// real files have them).
std::vector<uint8_t> random_rows(Type t, int64_t n, int64_t rows, uint32_t seed) {
    if (gl::type_info(t).block_size != 32 && (seed >> 1) % 2) {
        const auto f = kvtest::random_floats(static_cast<size_t>(n * rows), seed);
        std::vector<uint8_t> out(gl::row_size(t, n) * static_cast<size_t>(rows));
        for (int64_t r = 0; r < rows; r++)
            gl::ref::quantize_row(t, f.data() + r * n, out.data() + r * gl::row_size(t, n), n);
        return out;
    }
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int> byte(0, 255);
    std::uniform_real_distribution<float> scale(0.001f, 0.1f);
    std::vector<uint8_t> out(gl::row_size(t, n) * static_cast<size_t>(rows));
    for (auto& b : out) b = static_cast<uint8_t>(byte(rng));
    const size_t bs = gl::type_info(t).type_size;
    const ScaleFields f = scale_fields(t);
    for (size_t b = 0; b < out.size(); b += bs) {
        const uint16_t d = gl::fp32_to_fp16(scale(rng));
        std::memcpy(&out[b + f.d], &d, 2);
        if (f.second != SIZE_MAX) {
            // Q4_1/Q5_1's m as large as d and of either sign; a K-quant's dmin.
            const float v =
                scale(rng) *
                (t == Type::Q4_1 || t == Type::Q5_1 ? (byte(rng) % 2 ? 8.0f : -8.0f) : 1.0f);
            const uint16_t m = gl::fp32_to_fp16(v);
            std::memcpy(&out[b + f.second], &m, 2);
        }
    }
    return out;
}

// n_tok activation rows for weights of type w quantized by the reference
// (Q8_0, Q8_1 or Q8_K), and Q8_0's block sums.
struct Tokens {
    std::vector<uint8_t> rows;
    std::vector<int32_t> sums;
    size_t row_bytes;
    int64_t n_tok;
    Tokens(Type w, int64_t n, int64_t n_tok_, uint32_t seed)
        : row_bytes(gl::row_size(gl::vec_dot_type(w), n)), n_tok(n_tok_) {
        const auto x = kvtest::random_floats(static_cast<size_t>(n * n_tok), seed);
        rows.resize(row_bytes * static_cast<size_t>(n_tok));
        for (int64_t t = 0; t < n_tok; t++) {
            uint8_t* r = rows.data() + t * row_bytes;
            gl::ref::quantize_row(gl::vec_dot_type(w), x.data() + t * n, r, n);
            if (gl::vec_dot_type(w) != Type::Q8_0) continue;
            const auto* blocks = reinterpret_cast<const gl::BlockQ8_0*>(r);
            for (int64_t b = 0; b < n / 32; b++) {
                int32_t s = 0;
                for (int8_t q : blocks[b].qs) s += q;
                sums.push_back(s);
            }
        }
    }
    const uint8_t* row(int64_t t) const { return rows.data() + t * row_bytes; }
    gl::Q8Tokens view() const {
        return {rows.data(), row_bytes, sums.empty() ? nullptr : sums.data(), n_tok};
    }
};

bool same_bits(float a, float b) {
    return std::memcmp(&a, &b, sizeof a) == 0;
}

// y[t * n_rows + r]: the reference's dot product of weight row r (rows of n
// elements of type t) with token t of a.
std::vector<float> reference_outputs(Type t, int64_t n, const std::vector<uint8_t>& w,
                                     int64_t n_rows, const Tokens& a) {
    const size_t rb = gl::row_size(t, n);
    std::vector<float> y(static_cast<size_t>(a.n_tok * n_rows));
    for (int64_t tk = 0; tk < a.n_tok; tk++)
        for (int64_t r = 0; r < n_rows; r++)
            y[tk * n_rows + r] = gl::ref::vec_dot(t, n, w.data() + r * rb, a.row(tk));
    return y;
}

} // namespace

TEST_CASE("block chain: every table's gemm gives the reference's bits, 1 to 33 tokens") {
    uint32_t seed = 11;
    for (Type t : {Type::Q4_0, Type::Q8_0, Type::Q4_1, Type::Q5_0, Type::Q5_1, Type::IQ4_NL,
                   Type::Q2_K, Type::Q3_K, Type::Q4_K, Type::Q5_K, Type::Q6_K}) {
        REQUIRE(gl::block_chain(t));
        const int64_t bs = gl::type_info(t).block_size;
        for (int64_t n : {bs, 3 * bs, 5 * bs, 2048 + 3 * bs})
            for (int64_t n_rows : {1, 15, 16, 17, 33, 47, 70}) {
                const size_t rb = gl::row_size(t, n);
                const auto w = random_rows(t, n, n_rows, seed++);
                const int64_t n_tok = 33;
                const Tokens a(t, n, n_tok, seed++);
                const auto want = reference_outputs(t, n, w, n_rows, a);
                for (int i = 0; i < gl::kernel_table_count(); i++) {
                    const gl::KernelTable& k = gl::kernel_table(i);
                    const auto id = static_cast<uint32_t>(t);
                    int bad = 0;
                    std::vector<float> got(want.size());
                    // Tables without a GEMM (the scalar one: ref::gemm's dot
                    // products are the reference itself) have nothing to check.
                    if (auto f = k.gemm[id]) {
                        std::vector<uint8_t> scratch(gl::gemm_scratch_bytes(n) + 1);
                        // Full and partial token tiles.
                        for (int64_t m : {1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 33}) {
                            gl::Q8Tokens v = a.view();
                            v.n_tok = m;
                            std::fill(got.begin(), got.end(), -1.0f);
                            // An odd scratch address: the kernel aligns it itself.
                            f(n, w.data(), rb, n_rows, v, got.data(), static_cast<size_t>(n_rows),
                              scratch.data() + 1);
                            for (size_t j = 0; j < static_cast<size_t>(m * n_rows); j++)
                                bad += !same_bits(got[j], want[j]);
                            // Nothing written past the m tokens' rows.
                            for (size_t j = static_cast<size_t>(m * n_rows); j < got.size(); j++)
                                bad += got[j] != -1.0f;
                        }
                    }
                    CHECK(bad == 0);
                }
            }
    }
}

TEST_CASE("block chain: ops::matmul's invariant mode gives a token the same bits alone, in any "
          "batch, on 1 or 2 threads") {
    uint32_t seed = 91;
    for (Type t : {Type::Q4_0, Type::Q8_0, Type::Q4_1, Type::Q5_0, Type::Q5_1, Type::IQ4_NL,
                   Type::Q2_K, Type::Q3_K, Type::Q4_K, Type::Q5_K, Type::Q6_K}) {
        const int64_t n_in = gl::type_info(t).block_size == 32 ? 320 : 768, n_out = 67;
        const size_t rb = gl::row_size(t, n_in);
        const auto wq = random_rows(t, n_in, n_out, seed++);
        const gl::Tensor w{t, n_in, n_out, rb, wq.data()};
        const int64_t n_tok = 37;
        const auto x = kvtest::random_floats(static_cast<size_t>(n_in * n_tok), seed++);
        auto run = [&](gl::ThreadPool& pool, const float* xs, int64_t m) {
            std::vector<uint8_t> scratch(gl::ops::matmul_scratch_bytes(t, n_in, m, pool.size()));
            std::vector<float> y(static_cast<size_t>(m * n_out));
            // Only the batch-invariant paths: without AMX/OpenBLAS tiles.
            gl::ops::matmul(pool, w, xs, m, y.data(), scratch.data(),
                            {.tiles = false, .int8 = true, .invariant = true});
            return y;
        };
        gl::ThreadPool two(2), one(1);
        const auto batch = run(two, x.data(), n_tok);
        const auto batch1 = run(one, x.data(), n_tok);
        int bad = 0;
        for (int64_t tk = 0; tk < n_tok; tk++) {
            const auto alone = run(two, x.data() + tk * n_in, 1);
            // The same token at place 2 of a batch of 5 (a partial token tile).
            const int64_t at = 2;
            std::vector<float> five(x.begin(), x.begin() + 5 * n_in);
            std::copy(x.begin() + tk * n_in, x.begin() + (tk + 1) * n_in, five.begin() + at * n_in);
            const auto in_five = run(two, five.data(), 5);
            for (int64_t r = 0; r < n_out; r++) {
                const float b = batch[tk * n_out + r];
                bad += !same_bits(b, alone[r]);
                bad += !same_bits(b, batch1[tk * n_out + r]);
                bad += !same_bits(b, in_five[at * n_out + r]);
            }
        }
        INFO("type ", std::string(gl::type_name(t)),
             " integer GEMM in this table: ", gl::cpu::has_gemm(t));
        CHECK(bad == 0);
        // And, where the table has the GEMM, the batch gives the
        // reference's bits: it is the same arithmetic. (Without one, e.g. on
        // NEON, the table's own dot products sum in their own order.)
        if (!gl::cpu::has_gemm(t)) continue;
        for (int64_t tk = 0; tk < n_tok; tk += 9) {
            std::vector<uint8_t> q(gl::row_size(gl::vec_dot_type(t), n_in));
            gl::ref::quantize_row(gl::vec_dot_type(t), x.data() + tk * n_in, q.data(), n_in);
            for (int64_t r = 0; r < n_out; r += 7)
                CHECK(same_bits(batch[tk * n_out + r],
                                gl::ref::vec_dot(t, n_in, wq.data() + r * rb, q.data())));
        }
    }
}

namespace {

// Rows packed into the panel layout (kernels.h), at an odd-line offset in
// their buffer: the kernels may not assume more alignment than a row has.
struct PackedRows {
    std::vector<uint8_t> bytes;
    size_t at;
    PackedRows(Type t, int64_t n, const std::vector<uint8_t>& w, int64_t n_rows)
        : bytes(gl::packed_bytes(t, n, n_rows) + 64), at(2) {
        gl::pack_rows(t, n, w.data(), gl::row_size(t, n), n_rows, bytes.data() + at);
    }
    const uint8_t* data() const { return bytes.data() + at; }
};

} // namespace

TEST_CASE("packed weights: every table's packed gemm gives the reference's bits, 1 to 33 tokens") {
    uint32_t seed = 401;
    for (Type t : {Type::Q4_0, Type::Q8_0}) {
        REQUIRE(gl::packable(t));
        // Odd block counts (a lone last block), partial panels and pairs.
        for (int64_t n : {32, 96, 160, 2048 + 96})
            for (int64_t n_rows : {1, 15, 16, 17, 33, 47, 70}) {
                CHECK(gl::packed_bytes(t, n, n_rows) ==
                      static_cast<size_t>((n_rows + 15) / 16 * 16) * gl::row_size(t, n));
                const auto w = random_rows(t, n, n_rows, seed++);
                const PackedRows packed(t, n, w, n_rows);
                const int64_t n_tok = 33;
                const Tokens a(t, n, n_tok, seed++);
                const auto want = reference_outputs(t, n, w, n_rows, a);
                for (int i = 0; i < gl::kernel_table_count(); i++) {
                    const gl::KernelTable& k = gl::kernel_table(i);
                    auto f = k.gemm_packed[static_cast<uint32_t>(t)];
                    if (!f) continue; // this table reads the plain rows
                    int bad = 0;
                    std::vector<float> got(want.size());
                    for (int64_t m : {1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 33}) {
                        gl::Q8Tokens v = a.view();
                        v.n_tok = m;
                        std::fill(got.begin(), got.end(), -1.0f);
                        f(n, packed.data(), n_rows, v, got.data(), static_cast<size_t>(n_rows));
                        for (size_t j = 0; j < static_cast<size_t>(m * n_rows); j++)
                            bad += !same_bits(got[j], want[j]);
                        for (size_t j = static_cast<size_t>(m * n_rows); j < got.size(); j++)
                            bad += got[j] != -1.0f;
                    }
                    INFO(k.isa, " ", gl::type_name(t), " n ", n, " rows ", n_rows);
                    CHECK(bad == 0);
                }
            }
    }
}

TEST_CASE("packed weights: ops::matmul gives every token the reference's bits, alone or in any "
          "batch, on 1 or 2 threads, and so does a view of a fused matrix") {
    uint32_t seed = 501;
    for (Type t : {Type::Q4_0, Type::Q8_0}) {
        const int64_t n_in = 352, n_out = 83; // 11 blocks: a lone last one
        const size_t rb = gl::row_size(t, n_in);
        const auto wq = random_rows(t, n_in, n_out, seed++);
        const PackedRows packed(t, n_in, wq, n_out);
        gl::Tensor w{t, n_in, n_out, rb, wq.data()};
        w.packed = packed.data();
        const int64_t n_tok = 21;
        const auto x = kvtest::random_floats(static_cast<size_t>(n_in * n_tok), seed++);
        auto run = [&](gl::ThreadPool& pool, const gl::Tensor& m, const float* xs, int64_t k) {
            std::vector<uint8_t> scratch(gl::ops::matmul_scratch_bytes(t, n_in, k, pool.size()));
            std::vector<float> y(static_cast<size_t>(k * m.ne1));
            gl::ops::matmul(pool, m, xs, k, y.data(), scratch.data()); // the default paths
            return y;
        };
        gl::ThreadPool two(2), one(1);
        const auto batch = run(two, w, x.data(), n_tok);
        const auto batch1 = run(one, w, x.data(), n_tok);
        // Rows 32.. of the matrix as a view (a fused matrix's part on a
        // panel boundary keeps its packed rows), and rows 8.. (not on one:
        // the plain rows, whose one-token dot products sum in their own order).
        const gl::Tensor tail = w.rows(32, n_out - 32);
        CHECK(tail.packed == packed.data() + 32 * rb);
        CHECK(w.rows(8, 16).packed == nullptr);
        const auto tail_batch = run(two, tail, x.data(), n_tok);
        int bad = 0;
        for (int64_t tk = 0; tk < n_tok; tk++) {
            const auto alone = run(two, w, x.data() + tk * n_in, 1);
            std::vector<uint8_t> q(gl::row_size(gl::vec_dot_type(t), n_in));
            gl::ref::quantize_row(gl::vec_dot_type(t), x.data() + tk * n_in, q.data(), n_in);
            for (int64_t r = 0; r < n_out; r++) {
                const float b = batch[tk * n_out + r];
                bad += !same_bits(b, gl::ref::vec_dot(t, n_in, wq.data() + r * rb, q.data()));
                bad += !same_bits(b, alone[r]);
                bad += !same_bits(b, batch1[tk * n_out + r]);
                if (r >= 32) bad += !same_bits(b, tail_batch[tk * (n_out - 32) + r - 32]);
            }
        }
        INFO(gl::type_name(t), " packed gemm in this table: ", gl::cpu::has_packed_gemm(t));
        // Without a packed GEMM here (AVX2, NEON, scalar) matmul reads the
        // plain rows, whose dot products need not give the reference's bits.
        if (gl::cpu::has_packed_gemm(t)) CHECK(bad == 0);
    }
}
