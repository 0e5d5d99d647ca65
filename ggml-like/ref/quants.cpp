// gl::ref: plain scalar conversions and dot products, the reference that every
// SIMD kernel is tested against.
//
// Accuracy choices (why the reference looks the way it does):
//  - Float dot products accumulate in double, so the reference is close to the
//    exact sum and the tests can bound a fast kernel's float rounding alone.
//  - Quantized dot products sum each block's int8 products exactly in int32,
//    then add d_w * d_a * isum one block after another with a float FMA (the
//    block-chain arithmetic, kernels.h): the integer GEMM must give these
//    bits exactly; the tables' dot products are bounded against them.
//  - Quantizers pick q against the scale as stored (fp16-rounded), so the
//    round-trip error is at most half a step of the scale the decoder sees.
#include "ggml-like/kernels.h"
#include "ggml-like/blocks_k.h"

#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace gl {

namespace {

[[noreturn]] void unsupported(const char* what, Type t) {
    // A caller bug (types are validated when a model loads); no exceptions in
    // kernels, so stop loudly rather than compute garbage.
    std::fprintf(stderr, "kvrun: internal error: %s for unsupported type %s\n", what, type_name(t));
    std::abort();
}

uint16_t load_u16(const void* p) {
    uint16_t v;
    std::memcpy(&v, p, sizeof v);
    return v;
}

// Through the table: same values as fp16_to_fp32, several times faster in
// the scalar path (F16 weights and KV rows on CPUs without a SIMD table).
float load_fp16(const void* p) {
    return kFp16ToFp32[load_u16(p)];
}

// ---- dequantize ---------------------------------------------------------------

void dequant_f16(const void* src, float* dst, int64_t n) {
    const auto* s = static_cast<const uint8_t*>(src);
    for (int64_t i = 0; i < n; i++) dst[i] = load_fp16(s + 2 * i);
}

void dequant_bf16(const void* src, float* dst, int64_t n) {
    const auto* s = static_cast<const uint8_t*>(src);
    for (int64_t i = 0; i < n; i++) dst[i] = bf16_to_fp32(load_u16(s + 2 * i));
}

void dequant_q8_0(const void* src, float* dst, int64_t n) {
    const auto* b = static_cast<const BlockQ8_0*>(src);
    for (int64_t i = 0; i < n / QK8_0; i++) {
        const float d = fp16_to_fp32(b[i].d);
        for (int j = 0; j < QK8_0; j++) dst[i * QK8_0 + j] = static_cast<float>(b[i].qs[j]) * d;
    }
}

void dequant_q4_0(const void* src, float* dst, int64_t n) {
    const auto* b = static_cast<const BlockQ4_0*>(src);
    for (int64_t i = 0; i < n / QK4_0; i++) {
        const float d = fp16_to_fp32(b[i].d);
        float* out = dst + i * QK4_0;
        for (int j = 0; j < QK4_0 / 2; j++) {
            out[j] = static_cast<float>((b[i].qs[j] & 0x0f) - 8) * d;
            out[j + QK4_0 / 2] = static_cast<float>((b[i].qs[j] >> 4) - 8) * d;
        }
    }
}

// ---- quantize -----------------------------------------------------------------

void quant_f16(const float* src, void* dst, int64_t n) {
    auto* d = static_cast<uint8_t*>(dst);
    for (int64_t i = 0; i < n; i++) {
        const uint16_t h = fp32_to_fp16(src[i]);
        std::memcpy(d + 2 * i, &h, sizeof h);
    }
}

void quant_bf16(const float* src, void* dst, int64_t n) {
    auto* d = static_cast<uint8_t*>(dst);
    for (int64_t i = 0; i < n; i++) {
        const uint16_t h = fp32_to_bf16(src[i]);
        std::memcpy(d + 2 * i, &h, sizeof h);
    }
}

void quantize_block_q8_0(const float* x, BlockQ8_0* out) {
    float amax = 0.0f;
    for (int j = 0; j < QK8_0; j++) amax = std::fmax(amax, std::fabs(x[j]));
    out->d = fp32_to_fp16(amax / 127.0f);
    const float d = fp16_to_fp32(out->d);
    for (int j = 0; j < QK8_0; j++) {
        // roundf: halves away from zero. The clamp only matters when d lost
        // precision as an fp16 subnormal (or was flushed to 0 / overflowed).
        float q = d != 0.0f ? std::round(x[j] / d) : 0.0f;
        q = std::fmin(127.0f, std::fmax(-127.0f, q));
        out->qs[j] = static_cast<int8_t>(q);
    }
}

void quantize_block_q4_0(const float* x, BlockQ4_0* out) {
    // The signed value of largest magnitude maps to q = 0 (i.e. -8 * d), which
    // uses the asymmetric range [-8, 7] fully on the side that needs it.
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < QK4_0; j++) {
        if (std::fabs(x[j]) > amax) {
            amax = std::fabs(x[j]);
            max = x[j];
        }
    }
    out->d = fp32_to_fp16(max / -8.0f);
    const float d = fp16_to_fp32(out->d);
    uint8_t q[QK4_0];
    for (int j = 0; j < QK4_0; j++) {
        // x/d + 8.5 truncated is round-half-up of x/d, offset by 8.
        float v = d != 0.0f ? x[j] / d + 8.5f : 8.0f;
        v = std::fmin(15.0f, std::fmax(0.0f, v));
        q[j] = static_cast<uint8_t>(v);
    }
    for (int j = 0; j < QK4_0 / 2; j++)
        out->qs[j] = static_cast<uint8_t>(q[j] | (q[j + QK4_0 / 2] << 4));
}

