// Every operation of gl::Backend, for every type it takes, on every backend
// this build and machine have, against a plain reference computed here in
// double precision from the reference (gl::ref) decoding of the inputs.
//
// The table below has one row per op and type (adding an op or a type is one
// row); each row runs on each backend:
//   cpu-scalar   the CPU backend with the scalar kernel table forced (no
//                SIMD, no AMX, no OpenBLAS: the plain path);
//   cpu-best     the CPU backend with the best kernel table this CPU has (and
//                AMX tiles or OpenBLAS for batches of 16+ tokens where built);
//   fake-device  the CPU kernels on device twins (tests/support/fake_device.h),
//                with every activation an op touches tracked, as Forward does:
//                outputs stay "on the device", poisoned with NaN on the host,
//                until read back with host_read;
//   cuda         the CUDA backend, made by the CLI's factory; skipped with a
//                message where this build has no CUDA or there is no GPU.
// The kernel tests (test_kernels*.cpp, test_gemm.cpp) check each kernel
// against gl::ref closely; this table checks what a backend makes of them:
// paths picked by shape (decode matvec, batches, the GEMM of 16+ tokens),
// strides, tails of rows and row chunks, threads, residency. Shapes are odd
// on purpose: 1, 3 and 17 rows, widths that are no multiple of a SIMD width
// where the type allows, batches of 1, 2, 7 and 17 tokens.
//
// Each row states the largest error it allows, in the op's own measure (see
// each run_* function), and why that much.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "attention_problem.h"
#include "cli/common.h"
#include "fake_device.h"
#include "ggml-like/backend.h"
#include "ggml-like/cpu/ops.h"
#include "ggml-like/cuda/cuda_backend.h"
#include "ggml-like/kernels.h"
#include "kv_cache.h"
#include "test_util.h"

namespace {

using gl::Type;
using kvtest::random_floats;

// ---- backends -------------------------------------------------------------------------

struct BackendUnderTest {
    const char* name;
    std::unique_ptr<gl::Backend> be;
    bool scalar;   // run its ops with gl::cpu::force_scalar(true)
    bool resident; // run its ops on tracked buffers (device twins)
};

std::unique_ptr<gl::Backend> cli_backend(const char* device) {
    kvrun::cli::CommonOptions o;
    o.device = device;
    return kvrun::cli::make_backend(o, 2); // 2 threads: the ops' parallel splits run
}

std::vector<BackendUnderTest> backends_under_test() {
    std::vector<BackendUnderTest> v;
    v.push_back({"cpu-scalar", cli_backend("cpu"), true, false});
    v.push_back({"cpu-best", cli_backend("cpu"), false, false});
    v.push_back({"fake-device", std::make_unique<kvtest::FakeDeviceBackend>(2), false, true});
    std::string why;
    if (gl::cuda_available(&why))
        // Plain host pointers: the CUDA backend copies them in and out per op.
        // Its tracked-buffer path is covered by test_cuda's Forward cases.
        v.push_back({"cuda", cli_backend("cuda"), false, false});
    else
        MESSAGE("backend ops: cuda skipped: ", why);
    return v;
}

// Scalar kernels for the scope of one op (the flag is global: restored after).
class ScalarScope {
  public:
    explicit ScalarScope(bool on) : on_(on) {
        if (on_) gl::cpu::force_scalar(true);
    }
    ~ScalarScope() {
        if (on_) gl::cpu::force_scalar(false);
    }
    ScalarScope(const ScalarScope&) = delete;
    ScalarScope& operator=(const ScalarScope&) = delete;

