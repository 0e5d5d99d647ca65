// GGUF v2/v3 parsing. The format (little-endian):
//   magic "GGUF", u32 version, u64 tensor_count, u64 kv_count,
//   kv_count × (string key, u32 value_type, value),
//   tensor_count × (string name, u32 n_dims, u64 ne[n_dims], u32 type, u64 offset),
//   padding to general.alignment, tensor data (offsets relative to its start).
// A string is u64 length + bytes; an array is u32 element type + u64 count + elements.
#include "gguf.h"

#include <algorithm>
#include <cstdlib>
#include <cmath>
#include <cstring>
#include <system_error>
#include <thread>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "error.h"

namespace kvrun {

namespace {

constexpr uint32_t kMagic = 0x46554747; // "GGUF" read as a little-endian u32
constexpr int kMaxArrayDepth = 8;       // nested arrays deeper than this are hostile
constexpr int kMaxDims = 4;

size_t scalar_size(GgufType t) {
    switch (t) {
    case GgufType::u8:
    case GgufType::i8:
    case GgufType::boolean:
        return 1;
    case GgufType::u16:
    case GgufType::i16:
        return 2;
    case GgufType::u32:
    case GgufType::i32:
    case GgufType::f32:
        return 4;
    case GgufType::u64:
    case GgufType::i64:
    case GgufType::f64:
        return 8;
    default:
        return 0;
    }
}

// Bounds-checked cursor over the file.
class Reader {
  public:
    Reader(const uint8_t* p, uint64_t size, const std::string& name)
        : p_(p), size_(size), name_(name) {}
    uint64_t pos() const { return pos_; }
    uint64_t left() const { return size_ - pos_; }

    void need(uint64_t n, const char* what) const {
        if (n > left())
            fail(Exit::bad_model,
                 "{}: truncated GGUF file: {} needs {} bytes at offset {}, only {} left", name_,
                 what, n, pos_, left());
    }
    template <typename T> T read(const char* what) {
        need(sizeof(T), what);
        T v;
        std::memcpy(&v, p_ + pos_, sizeof(T));
        pos_ += sizeof(T);
        return v;
    }
    std::string_view str(const char* what) {
        uint64_t n = read<uint64_t>(what);
        need(n, what);
        std::string_view s(reinterpret_cast<const char*>(p_ + pos_), n);
        pos_ += n;
        return s;
    }
    const uint8_t* skip(uint64_t n, const char* what) {
        need(n, what);
        const uint8_t* at = p_ + pos_;
        pos_ += n;
        return at;
    }

