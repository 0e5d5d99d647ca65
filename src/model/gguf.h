// GGUF reader: mmap the file, parse and validate the header, metadata and
// tensor table. Nothing is copied: strings and tensor data are views into the
// mapping, which lives as long as the GgufFile. Every count, length and offset
// is checked against the file size before it is used, so a truncated or hostile
// file is a kvrun::Error (Exit::bad_model), never a crash.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "file_io.h"
#include "ggml-like/types.h"
#include "system_memory.h"

namespace kvrun {

enum class GgufType : uint32_t {
    u8 = 0,
    i8 = 1,
    u16 = 2,
    i16 = 3,
    u32 = 4,
    i32 = 5,
    f32 = 6,
    boolean = 7,
    string = 8,
    array = 9,
    u64 = 10,
    i64 = 11,
    f64 = 12,
};
const char* gguf_type_name(GgufType t);

struct GgufValue {
    GgufType type = GgufType::u8;
    // scalars: integers in i (signed types) or u (unsigned, bool), floats in f
    int64_t i = 0;
    uint64_t u = 0;
    double f = 0;
    std::string_view s; // string
    // arrays
    GgufType elem_type = GgufType::u8;
    uint64_t count = 0;
    const uint8_t* raw = nullptr;       // numeric arrays: packed little-endian elements
    std::vector<std::string_view> strs; // string arrays
    std::vector<GgufValue> items;       // arrays of arrays

    bool is_integer() const;
    bool is_float() const { return type == GgufType::f32 || type == GgufType::f64; }
    // Numeric array element k as a double / int64 (k < count; numeric elem types only).
    double array_f64(uint64_t k) const;
    int64_t array_i64(uint64_t k) const;
};

struct GgufTensor {
    std::string name;
    gl::Type type = gl::Type::F32;
    int n_dims = 0;
    int64_t ne[4] = {1, 1, 1, 1}; // element counts, ne[0] contiguous
    uint64_t offset = 0;          // from the start of the file
    uint64_t nbytes = 0;
    const void* data = nullptr; // into the mapping
    int64_t n_elements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
    std::string shape_str() const;
};

class GgufFile {
  public:
    // Map and parse a file. Throws kvrun::Error(Exit::bad_model) naming the problem.
    static GgufFile open(const std::string& path);
    // Parse a buffer the caller keeps alive (fuzzing, tests).
    static GgufFile parse(const uint8_t* data, size_t size, std::string name = "<memory>");

    GgufFile(GgufFile&&) noexcept;
    GgufFile& operator=(GgufFile&&) noexcept;
    ~GgufFile();

    const std::string& path() const { return path_; }
    uint32_t version() const { return version_; }
    uint64_t file_size() const { return size_; }
    // The file as it was opened (unknown for a parsed buffer).
    const FileIdentity& identity() const { return identity_; }
    const uint8_t* bytes() const { return base_; } // the whole mapped file
    // Moves the tensors (but those keep_mapped says to leave) out of the
    // file mapping into anonymous memory advised onto transparent huge
    // pages, and points them at it; the metadata stays mapped. Streaming
    // weights through 4 KiB pages costs a TLB walk per page, dearer still
    // under a hypervisor's nested paging (see LoadedModel::load). Copied in
    // pieces, each piece's mapped pages dropped right after it
    // (MADV_DONTNEED; the page cache keeps them), so resident memory never
    // holds the weights twice. False, with nothing changed, for a parsed
    // buffer, when nothing is to move or the memory cannot be allocated.
    bool move_data_to_huge_pages(const std::function<bool(const GgufTensor&)>& keep_mapped = {});
    bool data_moved() const { return data_copy_ != nullptr; }
    // Drops this process's pages of [p, p + n) where they lie in the file
    // mapping (MADV_DONTNEED: the page cache keeps them, and a later read
    // faults them back in from the file); anything else is left alone. For
    // data copied elsewhere (huge pages, packed weights).
    void drop_mapped_pages(const void* p, uint64_t n) const;
    uint64_t alignment() const { return alignment_; }
    uint64_t data_offset() const { return data_offset_; }

    const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return kv_; }
    const GgufValue* find(std::string_view key) const;
    // Typed look-ups: nullopt when absent; a present key of the wrong type is an error.
    std::optional<uint64_t> get_u64(std::string_view key) const;
    std::optional<double> get_f64(std::string_view key) const;
    // A number that must be finite and above zero (a frequency base, a
    // scale): inf passes "> 0" but turns every angle or norm into NaN or 0.
    std::optional<double> get_positive(std::string_view key) const;
    // An array of per-layer flags: integers or booleans, each 0 or 1 (a
    // float 0.5 or an i8 -1 is a bad file, not a flag to guess at).
    std::vector<bool> need_flags(std::string_view key, uint64_t count) const;
    std::optional<bool> get_bool(std::string_view key) const;
    std::optional<std::string_view> get_str(std::string_view key) const;
    // Required variants: a missing key is an error naming it.
    uint64_t need_u64(std::string_view key) const;
    std::string_view need_str(std::string_view key) const;
    // A required array of the given element type.
    const GgufValue& need_array(std::string_view key, GgufType elem) const;

    const std::vector<GgufTensor>& tensors() const { return tensors_; }
    const GgufTensor* tensor(std::string_view name) const;

  private:
    GgufFile() = default;
    void parse_all();

    std::string path_;
    const uint8_t* base_ = nullptr;
    uint64_t size_ = 0;
    FileIdentity identity_;
    void* map_ = nullptr; // owned mapping (null when parsing a caller's buffer)
    HugeBytes data_copy_; // the moved tensors' data
    uint32_t version_ = 0;
    uint64_t alignment_ = 32;
    uint64_t data_offset_ = 0;
    std::vector<std::pair<std::string, GgufValue>> kv_;
    std::unordered_map<std::string, size_t> kv_index_;
    std::vector<GgufTensor> tensors_;
    std::unordered_map<std::string, size_t> tensor_index_;
};

} // namespace kvrun