  private:
    bool on_;
};

// A buffer an op reads (In), writes (Out) or both.
struct Buf {
    enum Role { In, Out, InOut } role;
    const void* p;
    size_t bytes;
};

// Runs `op` on a backend the way Forward drives it. For a resident backend
// the buffers are tracked first, inputs announced as written by the host,
// outputs read back after: an output the backend left on the device without
// the host asking would read as NaN (the fake device poisons the host copy).
template <class Op> void run_on(BackendUnderTest& b, const std::vector<Buf>& bufs, Op&& op) {
    const ScalarScope scalar(b.scalar);
    if (b.resident)
        for (const Buf& x : bufs) {
            b.be->track(const_cast<void*>(x.p), x.bytes);
            if (x.role != Buf::Out) b.be->host_wrote(x.p, x.bytes);
        }
    op(*b.be);
    if (b.resident)
        for (const Buf& x : bufs) {
            if (x.role != Buf::In) b.be->host_read(x.p, x.bytes);
            b.be->untrack(const_cast<void*>(x.p));
        }
}

template <class T> Buf in(const std::vector<T>& v) {
    return {Buf::In, v.data(), sizeof(T) * v.size()};
}
template <class T> Buf out(const std::vector<T>& v) {
    return {Buf::Out, v.data(), sizeof(T) * v.size()};
}
template <class T> Buf inout(const std::vector<T>& v) {
    return {Buf::InOut, v.data(), sizeof(T) * v.size()};
}

// ---- error measure ----------------------------------------------------------------------

// |got - want| relative to `mag`, the size of what the output was computed
// from (a sum of |terms|, so that cancellation does not inflate it). A NaN or
// infinity in got, an output never written or left poisoned, is infinitely wrong.
double rel_err(float got, double want, double mag) {
    if (!std::isfinite(got)) return std::numeric_limits<double>::infinity();
    return std::abs(static_cast<double>(got) - want) / std::max(mag, 1e-30);
}

// The worst error of a row over its shapes, and which shape gave it.
struct Worst {
    double err = 0;
    std::string at;
    void add(double e, const std::string& shape) {
        if (e > err) err = e, at = shape;
    }
};

std::string str(int64_t v) {
    return std::to_string(v);
}

// ---- the table --------------------------------------------------------------------------

struct OpCase;
using RunFn = void (*)(BackendUnderTest&, const OpCase&, Worst&);

struct OpCase {
    const char* name;
    RunFn run;
    Type type;          // weight type (matmul), cache type (convert_rows, attention); else F32
    bool neox;          // rope: NeoX pairs (i, i + rope_dims/2) instead of (2i, 2i+1)
    double max_rel_err; // in the op's measure
    const char* why;    // why this tolerance
};

std::vector<uint8_t> quantize(Type t, const std::vector<float>& x, int64_t n, int64_t rows) {
    const size_t rb = gl::row_size(t, n);
    std::vector<uint8_t> q(rb * rows);
    for (int64_t r = 0; r < rows; r++)
        gl::ref::quantize_row(t, x.data() + r * n, q.data() + r * rb, n);
    return q;
}

std::vector<float> dequantize(Type t, const uint8_t* q, int64_t n, int64_t rows) {
    const size_t rb = gl::row_size(t, n);
    std::vector<float> f(static_cast<size_t>(n * rows));
    for (int64_t r = 0; r < rows; r++) gl::ref::dequantize_row(t, q + r * rb, f.data() + r * n, n);
    return f;
}

// matmul: y[t][r] = sum_k W[r][k] x[t][k], against the double sum over the
// reference-dequantized weights wd; measure: |y - want| / sum_k |W[r][k] x[t][k]|.
double matmul_error(const std::vector<float>& wd, const std::vector<float>& x,
                    const std::vector<float>& y, int64_t n_in, int64_t n_out, int64_t n_tok) {
    double e = 0;
    for (int64_t tk = 0; tk < n_tok; tk++)
        for (int64_t r = 0; r < n_out; r++) {
            double s = 0, m = 0;
            for (int64_t k = 0; k < n_in; k++) {
                const double p = static_cast<double>(wd[r * n_in + k]) * x[tk * n_in + k];
                s += p;
                m += std::abs(p);
            }
            e = std::max(e, rel_err(y[tk * n_out + r], s, m));
        }
    return e;
}

void run_matmul(BackendUnderTest& b, const OpCase& oc, Worst& worst) {
    const Type t = oc.type;
    const int64_t bs = gl::type_info(t).block_size;
    uint32_t seed = 1000 + static_cast<uint32_t>(t) * 16;
    // Float weights: 37 columns (no multiple of 8 or 16 lanes) and 96 (a
    // multiple of 32, which BF16 batches need to take the AMX tiles); block
    // types: one block, and three (an odd count for the unrolled loops).
    for (int64_t n_in : {bs == 1 ? int64_t{37} : bs, bs == 1 ? int64_t{96} : 3 * bs})
        for (int64_t n_out : {1, 3, 17}) // 17: a partial 16-row work chunk
            // 1: decode; 2 and 7: per-token dot products; 17: the batch GEMM
            // (AMX tiles or OpenBLAS where built; gemm::kMinTokens is 16).
            for (int64_t n_tok : {1, 2, 7, 17}) {
                const auto wf = random_floats(static_cast<size_t>(n_in * n_out), seed++, 0.5f);
                const auto wq = quantize(t, wf, n_in, n_out);
                const auto x = random_floats(static_cast<size_t>(n_in * n_tok), seed++);
                const gl::Tensor w{t, n_in, n_out, gl::row_size(t, n_in), wq.data()};
                const auto wd = dequantize(t, wq.data(), n_in, n_out);
                std::vector<float> y(static_cast<size_t>(n_tok * n_out), NAN);
                b.be->reserve(gl::ops::matmul_scratch_bytes(t, n_in, n_tok, b.be->n_threads()), 0);
                run_on(b, {in(x), out(y)},
                       [&](gl::Backend& be) { be.matmul(w, x.data(), n_tok, y.data()); });
                const double e = matmul_error(wd, x, y, n_in, n_out, n_tok);
                worst.add(e, "n_in " + str(n_in) + " n_out " + str(n_out) + " n_tok " + str(n_tok));
            }
}

// matmul_part: one expert of a mixture, a view into a 3-D tensor of three
// (the middle one, so that an offset view is read), over the n_tok rows a
// batch of batch_tok tokens sent to it; the path is the whole batch's (at
// 40 and 512 tokens the batched kernels even for one row). Measure as
// run_matmul.
void run_matmul_part(BackendUnderTest& b, const OpCase& oc, Worst& worst) {
    const Type t = oc.type;
    const int64_t bs = gl::type_info(t).block_size;
    uint32_t seed = 5000 + static_cast<uint32_t>(t) * 16;
    for (int64_t n_in : {bs, 3 * bs})
        for (int64_t n_out : {3, 17})
            for (int64_t n_tok : {1, 5, 17})
                for (int64_t batch_tok : {n_tok, int64_t{40}, int64_t{512}}) {
                    const int64_t n_expert = 3, e = 1;
                    const auto wf =
                        random_floats(static_cast<size_t>(n_in * n_out * n_expert), seed++, 0.5f);
                    const auto wq = quantize(t, wf, n_in, n_out * n_expert);
                    const size_t row = gl::row_size(t, n_in);
                    const gl::Tensor w{t, n_in, n_out, row, wq.data() + e * n_out * row};
                    const auto wd = dequantize(t, wq.data() + e * n_out * row, n_in, n_out);
                    const auto x = random_floats(static_cast<size_t>(n_in * n_tok), seed++);
                    std::vector<float> y(static_cast<size_t>(n_tok * n_out), NAN);
                    b.be->reserve(
                        gl::ops::matmul_scratch_bytes(t, n_in, batch_tok, b.be->n_threads()), 0);
                    run_on(b, {in(x), out(y)}, [&](gl::Backend& be) {
                        be.matmul_part(w, x.data(), n_tok, batch_tok, y.data());
                    });
                    const double err = matmul_error(wd, x, y, n_in, n_out, n_tok);
                    worst.add(err, "n_in " + str(n_in) + " n_out " + str(n_out) + " n_tok " +
                                       str(n_tok) + " of " + str(batch_tok));
                }
}

// rmsnorm: out = x / sqrt(mean(x^2) + eps) * w per row; measure: relative to |want|.
void run_rmsnorm(BackendUnderTest& b, const OpCase&, Worst& worst) {
    const float eps = 1e-5f;
    uint32_t seed = 2000;
    for (int64_t n : {1, 7, 33, 1001})
        for (int64_t rows : {1, 3, 17}) {
            const auto x = random_floats(static_cast<size_t>(n * rows), seed++, 3.0f);
            const auto w = random_floats(static_cast<size_t>(n), seed++);
            std::vector<float> o(x.size(), NAN);
            run_on(b, {in(x), out(o)}, [&](gl::Backend& be) {
                be.rmsnorm(x.data(), w.data(), n, rows, eps, o.data());
            });
            double e = 0;
            for (int64_t r = 0; r < rows; r++) {
                double ss = 0;
                for (int64_t i = 0; i < n; i++)
                    ss += static_cast<double>(x[r * n + i]) * x[r * n + i];
                const double s = 1.0 / std::sqrt(ss / static_cast<double>(n) + eps);
                for (int64_t i = 0; i < n; i++) {
                    const double want = x[r * n + i] * s * w[i];
                    e = std::max(e, rel_err(o[r * n + i], want, std::abs(want)));
                }
            }
            worst.add(e, "n " + str(n) + " rows " + str(rows));
        }
}

// rope: each of the first rope_dims of a head rotated by pairs (the rest
// untouched), row r with cos/sin + r * rope_dims/2; measure: relative to
// |x0 cos| + |x1 sin| of the pair (|x| for untouched dims).
void run_rope(BackendUnderTest& b, const OpCase& oc, Worst& worst) {
    struct Shape {
        int n_heads, head_dim, rope_dims;
    };
    // Whole heads; half of each head (partial rotary, as Phi/StableLM); 6
    // dims of 40, so the rotated pairs end mid-vector.
    const Shape shapes[] = {{3, 64, 64}, {2, 64, 32}, {5, 40, 6}};
    uint32_t seed = 3000;
    for (const Shape& s : shapes)
        for (int64_t rows : {1, 3, 17}) {
            const int half = s.rope_dims / 2;
            const int64_t stride = static_cast<int64_t>(s.n_heads) * s.head_dim;
            const auto x0 = random_floats(static_cast<size_t>(rows * stride), seed++);
            std::vector<float> cs(static_cast<size_t>(rows * half)), sn(cs.size());
            std::vector<double> inv(half);
            for (int i = 0; i < half; i++) inv[i] = std::pow(10000.0, -2.0 * i / s.rope_dims);
            for (int64_t r = 0; r < rows; r++) // positions past 1000: angles of many turns
                gl::ops::rope_angles(1000.0 + 7 * r, half, inv.data(), cs.data() + r * half,
                                     sn.data() + r * half);
            std::vector<float> x = x0;
            run_on(b, {inout(x), in(cs), in(sn)}, [&](gl::Backend& be) {
                be.rope(x.data(), rows, s.n_heads, s.head_dim, s.rope_dims, cs.data(), sn.data(),
                        oc.neox);
            });
            double e = 0;
            for (int64_t r = 0; r < rows; r++)
                for (int h = 0; h < s.n_heads; h++) {
                    const int64_t base = r * stride + static_cast<int64_t>(h) * s.head_dim;
                    std::vector<bool> rotated(s.head_dim, false);
                    for (int i = 0; i < half; i++) {
                        const int ia = oc.neox ? i : 2 * i, ib = oc.neox ? i + half : 2 * i + 1;
                        const double a = x0[base + ia], bb = x0[base + ib];
                        const double c = cs[r * half + i], sv = sn[r * half + i];
                        e = std::max(e, rel_err(x[base + ia], a * c - bb * sv,
                                                std::abs(a * c) + std::abs(bb * sv)));
                        e = std::max(e, rel_err(x[base + ib], a * sv + bb * c,
                                                std::abs(a * sv) + std::abs(bb * c)));
                        rotated[ia] = rotated[ib] = true;
                    }
                    for (int d = 0; d < s.head_dim; d++)
                        if (!rotated[d])
                            e = std::max(
                                e, rel_err(x[base + d], x0[base + d], std::abs(x0[base + d])));
                }
            worst.add(e, "heads " + str(s.n_heads) + " head_dim " + str(s.head_dim) +
                             " rope_dims " + str(s.rope_dims) + " rows " + str(rows));
        }
}

// Element counts for the element-wise ops: 1, odd counts around the CPU's
// 256-element exp chunk, and one long enough to be split between threads.
constexpr int64_t kElementCounts[] = {1, 7, 255, 257, 4097};

// gelu_mul: gate = gelu_tanh(gate) * up; measure: relative to |want| + |up|
// (GELU is near 0 for large negative x, where a relative error means nothing).
void run_gelu_mul(BackendUnderTest& b, const OpCase&, Worst& worst) {
    uint32_t seed = 4500;
    for (int64_t n : kElementCounts) {
        const auto g0 = random_floats(static_cast<size_t>(n), seed++, 4.0f);
        const auto up = random_floats(static_cast<size_t>(n), seed++);
        std::vector<float> g = g0;
        run_on(b, {inout(g), in(up)},
               [&](gl::Backend& be) { be.gelu_mul(g.data(), up.data(), n); });
        double e = 0;
        for (int64_t i = 0; i < n; i++) {
            const double x = g0[i];
            const double want =
                0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x))) *
                up[i];
            e = std::max(e, rel_err(g[i], want, std::abs(want) + std::abs(up[i]) * 1e-3));
        }
        worst.add(e, "n " + str(n));
    }
}