  private:
    const uint8_t* p_;
    uint64_t size_;
    uint64_t pos_ = 0;
    const std::string& name_;
};

GgufType read_type(Reader& r, const std::string& name, const char* what) {
    uint32_t t = r.read<uint32_t>(what);
    if (t > static_cast<uint32_t>(GgufType::f64))
        fail(Exit::bad_model, "{}: unknown GGUF value type {} in {}", name, t, what);
    return static_cast<GgufType>(t);
}

void read_scalar(Reader& r, GgufValue& v, const char* what) {
    switch (v.type) {
    case GgufType::u8:
        v.u = r.read<uint8_t>(what);
        break;
    case GgufType::i8:
        v.i = r.read<int8_t>(what);
        break;
    case GgufType::u16:
        v.u = r.read<uint16_t>(what);
        break;
    case GgufType::i16:
        v.i = r.read<int16_t>(what);
        break;
    case GgufType::u32:
        v.u = r.read<uint32_t>(what);
        break;
    case GgufType::i32:
        v.i = r.read<int32_t>(what);
        break;
    case GgufType::u64:
        v.u = r.read<uint64_t>(what);
        break;
    case GgufType::i64:
        v.i = r.read<int64_t>(what);
        break;
    case GgufType::f32:
        v.f = r.read<float>(what);
        break;
    case GgufType::f64:
        v.f = r.read<double>(what);
        break;
    case GgufType::boolean:
        v.u = r.read<uint8_t>(what) != 0;
        break;
    default:
        KV_ASSERT(false);
    }
}

void read_value(Reader& r, GgufValue& v, const std::string& name, const char* what, int depth) {
    if (v.type == GgufType::string) {
        v.s = r.str(what);
        return;
    }
    if (v.type != GgufType::array) {
        read_scalar(r, v, what);
        return;
    }
    if (depth >= kMaxArrayDepth)
        fail(Exit::bad_model, "{}: arrays nested deeper than {} in {}", name, kMaxArrayDepth, what);
    v.elem_type = read_type(r, name, what);
    v.count = r.read<uint64_t>(what);
    if (v.elem_type == GgufType::string) {
        // each string takes at least its 8-byte length: bound the count before reserving
        if (v.count > r.left() / 8)
            fail(Exit::bad_model, "{}: array of {} strings in {} cannot fit in the file", name,
                 v.count, what);
        v.strs.reserve(v.count);
        for (uint64_t k = 0; k < v.count; k++) v.strs.push_back(r.str(what));
    } else if (v.elem_type == GgufType::array) {
        // Each nested array costs ~120 bytes in memory for 12 in the file: cap
        // the count so a hostile file cannot make us allocate 10× its size.
        if (v.count > (1u << 20))
            fail(Exit::bad_model, "{}: array of {} arrays in {} is larger than kvrun accepts", name,
                 v.count, what);
        if (v.count > r.left() / 12)
            fail(Exit::bad_model, "{}: array of {} arrays in {} cannot fit in the file", name,
                 v.count, what);
        v.items.resize(v.count);
        for (auto& item : v.items) {
            item.type = GgufType::array;
            read_value(r, item, name, what, depth + 1);
        }
    } else {
        size_t es = scalar_size(v.elem_type);
        if (v.count > r.left() / es)
            fail(Exit::bad_model, "{}: array of {} elements in {} cannot fit in the file", name,
                 v.count, what);
        v.raw = r.skip(v.count * es, what);
    }
}

} // namespace

const char* gguf_type_name(GgufType t) {
    static const char* names[] = {"u8",   "i8",     "u16",   "i16", "u32", "i32", "f32",
                                  "bool", "string", "array", "u64", "i64", "f64"};
    auto i = static_cast<uint32_t>(t);
    return i < std::size(names) ? names[i] : "?";
}

bool GgufValue::is_integer() const {
    switch (type) {
    case GgufType::u8:
    case GgufType::i8:
    case GgufType::u16:
    case GgufType::i16:
    case GgufType::u32:
    case GgufType::i32:
    case GgufType::u64:
    case GgufType::i64:
        return true;
    default:
        return false;
    }
}

double GgufValue::array_f64(uint64_t k) const {
    KV_ASSERT(raw && k < count);
    const uint8_t* p = raw + k * scalar_size(elem_type);
    switch (elem_type) {
    case GgufType::f32: {
        float x;
        std::memcpy(&x, p, 4);
        return x;
    }
    case GgufType::f64: {
        double x;
        std::memcpy(&x, p, 8);
        return x;
    }
    default:
        return static_cast<double>(array_i64(k));
    }
}

// Float to integer, saturating: a plain cast of a value out of int64 range (or
// of NaN) is undefined behaviour, and hostile files can hold any float.
static int64_t saturate_i64(double x) {
    if (x != x) return 0;
    if (x >= 9223372036854775808.0) return INT64_MAX;
    if (x <= -9223372036854775808.0) return INT64_MIN;
    return static_cast<int64_t>(x);
}

int64_t GgufValue::array_i64(uint64_t k) const {
    KV_ASSERT(raw && k < count);
    const uint8_t* p = raw + k * scalar_size(elem_type);
    switch (elem_type) {
    case GgufType::u8:
    case GgufType::boolean:
        return *p;
    case GgufType::i8:
        return static_cast<int8_t>(*p);
    case GgufType::u16: {
        uint16_t x;
        std::memcpy(&x, p, 2);
        return x;
    }
    case GgufType::i16: {
        int16_t x;
        std::memcpy(&x, p, 2);
        return x;
    }
    case GgufType::u32: {
        uint32_t x;
        std::memcpy(&x, p, 4);
        return x;
    }
    case GgufType::i32: {
        int32_t x;
        std::memcpy(&x, p, 4);
        return x;
    }
    case GgufType::u64: {
        uint64_t x;
        std::memcpy(&x, p, 8);
        return static_cast<int64_t>(x);
    }
    case GgufType::i64: {
        int64_t x;
        std::memcpy(&x, p, 8);
        return x;
    }
    case GgufType::f32: {
        float x;
        std::memcpy(&x, p, 4);
        return saturate_i64(x);
    }
    case GgufType::f64: {
        double x;
        std::memcpy(&x, p, 8);
        return saturate_i64(x);
    }
    default:
        KV_ASSERT(false);
    }
    return 0;
}

std::string GgufTensor::shape_str() const {
    std::string s = "[";
    for (int d = 0; d < n_dims; d++) s += (d ? ", " : "") + std::to_string(ne[d]);
    return s + "]";
}

GgufFile GgufFile::open(const std::string& path) {
    // O_NONBLOCK: a FIFO must not block the open before fstat refuses it.
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) fail(Exit::bad_model, "cannot open model '{}': {}", path, std::strerror(errno));
    struct stat st {};
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        ::close(fd);
        fail(Exit::bad_model, "'{}' is not a regular file", path);
    }
    GgufFile f;
    f.path_ = path;
    f.size_ = static_cast<uint64_t>(st.st_size);
    f.identity_ = identity_of_fd(fd);
    if (f.size_ == 0) {
        ::close(fd);
        fail(Exit::bad_model, "{}: empty file, not a GGUF model", path);
    }
    // MAP_PRIVATE read-only: weights are used in place, never copied.
    void* m = mmap(nullptr, f.size_, PROT_READ, MAP_PRIVATE, fd, 0);
    ::close(fd);
    if (m == MAP_FAILED) fail(Exit::bad_model, "cannot map '{}': {}", path, std::strerror(errno));
    f.map_ = m;
    f.base_ = static_cast<const uint8_t*>(m);
    f.parse_all();
    return f;
}

