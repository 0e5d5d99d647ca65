// Weight and activation types: the GGUF block layouts and one table describing them.
//
// Every type the runtime can store is listed in `Type` with its GGUF id. The
// table (type_info) says how many elements a block holds and how many bytes it
// takes; a type with `supported == false` is known by name only, so a file that
// uses it fails with a clear message instead of silent garbage.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace gl {

// Values are the on-disk GGUF/ggml type ids.
enum class Type : uint32_t {
    F32 = 0,
    F16 = 1,
    Q4_0 = 2,
    Q4_1 = 3,
    Q5_0 = 6,
    Q5_1 = 7,
    Q8_0 = 8,
    Q8_1 = 9,
    Q2_K = 10,
    Q3_K = 11,
    Q4_K = 12,
    Q5_K = 13,
    Q6_K = 14,
    Q8_K = 15,
    IQ2_XXS = 16,
    IQ2_XS = 17,
    IQ3_XXS = 18,
    IQ1_S = 19,
    IQ4_NL = 20,
    IQ3_S = 21,
    IQ2_S = 22,
    IQ4_XS = 23,
    I8 = 24,
    I16 = 25,
    I32 = 26,
    I64 = 27,
    F64 = 28,
    IQ1_M = 29,
    BF16 = 30,
    TQ1_0 = 34,
    TQ2_0 = 35,
};
inline constexpr uint32_t kTypeIdLimit = 40; // ids >= this are unknown

// ---- the lists ------------------------------------------------------------------
// Everything that enumerates types (the reference dispatch, the CUDA switches,
// the CLI's cache types, the tests' loops) is generated from these two lists
// and the table below, so a new type is one entry here plus its kernels.
//
// Weight types kvrun computes with (type_info(t).supported): the CPU reference,
// the SIMD tables (per entry, ref otherwise) and the CUDA matmul all take them.
// clang-format off
#define GL_COMPUTE_TYPES(X) \
    X(F32) X(F16) X(BF16) X(Q8_0) X(Q4_0) X(Q4_1) X(Q5_0) X(Q5_1) X(IQ4_NL) \
    X(Q2_K) X(Q3_K) X(Q4_K) X(Q5_K) X(Q6_K)
// Types a KV cache can hold (type_info(t).kv_cache), CPU and CUDA alike; the
// CLI accepts exactly these for --ctk/--ctv, in this order. A subset of the
// compute types (attention reads K and V through their dequantizers).
#define GL_KV_TYPES(X) X(F32) X(F16) X(BF16) X(Q8_0) X(Q4_0)
// clang-format on

#define GL_TYPE_LIST_ITEM_(T) Type::T,
inline constexpr Type kComputeTypes[] = {GL_COMPUTE_TYPES(GL_TYPE_LIST_ITEM_)};
inline constexpr Type kKvTypes[] = {GL_KV_TYPES(GL_TYPE_LIST_ITEM_)};
#undef GL_TYPE_LIST_ITEM_

struct TypeInfo {
    const char* name;   // "q4_0", or nullptr for an id no ggml version ever used
    int64_t block_size; // elements per block (1 for plain types); 0 if unknown
    size_t type_size;   // bytes per block; 0 if unknown
    bool supported;     // kvrun can dequantize and compute with it (in GL_COMPUTE_TYPES)
    bool kv_cache;      // usable as a KV cache type (in GL_KV_TYPES)
    // The activation type its dot product wants: quantized weights want
    // activations quantized once per matrix (integer dot products), float
    // weights want F32. F32 for every type kvrun cannot compute with.
    Type vec_dot_type;
};

