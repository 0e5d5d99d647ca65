#include "ggml-like/cpu/ops.h"

#include <algorithm>
#include <cctype>
#include <cmath>

#include "ggml-like/cpu/gemm.h"
#include "ggml-like/kernels.h"

namespace gl::ops {

void rmsnorm(const float* x, const float* w, int64_t n, float eps, float* out) {
    double ss = 0; // double: a row of 4096 squares loses digits in float
    for (int64_t i = 0; i < n; i++) ss += static_cast<double>(x[i]) * x[i];
    const float scale = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(n) + eps));
    for (int64_t i = 0; i < n; i++) out[i] = x[i] * scale * w[i];
}

void softmax(float* x, int64_t n) {
    float mx = -INFINITY;
    for (int64_t i = 0; i < n; i++) mx = std::max(mx, x[i]);
    double sum = 0;
    for (int64_t i = 0; i < n; i++) {
        x[i] = std::exp(x[i] - mx);
        sum += x[i];
    }
    const float inv = static_cast<float>(1.0 / sum);
    for (int64_t i = 0; i < n; i++) x[i] *= inv;
}

void gelu_mul(float* gate, const float* up, int64_t n) {
    // 0.5 x (1 + tanh(u)) written as x / (1 + exp(-2u)): the same function,
    // without the cancellation of 1 + tanh(u) near -1 (7e-5 relative error in
    // float at x = -4, against 2e-7 this way).
    constexpr float k2Sqrt2OverPi = 1.5957691216057308f;
    for (int64_t i = 0; i < n; i++) {
        const float x = gate[i];
        gate[i] = x / (1.0f + std::exp(-k2Sqrt2OverPi * (x + 0.044715f * x * x * x))) * up[i];
    }
}

void silu_mul(float* gate, const float* up, int64_t n) {
    // exp(-g) a chunk at a time through the vectorised kernel (cpu::exp_sum
    // with max 0 computes exp in place; its sum is not needed).
    constexpr int64_t kChunk = 256;
    float e[kChunk];
    for (int64_t b = 0; b < n; b += kChunk) {
        const int64_t m = std::min(kChunk, n - b);
        for (int64_t i = 0; i < m; i++) e[i] = -gate[b + i];
        cpu::exp_sum(e, m, 0.0f);
        for (int64_t i = 0; i < m; i++) gate[b + i] = gate[b + i] / (1.0f + e[i]) * up[b + i];
    }
}

void add(float* y, const float* x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += x[i];
}

void rope_angles(double pos, int n_pairs, const double* inv_freq, float* cos_out, float* sin_out) {
    for (int i = 0; i < n_pairs; i++) {
        double a = pos * inv_freq[i];
        cos_out[i] = static_cast<float>(std::cos(a));
        sin_out[i] = static_cast<float>(std::sin(a));
    }
}

void rope(float* x, int n_heads, int head_dim, int rope_dims, const float* cos, const float* sin,
          bool neox) {
    const int half = rope_dims / 2;
    for (int h = 0; h < n_heads; h++) {
        float* v = x + static_cast<int64_t>(h) * head_dim;
        for (int i = 0; i < half; i++) {
            const int a = neox ? i : 2 * i;
            const int b = neox ? i + half : 2 * i + 1;
            const float x0 = v[a], x1 = v[b];
            v[a] = x0 * cos[i] - x1 * sin[i];
            v[b] = x0 * sin[i] + x1 * cos[i];
        }
    }
}