// silu_mul: gate = gate / (1 + exp(-gate)) * up; measure: relative to |want|.
void run_silu_mul(BackendUnderTest& b, const OpCase&, Worst& worst) {
    uint32_t seed = 4000;
    for (int64_t n : kElementCounts) {
        const auto g0 = random_floats(static_cast<size_t>(n), seed++, 4.0f); // exp over +-e^12
        const auto up = random_floats(static_cast<size_t>(n), seed++);
        std::vector<float> g = g0;
        run_on(b, {inout(g), in(up)},
               [&](gl::Backend& be) { be.silu_mul(g.data(), up.data(), n); });
        double e = 0;
        for (int64_t i = 0; i < n; i++) {
            const double gi = g0[i], want = gi / (1.0 + std::exp(-gi)) * up[i];
            e = std::max(e, rel_err(g[i], want, std::abs(want)));
        }
        worst.add(e, "n " + str(n));
    }
}

// add: y += x; measure: relative to |y| + |x|.
void run_add(BackendUnderTest& b, const OpCase&, Worst& worst) {
    uint32_t seed = 5000;
    for (int64_t n : kElementCounts) {
        const auto y0 = random_floats(static_cast<size_t>(n), seed++);
        const auto x = random_floats(static_cast<size_t>(n), seed++);
        std::vector<float> y = y0;
        run_on(b, {inout(y), in(x)}, [&](gl::Backend& be) { be.add(y.data(), x.data(), n); });
        double e = 0;
        for (int64_t i = 0; i < n; i++)
            e = std::max(e, rel_err(y[i], static_cast<double>(y0[i]) + x[i],
                                    std::abs(y0[i]) + std::abs(x[i])));
        worst.add(e, "n " + str(n));
    }
}

