// Element access for every weight and KV type, written once for both sides:
// the CUDA kernels call these on the device, and tests/test_cuda.cpp calls the
// very same functions on the host and checks them bit for bit against
// gl::ref (ref/quants.cpp / ref/quants_k.cpp) -- so the block layouts, the
// part most easily got wrong, are tested even on machines without a GPU.
//
// Layouts are read through byte offsets (not the structs of blocks_k.h) so
// this header needs nothing but <cstdint>; the offsets are the GGUF layouts
// documented in types.h and blocks_k.h, and the test asserts they agree with
// offsetof() on those structs. The arithmetic mirrors the reference exactly
// (same products, same fused multiply-add), so results are identical.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "ggml-like/types.h"

#if defined(__CUDACC__)
#include <cuda_fp16.h>
#define GL_HD __host__ __device__ __forceinline__
#define GL_HD_CONSTEXPR __host__ __device__ constexpr
#else
#define GL_HD inline
#define GL_HD_CONSTEXPR constexpr
#endif

namespace gl::cuda {

// ---- scalar loads and conversions ---------------------------------------------

// p is 2-byte aligned everywhere these are used (every block size is even and
// rows start at even offsets); the host path assembles bytes anyway.
GL_HD uint16_t ld_u16(const uint8_t* p) {
#if defined(__CUDA_ARCH__)
    return *reinterpret_cast<const uint16_t*>(p);
#else
    return static_cast<uint16_t>(p[0] | (p[1] << 8));
#endif
}

GL_HD uint32_t ld_u32_bytes(const uint8_t* p) { // any alignment
    return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
           (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
}

GL_HD float u32_as_f32(uint32_t u) {
#if defined(__CUDA_ARCH__)
    return __uint_as_float(u);
#else
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
#endif
}

GL_HD uint32_t f32_as_u32(float f) {
#if defined(__CUDA_ARCH__)
    return __float_as_uint(f);
#else
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    return u;
#endif
}

GL_HD float ld_f32(const uint8_t* p) {
#if defined(__CUDA_ARCH__)
    return *reinterpret_cast<const float*>(p);
#else
    float f;
    std::memcpy(&f, p, sizeof f);
    return f;
#endif
}

// Exact (every half is a float), so both paths give the same bits.
GL_HD float half_to_f32(uint16_t h) {
#if defined(__CUDA_ARCH__)
    return __half2float(__ushort_as_half(h));
#else
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0x1f) return u32_as_f32(sign | 0x7f800000u | (man << 13));
    if (exp != 0) return u32_as_f32(sign | ((exp + 112) << 23) | (man << 13));
    if (man == 0) return u32_as_f32(sign);
    exp = 113;
    while (!(man & 0x400u)) {
        man <<= 1;
        exp--;
    }
    return u32_as_f32(sign | (exp << 23) | ((man & 0x3ffu) << 13));
#endif
}

GL_HD float bf16_to_f32(uint16_t h) {
    return u32_as_f32(static_cast<uint32_t>(h) << 16);
}

// Same rounding (nearest even) and NaN handling as gl::fp32_to_fp16, on both
// sides, so a KV row converted on the GPU has the CPU's bytes.
GL_HD uint16_t f32_to_half(float f) {
    const uint32_t x = f32_as_u32(f);
    const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
    const uint32_t a = x & 0x7fffffffu;
    if (a >= 0x7f800000u) {
        if (a == 0x7f800000u) return static_cast<uint16_t>(sign | 0x7c00u);
        return static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    }
    if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);
    if (a >= 0x38800000u) {
        uint32_t h = (a >> 13) - (112u << 10);
        const uint32_t rest = a & 0x1fffu;
        if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++;
        return static_cast<uint16_t>(sign | h);
    }
    if (a <= 0x33000000u) return sign;
    const uint32_t e = a >> 23;
    const uint32_t m = (a & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - e;
    uint32_t q = m >> shift;
    const uint32_t rest = m & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rest > half || (rest == half && (q & 1u))) q++;
    return static_cast<uint16_t>(sign | q);
}