void quant_q8_0(const float* src, void* dst, int64_t n) {
    auto* b = static_cast<BlockQ8_0*>(dst);
    for (int64_t i = 0; i < n / QK8_0; i++) quantize_block_q8_0(src + i * QK8_0, b + i);
}

void quant_q4_0(const float* src, void* dst, int64_t n) {
    auto* b = static_cast<BlockQ4_0*>(dst);
    for (int64_t i = 0; i < n / QK4_0; i++) quantize_block_q4_0(src + i * QK4_0, b + i);
}

// F32 rows are floats already, both ways.
void dequant_f32(const void* src, float* dst, int64_t n) {
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
}

void quant_f32(const float* src, void* dst, int64_t n) {
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
}

// ---- dot products ---------------------------------------------------------------

// Plain float weights: w of type F32/F16/BF16 (read through `load`), a is F32.
template <typename Load> float dot_float(int64_t n, const void* w, const float* a, Load load) {
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) sum += static_cast<double>(load(w, i)) * a[i];
    return static_cast<float>(sum);
}

// The block-chain arithmetic (kernels.h's block_chain): exact integer block
// sums, then one float FMA per block in block order. The scale product is
// rounded to float first, as every kernel does.
float chain_step(float y, uint16_t dw, uint16_t da, int32_t isum) {
    return std::fma(fp16_to_fp32(dw) * fp16_to_fp32(da), static_cast<float>(isum), y);
}

float dot_q8_0(int64_t n, const void* w, const void* a) {
    const auto* x = static_cast<const BlockQ8_0*>(w);
    const auto* y = static_cast<const BlockQ8_0*>(a);
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK8_0; i++) {
        int32_t isum = 0;
        for (int j = 0; j < QK8_0; j++) isum += x[i].qs[j] * y[i].qs[j];
        sum = chain_step(sum, x[i].d, y[i].d, isum);
    }
    return sum;
}

float dot_q4_0(int64_t n, const void* w, const void* a) {
    const auto* x = static_cast<const BlockQ4_0*>(w);
    const auto* y = static_cast<const BlockQ8_0*>(a);
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK4_0; i++) {
        int32_t isum = 0;
        for (int j = 0; j < QK4_0 / 2; j++) {
            isum += ((x[i].qs[j] & 0x0f) - 8) * y[i].qs[j];
            isum += ((x[i].qs[j] >> 4) - 8) * y[i].qs[j + QK4_0 / 2];
        }
        sum = chain_step(sum, x[i].d, y[i].d, isum);
    }
    return sum;
}