// add_rmsnorm: x += y, then out = rmsnorm(x) * w per row, out apart from y
// and out in y's place (a block's residual add and the next block's norm, as
// Forward calls it). Measure: the new x against the float sum, out as
// run_rmsnorm against that sum's norm.
void run_add_rmsnorm(BackendUnderTest& b, const OpCase&, Worst& worst) {
    const float eps = 1e-5f;
    uint32_t seed = 7500;
    for (bool in_place : {false, true})
        for (int64_t n : {1, 7, 33, 1001})
            for (int64_t rows : {1, 3, 17}) {
                const size_t count = static_cast<size_t>(n * rows);
                const auto x0 = random_floats(count, seed++, 3.0f);
                const auto y0 = random_floats(count, seed++, 3.0f);
                const auto w = random_floats(static_cast<size_t>(n), seed++);
                std::vector<float> x = x0, y = y0, o(count, NAN);
                float* out_to = in_place ? y.data() : o.data();
                run_on(b,
                       in_place ? std::vector<Buf>{inout(x), inout(y)}
                                : std::vector<Buf>{inout(x), in(y), out(o)},
                       [&](gl::Backend& be) {
                           be.add_rmsnorm(x.data(), y.data(), w.data(), n, rows, eps, out_to);
                       });
                const std::vector<float>& got = in_place ? y : o;
                double e = 0;
                for (int64_t r = 0; r < rows; r++) {
                    double ss = 0;
                    for (int64_t i = 0; i < n; i++) {
                        const size_t at = static_cast<size_t>(r * n + i);
                        const double sum = static_cast<double>(x0[at]) + y0[at];
                        e = std::max(e, rel_err(x[at], sum, std::abs(x0[at]) + std::abs(y0[at])));
                        const float v = x0[at] + y0[at];
                        ss += static_cast<double>(v) * v;
                    }
                    const double s = 1.0 / std::sqrt(ss / static_cast<double>(n) + eps);
                    for (int64_t i = 0; i < n; i++) {
                        const size_t at = static_cast<size_t>(r * n + i);
                        const double want = (x0[at] + y0[at]) * s * w[i];
                        e = std::max(e, rel_err(got[at], want, std::abs(want)));
                    }
                }
                worst.add(e, std::string(in_place ? "out = y, " : "") + "n " + str(n) + " rows " +
                                 str(rows));
            }
}

