// Writes GGUF v3 files: metadata of any type and tensors with their data,
// aligned as the format requires. Used by `kvrun quantize`, by benchmark
// model synthesis and by tests that build small or deliberately broken models.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ggml-like/types.h"
#include "gguf.h"

namespace kvrun {

class GgufWriter {
  public:
    explicit GgufWriter(uint64_t alignment = 32) : alignment_(alignment) {}

    void set_u32(const std::string& key, uint32_t v);
    void set_i32(const std::string& key, int32_t v);
    void set_u64(const std::string& key, uint64_t v);
    void set_f32(const std::string& key, float v);
    void set_bool(const std::string& key, bool v);
    void set_str(const std::string& key, const std::string& v);
    void set_str_array(const std::string& key, const std::vector<std::string>& v);
    void set_f32_array(const std::string& key, const std::vector<float>& v);
    void set_i32_array(const std::string& key, const std::vector<int32_t>& v);
    // Copy a key/value from a parsed file as it is (any type, nested arrays too).
    void copy_kv(const std::string& key, const GgufValue& v);

    // ne: element counts, ne[0] contiguous; data: row_size(type, ne[0]) * rows bytes.
    void add_tensor(const std::string& name, gl::Type type, std::vector<int64_t> ne, const void* data, size_t nbytes);
    // Same, taking ownership of the bytes (no copy).
    void add_tensor(const std::string& name, gl::Type type, std::vector<int64_t> ne, std::vector<uint8_t> data);

    std::vector<uint8_t> bytes() const;
    // Write to a temporary file next to `path`, then rename: readers never see half a file.
    void write(const std::string& path) const;

  private:
    std::vector<uint8_t> header() const; // everything before the tensor data, padded
    uint64_t padded(uint64_t n) const { return (n + alignment_ - 1) / alignment_ * alignment_; }
    void key(const std::string& k, GgufType t);
    void put_str(std::vector<uint8_t>& out, const std::string& s) const;
    template <typename T> void put(std::vector<uint8_t>& out, T v) const;
    void put_value(const GgufValue& v, GgufType t);

    uint64_t alignment_;
    uint64_t n_kv_ = 0;
    std::vector<uint8_t> kv_; // encoded metadata
    struct PendingTensor {
        std::string name;
        gl::Type type;
        std::vector<int64_t> ne;
        std::vector<uint8_t> data;
    };
    std::vector<PendingTensor> tensors_;
};

} // namespace kvrun
