// The prompt-batch matmul (ggml-like/gemm.h: AMX BF16 tiles, or OpenBLAS
// SGEMM on dequantized panels) against a double-precision product of the
// reference-dequantized weights, on odd shapes: output rows that leave
// partial panels, token counts that leave partial 16-token tiles, odd numbers
// of k-blocks. Each path skips (with a message) where it is not available.
#include <doctest/doctest.h>

#include <cmath>
#include <iterator>
#include <random>
#include <vector>

#include "ggml-like/cpu/gemm.h"
#include "test_util.h"
#include "ggml-like/cpu/ops.h"
#include "ggml-like/kernels.h"
#include "ggml-like/cpu/thread_pool.h"

namespace {

using gl::Type;

using kvtest::random_floats;

// The largest |got - want| relative to sum |w x| over every output.
double worst_relative(const gl::Tensor& w, const std::vector<float>& x, int64_t n_tok,
                      const std::vector<float>& y) {
    const int64_t n_in = w.ne0, n_out = w.ne1;
    std::vector<float> wd(static_cast<size_t>(n_in));
    double worst = 0;
    for (int64_t r = 0; r < n_out; r++) {
        gl::ref::dequantize_row(w.type, w.row(r), wd.data(), n_in);
        for (int64_t t = 0; t < n_tok; t++) {
            double s = 0, m = 0;
            for (int64_t k = 0; k < n_in; k++) {
                const double p = static_cast<double>(wd[k]) * x[t * n_in + k];
                s += p;
                m += std::abs(p);
            }
            worst = std::max(worst, std::abs(y[t * n_out + r] - s) / (m + 1e-30));
        }
    }
    return worst;
}

// Runs ops::matmul for each type over odd shapes, requires that `path` is
// taken, and returns the worst relative error against the double product.
double worst_over_shapes(const std::vector<Type>& types, gl::gemm::Path path) {
    gl::ThreadPool pool(2);
    uint32_t seed = 7;
    double worst = 0;
    for (Type t : types) {
        const int64_t bs = std::max<int64_t>(32, gl::type_info(t).block_size);
        for (int64_t n_in : {bs * 3, bs * 5})
            for (int64_t n_out : {1, 31, 33, 67, 130})
                for (int64_t n_tok : {16, 17, 33, 70}) {
                    INFO("type ", std::string(gl::type_name(t)), " n_in ", n_in, " n_out ", n_out,
                         " n_tok ", n_tok);
                    REQUIRE(gl::gemm::path_for(t, n_in, n_tok) == path);
                    const auto wf = random_floats(static_cast<size_t>(n_in * n_out), seed++, 0.5f);
                    const size_t rb = gl::row_size(t, n_in);
                    std::vector<uint8_t> wq(rb * n_out);
                    for (int64_t r = 0; r < n_out; r++)
                        gl::ref::quantize_row(t, wf.data() + r * n_in, wq.data() + r * rb, n_in);
                    const gl::Tensor w{t, n_in, n_out, rb, wq.data()};
                    const auto x = random_floats(static_cast<size_t>(n_in * n_tok), seed++);
                    std::vector<uint8_t> scratch(
                        gl::ops::matmul_scratch_bytes(t, n_in, n_tok, pool.size()));
                    std::vector<float> y(static_cast<size_t>(n_tok * n_out), NAN);
                    // The tiles, not the integer GEMM the block-chain types take first.
                    gl::ops::matmul(pool, w, x.data(), n_tok, y.data(), scratch.data(),
                                    {.tiles = true, .int8 = false});
                    const double e = worst_relative(w, x, n_tok, y);
                    CHECK(std::isfinite(e));
                    worst = std::max(worst, e);
                }
    }
    return worst;
}

} // namespace

TEST_CASE("gemm tiles: every quantized type and BF16, odd shapes, against a double product") {
    if (!gl::gemm::amx_enabled()) {
        MESSAGE("skipped: this CPU (or KVRUN_ISA/KVRUN_AMX) has no AMX-BF16 tiles");
        return;
    }
    // bf16 keeps 8 significant bits: each product is off by at most ~2^-8
    // relative, so the sum by 2^-8 of sum |w x|.
    std::vector<Type> types; // every compute type but F32/F16, which never take the tiles
    for (Type t : gl::kComputeTypes)
        if (t != Type::F32 && t != Type::F16) types.push_back(t);
    const double worst = worst_over_shapes(types, gl::gemm::Path::Amx);
    CHECK(worst < 1.0 / 256);
}

TEST_CASE("gemm openblas: every type, F32 and F16 included, odd shapes, against a double product") {
    if (!gl::gemm::blas_enabled() || gl::gemm::amx_enabled()) {
        MESSAGE("skipped: built without OpenBLAS, or AMX takes the batches on this CPU");
        return;
    }
    // Exact weights and F32 activations: only float rounding of the sums
    // (n_in <= 1280 terms), far below the 8-bit activation path's 1e-2.
    const double worst = worst_over_shapes(
        std::vector<Type>(std::begin(gl::kComputeTypes), std::end(gl::kComputeTypes)),
        gl::gemm::Path::Blas);
    CHECK(worst < 1e-5);
}

TEST_CASE("gemm tiles: not taken for small batches, F32/F16 weights on AMX, or when switched off") {
    CHECK_FALSE(gl::gemm::applies(Type::Q4_0, 256, gl::gemm::kMinTokens - 1));
    // Float weights never go to the bf16 tiles; OpenBLAS keeps them exact.
    const auto float_path = gl::gemm::blas_enabled() ? gl::gemm::Path::Blas : gl::gemm::Path::None;
    CHECK(gl::gemm::path_for(Type::F32, 256, 64) == float_path);
    CHECK(gl::gemm::path_for(Type::F16, 256, 64) == float_path);
    gl::gemm::force_off(true);
    CHECK_FALSE(gl::gemm::applies(Type::Q4_0, 256, 64));
    gl::gemm::force_off(false);
    gl::cpu::force_scalar(true);
    CHECK_FALSE(gl::gemm::applies(Type::Q4_0, 256, 64));
    gl::cpu::force_scalar(false);
}