GgufFile GgufFile::parse(const uint8_t* data, size_t size, std::string name) {
    GgufFile f;
    f.path_ = std::move(name);
    f.base_ = data;
    f.size_ = size;
    f.parse_all();
    return f;
}

GgufFile::GgufFile(GgufFile&& o) noexcept {
    *this = std::move(o);
}

GgufFile& GgufFile::operator=(GgufFile&& o) noexcept {
    if (this != &o) {
        if (map_) munmap(map_, size_);
        path_ = std::move(o.path_);
        base_ = o.base_;
        size_ = o.size_;
        identity_ = o.identity_;
        map_ = o.map_;
        data_copy_ = std::move(o.data_copy_);
        version_ = o.version_;
        alignment_ = o.alignment_;
        data_offset_ = o.data_offset_;
        kv_ = std::move(o.kv_);
        kv_index_ = std::move(o.kv_index_);
        tensors_ = std::move(o.tensors_);
        tensor_index_ = std::move(o.tensor_index_);
        o.map_ = nullptr;
        o.base_ = nullptr;
    }
    return *this;
}

GgufFile::~GgufFile() {
    if (map_) munmap(map_, size_);
}

bool GgufFile::move_data_to_huge_pages(const std::function<bool(const GgufTensor&)>& keep_mapped) {
    if (!map_ || data_copy_) return false;
    // The moved tensors in file order, each 64-byte aligned in the copy.
    std::vector<uint64_t> at(tensors_.size(), 0);
    std::vector<size_t> moved;
    uint64_t n = 0;
    for (size_t i = 0; i < tensors_.size(); i++) {
        if (keep_mapped && keep_mapped(tensors_[i])) continue;
        moved.push_back(i);
        at[i] = n;
        n += (tensors_[i].nbytes + 63) / 64 * 64;
    }
    if (n == 0) return false;
    constexpr size_t kPiece = size_t{8} << 20;
    HugeBytes copy = allocate_huge(n);
    if (!copy) return false;
    struct Piece {
        size_t tensor;
        uint64_t off, len;
    };
    std::vector<Piece> pieces;
    for (size_t i : moved)
        for (uint64_t o = 0; o < tensors_[i].nbytes; o += kPiece)
            pieces.push_back({i, o, std::min<uint64_t>(kPiece, tensors_[i].nbytes - o)});
    // Piece k on thread k % 2: the new pages' faults and zeroing are most of
    // the time, and two cores halve it (TinyLlama Q4_0: 0.2-1 s -> 0.1-0.7 s).
    auto copy_pieces = [&](size_t first) {
        for (size_t k = first; k < pieces.size(); k += 2) {
            const Piece& p = pieces[k];
            const uint8_t* src = base_ + tensors_[p.tensor].offset + p.off;
            std::memcpy(copy.get() + at[p.tensor] + p.off, src, p.len);
            // The piece's pages leave this process (a page it shares with
            // the metadata or a kept tensor faults back in from the file).
            drop_mapped_pages(src, p.len);
        }
    };
    std::thread helper;
    try {
        helper = std::thread(copy_pieces, 1);
    } catch (const std::system_error&) { // no second thread: this one does both halves
    }
    copy_pieces(0);
    if (helper.joinable())
        helper.join();
    else
        copy_pieces(1);
    for (size_t i : moved) tensors_[i].data = copy.get() + at[i];
    data_copy_ = std::move(copy);
    return true;
}

