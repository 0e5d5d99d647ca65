// Row conversions and dot products per type, in two flavours:
//  - gl::ref::*  plain scalar code, the reference every other path is tested against;
//  - gl::cpu::*  the fastest path this CPU has (AVX-512, AVX2, NEON or the scalar one),
//                chosen once at start-up.
//
// A dot product takes a weight row of type W and an activation row of type
// vec_dot_type(W): quantized weights want activations quantized once per matrix
// (Q8_0, Q8_1 or Q8_K: integer dot products), float weights want F32 activations.
#pragma once

#include "ggml-like/kv_layout.h"
#include "ggml-like/tensor.h"
#include "ggml-like/types.h"

namespace gl {

// The activation type a weight type's dot product wants (the type table's
// column; F32 for float weights and for types kvrun cannot compute with).
constexpr Type vec_dot_type(Type weight) {
    return type_info(weight).vec_dot_type;
}

// Prompt activations for a GEMM (KernelTable::gemm): n_tok rows of the
// weight type's activation blocks (Q8_0, Q8_1 or Q8_K), row t at rows + t *
// row_bytes, and for Q8_0 each block's sum of its 32 values at
// sums[t * (n / 32) + b] (the weights' offset term needs it).
struct Q8Tokens {
    const void* rows;
    size_t row_bytes;
    const int32_t* sums;
    int64_t n_tok;
};

// A table's GEMM (KernelTable::gemm): y[t * y_stride + r] for the n_tok
// tokens of `a` and the n_rows rows of w (row_bytes apart, n elements).
using GemmFn = void(int64_t n, const void* w, size_t row_bytes, int64_t n_rows, const Q8Tokens& a,
                    float* y, size_t y_stride, void* scratch);

// ---- weights kept in the GEMM's layout ("packed") -----------------------------------
//
// A packed matrix holds the same values as its rows, in panels of
// kPackedPanelRows rows, so that one vector word carries four consecutive
// weights of each of the panel's rows (lane = row) and a GEMM reads them with
// no per-call repacking: a token's products with sixteen rows cost one
// vpdpbusd per four weights and no horizontal sum. A panel of rows of n
// elements takes kPackedPanelRows * row_size(type, n) bytes, the rows' own
// bytes (rows past a matrix's end are zero): panel p of a matrix starts
// p * kPackedPanelRows rows' bytes in, as row 16 p of the plain matrix does.
// Within a panel its n / 32 blocks come in pairs (the last alone if their
// count is odd), so that a panel is one stream of whole 64-byte lines (but
// where n / 32 is odd, when every other panel starts 32 bytes into one):
// the pair's two blocks' words, then their sixteen fp16 scales each.
//   Q4_0: a block's four 64-byte words (word k, lane r: bytes 4k..4k+3 of qs
//         of row r's block; their low nibbles are elements 4k..4k+3, their
//         high nibbles elements 16+4k..19+4k).
//   Q8_0: a block's eight 64-byte words (word k, lane r: qs[4k..4k+3] of
//         row r, each byte xor 0x80: the unsigned u = q + 128).
// A table's packed GEMM computes exactly the block-chain arithmetic (below),
// as its gemm does: a token's outputs are the same bits whatever its batch,
// one token or many, and the same as ref::gemm's on the plain rows.
inline constexpr int64_t kPackedPanelRows = Tensor::kPanelRows; // 16
constexpr bool packable(Type weight) {
    return weight == Type::Q4_0 || weight == Type::Q8_0;
}
// Bytes of n_rows rows of n elements packed (whole panels).
size_t packed_bytes(Type weight, int64_t n, int64_t n_rows);
// Packs n_rows rows (row_bytes apart) of a packable type into dst
// (packed_bytes of them; 64-byte alignment lets the kernels load whole words).
void pack_rows(Type weight, int64_t n, const void* w, size_t row_bytes, int64_t n_rows, void* dst);
// A table's packed GEMM (KernelTable::gemm_packed): y[t * y_stride + r] for
// the n_tok tokens of `a` and rows r < n_rows of the panels from `panels` on.
using PackedGemmFn = void(int64_t n, const void* panels, int64_t n_rows, const Q8Tokens& a,
                          float* y, size_t y_stride);

// Types whose reference dot product is the block-chain arithmetic: each
// block's products summed exactly in integers (a K-quant's super-block: its
// sub-blocks' sums times their integer scales, and the mins' term apart),
// then y = fma(d_w * d_a, isum, y) block after block in float (Q4_1 then
// y = fma(m_w, s_a, y); K-quants with mins then y = fma(-(dmin_w * d_a),
// msum, y)). A GEMM that computes exactly
// this (KernelTable::gemm, for one token or many, on any ISA with FMA) gives
// a token the same bits whatever its batch, its place in it or the thread
// count. (The tables' own vec_dot and matvec may sum in another order.)
constexpr bool block_chain(Type weight) {
    return weight == Type::Q4_0 || weight == Type::Q8_0 || weight == Type::Q4_1 ||
           weight == Type::Q5_0 || weight == Type::Q5_1 || weight == Type::IQ4_NL ||
           weight == Type::Q2_K || weight == Type::Q3_K || weight == Type::Q4_K ||
           weight == Type::Q5_K || weight == Type::Q6_K;
}

// Bytes of scratch one caller of KernelTable::gemm needs for rows of n
// elements: two panels of kGemmPanelBlockBytes per 32 elements (the x86
// layout of Q2_K, the largest any table uses) and alignment slack.
inline constexpr size_t kGemmPanelBlockBytes = 720;
constexpr size_t gemm_scratch_bytes(int64_t n) {
    return 2 * static_cast<size_t>(n / 32) * kGemmPanelBlockBytes + 64;
}

namespace ref {
// n elements; n is a multiple of the block size. Supported types only.
void dequantize_row(Type t, const void* src, float* dst, int64_t n);
void quantize_row(Type t, const float* src, void* dst, int64_t n); // compute and activation types
// sum_i w[i] * a[i], with w of type `weight` and a of type vec_dot_type(weight)
float vec_dot(Type weight, int64_t n, const void* w, const void* a);
// y[r] = vec_dot(weight, n, w + r * row_bytes, a) for r in [0, n_rows): a
// matrix-vector product over consecutive rows sharing one activation row.
void matvec(Type weight, int64_t n, const void* w, size_t row_bytes, int64_t n_rows, const void* a,
            float* y);
// y[t * y_stride + r] = vec_dot(weight, n, row r, token t) for r < n_rows, t < a.n_tok.
void gemm(Type weight, int64_t n, const void* w, size_t row_bytes, int64_t n_rows,
          const Q8Tokens& a, float* y, size_t y_stride);
// y[i] += alpha * x[i] for x of type F32, F16 or BF16 (used to accumulate V rows)
void axpy(Type x_type, int64_t n, float alpha, const void* x, float* y);

// Attention over n cached rows of a float type (F32, F16, BF16), `stride`
// bytes apart, each starting at the head's first element:
//   dot_rows:  out[i] = scale * dot(row i, q[0..hd))
//   axpy_rows: y[0..hd) += sum_i w[i] * row i
void dot_rows(Type t, int64_t hd, const void* rows, size_t stride, int64_t n, const float* q,
              float scale, float* out);
void axpy_rows(Type t, int64_t hd, const void* rows, size_t stride, int64_t n, const float* w,
               float* y);
// For each of nh heads j: y[j][0..hd) += sum_i w[j * w_stride + i] * row i,
// n rows of a float type `stride` bytes apart (the rows are read once for all
// heads).
void axpy_heads(Type t, int64_t hd, const void* rows, size_t stride, int64_t n, const float* w,
                size_t w_stride, int nh, float* const* y);
// dst[i * hd + k] = element k of row i, as float: n rows of a float type
// (F32, F16, BF16) made one contiguous F32 tile.
void rows_to_f32(Type t, int64_t hd, const void* rows, size_t stride, int64_t n, float* dst);
// Scores of up to kKeyTileHeads query heads over one key tile (see
// key_tile_index): for heads j < nh and keys i in [lo, hi) of the tile's
// `width` keys, out[j * out_stride + i - lo] = scale * dot(key i, q + j * hd).
void dot_tile(Type t, int64_t hd, const void* tile, int width, int lo, int hi, const float* q,
              int nh, float scale, float* out, size_t out_stride);
// x[i] = exp(x[i] - mx) (exactly 0 where x[i] is -inf); returns the sum.
float exp_sum(float* x, int64_t n, float mx);
// Largest of x[0..n) (NaNs ignored), -inf when n == 0 or nothing is larger.
float max_of(const float* x, int64_t n);
// One token's gated-delta-rule step for one value head (Gated DeltaNet): the
// state s (d_v rows of d_k floats) is decayed, then per row j
//   d = (v[j] - s_j . k) * beta;  s_j += d k;  o[j] = (s_j . q) * scale.
void delta_rule(float* s, int64_t d_v, int64_t d_k, const float* k, const float* q, const float* v,
                float decay, float beta, float scale, float* o);
} // namespace ref

// One ISA's kernels; a null member means "use the reference".
struct KernelTable {
    const char* isa; // "scalar", "avx2", "avx512", "neon"
    float (*vec_dot[kTypeIdLimit])(int64_t n, const void* w, const void* a);
    void (*quantize_row[kTypeIdLimit])(const float* src, void* dst, int64_t n); // activation types
    void (*dequantize_row[kTypeIdLimit])(const void* src, float* dst, int64_t n);
    void (*axpy[kTypeIdLimit])(int64_t n, float alpha, const void* x, float* y);
    // Attention kernels (see ref::dot_rows, ref::axpy_rows, ref::exp_sum).
    void (*dot_rows[kTypeIdLimit])(int64_t hd, const void* rows, size_t stride, int64_t n,
                                   const float* q, float scale, float* out);
    void (*axpy_rows[kTypeIdLimit])(int64_t hd, const void* rows, size_t stride, int64_t n,
                                    const float* w, float* y);
    void (*rows_to_f32[kTypeIdLimit])(int64_t hd, const void* rows, size_t stride, int64_t n,
                                      float* dst);
    void (*axpy_heads[kTypeIdLimit])(int64_t hd, const void* rows, size_t stride, int64_t n,
                                     const float* w, size_t w_stride, int nh, float* const* y);
    void (*dot_tile[kTypeIdLimit])(int64_t hd, const void* tile, int width, int lo, int hi,
                                   const float* q, int nh, float scale, float* out,
                                   size_t out_stride);
    float (*exp_sum)(float* x, int64_t n, float mx);
    float (*max_of)(const float* x, int64_t n);
    void (*delta_rule)(float* s, int64_t d_v, int64_t d_k, const float* k, const float* q,
                       const float* v, float decay, float beta, float scale, float* o);
    // Several rows at once (see ref::matvec), where sharing the activation
    // between rows pays; null means a vec_dot per row.
    void (*matvec[kTypeIdLimit])(int64_t n, const void* w, size_t row_bytes, int64_t n_rows,
                                 const void* a, float* y);
    // Any number of tokens at once, bit-identical to ref::gemm (the
    // block-chain arithmetic): block-chain types only. `scratch` holds
    // gemm_scratch_bytes(n) bytes, any alignment; null: no GEMM.
    GemmFn* gemm[kTypeIdLimit];
    // The same on packed weights (packable types; null: none).
    PackedGemmFn* gemm_packed[kTypeIdLimit];
};

// Kernel tables compiled into this binary and usable on this CPU, best first;
// the last one is always the scalar reference table. Tests run each against ref.
int kernel_table_count();
const KernelTable& kernel_table(int i);

namespace cpu {
// Dispatched to the best table (kernel_table(0)); falls back to ref per entry.
const char* isa_name();
float vec_dot(Type weight, int64_t n, const void* w, const void* a);
void matvec(Type weight, int64_t n, const void* w, size_t row_bytes, int64_t n_rows, const void* a,
            float* y);
// Whether the active table has a GEMM kernel for this weight type.
bool has_gemm(Type weight);
// The active table's GEMM; requires has_gemm(weight).
void gemm(Type weight, int64_t n, const void* w, size_t row_bytes, int64_t n_rows,
          const Q8Tokens& a, float* y, size_t y_stride, void* scratch);
// Whether the active table has a GEMM on packed weights of this type.
bool has_packed_gemm(Type weight);
// The active table's packed GEMM; requires has_packed_gemm(weight).
void gemm_packed(Type weight, int64_t n, const void* panels, int64_t n_rows, const Q8Tokens& a,
                 float* y, size_t y_stride);
void quantize_row(Type t, const float* src, void* dst, int64_t n);
void dequantize_row(Type t, const void* src, float* dst, int64_t n);
void axpy(Type x_type, int64_t n, float alpha, const void* x, float* y);
void dot_rows(Type t, int64_t hd, const void* rows, size_t stride, int64_t n, const float* q,
              float scale, float* out);
void axpy_rows(Type t, int64_t hd, const void* rows, size_t stride, int64_t n, const float* w,
               float* y);
void rows_to_f32(Type t, int64_t hd, const void* rows, size_t stride, int64_t n, float* dst);
void axpy_heads(Type t, int64_t hd, const void* rows, size_t stride, int64_t n, const float* w,
                size_t w_stride, int nh, float* const* y);
void dot_tile(Type t, int64_t hd, const void* tile, int width, int lo, int hi, const float* q,
              int nh, float scale, float* out, size_t out_stride);
// Whether the active table has an axpy_heads kernel for rows of type t (the
// fallback for F16/BF16 is the reference loop: widen them to an F32 tile
// first instead).
bool has_axpy_heads(Type t);
float exp_sum(float* x, int64_t n, float mx);
float max_of(const float* x, int64_t n);
void delta_rule(float* s, int64_t d_v, int64_t d_k, const float* k, const float* q, const float* v,
                float decay, float beta, float scale, float* o);
// Force the scalar table (KVRUN_ISA=scalar in the environment does the same).
void force_scalar(bool on);
} // namespace cpu

} // namespace gl
