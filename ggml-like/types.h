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

struct TypeInfo {
    const char* name;   // "q4_0", or nullptr for an id no ggml version ever used
    int64_t block_size; // elements per block (1 for plain types); 0 if unknown
    size_t type_size;   // bytes per block; 0 if unknown
    bool supported;     // kvrun can dequantize and compute with it
};

// Info for any id; ids the table does not know get {nullptr, 0, 0, false}.
const TypeInfo& type_info(uint32_t id);
inline const TypeInfo& type_info(Type t) { return type_info(static_cast<uint32_t>(t)); }
const char* type_name(Type t); // never null: "unknown(<id>)" style names come from a static buffer-free table
bool type_from_name(const char* name, Type* out); // "f16", "q8_0", ... case-insensitive

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
static_assert(sizeof(BlockQ4_0) == 18);

inline constexpr int QK8_0 = 32;
struct BlockQ8_0 {
    uint16_t d;      // scale, fp16
    int8_t qs[QK8_0]; // value = q * d
};
static_assert(sizeof(BlockQ8_0) == 34);

} // namespace gl