void GgufFile::drop_mapped_pages(const void* p, uint64_t n) const {
    if (!map_ || n == 0) return;
    const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
    const auto map_begin = reinterpret_cast<uintptr_t>(map_);
    const uintptr_t map_end = map_begin + (size_ + page - 1) / page * page;
    const auto at = reinterpret_cast<uintptr_t>(p);
    if (at < map_begin || at + n > map_end) return;
    const uintptr_t b = at / page * page;
    const uintptr_t e = std::min((at + n + page - 1) / page * page, map_end);
    madvise(reinterpret_cast<void*>(b), e - b, MADV_DONTNEED);
}

void GgufFile::parse_all() {
    const std::string& name = path_;
    Reader r(base_, size_, name);
    if (size_ < 4 || r.read<uint32_t>("magic") != kMagic)
        fail(Exit::bad_model, "{}: not a GGUF file (bad magic)", name);
    version_ = r.read<uint32_t>("version");
    if (version_ != 2 && version_ != 3)
        fail(Exit::bad_model, "{}: unsupported GGUF version {} (kvrun reads 2 and 3)", name,
             version_);
    uint64_t n_tensors = r.read<uint64_t>("tensor count");
    uint64_t n_kv = r.read<uint64_t>("metadata count");
    // Each key/value needs at least 8 (key length) + 4 (type) + 1 bytes; each
    // tensor info at least 8 + 4 + 8 + 4 + 8: bound counts before reserving.
    if (n_kv > r.left() / 13)
        fail(Exit::bad_model, "{}: metadata count {} cannot fit in the file", name, n_kv);
    if (n_tensors > r.left() / 32)
        fail(Exit::bad_model, "{}: tensor count {} cannot fit in the file", name, n_tensors);

    kv_.reserve(n_kv);
    for (uint64_t k = 0; k < n_kv; k++) {
        std::string key(r.str("metadata key"));
        GgufValue v;
        v.type = read_type(r, name, key.c_str());
        read_value(r, v, name, key.c_str(), 0);
        if (!kv_index_.emplace(key, kv_.size()).second)
            fail(Exit::bad_model, "{}: duplicate metadata key '{}'", name, key);
        kv_.emplace_back(std::move(key), std::move(v));
    }

    if (const GgufValue* a = find("general.alignment")) {
        if (!a->is_integer())
            fail(Exit::bad_model, "{}: general.alignment is not an integer", name);
        uint64_t al = a->type == GgufType::i8 || a->type == GgufType::i16 ||
                              a->type == GgufType::i32 || a->type == GgufType::i64
                          ? static_cast<uint64_t>(a->i)
                          : a->u;
        if (al == 0 || (al & (al - 1)) != 0 || al > (1u << 20))
            fail(Exit::bad_model, "{}: general.alignment {} is not a power of two", name, al);
        alignment_ = al;
    }

    tensors_.reserve(n_tensors);
    for (uint64_t k = 0; k < n_tensors; k++) {
        GgufTensor t;
        t.name = std::string(r.str("tensor name"));
        uint32_t nd = r.read<uint32_t>("tensor dims");
        if (nd == 0 || nd > kMaxDims)
            fail(Exit::bad_model, "{}: tensor '{}' has {} dimensions (1..{} allowed)", name, t.name,
                 nd, kMaxDims);
        t.n_dims = static_cast<int>(nd);
        uint64_t n_el = 1;
        for (uint32_t d = 0; d < nd; d++) {
            uint64_t ne = r.read<uint64_t>("tensor shape");
            if (ne == 0 || ne > (1ull << 40) || n_el > (1ull << 42) / ne)
                fail(Exit::bad_model, "{}: tensor '{}' has an absurd shape (dimension {} = {})",
                     name, t.name, d, ne);
            t.ne[d] = static_cast<int64_t>(ne);
            n_el *= ne;
        }
        uint32_t type_id = r.read<uint32_t>("tensor type");
        const gl::TypeInfo& ti = gl::type_info(type_id);
        if (!ti.name || ti.block_size == 0)
            fail(Exit::bad_model, "{}: tensor '{}' has unknown type id {}", name, t.name, type_id);
        t.type = static_cast<gl::Type>(type_id);
        if (t.ne[0] % ti.block_size != 0)
            fail(Exit::bad_model,
                 "{}: tensor '{}' of type {} has a row of {} elements, not a multiple of {}", name,
                 t.name, ti.name, t.ne[0], ti.block_size);
        t.nbytes = n_el / ti.block_size * ti.type_size;
        t.offset = r.read<uint64_t>("tensor offset");
        if (t.offset % alignment_ != 0)
            fail(Exit::bad_model, "{}: tensor '{}' offset {} is not aligned to {}", name, t.name,
                 t.offset, alignment_);
        if (!tensor_index_.emplace(t.name, tensors_.size()).second)
            fail(Exit::bad_model, "{}: duplicate tensor name '{}'", name, t.name);
        tensors_.push_back(std::move(t));
    }

    uint64_t pos = r.pos();
    data_offset_ = (pos + alignment_ - 1) / alignment_ * alignment_;
    if (n_tensors > 0 && data_offset_ > size_)
        fail(Exit::bad_model,
             "{}: truncated GGUF file: tensor data would start at {} but the file has {} bytes",
             name, data_offset_, size_);
    for (GgufTensor& t : tensors_) {
        uint64_t avail = size_ - data_offset_;
        if (t.offset > avail || t.nbytes > avail - t.offset)
            fail(Exit::bad_model,
                 "{}: tensor '{}' ({} bytes at data offset {}) lies outside the file ({} bytes of "
                 "data): truncated?",
                 name, t.name, t.nbytes, t.offset, avail);
        t.offset += data_offset_;
        t.data = base_ + t.offset;
    }
    // Tensors whose bytes overlap are a forged file: each alias would be
    // loaded (and moved to huge pages) on its own, many times the file's size.
    std::vector<const GgufTensor*> by_offset;
    by_offset.reserve(tensors_.size());
    for (const GgufTensor& t : tensors_) by_offset.push_back(&t);
    std::sort(by_offset.begin(), by_offset.end(),
              [](const GgufTensor* a, const GgufTensor* b) { return a->offset < b->offset; });
    for (size_t k = 1; k < by_offset.size(); k++) {
        const GgufTensor& a = *by_offset[k - 1];
        const GgufTensor& b = *by_offset[k];
        if (a.offset + a.nbytes > b.offset)
            fail(Exit::bad_model, "{}: tensors '{}' and '{}' overlap in the file", name, a.name,
                 b.name);
    }
}