float load_f32(const void* p, int64_t i) {
    float v;
    std::memcpy(&v, static_cast<const uint8_t*>(p) + 4 * i, sizeof v);
    return v;
}
float load_f16(const void* p, int64_t i) {
    return load_fp16(static_cast<const uint8_t*>(p) + 2 * i);
}
float load_bf16(const void* p, int64_t i) {
    return bf16_to_fp32(load_u16(static_cast<const uint8_t*>(p) + 2 * i));
}

template <typename Load>
void axpy_float(int64_t n, float alpha, const void* x, float* y, Load load) {
    for (int64_t i = 0; i < n; i++) y[i] += alpha * load(x, i);
}

float dot_f32(int64_t n, const void* w, const void* a) {
    return dot_float(n, w, static_cast<const float*>(a), load_f32);
}
float dot_f16(int64_t n, const void* w, const void* a) {
    return dot_float(n, w, static_cast<const float*>(a), load_f16);
}
float dot_bf16(int64_t n, const void* w, const void* a) {
    return dot_float(n, w, static_cast<const float*>(a), load_bf16);
}

// ---- the kernel table -------------------------------------------------------------

struct Row {
    Type type;
    ref::RowKernels k;
};

// The reference kernels of types.h's types; those of blocks_k.h's are in
// ref/quants_k.cpp (ref::kRowKernelsK). A new type adds its row in the file
// that holds its kernels.
constexpr Row kRows[] = {
    {Type::F32, {dequant_f32, quant_f32, dot_f32}},
    {Type::F16, {dequant_f16, quant_f16, dot_f16}},
    {Type::BF16, {dequant_bf16, quant_bf16, dot_bf16}},
    {Type::Q8_0, {dequant_q8_0, quant_q8_0, dot_q8_0}},
    {Type::Q4_0, {dequant_q4_0, quant_q4_0, dot_q4_0}},
};

constexpr std::array<ref::RowKernels, kTypeIdLimit> make_table() {
    std::array<ref::RowKernels, kTypeIdLimit> t{};
    for (const Row& r : kRows) t[static_cast<uint32_t>(r.type)] = r.k;
    return t;
}
constexpr std::array<ref::RowKernels, kTypeIdLimit> kRowKernels = make_table();

constexpr ref::RowKernels kNoKernels = {nullptr, nullptr, nullptr};

// The row of t: this file's if it has one, else quants_k.cpp's (all null
// for a type neither knows, which the callers report).
const ref::RowKernels& kernels(Type t) {
    const auto id = static_cast<uint32_t>(t);
    if (id >= kTypeIdLimit) return kNoKernels;
    return kRowKernels[id].dequantize_row ? kRowKernels[id] : ref::kRowKernelsK[id];
}

} // namespace

