#include "gguf_writer.h"

#include <cstdio>
#include <cstring>
#include <unistd.h>

#include "error.h"
#include "file_io.h"

namespace kvrun {

template <typename T> void GgufWriter::put(std::vector<uint8_t>& out, T v) const {
    const size_t at = out.size();
    out.resize(at + sizeof(T));
    std::memcpy(out.data() + at, &v, sizeof(T));
}

void GgufWriter::put_str(std::vector<uint8_t>& out, const std::string& s) const {
    put<uint64_t>(out, s.size());
    out.insert(out.end(), s.begin(), s.end());
}

void GgufWriter::key(const std::string& k, GgufType t) {
    put_str(kv_, k);
    put<uint32_t>(kv_, static_cast<uint32_t>(t));
    n_kv_++;
}

void GgufWriter::set_u32(const std::string& k, uint32_t v) { key(k, GgufType::u32); put(kv_, v); }
void GgufWriter::set_i32(const std::string& k, int32_t v) { key(k, GgufType::i32); put(kv_, v); }
void GgufWriter::set_u64(const std::string& k, uint64_t v) { key(k, GgufType::u64); put(kv_, v); }
void GgufWriter::set_f32(const std::string& k, float v) { key(k, GgufType::f32); put(kv_, v); }
void GgufWriter::set_bool(const std::string& k, bool v) { key(k, GgufType::boolean); put<uint8_t>(kv_, v); }
void GgufWriter::set_str(const std::string& k, const std::string& v) { key(k, GgufType::string); put_str(kv_, v); }

void GgufWriter::set_str_array(const std::string& k, const std::vector<std::string>& v) {
    key(k, GgufType::array);
    put<uint32_t>(kv_, static_cast<uint32_t>(GgufType::string));
    put<uint64_t>(kv_, v.size());
    for (const auto& s : v) put_str(kv_, s);
}

void GgufWriter::set_f32_array(const std::string& k, const std::vector<float>& v) {
    key(k, GgufType::array);
    put<uint32_t>(kv_, static_cast<uint32_t>(GgufType::f32));
    put<uint64_t>(kv_, v.size());
    for (float x : v) put(kv_, x);
}

void GgufWriter::set_i32_array(const std::string& k, const std::vector<int32_t>& v) {
    key(k, GgufType::array);
    put<uint32_t>(kv_, static_cast<uint32_t>(GgufType::i32));
    put<uint64_t>(kv_, v.size());
    for (int32_t x : v) put(kv_, x);
}

void GgufWriter::put_value(const GgufValue& v, GgufType t) {
    switch (t) {
    case GgufType::u8: put<uint8_t>(kv_, static_cast<uint8_t>(v.u)); break;
    case GgufType::i8: put<int8_t>(kv_, static_cast<int8_t>(v.i)); break;
    case GgufType::u16: put<uint16_t>(kv_, static_cast<uint16_t>(v.u)); break;
    case GgufType::i16: put<int16_t>(kv_, static_cast<int16_t>(v.i)); break;
    case GgufType::u32: put<uint32_t>(kv_, static_cast<uint32_t>(v.u)); break;
    case GgufType::i32: put<int32_t>(kv_, static_cast<int32_t>(v.i)); break;
    case GgufType::u64: put<uint64_t>(kv_, v.u); break;
    case GgufType::i64: put<int64_t>(kv_, v.i); break;
    case GgufType::f32: put<float>(kv_, static_cast<float>(v.f)); break;
    case GgufType::f64: put<double>(kv_, v.f); break;
    case GgufType::boolean: put<uint8_t>(kv_, v.u ? 1 : 0); break;
    case GgufType::string: put_str(kv_, std::string(v.s)); break;
    case GgufType::array: {
        put<uint32_t>(kv_, static_cast<uint32_t>(v.elem_type));
        put<uint64_t>(kv_, v.count);
        if (v.elem_type == GgufType::string) {
            for (auto s : v.strs) put_str(kv_, std::string(s));
        } else if (v.elem_type == GgufType::array) {
            for (const auto& item : v.items) put_value(item, GgufType::array);
        } else {
            static const size_t sizes[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
            kv_.insert(kv_.end(), v.raw, v.raw + v.count * sizes[static_cast<int>(v.elem_type)]);
        }
        break;
    }
    }
}

void GgufWriter::copy_kv(const std::string& k, const GgufValue& v) {
    key(k, v.type);
    put_value(v, v.type);
}

void GgufWriter::add_tensor(const std::string& name, gl::Type type, std::vector<int64_t> ne, const void* data,
                            size_t nbytes) {
    tensors_.push_back({name, type, std::move(ne), {}});
    const auto* p = static_cast<const uint8_t*>(data);
    tensors_.back().data.assign(p, p + nbytes);
}

void GgufWriter::add_tensor(const std::string& name, gl::Type type, std::vector<int64_t> ne, std::vector<uint8_t> data) {
    tensors_.push_back({name, type, std::move(ne), std::move(data)});
}

std::vector<uint8_t> GgufWriter::header() const {
    std::vector<uint8_t> out;
    put<uint32_t>(out, 0x46554747);
    put<uint32_t>(out, 3);
    put<uint64_t>(out, tensors_.size());
    put<uint64_t>(out, n_kv_ + (alignment_ != 32 ? 1 : 0));
    out.insert(out.end(), kv_.begin(), kv_.end());
    if (alignment_ != 32) {
        put_str(out, "general.alignment");
        put<uint32_t>(out, static_cast<uint32_t>(GgufType::u32));
        put<uint32_t>(out, static_cast<uint32_t>(alignment_));
    }
    uint64_t offset = 0;
    for (const PendingTensor& t : tensors_) {
        put_str(out, t.name);
        put<uint32_t>(out, static_cast<uint32_t>(t.ne.size()));
        for (int64_t n : t.ne) put<uint64_t>(out, static_cast<uint64_t>(n));
        put<uint32_t>(out, static_cast<uint32_t>(t.type));
        put<uint64_t>(out, offset);
        offset += padded(t.data.size());
    }
    out.resize(padded(out.size()), 0);
    return out;
}

std::vector<uint8_t> GgufWriter::bytes() const {
    std::vector<uint8_t> out = header();
    for (const PendingTensor& t : tensors_) {
        out.insert(out.end(), t.data.begin(), t.data.end());
        out.resize(padded(out.size()), 0);
    }
    return out;
}

void GgufWriter::write(const std::string& path) const {
    // An existing output is replaced only when it is a GGUF file (or empty).
    AtomicFile f(path, "GGUF file",
                 [](std::string_view head) { return head.rfind("GGUF", 0) == 0; });
    // Streamed: the header, then each tensor and its padding (no second copy in memory).
    const std::vector<uint8_t> head = header();
    f.write(head.data(), head.size());
    static const uint8_t zeros[256] = {};
    for (const PendingTensor& t : tensors_) {
        if (!t.data.empty()) f.write(t.data.data(), t.data.size());
        f.write(zeros, padded(t.data.size()) - t.data.size());
    }
    f.commit();
}

} // namespace kvrun