namespace type_table_detail {

// The GGUF layout facts of one type, plus the activation its dot product
// takes. Block and byte sizes are known even for types kvrun cannot compute
// with: a loader needs them to size and skip such tensors.
struct Row {
    Type type;
    const char* name;
    int64_t block_size;
    size_t type_size;
    Type vec_dot_type = Type::F32;
};

// One line per id ever assigned by GGUF that kvrun knows the layout of.
// Ids 4 and 5 (the removed Q4_2/Q4_3), 31..33 (the removed repacked Q4_0
// variants) and 36..39 are left out and read as unknown. Why which activation
// type: see blocks_k.h.
inline constexpr Row kRows[] = {
    {Type::F32, "f32", 1, 4},
    {Type::F16, "f16", 1, 2},
    {Type::Q4_0, "q4_0", 32, 18, Type::Q8_0},       // fp16 d + 16 bytes of nibbles
    {Type::Q4_1, "q4_1", 32, 20, Type::Q8_1},       // fp16 d, m + 16 bytes
    {Type::Q5_0, "q5_0", 32, 22, Type::Q8_0},       // fp16 d + 4 bytes high bits + 16 bytes
    {Type::Q5_1, "q5_1", 32, 24, Type::Q8_1},       // fp16 d, m + 4 + 16
    {Type::Q8_0, "q8_0", 32, 34, Type::Q8_0},       // fp16 d + 32 int8
    {Type::Q8_1, "q8_1", 32, 36},                   // fp16 d, s + 32 int8
    {Type::Q2_K, "q2_K", 256, 84, Type::Q8_K},      // 16 scales + 64 quants + fp16 d, dmin
    {Type::Q3_K, "q3_K", 256, 110, Type::Q8_K},     // 32 hmask + 64 quants + 12 scales + fp16 d
    {Type::Q4_K, "q4_K", 256, 144, Type::Q8_K},     // fp16 d, dmin + 12 scales + 128 quants
    {Type::Q5_K, "q5_K", 256, 176, Type::Q8_K},     // fp16 d, dmin + 12 scales + 32 high bits + 128
    {Type::Q6_K, "q6_K", 256, 210, Type::Q8_K},     // 128 low + 64 high + 16 scales + fp16 d
    {Type::Q8_K, "q8_K", 256, 292},                 // f32 d + 256 int8 + 16 int16 block sums
    {Type::IQ2_XXS, "iq2_xxs", 256, 66},            // fp16 d + 32 uint16
    {Type::IQ2_XS, "iq2_xs", 256, 74},              // fp16 d + 32 uint16 + 8 scales
    {Type::IQ3_XXS, "iq3_xxs", 256, 98},            // fp16 d + 96 bytes
    {Type::IQ1_S, "iq1_s", 256, 50},                // fp16 d + 32 bytes + 8 uint16
    {Type::IQ4_NL, "iq4_nl", 32, 18, Type::Q8_0},   // fp16 d + 16 bytes of nibbles
    {Type::IQ3_S, "iq3_s", 256, 110},               // fp16 d + 64 + 8 + 32 + 4
    {Type::IQ2_S, "iq2_s", 256, 82},                // fp16 d + 64 + 8 + 8
    {Type::IQ4_XS, "iq4_xs", 256, 136},             // fp16 d + uint16 + 4 + 128
    {Type::I8, "i8", 1, 1},
    {Type::I16, "i16", 1, 2},
    {Type::I32, "i32", 1, 4},
    {Type::I64, "i64", 1, 8},
    {Type::F64, "f64", 1, 8},
    {Type::IQ1_M, "iq1_m", 256, 56}, // 32 + 16 + 8 bytes, scale folded into the 8
    {Type::BF16, "bf16", 1, 2},
    {Type::TQ1_0, "tq1_0", 256, 54}, // 48 base-3 bytes + 4 + fp16 d
    {Type::TQ2_0, "tq2_0", 256, 66}, // 64 bytes of 2-bit + fp16 d
};

template <size_t N> constexpr bool contains(const Type (&list)[N], Type t) {
    for (Type x : list)
        if (x == t) return true;
    return false;
}

constexpr std::array<TypeInfo, kTypeIdLimit> make_table() {
    std::array<TypeInfo, kTypeIdLimit> t{};
    for (TypeInfo& i : t) i = {nullptr, 0, 0, false, false, Type::F32};
    for (const Row& r : kRows)
        t[static_cast<uint32_t>(r.type)] = {r.name,
                                            r.block_size,
                                            r.type_size,
                                            contains(kComputeTypes, r.type),
                                            contains(kKvTypes, r.type),
                                            r.vec_dot_type};
    return t;
}

} // namespace type_table_detail

// Indexed by id; ids the table does not know hold {nullptr, 0, 0, false, false, F32}.
inline constexpr std::array<TypeInfo, kTypeIdLimit> kTypeTable = type_table_detail::make_table();
inline constexpr TypeInfo kUnknownType = {nullptr, 0, 0, false, false, Type::F32};

// Info for any id. constexpr, so kernels can take block sizes from here at
// compile time (CUDA TypeTraits, the reference rows of ref/quants_k.cpp).
constexpr const TypeInfo& type_info(uint32_t id) {
    return id < kTypeIdLimit ? kTypeTable[id] : kUnknownType;
}
constexpr const TypeInfo& type_info(Type t) { return type_info(static_cast<uint32_t>(t)); }

// The table's promises, checked where it is defined: each listed type has a
// layout, a KV type is a compute type, and a quantized activation type has the
// weight's block size (the dot products walk both rows block by block).
constexpr bool type_lists_consistent() {
    for (Type t : kComputeTypes) {
        const TypeInfo& i = type_info(t);
        if (!i.name || i.block_size <= 0) return false;
        const TypeInfo& a = type_info(i.vec_dot_type);
        if (i.vec_dot_type != Type::F32 && a.block_size != i.block_size) return false;
    }
    for (Type t : kKvTypes)
        if (!type_info(t).supported) return false;
    return true;
}
static_assert(type_lists_consistent(), "GL_COMPUTE_TYPES / GL_KV_TYPES disagree with the type table");

const char* type_name(Type t); // never null: "unknown(<id>)" style names come from a static buffer-free table
bool type_from_name(const char* name, Type* out); // "f16", "q8_0", ... case-insensitive
// "f32, f16, bf16, q8_0, q4_0": the KV types' names in GL_KV_TYPES order, for
// help and error messages.
const char* kv_type_names();

// Bytes for a row of n elements; n must be a multiple of the block size
// (callers validate that first with row_size_ok).
size_t row_size(Type t, int64_t n);
bool row_size_ok(Type t, int64_t n);

// ---- half precision ------------------------------------------------------
float fp16_to_fp32(uint16_t h);
uint16_t fp32_to_fp16(float f); // round to nearest even, like F16C
float bf16_to_fp32(uint16_t h);
// fp16_to_fp32 of every half, computed at compile time (256 KiB). SIMD kernels
// read block scales through it: a broadcast load costs no shuffle-port uop,
// unlike an F16C conversion followed by a broadcast.
extern const std::array<float, 65536> kFp16ToFp32;
uint16_t fp32_to_bf16(float f); // round to nearest even; NaN stays NaN

// ---- block layouts (as stored in GGUF) ---------------------------------------
inline constexpr int QK4_0 = 32;
struct BlockQ4_0 {
    uint16_t d;              // scale, fp16
    uint8_t qs[QK4_0 / 2];   // element j in low nibble of qs[j], element j+16 in high nibble; value = (q - 8) * d
};
static_assert(sizeof(BlockQ4_0) == type_info(Type::Q4_0).type_size);

inline constexpr int QK8_0 = 32;
struct BlockQ8_0 {
    uint16_t d;      // scale, fp16
    int8_t qs[QK8_0]; // value = q * d
};
static_assert(sizeof(BlockQ8_0) == type_info(Type::Q8_0).type_size);

} // namespace gl