namespace ref {

void dequantize_row(Type t, const void* src, float* dst, int64_t n) {
    if (auto f = kernels(t).dequantize_row) return f(src, dst, n);
    unsupported("dequantize_row", t);
}

void quantize_row(Type t, const float* src, void* dst, int64_t n) {
    if (auto f = kernels(t).quantize_row) return f(src, dst, n);
    unsupported("quantize_row", t);
}

float vec_dot(Type weight, int64_t n, const void* w, const void* a) {
    if (auto f = kernels(weight).vec_dot) return f(n, w, a);
    unsupported("vec_dot", weight);
}

void gemm(Type weight, int64_t n, const void* w, size_t row_bytes, int64_t n_rows,
          const Q8Tokens& a, float* y, size_t y_stride) {
    for (int64_t t = 0; t < a.n_tok; t++)
        matvec(weight, n, w, row_bytes, n_rows,
               static_cast<const uint8_t*>(a.rows) + t * a.row_bytes, y + t * y_stride);
}

void matvec(Type weight, int64_t n, const void* w, size_t row_bytes, int64_t n_rows, const void* a,
            float* y) {
    const auto* row = static_cast<const uint8_t*>(w);
    for (int64_t r = 0; r < n_rows; r++) y[r] = vec_dot(weight, n, row + r * row_bytes, a);
}

void axpy(Type x_type, int64_t n, float alpha, const void* x, float* y) {
    switch (x_type) {
    case Type::F32:
        axpy_float(n, alpha, x, y, load_f32);
        return;
    case Type::F16:
        axpy_float(n, alpha, x, y, load_f16);
        return;
    case Type::BF16:
        axpy_float(n, alpha, x, y, load_bf16);
        return;
    default:
        unsupported("axpy", x_type);
    }
}

void dot_rows(Type t, int64_t hd, const void* rows, size_t stride, int64_t n, const float* q,
              float scale, float* out) {
    const auto* r = static_cast<const uint8_t*>(rows);
    for (int64_t i = 0; i < n; i++) out[i] = vec_dot(t, hd, r + i * stride, q) * scale;
}

void axpy_rows(Type t, int64_t hd, const void* rows, size_t stride, int64_t n, const float* w,
               float* y) {
    const auto* r = static_cast<const uint8_t*>(rows);
    for (int64_t i = 0; i < n; i++)
        if (w[i] != 0.0f) axpy(t, hd, w[i], r + i * stride, y);
}

void axpy_heads(Type t, int64_t hd, const void* rows, size_t stride, int64_t n, const float* w,
                size_t w_stride, int nh, float* const* y) {
    for (int j = 0; j < nh; j++) axpy_rows(t, hd, rows, stride, n, w + j * w_stride, y[j]);
}

void rows_to_f32(Type t, int64_t hd, const void* rows, size_t stride, int64_t n, float* dst) {
    const auto* r = static_cast<const uint8_t*>(rows);
    for (int64_t i = 0; i < n; i++) {
        const uint8_t* row = r + i * stride;
        float* d = dst + i * hd;
        switch (t) {
        case Type::F32:
            for (int64_t k = 0; k < hd; k++) d[k] = load_f32(row, k);
            break;
        case Type::F16:
            for (int64_t k = 0; k < hd; k++) d[k] = load_f16(row, k);
            break;
        case Type::BF16:
            for (int64_t k = 0; k < hd; k++) d[k] = load_bf16(row, k);
            break;
        default:
            unsupported("rows_to_f32", t);
        }
    }
}

void dot_tile(Type t, int64_t hd, const void* tile, int width, int lo, int hi, const float* q,
              int nh, float scale, float* out, size_t out_stride) {
    const auto* p = static_cast<const uint8_t*>(tile);
    auto element = [&](int64_t i) {
        switch (t) {
        case Type::F32:
            return load_f32(p, i);
        case Type::F16:
            return load_f16(p, i);
        case Type::BF16:
            return load_bf16(p, i);
        default:
            unsupported("dot_tile", t);
        }
    };
    for (int j = 0; j < nh; j++)
        for (int i = lo; i < hi; i++) {
            double s = 0; // as dot_float: summed in double, rounded once
            for (int64_t k = 0; k < hd; k++)
                s += static_cast<double>(element(k * width + i)) * q[j * hd + k];
            out[j * out_stride + (i - lo)] = static_cast<float>(s) * scale;
        }
}

float exp_sum(float* x, int64_t n, float mx) {
    double sum = 0;
    for (int64_t i = 0; i < n; i++) {
        x[i] = x[i] == -INFINITY ? 0.0f : std::exp(x[i] - mx);
        sum += x[i];
    }
    return static_cast<float>(sum);
}

float max_of(const float* x, int64_t n) {
    float mx = -INFINITY;
    for (int64_t i = 0; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    return mx;
}

} // namespace ref

} // namespace gl