namespace {

// Quantized activation rows of n_in elements (type at), then, for the integer
// GEMM, each Q8_0 block's sum, then one GEMM scratch per thread.
struct ActivationLayout {
    size_t row_bytes, rows_bytes, sums_bytes, gemm_bytes;
    ActivationLayout(Type at, int64_t n_in, int64_t n_tok, bool int8)
        : row_bytes(at == Type::F32 ? 0 : row_size(at, n_in)),
          rows_bytes(align64(row_bytes * static_cast<size_t>(n_tok))),
          sums_bytes(int8 && at == Type::Q8_0
                         ? align64(sizeof(int32_t) * static_cast<size_t>(n_in / 32 * n_tok))
                         : 0),
          gemm_bytes(int8 ? align64(gemm_scratch_bytes(n_in)) : 0) {}
    static size_t align64(size_t b) { return (b + 63) / 64 * 64; }
    size_t total(int n_threads) const {
        return rows_bytes + sums_bytes + gemm_bytes * static_cast<size_t>(n_threads);
    }
};

// Whether the integer GEMM is the default for prompts of this type (it
// always is in the invariant mode). Measured on the real models' goldens
// (../shared/golden-real, max |logit - F32 reference|): SmolLM2's Q4_1
// matrices with 8-bit activations 0.65-0.94, past the reference engine's own
// 0.38-0.83 on those files, and its chat answer changes; with F32 activations
// (OpenBLAS) 0.15-0.19. So Q4_1 keeps F32 prompts unless batch invariance is
// asked for, and so does Q5_1 (the same min term against Q8_1's fp16 sums;
// no real Q5_1 file to measure). (docs/performance.md, "Prompt precision".)
bool int8_by_default(Type weight) {
    return weight != Type::Q4_1 && weight != Type::Q5_1;
}

bool int8_applies(Type weight, int64_t n_tok, MatmulPaths paths) {
    return paths.int8 &&
           (paths.invariant ||
            (!paths.rows_exact && n_tok >= kInt8MinTokens && int8_by_default(weight))) &&
           block_chain(weight) && cpu::has_gemm(weight);
}

// Each token's row quantized to the activation type (and its block sums).
void quantize_tokens(ThreadPool& pool, Type at, const float* x, int64_t n_in, int64_t n_tok,
                     uint8_t* dst, size_t row_bytes, int32_t* sums) {
    pool.parallel_for(
        n_tok,
        [&](int64_t b, int64_t e, int) {
            for (int64_t t = b; t < e; t++) {
                uint8_t* row = dst + t * row_bytes;
                cpu::quantize_row(at, x + t * n_in, row, n_in);
                if (!sums) continue;
                const auto* blocks = reinterpret_cast<const BlockQ8_0*>(row);
                for (int64_t i = 0; i < n_in / QK8_0; i++) {
                    int32_t s = 0;
                    for (int8_t q : blocks[i].qs) s += q;
                    sums[t * (n_in / QK8_0) + i] = s;
                }
            }
        },
        n_tok * n_in);
}

} // namespace

size_t matmul_scratch_bytes(Type weight, int64_t n_in, int64_t n_tok, int n_threads) {
    const Type at = vec_dot_type(weight);
    // The path is decided per call (paths may be switched off), so room for all.
    const bool int8 = block_chain(weight);
    const size_t dot = ActivationLayout(at, n_in, n_tok, int8).total(n_threads);
    const size_t tiles =
        n_tok >= gemm::kMinTokens ? gemm::scratch_bytes(n_in, n_tok, n_threads) : 0;
    return std::max(dot, tiles);
}

namespace {

enum class BatchPath { Tiles, Int8, Dots, Packed };

// The packed path's chunks start on panels.
static_assert(kGemmRows % kPackedPanelRows == 0);

bool packed_applies(const Tensor& w, MatmulPaths paths) {
    return w.packed && paths.packed && cpu::has_packed_gemm(w.type);
}

BatchPath batch_path(Type weight, int64_t n_in, int64_t n_tok, MatmulPaths paths) {
    // Rows of a larger batch (MatmulPaths::batch_tokens) take its arithmetic:
    // where the batch would take the integer GEMM, its 8-bit activations (the
    // GEMM, or for a few rows the dot products, 8-bit too); where it would
    // take F32 tiles (--precise, types kept on F32 prompts), the tiles.
    const int64_t whole = std::max(n_tok, paths.batch_tokens);
    const bool int8 = int8_applies(weight, n_tok, paths);
    const bool int8_whole = int8_applies(weight, whole, paths);
    const gemm::Path tile_path = paths.tiles && !paths.rows_exact
                                     ? gemm::path_for(weight, n_in, int8_whole ? n_tok : whole)
                                     : gemm::Path::None;
    // AMX tiles before the integer GEMM (faster where they exist); the
    // integer GEMM before OpenBLAS.
    if (tile_path == gemm::Path::Amx || (tile_path != gemm::Path::None && !int8))
        return BatchPath::Tiles;
    return int8 ? BatchPath::Int8 : BatchPath::Dots;
}

} // namespace