// convert_rows: rows of floats to a KV cache type, against gl::ref::quantize_row
// of the same rows; measure: the decoded values, relative to the reference's.
void run_convert_rows(BackendUnderTest& b, const OpCase& oc, Worst& worst) {
    const Type t = oc.type;
    const int64_t bs = gl::type_info(t).block_size;
    uint32_t seed = 6000;
    for (int64_t n : {bs == 1 ? int64_t{37} : bs, bs == 1 ? int64_t{160} : 5 * bs})
        for (int64_t rows : {1, 3, 17}) {
            const auto x = random_floats(static_cast<size_t>(n * rows), seed++, 2.0f);
            const auto want = quantize(t, x, n, rows);
            std::vector<uint8_t> got(want.size(), 0xff);
            run_on(b, {in(x), out(got)},
                   [&](gl::Backend& be) { be.convert_rows(t, x.data(), n, rows, got.data()); });
            const auto gf = dequantize(t, got.data(), n, rows),
                       wf = dequantize(t, want.data(), n, rows);
            double e = 0;
            for (size_t i = 0; i < wf.size(); i++)
                e = std::max(e, rel_err(gf[i], wf[i], std::abs(wf[i])));
            // Equal values in other bits (a -0, another NaN) would still be another cache file.
            if (e == 0 && got != want) e = std::numeric_limits<double>::infinity();
            worst.add(e, "n " + str(n) + " rows " + str(rows));
        }
}

// attention: the softmax of scaled q.k over the keys each query sees (the
// rules of ggml-like/attention.h), computed from the reference-dequantized
// rows in double; measure: relative to sum_i p_i |v_i| (the size of the
// weighted sum). Row layout on every backend; head-major slots (float caches)
// where the backend reads them.
std::vector<double> attention_reference(const kvtest::AttentionProblem& p,
                                        std::vector<double>& mag) {
    const kvtest::AttentionCase& c = p.c;
    const gl::AttentionArgs& a = p.a;
    const int kvd = c.n_head_kv * c.head_dim, hd = c.head_dim, group = c.n_head / c.n_head_kv;
    const auto ks = dequantize(c.tk, p.ks.data(), kvd, c.n_ctx);
    const auto vs = dequantize(c.tv, p.vs.data(), kvd, c.n_ctx);
    const auto kn = dequantize(c.tk, p.kn.data(), kvd, c.n_tok);
    const auto vn = dequantize(c.tv, p.vn.data(), kvd, c.n_tok);
    std::vector<double> want(p.q.size());
    mag.assign(p.q.size(), 0);
    struct Key {
        const float *k, *v, *q;
    };
    for (int t = 0; t < c.n_tok; t++) {
        const int64_t pos = p.pos[t];
        const bool slid = pos >= c.n_ctx;
        const int64_t lo = slid ? pos - a.window + 1 : 0;
        for (int h = 0; h < c.n_head; h++) {
            const int64_t kh = static_cast<int64_t>(h / group) * hd,
                          qi = (static_cast<int64_t>(t) * c.n_head + h) * hd;
            const float* q = p.q.data() + qi;
            std::vector<Key> keys;
            for (int s = 0; s < c.n_ctx; s++) {
                const int64_t sp = p.slot_pos[s];
                const float* v = vs.data() + static_cast<int64_t>(s) * kvd + kh;
                if (sp < 0) continue;
                if (sp < c.n_sink && slid) // a sink seen as if just before the window
                    keys.push_back({p.sink_k.data() + sp * kvd + kh, v, p.qu.data() + qi});
                else if (sp < c.n_sink || sp >= lo)
                    keys.push_back({ks.data() + static_cast<int64_t>(s) * kvd + kh, v, q});
            }
            for (int u = 0; u <= t; u++) // the batch's own keys (no sink among them here)
                if (p.pos[u] >= lo)
                    keys.push_back({kn.data() + static_cast<int64_t>(u) * kvd + kh,
                                    vn.data() + static_cast<int64_t>(u) * kvd + kh, q});
            std::vector<double> sc(keys.size());
            double mx = -1e300, sum = 0;
            for (size_t i = 0; i < keys.size(); i++) {
                double d = 0;
                for (int k = 0; k < hd; k++) d += static_cast<double>(keys[i].q[k]) * keys[i].k[k];
                sc[i] = d * a.scale;
                mx = std::max(mx, sc[i]);
            }
            for (double& s : sc) sum += (s = std::exp(s - mx));
            for (size_t i = 0; i < keys.size(); i++)
                for (int k = 0; k < hd; k++) {
                    want[qi + k] += sc[i] / sum * keys[i].v[k];
                    mag[qi + k] += sc[i] / sum * std::abs(keys[i].v[k]);
                }
        }
    }
    return want;
}

