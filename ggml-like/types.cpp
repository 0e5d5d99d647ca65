// Name lookups over the type table (types.h) and the scalar half-precision
// conversions.
#include "ggml-like/types.h"

#include <array>
#include <bit>
#include <cstdint>

namespace gl {

namespace {

// "unknown(<id>)" for every id below the limit, built at compile time so
// type_name can hand out a pointer without any buffer of its own.
struct UnknownNames {
    char s[kTypeIdLimit][12];
};
constexpr UnknownNames make_unknown_names() {
    UnknownNames u{};
    for (uint32_t id = 0; id < kTypeIdLimit; id++) {
        const char prefix[] = "unknown(";
        int k = 0;
        for (int i = 0; prefix[i]; i++) u.s[id][k++] = prefix[i];
        if (id >= 10) u.s[id][k++] = static_cast<char>('0' + id / 10);
        u.s[id][k++] = static_cast<char>('0' + id % 10);
        u.s[id][k++] = ')';
        u.s[id][k] = '\0';
    }
    return u;
}
constexpr UnknownNames kUnknownNames = make_unknown_names();

// The KV types' names joined with ", ", built at compile time so the help and
// error texts cannot drift from GL_KV_TYPES.
constexpr size_t kv_type_names_length() {
    size_t n = 0;
    for (Type t : kKvTypes) {
        if (n) n += 2;
        for (const char* p = type_info(t).name; *p; p++) n++;
    }
    return n;
}
constexpr std::array<char, kv_type_names_length() + 1> make_kv_type_names() {
    std::array<char, kv_type_names_length() + 1> s{};
    size_t k = 0;
    for (Type t : kKvTypes) {
        if (k) {
            s[k++] = ',';
            s[k++] = ' ';
        }
        for (const char* p = type_info(t).name; *p; p++) s[k++] = *p;
    }
    s[k] = '\0';
    return s;
}
constexpr auto kKvTypeNames = make_kv_type_names();

char lower(char c) {
    return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
}

bool equal_nocase(const char* a, const char* b) {
    for (; *a && *b; a++, b++)
        if (lower(*a) != lower(*b)) return false;
    return *a == *b;
}

// constexpr so the lookup table below is built by the compiler.
constexpr float half_to_float(uint16_t h) {
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0x1f) // inf / NaN: keep the payload so a quiet NaN stays quiet
        return std::bit_cast<float>(sign | 0x7f800000u | (man << 13));
    if (exp != 0) // normal: rebias 15 -> 127
        return std::bit_cast<float>(sign | ((exp + 112) << 23) | (man << 13));
    if (man == 0) return std::bit_cast<float>(sign); // +-0
    // Subnormal half (man * 2^-24) is a normal float: shift the mantissa up
    // until its leading one reaches the implicit-bit position.
    exp = 113; // exponent of 2^-14, the value of bit 10
    while (!(man & 0x400u)) {
        man <<= 1;
        exp--;
    }
    return std::bit_cast<float>(sign | (exp << 23) | ((man & 0x3ffu) << 13));
}

constexpr std::array<float, 65536> make_half_table() {
    std::array<float, 65536> t{};
    for (uint32_t h = 0; h < 65536; h++) t[h] = half_to_float(static_cast<uint16_t>(h));
    return t;
}

} // namespace

const char* type_name(Type t) {
    const uint32_t id = static_cast<uint32_t>(t);
    if (id >= kTypeIdLimit) return "unknown";
    return kTypeTable[id].name ? kTypeTable[id].name : kUnknownNames.s[id];
}

bool type_from_name(const char* name, Type* out) {
    if (!name) return false;
    for (const type_table_detail::Row& r : type_table_detail::kRows) {
        if (equal_nocase(name, r.name)) {
            if (out) *out = r.type;
            return true;
        }
    }
    return false;
}

const char* kv_type_names() {
    return kKvTypeNames.data();
}

size_t row_size(Type t, int64_t n) {
    const TypeInfo& ti = type_info(t);
    if (ti.block_size <= 0) return 0;
    return static_cast<size_t>(n / ti.block_size) * ti.type_size;
}

bool row_size_ok(Type t, int64_t n) {
    const TypeInfo& ti = type_info(t);
    if (ti.block_size <= 0 || n < 0 || n % ti.block_size != 0) return false;
    // The byte count must fit in size_t (it always does on 64-bit hosts for
    // sane n, but a hostile file can claim anything).
    const uint64_t blocks = static_cast<uint64_t>(n / ti.block_size);
    return blocks <= SIZE_MAX / ti.type_size;
}

// Table and the function come from the same code, so they agree bit for bit.
alignas(64) constinit const std::array<float, 65536> kFp16ToFp32 = make_half_table();

// ---- half precision ----------------------------------------------------------
//
// IEEE binary16: 1 sign, 5 exponent (bias 15), 10 mantissa bits.
// binary32:      1 sign, 8 exponent (bias 127), 23 mantissa bits.

float fp16_to_fp32(uint16_t h) {
    return half_to_float(h);
}

uint16_t fp32_to_fp16(float f) {
    const uint32_t x = std::bit_cast<uint32_t>(f);
    const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
    const uint32_t a = x & 0x7fffffffu;
    if (a >= 0x7f800000u) { // inf or NaN
        if (a == 0x7f800000u) return sign | 0x7c00u;
        // Quiet NaN keeping the top payload bits, as F16C's vcvtps2ph does.
        return static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    }
    if (a >= 0x477ff000u) return sign | 0x7c00u; // >= 65520 rounds past 65504: inf
    if (a >= 0x38800000u) {                      // >= 2^-14: a normal half
        // Drop 13 mantissa bits and rebias; a carry out of the mantissa
        // correctly bumps the exponent.
        uint32_t h = (a >> 13) - (112u << 10);
        const uint32_t rest = a & 0x1fffu;
        if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++;
        return static_cast<uint16_t>(sign | h);
    }
    if (a <= 0x33000000u) return sign; // <= 2^-25: rounds (ties to even) to zero
    // Subnormal half: value / 2^-24, rounded to nearest even. The float is
    // normal here (exponent 102..112), so the shift is 14..24.
    const uint32_t e = a >> 23;
    const uint32_t m = (a & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - e;
    uint32_t q = m >> shift;
    const uint32_t rest = m & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rest > half || (rest == half && (q & 1u))) q++; // may reach 0x400 = 2^-14, still right
    return static_cast<uint16_t>(sign | q);
}

float bf16_to_fp32(uint16_t h) {
    return std::bit_cast<float>(static_cast<uint32_t>(h) << 16);
}

uint16_t fp32_to_bf16(float f) {
    const uint32_t x = std::bit_cast<uint32_t>(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) // NaN: truncating could give inf, so force quiet
        return static_cast<uint16_t>((x >> 16) | 0x40u);
    // Round to nearest even on the 16 dropped bits; overflow to inf is correct.
    return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

} // namespace gl