std::string batch_path_name(Type weight, int64_t n_in, int64_t n_tok, MatmulPaths paths) {
    switch (batch_path(weight, n_in, n_tok, paths)) {
    case BatchPath::Tiles:
        return gemm::path_name(gemm::path_for(weight, n_in, n_tok));
    case BatchPath::Int8:
        return std::string("int8 gemm (") + cpu::isa_name() + ")";
    case BatchPath::Packed:
    case BatchPath::Dots:
        break;
    }
    return "dot products";
}

std::string batch_path_name(const Tensor& w, int64_t n_tok, MatmulPaths paths) {
    if (packed_applies(w, paths)) return std::string("packed int8 gemm (") + cpu::isa_name() + ")";
    return batch_path_name(w.type, w.ne0, n_tok, paths);
}

std::string batch_paths_summary() {
    const std::string chain = batch_path_name(Type::Q4_0, 4096, 512);
    // F16 has no integer GEMM: it stands for the types that take the rest.
    const std::string rest = batch_path_name(Type::F16, 4096, 512);
    constexpr Type kChainTypes[] = {Type::Q4_0, Type::Q4_1,   Type::Q5_0, Type::Q5_1,
                                    Type::Q8_0, Type::IQ4_NL, Type::Q2_K, Type::Q3_K,
                                    Type::Q4_K, Type::Q5_K,   Type::Q6_K};
    // "Q4_0, Q8_0": the types of kChainTypes that keep(t) takes, as files name them.
    auto names = [&](auto keep) {
        std::string list;
        for (Type t : kChainTypes)
            if (keep(t)) {
                std::string name = type_name(t);
                for (char& c : name)
                    c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
                list += (list.empty() ? "" : ", ") + name;
            }
        return list;
    };
    std::string packed = names([](Type t) { return packable(t) && cpu::has_packed_gemm(t); });
    if (!packed.empty()) packed = " (" + packed + " packed at load: generation too)";
    if (chain == rest) return chain + packed;
    const std::string types = names([&](Type t) { return batch_path_name(t, 4096, 512) == chain; });
    return chain + " for " + types + packed + "; " + rest + " for the rest";
}

void matmul(ThreadPool& pool, const Tensor& w, const float* x, int64_t n_tok, float* y,
            void* scratch, MatmulPaths paths) {
    const BatchPath path =
        packed_applies(w, paths) ? BatchPath::Packed : batch_path(w.type, w.ne0, n_tok, paths);
    if (path == BatchPath::Tiles) {
        const bool int8_whole = int8_applies(w.type, std::max(n_tok, paths.batch_tokens), paths);
        return gemm::matmul_tiles(pool, w, x, n_tok, y, scratch,
                                  int8_whole ? 0 : paths.batch_tokens);
    }
    const bool int8 = path == BatchPath::Int8 || path == BatchPath::Packed;
    const Type at = vec_dot_type(w.type);
    const int64_t n_in = w.ne0, n_out = w.ne1;
    const ActivationLayout lay(at, n_in, n_tok, int8);
    auto* base = static_cast<uint8_t*>(scratch);
    const void* act = x;
    size_t act_row = static_cast<size_t>(n_in) * sizeof(float);
    if (at != Type::F32) {
        // Quantize each activation row once; every weight row then reuses it.
        act_row = lay.row_bytes;
        quantize_tokens(pool, at, x, n_in, n_tok, base, act_row,
                        lay.sums_bytes ? reinterpret_cast<int32_t*>(base + lay.rows_bytes)
                                       : nullptr);
        act = base;
    }
    if (int8) {
        const Q8Tokens tokens{act, act_row, reinterpret_cast<const int32_t*>(base + lay.rows_bytes),
                              n_tok};
        const int64_t n_chunks = (n_out + kGemmRows - 1) / kGemmRows;
        if (path == BatchPath::Packed) {
            pool.parallel_for(
                n_chunks,
                [&](int64_t cb, int64_t ce, int) {
                    const int64_t r0 = cb * kGemmRows, r1 = std::min(n_out, ce * kGemmRows);
                    cpu::gemm_packed(w.type, n_in,
                                     static_cast<const uint8_t*>(w.packed) + r0 * w.row_bytes,
                                     r1 - r0, tokens, y + r0, static_cast<size_t>(n_out));
                },
                n_out * n_in * n_tok);
            return;
        }
        uint8_t* per_thread = base + lay.rows_bytes + lay.sums_bytes;
        pool.parallel_for(
            n_chunks,
            [&](int64_t cb, int64_t ce, int ith) {
                const int64_t r0 = cb * kGemmRows, r1 = std::min(n_out, ce * kGemmRows);
                cpu::gemm(w.type, n_in, w.row(r0), w.row_bytes, r1 - r0, tokens, y + r0,
                          static_cast<size_t>(n_out), per_thread + lay.gemm_bytes * ith);
            },
            n_out * n_in * n_tok);
        return;
    }
    const int64_t n_chunks = (n_out + kRowChunk - 1) / kRowChunk;
    pool.parallel_for(
        n_chunks,
        [&](int64_t cb, int64_t ce, int) {
            for (int64_t c = cb; c < ce; c++) {
                const int64_t r0 = c * kRowChunk, r1 = std::min(n_out, r0 + kRowChunk);
                // token-outer within the chunk: the chunk's weight rows stay in cache
                for (int64_t t = 0; t < n_tok; t++) {
                    const uint8_t* a = static_cast<const uint8_t*>(act) + t * act_row;
                    float* yt = y + t * n_out;
                    cpu::matvec(w.type, n_in, w.row(r0), w.row_bytes, r1 - r0, a, yt + r0);
                }
            }
        },
        n_out * n_in * n_tok);
}