void run_attention(BackendUnderTest& b, const OpCase& oc, Worst& worst) {
    const Type t = oc.type;
    // n_tok n_head n_kv head_dim n_ctx n_sink past (K/V rows of n_kv * head_dim,
    // a multiple of 32 for the block types).
    const kvtest::AttentionCase cases[] = {
        {1, 6, 2, 48, 24, 4, 10, t, t}, // decode, ring partly filled, GQA 3:1
        {7, 4, 4, 40, 24, 4, 45, t, t}, // batch on a slid ring: shifted sinks, old slots hidden
        {17, 8, 1, 32, 40, 2, 5, t, t}, // prompt-sized batch (16+), MQA, short last key tile
    };
    const bool float_cache = gl::type_info(t).block_size == 1;
    uint32_t seed = 7000 + static_cast<uint32_t>(t) * 16;
    for (const kvtest::AttentionCase& c : cases)
        for (bool head_major : {false, true}) {
            if (head_major && !(float_cache && b.be->head_major_kv())) continue;
            kvtest::AttentionProblem p(c, seed);
            std::vector<double> mag;
            const std::vector<double> want = attention_reference(p, mag);
            std::unique_ptr<kvtest::HeadMajorSlots> hm;
            if (head_major) hm = std::make_unique<kvtest::HeadMajorSlots>(p);
            const int kvd = c.n_head_kv * c.head_dim;
            b.be->reserve(0, gl::attention_scratch_floats(b.be->n_threads(), c.n_ctx, c.n_tok, kvd,
                                                          c.head_dim));
            // The activations Forward tracks (q, q_unrot, positions, the
            // batch's K/V rows, the output); the ring and sink keys are host memory.
            std::vector<Buf> bufs = {in(p.q), in(p.pos), in(p.kn), in(p.vn), out(p.out)};
            if (p.a.q_unrot) bufs.push_back(in(p.qu));
            run_on(b, bufs, [&](gl::Backend& be) { be.attention(p.a); });
            double e = 0;
            for (size_t i = 0; i < want.size(); i++)
                e = std::max(e, rel_err(p.out[i], want[i], mag[i]));
            worst.add(e, "n_tok " + str(c.n_tok) + " heads " + str(c.n_head) + "/" +
                             str(c.n_head_kv) + " head_dim " + str(c.head_dim) + " n_ctx " +
                             str(c.n_ctx) + " past " + str(c.past) +
                             (head_major ? " head-major" : " rows"));
            seed++;
        }
}

// Tolerances. Float sums of n terms are off by at most ~n * 2^-24 of the sum
// of |terms| in any order; the rest is each row's own reason.
constexpr const char* kFloatDot =
    "exact weights, F32 activations: only float rounding of <= 96-term sums (<= 6e-6 of sum|wx| "
    "in any order)";
constexpr const char* kBf16Dot =
    "as F32, but on AMX tiles (batches of 16+, 96 columns) the activations are rounded to bf16: at "
    "most 2^-9 (2e-3) of sum|wx|; measured 8e-4";
constexpr const char* kInt8Dot =
    "8-bit activations (Q8_0/Q8_K per block, or bf16 on AMX tiles): each activation off by up to "
    "1/254 of its block's largest, errors of random sign; measured worst 6e-3 of sum|wx| (a row of "
    "one 32-element block)";
constexpr const char* kKvExact = "the cache rows must be gl::ref::quantize_row's: prompt-cache "
                                 "files and other backends read them";
constexpr const char* kAttnFloat =
    "keys and values decoded exactly; float dot products, exp and sums over <= 64 keys: a few ulp "
    "(measured 5e-7)";
constexpr const char* kAttnF16 =
    "as the other types, but prompt batches (17 tokens) over head-major F16 slots take the AMX "
    "tiles, each product split in hi/lo bf16 halves: ~2^-16 a score (measured 3e-5)";