GL_HD uint16_t f32_to_bf16(float f) {
    const uint32_t x = f32_as_u32(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
    return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

GL_HD float fma_f(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
    return __fmaf_rn(a, b, c);
#else
    return __builtin_fmaf(a, b, c);
#endif
}

GL_HD int iq4nl_level(int q) {
    // The IQ4_NL codebook (blocks_k.h kIQ4NL), as a switch so the device needs no table.
    switch (q) {
    case 0:
        return -127;
    case 1:
        return -104;
    case 2:
        return -83;
    case 3:
        return -65;
    case 4:
        return -49;
    case 5:
        return -35;
    case 6:
        return -22;
    case 7:
        return -10;
    case 8:
        return 1;
    case 9:
        return 13;
    case 10:
        return 25;
    case 11:
        return 38;
    case 12:
        return 53;
    case 13:
        return 69;
    case 14:
        return 89;
    default:
        return 113;
    }
}

// ---- the types the CUDA matmul reads --------------------------------------------

GL_HD_CONSTEXPR uint32_t tid(Type t) {
    return static_cast<uint32_t>(t);
}

// Block elements and block bytes, from the type table (types.h): the matmul
// instantiates its kernels for every type of GL_COMPUTE_TYPES.
template <uint32_t T> struct TypeTraits {
    static_assert(type_info(T).supported, "TypeTraits: not a compute type");
    static constexpr int block = static_cast<int>(type_info(T).block_size);
    static constexpr int bytes = static_cast<int>(type_info(T).type_size);
};

template <uint32_t T> GL_HD_CONSTEXPR bool is_float_type() {
    return TypeTraits<T>::block == 1;
}

// Eight bytes at p, which is 2-byte aligned (every block size and every
// offset of an 8-byte group in a block is even), as one little-endian word.
// On the device that is four 16-bit loads instead of eight byte loads: the
// decode matvec is bound by load instructions, not by DRAM.
GL_HD uint64_t ld8_a2(const uint8_t* p) {
#if defined(__CUDA_ARCH__)
    const auto* h = reinterpret_cast<const uint16_t*>(p);
    return static_cast<uint64_t>(h[0]) | (static_cast<uint64_t>(h[1]) << 16) |
           (static_cast<uint64_t>(h[2]) << 32) | (static_cast<uint64_t>(h[3]) << 48);
#else
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= static_cast<uint64_t>(p[i]) << (8 * i);
    return v;
#endif
}

// Byte i of a word from ld8_a2.
GL_HD int byte_of(uint64_t v, int i) {
    return static_cast<int>((v >> (8 * i)) & 0xffu);
}

// Scale j and min j (0..7) of the 12-byte 6-bit packing of Q4_K/Q5_K.
GL_HD void scale_min_k4(const uint8_t* s, int j, int* sc, int* m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

// Q3_K's sixteen 6-bit scales, as stored (0..63, offset 32).
GL_HD int scale_k3(const uint8_t* s, int j) {
    const int lo = j < 8 ? (s[j] & 0x0f) : (s[j - 8] >> 4);
    const int hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
    return lo | (hi << 4);
}

// Elements k0 .. k0 + 7 of a row of type T (k0 a multiple of 8, all inside
// the row). Eight elements never straddle a block, a sub-block or a scale.
template <uint32_t T> GL_HD void dequant8(const uint8_t* row, int64_t k0, float* o) {
    constexpr int BS = TypeTraits<T>::block;
    constexpr int BB = TypeTraits<T>::bytes;
    if constexpr (T == tid(Type::F32)) {
        for (int i = 0; i < 8; i++) o[i] = ld_f32(row + 4 * (k0 + i));
    } else if constexpr (T == tid(Type::F16)) {
        for (int i = 0; i < 8; i++) o[i] = half_to_f32(ld_u16(row + 2 * (k0 + i)));
    } else if constexpr (T == tid(Type::BF16)) {
        for (int i = 0; i < 8; i++) o[i] = bf16_to_f32(ld_u16(row + 2 * (k0 + i)));
    } else {
        const uint8_t* b = row + (k0 / BS) * BB;
        const int j = static_cast<int>(k0 % BS); // first element within the block
        if constexpr (T == tid(Type::Q8_0)) {
            const float d = half_to_f32(ld_u16(b));
            const uint64_t v = ld8_a2(b + 2 + j);
            for (int i = 0; i < 8; i++)
                o[i] = static_cast<float>(static_cast<int8_t>(byte_of(v, i))) * d;
        } else if constexpr (T == tid(Type::Q4_0) || T == tid(Type::IQ4_NL)) {
            const float d = half_to_f32(ld_u16(b));
            const uint8_t* qs = b + 2;
            const int sh = j < 16 ? 0 : 4, o0 = j & 15;
            const uint64_t v = ld8_a2(qs + o0);
            for (int i = 0; i < 8; i++) {
                const int q = (byte_of(v, i) >> sh) & 0x0f;
                if constexpr (T == tid(Type::Q4_0))
                    o[i] = static_cast<float>(q - 8) * d;
                else
                    o[i] = fma_f(d, static_cast<float>(iq4nl_level(q)), -0.0f);
            }
        } else if constexpr (T == tid(Type::Q4_1)) {
            const float d = half_to_f32(ld_u16(b)), m = half_to_f32(ld_u16(b + 2));
            const uint8_t* qs = b + 4;
            const int sh = j < 16 ? 0 : 4, o0 = j & 15;
            const uint64_t v = ld8_a2(qs + o0);
            for (int i = 0; i < 8; i++)
                o[i] = fma_f(d, static_cast<float>((byte_of(v, i) >> sh) & 0x0f), m);
        } else if constexpr (T == tid(Type::Q5_0) || T == tid(Type::Q5_1)) {
            constexpr bool has_min = T == tid(Type::Q5_1);
            const float d = half_to_f32(ld_u16(b));
            const float m = has_min ? half_to_f32(ld_u16(b + 2)) : -0.0f;
            const uint32_t qh = ld_u32_bytes(b + (has_min ? 4 : 2));
            const uint8_t* qs = b + (has_min ? 8 : 6);
            const int sh = j < 16 ? 0 : 4, o0 = j & 15;
            const uint64_t v = ld8_a2(qs + o0);
            for (int i = 0; i < 8; i++) {
                int q =
                    ((byte_of(v, i) >> sh) & 0x0f) | (static_cast<int>((qh >> (j + i)) & 1u) << 4);
                if constexpr (!has_min) q -= 16;
                o[i] = fma_f(d, static_cast<float>(q), m);
            }
        } else if constexpr (T == tid(Type::Q4_K) || T == tid(Type::Q5_K)) {
            constexpr bool five = T == tid(Type::Q5_K);
            const float d = half_to_f32(ld_u16(b)), dmin = half_to_f32(ld_u16(b + 2));
            const uint8_t* scales = b + 4;
            const uint8_t* qh = b + 16;
            const uint8_t* qs = b + (five ? 48 : 16);
            const int sub = j / 32, c = j / 64, l = j % 32, sh = 4 * (sub & 1);
            int sc, m;
            scale_min_k4(scales, sub, &sc, &m);
            const float dl = d * static_cast<float>(sc), ml = dmin * static_cast<float>(m);
            const uint64_t v = ld8_a2(qs + 32 * c + l);
            const uint64_t vh = five ? ld8_a2(qh + l) : 0;
            for (int i = 0; i < 8; i++) {
                int q = (byte_of(v, i) >> sh) & 0x0f;
                if constexpr (five) q |= ((byte_of(vh, i) >> sub) & 1) << 4;
                o[i] = fma_f(dl, static_cast<float>(q), -ml);
            }
        } else if constexpr (T == tid(Type::Q6_K)) {
            const uint8_t* ql = b;
            const uint8_t* qh = b + 128;
            const auto* scales = reinterpret_cast<const int8_t*>(b + 192);
            const float d = half_to_f32(ld_u16(b + 208));
            const int h = j / 128, k = (j % 128) / 32, l = j % 32;
            const float dl = d * static_cast<float>(scales[8 * h + 2 * k + l / 16]);
            const uint64_t vl = ld8_a2(ql + 64 * h + l + 32 * (k & 1)),
                           vh = ld8_a2(qh + 32 * h + l);
            for (int i = 0; i < 8; i++) {
                const int low = (byte_of(vl, i) >> (4 * (k >> 1))) & 0x0f;
                const int high = (byte_of(vh, i) >> (2 * k)) & 3;
                o[i] = fma_f(dl, static_cast<float>((low | (high << 4)) - 32), -0.0f);
            }
        } else if constexpr (T == tid(Type::Q2_K)) {
            const uint8_t* qs = b + 16;
            const float d = half_to_f32(ld_u16(b + 80)), dmin = half_to_f32(ld_u16(b + 82));
            const int h = j / 128, k = (j % 128) / 32, l = j % 32;
            const int s = b[j / 16];
            const float dl = d * static_cast<float>(s & 0x0f),
                        ml = dmin * static_cast<float>(s >> 4);
            const uint64_t v = ld8_a2(qs + 32 * h + l);
            for (int i = 0; i < 8; i++)
                o[i] = fma_f(dl, static_cast<float>((byte_of(v, i) >> (2 * k)) & 3), -ml);
        } else if constexpr (T == tid(Type::Q3_K)) {
            const uint8_t* hmask = b;
            const uint8_t* qs = b + 32;
            const float d = half_to_f32(ld_u16(b + 108));
            const int h = j / 128, k = (j % 128) / 32, l = j % 32;
            const float dl = d * static_cast<float>(scale_k3(b + 96, j / 16) - 32);
            const uint64_t v = ld8_a2(qs + 32 * h + l), vm = ld8_a2(hmask + l);
            for (int i = 0; i < 8; i++) {
                const int lo = (byte_of(v, i) >> (2 * k)) & 3;
                const int hi = (byte_of(vm, i) >> (j / 32)) & 1;
                o[i] = fma_f(dl, static_cast<float>((lo | (hi << 2)) - 4), -0.0f);
            }
        } else {
            static_assert(T == tid(Type::F32), "dequant8: type without a CUDA path");
        }
    }
}

// One element of a float-type row (the tail of a row whose length is not a
// multiple of 8; block types never have one).
template <uint32_t T> GL_HD float load1(const uint8_t* row, int64_t k) {
    if constexpr (T == tid(Type::F32))
        return ld_f32(row + 4 * k);
    else if constexpr (T == tid(Type::F16))
        return half_to_f32(ld_u16(row + 2 * k));
    else if constexpr (T == tid(Type::BF16))
        return bf16_to_f32(ld_u16(row + 2 * k));
    else
        return 0.0f;
}

// ---- KV rows: element e of a row (any e; heads may start mid-block) ---------------

template <uint32_t T> GL_HD float kv_elem_of(const uint8_t* row, int64_t e) {
    if constexpr (T == tid(Type::F32)) {
        return ld_f32(row + 4 * e);
    } else if constexpr (T == tid(Type::F16)) {
        return half_to_f32(ld_u16(row + 2 * e));
    } else if constexpr (T == tid(Type::BF16)) {
        return bf16_to_f32(ld_u16(row + 2 * e));
    } else if constexpr (T == tid(Type::Q8_0)) {
        const uint8_t* b = row + (e / 32) * 34;
        return static_cast<float>(static_cast<int8_t>(b[2 + e % 32])) * half_to_f32(ld_u16(b));
    } else if constexpr (T == tid(Type::Q4_0)) {
        const uint8_t* b = row + (e / 32) * 18;
        const int j = static_cast<int>(e % 32);
        const int q = (b[2 + (j & 15)] >> (j < 16 ? 0 : 4)) & 0x0f;
        return static_cast<float>(q - 8) * half_to_f32(ld_u16(b));
    } else {
        // A type added to GL_KV_TYPES needs its element reader here.
        static_assert(T == tid(Type::F32), "kv_elem: KV type without a CUDA path");
        return 0.0f;
    }
}

// The switch is generated from GL_KV_TYPES, so every KV type the host accepts
// (kv_type_ok) has a case, and a missing reader fails to compile above.
GL_HD float kv_elem(Type t, const uint8_t* row, int64_t e) {
    switch (t) {
#define GL_CASE(T)                                                                                 \
    case Type::T:                                                                                  \
        return kv_elem_of<tid(Type::T)>(row, e);
        GL_KV_TYPES(GL_CASE)
#undef GL_CASE
    default:
        return 0.0f; // rejected by the host before any launch
    }
}

inline bool kv_type_ok(Type t) {
    return type_info(t).kv_cache;
}

// ---- KV row quantizers (convert_rows), same arithmetic as ref/quants.cpp ------------

GL_HD void quantize_block_q8_0(const float* x, uint8_t* out) {
    float amax = 0.0f;
    for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
    const uint16_t dh = f32_to_half(amax / 127.0f);
    out[0] = static_cast<uint8_t>(dh & 0xff);
    out[1] = static_cast<uint8_t>(dh >> 8);
    const float d = half_to_f32(dh);
    for (int j = 0; j < 32; j++) {
        float q = d != 0.0f ? roundf(x[j] / d) : 0.0f;
        q = fminf(127.0f, fmaxf(-127.0f, q));
        out[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(q));
    }
}

GL_HD void quantize_block_q4_0(const float* x, uint8_t* out) {
    float amax = 0.0f, mx = 0.0f;
    for (int j = 0; j < 32; j++) {
        if (fabsf(x[j]) > amax) {
            amax = fabsf(x[j]);
            mx = x[j];
        }
    }
    const uint16_t dh = f32_to_half(mx / -8.0f);
    out[0] = static_cast<uint8_t>(dh & 0xff);
    out[1] = static_cast<uint8_t>(dh >> 8);
    const float d = half_to_f32(dh);
    uint8_t q[32];
    for (int j = 0; j < 32; j++) {
        float v = d != 0.0f ? x[j] / d + 8.5f : 8.0f;
        v = fminf(15.0f, fmaxf(0.0f, v));
        q[j] = static_cast<uint8_t>(v);
    }
    for (int j = 0; j < 16; j++) out[2 + j] = static_cast<uint8_t>(q[j] | (q[j + 16] << 4));
}

// ---- attention: which keys a query sees (attention.h) ---------------------------------

enum KeyKind : int { kHidden = 0, kKey = 1, kShiftedSink = 2 };

// Slot holding position sp (-1 = empty) for a query at position p.
GL_HD int slot_kind(int64_t sp, int64_t p, int n_ctx, int n_sink, int64_t window) {
    if (sp < 0) return kHidden;
    const bool slid = p >= n_ctx;
    const int64_t lo = slid ? p - window + 1 : 0;
    if (sp < n_sink && slid) return kShiftedSink;
    return (sp < n_sink || sp >= lo) ? kKey : kHidden;
}

// The batch's own key u (position up) for query t (position p); u <= t only.
GL_HD int batch_kind(int u, int t, int64_t up, int64_t p, int n_ctx, int n_sink, int64_t window) {
    if (u > t) return kHidden;
    const int64_t lo = p >= n_ctx ? p - window + 1 : 0;
    return (up >= lo || up < n_sink) ? kKey : kHidden;
}

} // namespace gl::cuda