void matvec_group(ThreadPool& pool, const MatvecJob* jobs, int n_jobs, MatvecGroupScratch& group,
                  void* scratch, MatmulPaths paths) {
    group.offset.assign(static_cast<size_t>(n_jobs), MatvecGroupScratch::kNone);
    group.chunks.clear();
    size_t bytes = 0;
    int prev = -1; // the last job whose activations were converted
    int64_t work = 0;
    for (int j = 0; j < n_jobs; j++) {
        const Tensor& w = *jobs[j].w;
        if (packed_applies(w, paths) || batch_path(w.type, w.ne0, 1, paths) != BatchPath::Dots) {
            matmul(pool, w, jobs[j].x, 1, jobs[j].y, scratch, paths);
            continue;
        }
        const Type at = vec_dot_type(w.type);
        if (at != Type::F32) {
            if (prev >= 0 && jobs[prev].x == jobs[j].x && vec_dot_type(jobs[prev].w->type) == at &&
                jobs[prev].w->ne0 == w.ne0) {
                group.offset[j] = group.offset[prev];
            } else {
                group.offset[j] = bytes;
                bytes += ActivationLayout::align64(row_size(at, w.ne0));
                if (group.acts.size() < bytes) group.acts.resize(bytes);
                cpu::quantize_row(at, jobs[j].x, group.acts.data() + group.offset[j], w.ne0);
            }
            prev = j;
        }
        for (int64_t r0 = 0; r0 < w.ne1; r0 += kRowChunk)
            group.chunks.push_back({j, r0, std::min(w.ne1, r0 + kRowChunk)});
        work += w.ne0 * w.ne1;
    }
    const int64_t n_chunks = static_cast<int64_t>(group.chunks.size());
    if (n_chunks == 0) return;
    pool.parallel_for(
        n_chunks,
        [&](int64_t cb, int64_t ce, int) {
            for (int64_t c = cb; c < ce; c++) {
                const MatvecGroupScratch::Chunk& k = group.chunks[c];
                const MatvecJob& job = jobs[k.job];
                const Tensor& w = *job.w;
                const size_t off = group.offset[k.job];
                const void* a = off == MatvecGroupScratch::kNone ? static_cast<const void*>(job.x)
                                                                 : group.acts.data() + off;
                cpu::matvec(w.type, w.ne0, w.row(k.r0), w.row_bytes, k.r1 - k.r0, a, job.y + k.r0);
            }
        },
        work);
}

} // namespace gl::ops