const OpCase kOps[] = {
    // name, run, type, neox, max_rel_err, why
    {"matmul f32", run_matmul, Type::F32, false, 1e-5, kFloatDot},
    {"matmul f16", run_matmul, Type::F16, false, 1e-5, kFloatDot},
    {"matmul bf16", run_matmul, Type::BF16, false, 2.5e-3, kBf16Dot},
    {"matmul q8_0", run_matmul, Type::Q8_0, false, 1e-2, kInt8Dot},
    {"matmul q4_0", run_matmul, Type::Q4_0, false, 1e-2, kInt8Dot},
    {"matmul q4_1", run_matmul, Type::Q4_1, false, 1e-2, kInt8Dot},
    {"matmul q5_0", run_matmul, Type::Q5_0, false, 1e-2, kInt8Dot},
    {"matmul q5_1", run_matmul, Type::Q5_1, false, 1e-2, kInt8Dot},
    {"matmul iq4_nl", run_matmul, Type::IQ4_NL, false, 1e-2, kInt8Dot},
    {"matmul q2_K", run_matmul, Type::Q2_K, false, 1e-2, kInt8Dot},
    {"matmul q3_K", run_matmul, Type::Q3_K, false, 1e-2, kInt8Dot},
    {"matmul q4_K", run_matmul, Type::Q4_K, false, 1e-2, kInt8Dot},
    {"matmul q5_K", run_matmul, Type::Q5_K, false, 1e-2, kInt8Dot},
    {"matmul q6_K", run_matmul, Type::Q6_K, false, 1e-2, kInt8Dot},
    // A mixture of experts' per-expert products: the types Q4_K_M files give
    // experts (Q4_K gate/up, Q6_K or Q5_0/Q8_0 down) and F16.
    {"matmul_part q4_K", run_matmul_part, Type::Q4_K, false, 1e-2, kInt8Dot},
    {"matmul_part q6_K", run_matmul_part, Type::Q6_K, false, 1e-2, kInt8Dot},
    {"matmul_part q5_0", run_matmul_part, Type::Q5_0, false, 1e-2, kInt8Dot},
    {"matmul_part q8_0", run_matmul_part, Type::Q8_0, false, 1e-2, kInt8Dot},
    {"matmul_part f16", run_matmul_part, Type::F16, false, 1e-5, kFloatDot},
    {"rmsnorm", run_rmsnorm, Type::F32, false, 1e-5,
     "two float products after the sum of squares (measured 1.4e-7); room for a device's float "
     "sum of squares over 1001 elements"},
    {"rope", run_rope, Type::F32, false, 1e-6,
     "two float products and a sum per element: ~3 ulp of |x0 c| + |x1 s| (measured 1.1e-7)"},
    {"rope neox", run_rope, Type::F32, true, 1e-6,
     "two float products and a sum per element: ~3 ulp of |x0 c| + |x1 s| (measured 1.1e-7)"},
    {"silu_mul", run_silu_mul, Type::F32, false, 1e-6,
     "exp by the kernels' polynomial (a few ulp), a division and a product in float (measured "
     "2.3e-7)"},
    {"gelu_mul", run_gelu_mul, Type::F32, false, 1e-6,
     "exp of a cubic, a division and a product in float, computed as x / (1 + exp(-2u)) to avoid "
     "1 + tanh(u)'s cancellation (which measured 7e-5); relative to |want| plus a 1e-3 floor of "
     "|up|"},
    {"add", run_add, Type::F32, false, 1e-7, "one float rounding: 2^-24 of |y| + |x|"},
    {"add_rmsnorm", run_add_rmsnorm, Type::F32, false, 1e-5,
     "add's rounding, then rmsnorm's two float products (measured as rmsnorm's)"},
    {"convert_rows f32", run_convert_rows, Type::F32, false, 0, kKvExact},
    {"convert_rows f16", run_convert_rows, Type::F16, false, 0, kKvExact},
    {"convert_rows bf16", run_convert_rows, Type::BF16, false, 0, kKvExact},
    {"convert_rows q8_0", run_convert_rows, Type::Q8_0, false, 0, kKvExact},
    {"convert_rows q4_0", run_convert_rows, Type::Q4_0, false, 0, kKvExact},
    {"attention f32", run_attention, Type::F32, false, 1e-5, kAttnFloat},
    {"attention f16", run_attention, Type::F16, false, 1e-4, kAttnF16},
    {"attention bf16", run_attention, Type::BF16, false, 1e-5, kAttnFloat},
    {"attention q8_0", run_attention, Type::Q8_0, false, 1e-5, kAttnFloat},
    {"attention q4_0", run_attention, Type::Q4_0, false, 1e-5, kAttnFloat},
};

bool has_row(RunFn run, Type t) {
    return std::any_of(std::begin(kOps), std::end(kOps),
                       [&](const OpCase& o) { return o.run == run && o.type == t; });
}

} // namespace