const GgufValue* GgufFile::find(std::string_view key) const {
    auto it = kv_index_.find(std::string(key));
    return it == kv_index_.end() ? nullptr : &kv_[it->second].second;
}

std::optional<uint64_t> GgufFile::get_u64(std::string_view key) const {
    const GgufValue* v = find(key);
    if (!v) return std::nullopt;
    if (!v->is_integer())
        fail(Exit::bad_model, "{}: '{}' should be an integer, is {}", path_, key,
             gguf_type_name(v->type));
    bool is_signed = v->type == GgufType::i8 || v->type == GgufType::i16 ||
                     v->type == GgufType::i32 || v->type == GgufType::i64;
    if (is_signed && v->i < 0) fail(Exit::bad_model, "{}: '{}' is negative ({})", path_, key, v->i);
    return is_signed ? static_cast<uint64_t>(v->i) : v->u;
}

std::optional<double> GgufFile::get_f64(std::string_view key) const {
    const GgufValue* v = find(key);
    if (!v) return std::nullopt;
    if (v->is_float()) return v->f;
    if (v->is_integer()) return static_cast<double>(*get_u64(key));
    fail(Exit::bad_model, "{}: '{}' should be a number, is {}", path_, key,
         gguf_type_name(v->type));
}

std::optional<double> GgufFile::get_positive(std::string_view key) const {
    const std::optional<double> x = get_f64(key);
    if (x && !(*x > 0 && std::isfinite(*x)))
        fail(Exit::bad_model, "{}: '{}' = {} must be a finite positive number", path_, key, *x);
    return x;
}

