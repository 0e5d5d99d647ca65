// Prompt attention on AMX tiles (see x86/amx.h): for up to 128 query rows of
// one KV head, an online softmax over blocks of 32 keys, with
//   S (16 rows x 16 keys, fp32 tile) = Q (16 rows x 32 dims) . K^T (32 dims x 16 keys)
//   O (16 rows x 16 dims, fp32 tile) += P (16 rows x 32 keys) . V (32 keys x 16 dims)
// per tile product, each over bf16 pairs. A block's keys and values are
// converted to tiles once and serve every row tile; the softmax between the
// two products runs on AVX-512 over rows of 32 scores.
#include "ggml-like/cpu/x86/amx.h"

#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic ignored "-Wuninitialized" // GCC PR 105593, see x86/avx512.cpp
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "ggml-like/attention.h"
#include "ggml-like/kernels.h"

namespace gl::amx {

namespace {

constexpr int kTileElems = 512; // bf16 in one 16 x 64-byte tile

// f = hi + lo with hi the top 16 bits of f (exact in bf16) and lo the
// remainder (exact in fp32, then rounded to bf16 when packed).
inline void split(__m512 f, __m512& hi, __m512& lo) {
    hi = _mm512_castsi512_ps(
        _mm512_and_si512(_mm512_castps_si512(f), _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
    lo = _mm512_sub_ps(f, hi);
}

// 32 floats (f0 then f1) as 32 bf16 in that order: an A-tile row.
inline __m512i bf16_row(__m512 f0, __m512 f1) {
    return reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(f1, f0));
}

// Two 16-float rows a and b as the pairs (a0, b0), (a1, b1), ...: a B-tile row.
inline __m512i bf16_interleave(__m512 a, __m512 b) {
    alignas(64) static constexpr uint16_t kInterleave[32] = {
        0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
        8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
    return _mm512_permutexvar_epi16(_mm512_load_si512(kInterleave), bf16_row(a, b));
}

// Row `row` of the hi and lo B tiles from two 16-float rows.
inline void put_pairs(__m512 a, __m512 b, uint16_t* hi, uint16_t* lo, int row) {
    __m512 ah, al, bh, bl;
    split(a, ah, al);
    split(b, bh, bl);
    _mm512_store_si512(hi + row * 32, bf16_interleave(ah, bh));
    _mm512_store_si512(lo + row * 32, bf16_interleave(al, bl));
}

inline __m512 load_f16(const uint16_t* p, __mmask16 m) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
}

} // namespace

void attend_rows(const AttnRows& rows, int hd, float scale, const AttnKeys* segs, int n_segs,
                 float* scratch) {
    const int n_ks = hd / 32, n_vc = hd / 16, n_qt = (rows.n + 15) / 16;
    auto* qa = reinterpret_cast<uint16_t*>(scratch); // [qt][ks][hi, lo] tiles
    float* o = scratch + (kAttnRows / 16) * n_ks * kTileElems;
    float* m = o + kAttnRows * hd;
    float* l = m + kAttnRows;
    auto* kb = reinterpret_cast<uint16_t*>(l + kAttnRows); // [kt][ks][hi, lo]
    uint16_t* vb = kb + 2 * n_ks * 2 * kTileElems;         // [c][hi, lo]
    auto* s = reinterpret_cast<float*>(vb + n_vc * 2 * kTileElems);
    auto* pa = reinterpret_cast<uint16_t*>(s + 16 * kAttnBlockKeys); // [hi, lo]
    if (reinterpret_cast<float*>(pa + 2 * kTileElems) > scratch + attention_prompt_floats(hd))
        std::abort(); // the layout above outgrew attention_prompt_floats

    // Scaled queries, split, as A tiles; rows past n are zero.
    const __m512 vscale = _mm512_set1_ps(scale);
    for (int r = 0; r < n_qt * 16; r++)
        for (int ks = 0; ks < n_ks; ks++) {
            uint16_t* hi = qa + ((r / 16 * n_ks + ks) * 2) * kTileElems + (r % 16) * 32;
            uint16_t* lo = hi + kTileElems;
            if (r >= rows.n) {
                _mm512_store_si512(hi, _mm512_setzero_si512());
                _mm512_store_si512(lo, _mm512_setzero_si512());
                continue;
            }
            __m512 h0, l0, h1, l1;
            split(_mm512_mul_ps(_mm512_loadu_ps(rows.q[r] + 32 * ks), vscale), h0, l0);
            split(_mm512_mul_ps(_mm512_loadu_ps(rows.q[r] + 32 * ks + 16), vscale), h1, l1);
            _mm512_store_si512(hi, bf16_row(h0, h1));
            _mm512_store_si512(lo, bf16_row(l0, l1));
        }
    std::memset(o, 0, sizeof(float) * kAttnRows * hd);
    for (int r = 0; r < kAttnRows; r++) {
        m[r] = -INFINITY;
        l[r] = 0;
    }
    int64_t max_row_pos = INT64_MIN;
    for (int r = 0; r < rows.n; r++) max_row_pos = std::max(max_row_pos, rows.pos[r]);

    configure_tiles();
    for (int g = 0; g < n_segs; g++) {
        const AttnKeys& seg = segs[g];
        const int end = std::min(seg.end, seg.n_keys);
        for (int b0 = seg.begin / 16 * 16; b0 < end; b0 += kAttnBlockKeys) {
            // Which of the block's keys exist and are filled, and their positions.
            uint32_t valid = 0;
            int64_t kpos[kAttnBlockKeys], kmax = INT64_MIN;
            for (int j = 0; j < kAttnBlockKeys; j++) {
                const int i = b0 + j;
                kpos[j] = i >= seg.begin && i < end ? seg.pos[i] : -1;
                if (kpos[j] < 0 || kpos[j] > max_row_pos) continue;
                valid |= 1u << j;
                kmax = std::max(kmax, kpos[j]);
            }
            if (!valid) continue;
            // Keys as B tiles (pairs of dimensions x 16 keys); a tile past the
            // keys is zero.
            for (int kt = 0; kt < 2; kt++) {
                const int t0 = b0 + 16 * kt;
                const int w = t0 < seg.n_keys ? key_tile_width(t0, seg.n_keys) : 0;
                const auto wm = static_cast<__mmask16>((1u << w) - 1);
                const uint16_t* tile = seg.k + static_cast<int64_t>(t0) * hd;
                for (int ks = 0; ks < n_ks; ks++) {
                    uint16_t* hi = kb + ((kt * n_ks + ks) * 2) * kTileElems;
                    for (int p = 0; p < 16; p++) {
                        const int d = 32 * ks + 2 * p;
                        const __m512 a = w ? load_f16(tile + d * w, wm) : _mm512_setzero_ps();
                        const __m512 b = w ? load_f16(tile + (d + 1) * w, wm) : _mm512_setzero_ps();
                        put_pairs(a, b, hi, hi + kTileElems, p);
                    }
                }
            }
            // Values as B tiles (pairs of keys x 16 dimensions); keys not
            // valid are zero (a zero weight times a stray NaN is NaN).
            for (int c = 0; c < n_vc; c++) {
                uint16_t* hi = vb + c * 2 * kTileElems;
                for (int p = 0; p < 16; p++) {
                    auto value = [&](int j) {
                        if (!(valid >> j & 1)) return _mm512_setzero_ps();
                        const auto* v =
                            reinterpret_cast<const uint16_t*>(seg.v + (b0 + j) * seg.v_stride);
                        return _mm512_cvtph_ps(
                            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + 16 * c)));
                    };
                    put_pairs(value(2 * p), value(2 * p + 1), hi, hi + kTileElems, p);
                }
            }
            const auto valid_lo = static_cast<__mmask16>(valid),
                       valid_hi = static_cast<__mmask16>(valid >> 16);
            for (int qt = 0; qt < n_qt; qt++) {
                const int r0 = qt * 16;
                // Scores of 16 rows x 32 keys.
                _tile_zero(0);
                _tile_zero(1);
                for (int ks = 0; ks < n_ks; ks++) {
                    const uint16_t* q = qa + ((qt * n_ks + ks) * 2) * kTileElems;
                    _tile_loadd(2, q, 64);
                    _tile_loadd(3, q + kTileElems, 64);
                    const uint16_t* k0 = kb + (ks * 2) * kTileElems;
                    _tile_loadd(4, k0, 64);
                    _tile_loadd(5, k0 + kTileElems, 64);
                    _tile_dpbf16ps(0, 2, 4);
                    _tile_dpbf16ps(0, 2, 5);
                    _tile_dpbf16ps(0, 3, 4);
                    const uint16_t* k1 = kb + ((n_ks + ks) * 2) * kTileElems;
                    _tile_loadd(4, k1, 64);
                    _tile_loadd(5, k1 + kTileElems, 64);
                    _tile_dpbf16ps(1, 2, 4);
                    _tile_dpbf16ps(1, 2, 5);
                    _tile_dpbf16ps(1, 3, 4);
                }
                _tile_stored(0, s, kAttnBlockKeys * sizeof(float));
                _tile_stored(1, s + 16, kAttnBlockKeys * sizeof(float));
                // Online softmax per row; the weights become A tiles.
                for (int rr = 0; rr < 16; rr++) {
                    const int r = r0 + rr;
                    float* sr = s + rr * kAttnBlockKeys;
                    uint16_t* ph = pa + rr * 32;
                    __mmask16 see_lo = valid_lo, see_hi = valid_hi;
                    if (r < rows.n &&
                        kmax > rows.pos[r]) { // the causal edge runs through the block
                        uint32_t see = 0;
                        for (int j = 0; j < kAttnBlockKeys; j++)
                            see |= static_cast<uint32_t>(valid >> j & 1 && kpos[j] <= rows.pos[r])
                                   << j;
                        see_lo = static_cast<__mmask16>(see);
                        see_hi = static_cast<__mmask16>(see >> 16);
                    }
                    const __m512 ninf = _mm512_set1_ps(-INFINITY);
                    const __m512 s0 = _mm512_mask_blend_ps(see_lo, ninf, _mm512_load_ps(sr));
                    const __m512 s1 = _mm512_mask_blend_ps(see_hi, ninf, _mm512_load_ps(sr + 16));
                    const float bm = _mm512_reduce_max_ps(_mm512_max_ps(s0, s1));
                    const float mn = std::max(m[r], bm);
                    if (r >= rows.n || mn == -INFINITY) { // nothing seen yet: weights 0
                        _mm512_store_si512(ph, _mm512_setzero_si512());
                        _mm512_store_si512(ph + kTileElems, _mm512_setzero_si512());
                        continue;
                    }
                    if (mn > m[r]) {
                        const float f = m[r] == -INFINITY ? 0.0f : std::exp(m[r] - mn);
                        float* orow = o + r * hd;
                        for (int d = 0; d < hd; d += 16)
                            _mm512_store_ps(orow + d, _mm512_mul_ps(_mm512_load_ps(orow + d),
                                                                    _mm512_set1_ps(f)));
                        l[r] *= f;
                        m[r] = mn;
                    }
                    _mm512_store_ps(sr, s0);
                    _mm512_store_ps(sr + 16, s1);
                    l[r] += cpu::exp_sum(sr, kAttnBlockKeys, mn);
                    __m512 h0, l0, h1, l1;
                    split(_mm512_load_ps(sr), h0, l0);
                    split(_mm512_load_ps(sr + 16), h1, l1);
                    _mm512_store_si512(ph, bf16_row(h0, h1));
                    _mm512_store_si512(ph + kTileElems, bf16_row(l0, l1));
                }
                // O += P . V, 16 dimensions per tile.
                _tile_loadd(2, pa, 64);
                _tile_loadd(3, pa + kTileElems, 64);
                for (int c = 0; c < n_vc; c++) {
                    float* oc = o + r0 * hd + 16 * c;
                    _tile_loadd(6, oc, hd * sizeof(float));
                    _tile_loadd(4, vb + c * 2 * kTileElems, 64);
                    _tile_loadd(5, vb + c * 2 * kTileElems + kTileElems, 64);
                    _tile_dpbf16ps(6, 2, 4);
                    _tile_dpbf16ps(6, 2, 5);
                    _tile_dpbf16ps(6, 3, 4);
                    _tile_stored(6, oc, hd * sizeof(float));
                }
            }
        }
    }
    _tile_release();
    for (int r = 0; r < rows.n; r++) {
        const float inv = l[r] > 0 ? 1.0f / l[r] : 0.0f;
        for (int d = 0; d < hd; d++) rows.out[r][d] = o[r * hd + d] * inv;
    }
}

} // namespace gl::amx