TEST_CASE("backend ops: the table covers every weight type and every KV cache type") {
    // A type kvrun learns to compute with (or to cache) needs its rows here.
    for (uint32_t id = 0; id < gl::kTypeIdLimit; id++) {
        const Type t = static_cast<Type>(id);
        if (gl::type_info(id).supported)
            CHECK_MESSAGE(has_row(run_matmul, t), "matmul ", std::string(gl::type_name(t)));
        if (kvrun::kv_cache_type_ok(t)) {
            CHECK_MESSAGE(has_row(run_convert_rows, t), "convert_rows ",
                          std::string(gl::type_name(t)));
            CHECK_MESSAGE(has_row(run_attention, t), "attention ", std::string(gl::type_name(t)));
        }
    }
}

TEST_CASE("backend ops: matmul_group gives each job the bits of its own one-token matmul") {
    // A generated token's experts go through matmul_group (one parallel loop
    // on the CPU). Mixed types and odd row counts, chunks that end mid-job;
    // jobs 0-2 share one x (converted once), jobs 3-4 another of the same
    // width but another activation type; F16 takes F32 activations.
    struct JobSpec {
        Type type;
        int64_t n_in, n_out;
        int x; // which input
    };
    const JobSpec specs[] = {{Type::Q4_K, 512, 17, 0}, {Type::Q4_K, 512, 33, 0},
                             {Type::Q6_K, 512, 3, 0},  {Type::Q8_0, 256, 1, 1},
                             {Type::Q4_0, 256, 19, 1}, {Type::F16, 256, 5, 1},
                             {Type::Q5_K, 256, 16, 1}, {Type::Q4_K, 768, 7, 2}};
    const int64_t widths[] = {512, 256, 768};
    std::vector<std::vector<float>> xs;
    uint32_t seed = 7000;
    for (int64_t w : widths) xs.push_back(random_floats(static_cast<size_t>(w), seed++));
    std::vector<std::vector<uint8_t>> wq;
    std::vector<gl::Tensor> ws;
    for (const JobSpec& j : specs) {
        wq.push_back(quantize(j.type,
                              random_floats(static_cast<size_t>(j.n_in * j.n_out), seed++, 0.5f),
                              j.n_in, j.n_out));
        ws.push_back({j.type, j.n_in, j.n_out, gl::row_size(j.type, j.n_in), wq.back().data()});
    }
    for (BackendUnderTest& b : backends_under_test()) {
        INFO("backend ", std::string(b.name));
        size_t scratch = 0;
        for (const JobSpec& j : specs)
            scratch = std::max(scratch,
                               gl::ops::matmul_scratch_bytes(j.type, j.n_in, 1, b.be->n_threads()));
        b.be->reserve(scratch, 0);
        std::vector<std::vector<float>> want, got;
        std::vector<gl::MatvecJob> jobs;
        std::vector<Buf> bufs;
        for (const auto& x : xs) bufs.push_back(in(x));
        for (size_t i = 0; i < std::size(specs); i++) {
            want.emplace_back(static_cast<size_t>(specs[i].n_out), NAN);
            run_on(b, {in(xs[specs[i].x]), out(want.back())}, [&](gl::Backend& be) {
                be.matmul(ws[i], xs[specs[i].x].data(), 1, want.back().data());
            });
            got.emplace_back(static_cast<size_t>(specs[i].n_out), NAN);
        }
        for (size_t i = 0; i < std::size(specs); i++) {
            jobs.push_back({&ws[i], xs[specs[i].x].data(), got[i].data()});
            bufs.push_back(out(got[i]));
        }
        run_on(b, bufs, [&](gl::Backend& be) {
            be.matmul_group(jobs.data(), static_cast<int>(jobs.size()));
        });
        for (size_t i = 0; i < std::size(specs); i++) {
            INFO("job ", i, " ", std::string(gl::type_name(specs[i].type)));
            for (int64_t r = 0; r < specs[i].n_out; r++) {
                INFO("row ", r, " got ", got[i][r], " want ", want[i][r]);
                CHECK(std::isfinite(got[i][r]));
                CHECK(std::memcmp(&got[i][r], &want[i][r], sizeof(float)) == 0);
            }
        }
    }
}

TEST_CASE("backend ops: every op and type on every backend against a double-precision reference") {
    std::vector<BackendUnderTest> backends = backends_under_test();
    {
        // The scalar column really runs the scalar table.
        const ScalarScope s(true);
        CHECK(std::string(gl::cpu::isa_name()) == "scalar");
        CHECK(backends[0].be->name() == "cpu/scalar");
    }
    for (BackendUnderTest& b : backends)
        for (const OpCase& oc : kOps) {
            Worst worst;
            oc.run(b, oc, worst);
            const std::string be_name = [&] { // the scalar column's name under its table
                const ScalarScope s(b.scalar);
                return b.be->name();
            }();
            // (std::string: doctest prints a plain const char* as a pointer)
            INFO(std::string(oc.name), " on ", std::string(b.name), " (", be_name, "): worst ",
                 worst.err, " at ", worst.at, "; allowed ", oc.max_rel_err, ": ",
                 std::string(oc.why));
            CHECK(worst.err <= oc.max_rel_err);
        }
    MESSAGE("backend ops: ", std::size(kOps), " op rows x ", backends.size(), " backends");
}