std::vector<bool> GgufFile::need_flags(std::string_view key, uint64_t count) const {
    const GgufValue* v = find(key);
    if (!v) fail(Exit::bad_model, "{}: missing key '{}'", path_, key);
    const bool integers = v->type == GgufType::array && v->elem_type != GgufType::f32 &&
                          v->elem_type != GgufType::f64 && v->elem_type != GgufType::string &&
                          v->elem_type != GgufType::array;
    if (v->type != GgufType::array || v->count != count)
        fail(Exit::bad_model, "{}: '{}' must hold one flag per layer ({})", path_, key, count);
    if (!integers)
        fail(Exit::bad_model, "{}: '{}' must hold integer or boolean flags, holds {}", path_, key,
             gguf_type_name(v->elem_type));
    std::vector<bool> out(count);
    for (uint64_t i = 0; i < count; i++) {
        const int64_t x = v->array_i64(i);
        if (x != 0 && x != 1)
            fail(Exit::bad_model, "{}: '{}' holds {} at {}, expected 0 or 1", path_, key, x, i);
        out[i] = x == 1;
    }
    return out;
}

std::optional<bool> GgufFile::get_bool(std::string_view key) const {
    const GgufValue* v = find(key);
    if (!v) return std::nullopt;
    if (v->type != GgufType::boolean)
        fail(Exit::bad_model, "{}: '{}' should be a bool, is {}", path_, key,
             gguf_type_name(v->type));
    return v->u != 0;
}

std::optional<std::string_view> GgufFile::get_str(std::string_view key) const {
    const GgufValue* v = find(key);
    if (!v) return std::nullopt;
    if (v->type != GgufType::string)
        fail(Exit::bad_model, "{}: '{}' should be a string, is {}", path_, key,
             gguf_type_name(v->type));
    return v->s;
}

uint64_t GgufFile::need_u64(std::string_view key) const {
    auto v = get_u64(key);
    if (!v) fail(Exit::bad_model, "{}: missing required key '{}'", path_, key);
    return *v;
}

std::string_view GgufFile::need_str(std::string_view key) const {
    auto v = get_str(key);
    if (!v) fail(Exit::bad_model, "{}: missing required key '{}'", path_, key);
    return *v;
}

const GgufValue& GgufFile::need_array(std::string_view key, GgufType elem) const {
    const GgufValue* v = find(key);
    if (!v) fail(Exit::bad_model, "{}: missing required key '{}'", path_, key);
    if (v->type != GgufType::array)
        fail(Exit::bad_model, "{}: '{}' should be an array, is {}", path_, key,
             gguf_type_name(v->type));
    bool ok = v->elem_type == elem;
    // numeric arrays: accept any numeric element type where one was asked for
    if (!ok && elem != GgufType::string && elem != GgufType::array)
        ok = v->elem_type != GgufType::string && v->elem_type != GgufType::array;
    if (!ok)
        fail(Exit::bad_model, "{}: '{}' should be an array of {}, is an array of {}", path_, key,
             gguf_type_name(elem), gguf_type_name(v->elem_type));
    return *v;
}

const GgufTensor* GgufFile::tensor(std::string_view name) const {
    auto it = tensor_index_.find(std::string(name));
    return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

} // namespace kvrun
