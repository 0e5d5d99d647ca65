// GGUF reader tests: facts about every real file in ../shared (checked against
// values read independently of kvrun), a writer round trip with every value
// type, hostile and truncated inputs (always Error(bad_model): never a crash,
// another exception or a huge allocation), random byte flips, and the model
// binder's errors naming what is missing or misshapen.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <sys/resource.h>
#include <unistd.h>

#include "error.h"
#include "ggml-like/types.h"
#include "gguf.h"
#include "gguf_writer.h"
#include "memory_plan.h"
#include "model.h"
#include "test_util.h"

using namespace kvrun;
namespace fs = std::filesystem;

namespace {

using Bytes = std::vector<uint8_t>;
constexpr uint32_t kMagic = 0x46554747; // "GGUF" as a little-endian u32

Bytes slurp(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    REQUIRE_MESSAGE(f, "cannot read " << path);
    return Bytes(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

bool contains(const std::string& s, const std::string& needle) {
    return s.find(needle) != std::string::npos;
}

// Parse the first n bytes of b from a heap block of exactly n bytes, so a
// sanitizer build sees any read past the end. The result is dropped with the copy.
void parse_prefix(const Bytes& b, size_t n, const std::string& name = "<memory>") {
    const Bytes copy(b.begin(), b.begin() + static_cast<std::ptrdiff_t>(n));
    GgufFile::parse(copy.data(), copy.size(), name);
}

// The outcome of parsing an input that must be rejected.
struct Rejection {
    bool threw_error = false; // a kvrun::Error was thrown
    Exit code = Exit::ok;
    std::string message;
    std::string other; // what else happened: a different exception, or no exception
};

template <typename F> Rejection try_reject(F&& f) {
    Rejection r;
    try {
        f();
        r.other = "no exception";
    } catch (const Error& e) {
        r.threw_error = true;
        r.code = e.code();
        r.message = e.what();
    } catch (const std::exception& e) {
        r.other = std::string("non-kvrun exception: ") + e.what();
    } catch (...) {
        r.other = "unknown exception";
    }
    return r;
}

// Check that f throws kvrun::Error(bad_model); returns the message.
template <typename F> std::string expect_bad_model(F&& f) {
    Rejection r = try_reject(f);
    CHECK_MESSAGE(r.threw_error, r.other);
    CHECK(r.code == Exit::bad_model);
    CHECK(!r.message.empty());
    return r.message;
}

std::string expect_bad_bytes(const Bytes& b, const std::string& name = "hostile.gguf") {
    return expect_bad_model([&] { parse_prefix(b, b.size(), name); });
}

// Caps the address space a little above what the process maps now, so code
// that tried to reserve memory for a hostile count gets std::bad_alloc (a
// test failure: it is not a kvrun::Error) instead of quietly succeeding
// through overcommit. Off under AddressSanitizer, which maps huge shadow regions.
#if defined(__SANITIZE_ADDRESS__)
#define KVTEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KVTEST_ASAN 1
#endif
#endif
class AddressSpaceCap {
  public:
    explicit AddressSpaceCap(uint64_t headroom) {
#ifndef KVTEST_ASAN
        std::ifstream statm("/proc/self/statm");
        uint64_t pages = 0;
        if (!(statm >> pages) || getrlimit(RLIMIT_AS, &old_) != 0) return;
        rlimit r = old_;
        const uint64_t cap = pages * static_cast<uint64_t>(sysconf(_SC_PAGESIZE)) + headroom;
        if (r.rlim_cur != RLIM_INFINITY && r.rlim_cur <= cap) return;
        r.rlim_cur = cap;
        active_ = setrlimit(RLIMIT_AS, &r) == 0;
#else
        (void)headroom;
#endif
    }
    ~AddressSpaceCap() {
        if (active_) setrlimit(RLIMIT_AS, &old_);
    }
    AddressSpaceCap(const AddressSpaceCap&) = delete;
    AddressSpaceCap& operator=(const AddressSpaceCap&) = delete;

  private:
    rlimit old_{};
    bool active_ = false;
};
constexpr uint64_t kHeadroom = 1ull << 30;

// A temporary directory, removed with everything in it.
struct TempDir {
    fs::path path;
    TempDir() {
        std::string t = (fs::temp_directory_path() / "kvrun_gguf_XXXXXX").string();
        REQUIRE(mkdtemp(t.data()) != nullptr);
        path = t;
    }
    ~TempDir() {
        std::error_code ec;
        fs::remove_all(path, ec);
    }
    std::string file(const std::string& name, const Bytes& b) const {
        const std::string p = (path / name).string();
        std::ofstream f(p, std::ios::binary);
        f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
        return p;
    }
};

// ---- raw GGUF bytes, for inputs the writer would never produce --------------

struct Raw {
    Bytes b;
    template <typename T> Raw& put(T v) {
        const size_t at = b.size();
        b.resize(at + sizeof(T));
        std::memcpy(b.data() + at, &v, sizeof(T));
        return *this;
    }
    Raw& u32(uint32_t v) { return put(v); }
    Raw& u64(uint64_t v) { return put(v); }
    Raw& str(std::string_view s) {
        u64(s.size());
        b.insert(b.end(), s.begin(), s.end());
        return *this;
    }
    Raw& header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3, uint32_t magic = kMagic) {
        return u32(magic).u32(version).u64(n_tensors).u64(n_kv);
    }
    Raw& key(std::string_view k, GgufType t) { return str(k).u32(static_cast<uint32_t>(t)); }
    Raw& kv_u32(std::string_view k, uint32_t v) { return key(k, GgufType::u32).u32(v); }
    Raw& kv_str(std::string_view k, std::string_view v) { return key(k, GgufType::string).str(v); }
    Raw& tensor(std::string_view name, const std::vector<uint64_t>& ne, uint32_t type,
                uint64_t offset) {
        str(name).u32(static_cast<uint32_t>(ne.size()));
        for (uint64_t n : ne) u64(n);
        return u32(type).u64(offset);
    }
    Raw& pad(size_t alignment) {
        b.resize((b.size() + alignment - 1) / alignment * alignment, 0);
        return *this;
    }
    Raw& zeros(size_t n) {
        b.resize(b.size() + n, 0);
        return *this;
    }
};

// A small valid file with one tensor; each hostile case changes one field.
struct OneTensor {
    uint32_t magic = kMagic, version = 3;
    std::optional<uint64_t> n_tensors, n_kv; // header counts (default: the real ones)
    std::string name = "blk.0.attn_q.weight";
    std::vector<uint64_t> ne = {8, 2};
    uint32_t type = 0; // F32
    uint64_t offset = 0;
    std::optional<uint32_t> alignment; // written as general.alignment (u32)
    size_t data = 64;                  // bytes after the padding

    Bytes bytes() const {
        Raw r;
        r.header(n_tensors.value_or(1), n_kv.value_or(alignment ? 2 : 1), version, magic);
        r.kv_str("general.architecture", "llama");
        if (alignment) r.kv_u32("general.alignment", *alignment);
        r.tensor(name, ne, type, offset);
        const uint32_t al = alignment.value_or(32);
        r.pad(al != 0 && (al & (al - 1)) == 0 ? al : 32);
        return r.zeros(data).b;
    }
};

// A metadata-only file with one extra key whose encoded type and value are given.
Bytes one_key(std::string_view key, GgufType type, const Bytes& value) {
    Raw r;
    r.header(0, 2).kv_str("general.architecture", "llama").key(key, type);
    r.b.insert(r.b.end(), value.begin(), value.end());
    return r.b;
}

// An array nested `depth` levels (depth 1 = a plain array) holding one u32.
Bytes nested_array_value(int depth) {
    Raw r;
    for (int d = 1; d < depth; d++) r.u32(static_cast<uint32_t>(GgufType::array)).u64(1);
    r.u32(static_cast<uint32_t>(GgufType::u32)).u64(1).u32(7);
    return r.b;
}

// ---- a tiny llama model written with GgufWriter ----------------------------

// Bytes of `rows` rows of `ne0` elements of type t, filled deterministically.
Bytes tensor_data(gl::Type t, int64_t ne0, int64_t rows, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    const int64_t n = ne0 * rows;
    Bytes out;
    auto put = [&](const void* p, size_t sz) {
        const auto* c = static_cast<const uint8_t*>(p);
        out.insert(out.end(), c, c + sz);
    };
    if (t == gl::Type::F32) {
        for (int64_t i = 0; i < n; i++) {
            float x = u(rng);
            put(&x, 4);
        }
    } else if (t == gl::Type::F16) {
        for (int64_t i = 0; i < n; i++) {
            uint16_t h = gl::fp32_to_fp16(u(rng));
            put(&h, 2);
        }
    } else {
        REQUIRE(t == gl::Type::Q8_0);
        for (int64_t b = 0; b < n / gl::QK8_0; b++) {
            gl::BlockQ8_0 blk{};
            blk.d = gl::fp32_to_fp16(1.0f / 64);
            for (int j = 0; j < gl::QK8_0; j++) blk.qs[j] = static_cast<int8_t>(rng() % 255 - 127);
            put(&blk, sizeof blk);
        }
    }
    REQUIRE(out.size() == gl::row_size(t, ne0) * static_cast<size_t>(rows));
    return out;
}

struct TinyTensor {
    std::string name;
    gl::Type type;
    std::vector<int64_t> ne;
};

// n_embd 32, 4 heads of 8, 2 KV heads, FFN 32, vocab 32, 1 layer, context 64.
struct TinyModel {
    std::string arch = "llama";
    std::string skip_key;       // metadata key (without the arch prefix) to leave out
    std::string skip_tensor;    // tensor to leave out
    std::string reshape;        // tensor whose first dimension is made wrong
    std::string embd_as_string; // set: "<arch>.embedding_length" is written as this string
    bool biases = false;        // write Q/K/V biases (qwen2)

    std::vector<TinyTensor> tensor_list() const {
        using gl::Type;
        std::vector<TinyTensor> t = {
            {"token_embd.weight", Type::F16, {32, 32}},
            {"output_norm.weight", Type::F32, {32}},
            {"output.weight", Type::Q8_0, {32, 32}},
            {"blk.0.attn_norm.weight", Type::F32, {32}},
            {"blk.0.attn_q.weight", Type::F16, {32, 32}},
            {"blk.0.attn_k.weight", Type::F16, {32, 16}},
            {"blk.0.attn_v.weight", Type::F32, {32, 16}},
            {"blk.0.attn_output.weight", Type::Q8_0, {32, 32}},
            {"blk.0.ffn_norm.weight", Type::F32, {32}},
            {"blk.0.ffn_gate.weight", Type::F16, {32, 32}},
            {"blk.0.ffn_up.weight", Type::F16, {32, 32}},
            {"blk.0.ffn_down.weight", Type::F16, {32, 32}},
        };
        if (biases) {
            t.push_back({"blk.0.attn_q.bias", Type::F32, {32}});
            t.push_back({"blk.0.attn_k.bias", Type::F32, {16}});
            t.push_back({"blk.0.attn_v.bias", Type::F32, {16}});
        }
        return t;
    }

    Bytes bytes() const {
        GgufWriter w;
        w.set_str("general.architecture", arch);
        w.set_str("general.name", "kvtest-tiny-gguf");
        const std::string p = arch + ".";
        auto u32 = [&](const std::string& k, uint32_t v) {
            if (k != skip_key) w.set_u32(p + k, v);
        };
        u32("context_length", 64);
        if (!embd_as_string.empty())
            w.set_str(p + "embedding_length", embd_as_string);
        else
            u32("embedding_length", 32);
        u32("block_count", 1);
        u32("feed_forward_length", 32);
        u32("attention.head_count", 4);
        u32("attention.head_count_kv", 2);
        u32("rope.dimension_count", 8);
        if (skip_key != "attention.layer_norm_rms_epsilon")
            w.set_f32(p + "attention.layer_norm_rms_epsilon", 1e-5f);
        w.set_str("tokenizer.ggml.model", "llama");
        std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
        while (tokens.size() < 32)
            tokens.push_back("\xe2\x96\x81t" + std::to_string(tokens.size()));
        w.set_str_array("tokenizer.ggml.tokens", tokens);
        w.set_f32_array("tokenizer.ggml.scores", std::vector<float>(32, 0.0f));
        w.set_i32_array("tokenizer.ggml.token_type", std::vector<int32_t>(32, 1));
        uint32_t seed = 1;
        for (TinyTensor t : tensor_list()) {
            if (t.name == skip_tensor) continue;
            if (t.name == reshape) t.ne[0] += t.ne.size() == 1 ? 1 : 32; // Q8_0 rows stay whole
            const int64_t rows = t.ne.size() > 1 ? t.ne[1] : 1;
            const Bytes d = tensor_data(t.type, t.ne[0], rows, seed++);
            w.add_tensor(t.name, t.type, t.ne, d.data(), d.size());
        }
        return w.bytes();
    }
};

// Touch every tensor's first and last byte (a sanitizer build checks them).
unsigned touch_tensors(const GgufFile& f) {
    unsigned acc = 0;
    for (const GgufTensor& t : f.tensors()) {
        const auto* p = static_cast<const uint8_t*>(t.data);
        if (t.nbytes) acc += p[0] + p[t.nbytes - 1];
    }
    return acc;
}

// ---- facts about the shared files, read independently of kvrun ------------

struct FileFacts {
    const char* rel;
    const char* arch;
    uint64_t n_kv, n_tensors, size, data_offset, n_vocab;
};
// From a separate reading of each file's header (a few lines of Python written
// from the format description, not from kvrun's code).
const FileFacts kFacts[] = {
    {"models/stories260K.gguf", "llama", 19, 48, 1185376, 14176, 512},
    {"models/synthetic/tiny-Q4_0.gguf", "llama", 24, 39, 13832928, 726240, 32000},
    {"models/synthetic/tiny-Q4_K_M.gguf", "llama", 24, 39, 13951200, 726240, 32000},
    {"models/synthetic/tiny-Q6_K.gguf", "llama", 24, 39, 16755936, 726240, 32000},
    {"models/synthetic/tiny-Q8_0.gguf", "llama", 24, 39, 21485792, 726240, 32000},
    {"models/synthetic/tiny-f16.gguf", "llama", 23, 39, 39794880, 726208, 32000},
    {"models/synthetic/tiny-qwen2-Q8_0.gguf", "qwen2", 21, 50, 18658208, 1769856, 50257},
    {"vocab/ggml-vocab-gpt-2.gguf", "gpt2", 16, 0, 1766807, 1766816, 50257},
    {"vocab/ggml-vocab-llama-spm.gguf", "llama", 22, 0, 723869, 723872, 32000},
    {"vocab/ggml-vocab-phi-3.gguf", "phi3", 26, 0, 726019, 726048, 32064},
};

// Elements per block and bytes per block, from the GGUF type descriptions.
std::optional<std::pair<uint64_t, uint64_t>> block_of(gl::Type t) {
    switch (static_cast<uint32_t>(t)) {
    case 0:
        return std::pair<uint64_t, uint64_t>{1, 4}; // f32
    case 1:
        return std::pair<uint64_t, uint64_t>{1, 2}; // f16
    case 2:
        return std::pair<uint64_t, uint64_t>{32, 18}; // q4_0
    case 8:
        return std::pair<uint64_t, uint64_t>{32, 34}; // q8_0
    case 12:
        return std::pair<uint64_t, uint64_t>{256, 144}; // q4_K
    case 14:
        return std::pair<uint64_t, uint64_t>{256, 210}; // q6_K
    default:
        return std::nullopt;
    }
}

std::vector<std::string> shared_gguf_files() {
    std::vector<std::string> out;
    for (const char* dir : {"models", "models/synthetic", "vocab"}) {
        const fs::path d = kvtest::shared(dir);
        if (!fs::is_directory(d)) continue;
        for (const auto& e : fs::directory_iterator(d))
            if (e.is_regular_file() && e.path().extension() == ".gguf")
                out.push_back(fs::relative(e.path(), kvtest::shared("")).generic_string());
    }
    std::sort(out.begin(), out.end());
    return out;
}

} // namespace

// ---------------------------------------------------------------------------

TEST_CASE("gguf: every shared file parses and matches independently read facts") {
    const std::vector<std::string> files = shared_gguf_files();
    for (const FileFacts& ff : kFacts) {
        INFO(ff.rel);
        CHECK(std::find(files.begin(), files.end(), ff.rel) != files.end());
    }
    for (const std::string& rel : files) {
        CAPTURE(rel);
        const std::string path = kvtest::shared(rel);
        GgufFile f = GgufFile::open(path);
        CHECK(f.version() == 3);
        CHECK(f.file_size() == fs::file_size(path));
        CHECK(f.alignment() == 32);
        CHECK(f.data_offset() % f.alignment() == 0);
        REQUIRE(f.get_str("general.architecture"));

        const FileFacts* ff = nullptr;
        for (const FileFacts& x : kFacts)
            if (rel == x.rel) ff = &x;
        if (ff) {
            CHECK(*f.get_str("general.architecture") == ff->arch);
            CHECK(f.metadata().size() == ff->n_kv);
            CHECK(f.tensors().size() == ff->n_tensors);
            CHECK(f.file_size() == ff->size);
            CHECK(f.data_offset() == ff->data_offset);
            const GgufValue& toks = f.need_array("tokenizer.ggml.tokens", GgufType::string);
            CHECK(toks.count == ff->n_vocab);
            CHECK(toks.strs.size() == ff->n_vocab);
        }
        const bool is_model = rel.rfind("models/", 0) == 0;
        if (is_model) {
            CHECK(f.tensors().size() > 0);
            const std::string arch(*f.get_str("general.architecture"));
            CHECK((arch == "llama" || arch == "qwen2"));
            CHECK(f.need_u64(arch + ".block_count") > 0);
            CHECK(f.need_u64(arch + ".embedding_length") > 0);
            CHECK(f.tensor("token_embd.weight") != nullptr);
        }

        // Every tensor: inside the file, aligned, sized by its shape and type,
        // no two overlapping, one base address for all.
        std::vector<std::pair<uint64_t, uint64_t>> spans;
        const uint8_t* base = nullptr;
        for (const GgufTensor& t : f.tensors()) {
            CAPTURE(t.name);
            REQUIRE(f.tensor(t.name) == &t);
            CHECK(t.n_dims >= 1);
            CHECK(t.n_dims <= 4);
            CHECK(t.offset >= f.data_offset());
            CHECK((t.offset - f.data_offset()) % f.alignment() == 0);
            CHECK(t.offset + t.nbytes <= f.file_size());
            const auto blk = block_of(t.type);
            REQUIRE_MESSAGE(blk, "unexpected type " << gl::type_name(t.type));
            CHECK(static_cast<uint64_t>(t.ne[0]) % blk->first == 0);
            CHECK(t.nbytes == static_cast<uint64_t>(t.n_elements()) / blk->first * blk->second);
            const uint8_t* b = static_cast<const uint8_t*>(t.data) - t.offset;
            if (!base) base = b;
            CHECK(b == base);
            spans.push_back({t.offset, t.offset + t.nbytes});
        }
        std::sort(spans.begin(), spans.end());
        for (size_t i = 1; i < spans.size(); i++) CHECK(spans[i - 1].second <= spans[i].first);
        if (!f.tensors().empty()) touch_tensors(f);
    }
}

TEST_CASE("gguf: stories260K metadata, shapes and data") {
    GgufFile f = GgufFile::open(kvtest::shared("models/stories260K.gguf"));
    // Metadata in file order, with the types the file uses.
    REQUIRE(f.metadata().size() == 19);
    CHECK(f.metadata()[0].first == "tokenizer.ggml.tokens");
    CHECK(f.metadata()[4].first == "general.architecture");
    CHECK(f.metadata()[18].first == "llama.attention.layer_norm_rms_epsilon");
    const std::map<std::string, uint64_t> ints = {
        {"llama.context_length", 2048},       {"llama.embedding_length", 64},
        {"llama.feed_forward_length", 172},   {"llama.attention.head_count", 8},
        {"llama.attention.head_count_kv", 4}, {"llama.block_count", 5},
        {"llama.rope.dimension_count", 8},    {"tokenizer.ggml.bos_token_id", 1},
        {"tokenizer.ggml.eos_token_id", 2},   {"tokenizer.ggml.seperator_token_id", 4294967295u},
    };
    for (const auto& [k, v] : ints) {
        CAPTURE(k);
        REQUIRE(f.find(k));
        CHECK(f.find(k)->type == GgufType::u32);
        CHECK(f.need_u64(k) == v);
    }
    CHECK(f.find("llama.attention.layer_norm_rms_epsilon")->type == GgufType::f32);
    CHECK(*f.get_f64("llama.attention.layer_norm_rms_epsilon") == static_cast<double>(1e-5f));
    CHECK(f.need_str("tokenizer.ggml.model") == "llama");
    CHECK(f.need_str("general.name") == "llama");
    const GgufValue& toks = f.need_array("tokenizer.ggml.tokens", GgufType::string);
    CHECK(toks.strs[0] == "<unk>");
    CHECK(toks.strs[1] == "<s>");
    CHECK(toks.strs[13] == "<0x0A>");
    const GgufValue& types = f.need_array("tokenizer.ggml.token_type", GgufType::i32);
    CHECK(types.elem_type == GgufType::i32);
    CHECK(types.array_i64(0) == 2);
    CHECK(types.array_i64(3) == 6);
    CHECK(f.need_array("tokenizer.ggml.scores", GgufType::f32).elem_type == GgufType::f32);
    CHECK(f.find("no.such.key") == nullptr);
    CHECK(!f.get_u64("no.such.key"));

    // Shapes, in file order.
    REQUIRE(f.tensors().size() == 48);
    const std::vector<std::pair<std::string, std::vector<int64_t>>> head = {
        {"token_embd.weight", {64, 512}},
        {"output_norm.weight", {64}},
        {"output.weight", {64, 512}},
    };
    const std::vector<std::pair<std::string, std::vector<int64_t>>> layer = {
        {"attn_q.weight", {64, 64}},    {"attn_k.weight", {64, 32}},
        {"attn_v.weight", {64, 32}},    {"attn_output.weight", {64, 64}},
        {"attn_norm.weight", {64}},     {"ffn_gate.weight", {64, 172}},
        {"ffn_down.weight", {172, 64}}, {"ffn_up.weight", {64, 172}},
        {"ffn_norm.weight", {64}},
    };
    std::vector<std::pair<std::string, std::vector<int64_t>>> all = head;
    for (int l = 0; l < 5; l++)
        for (const auto& [n, ne] : layer) all.push_back({"blk." + std::to_string(l) + "." + n, ne});
    REQUIRE(all.size() == 48);
    for (size_t i = 0; i < all.size(); i++) {
        const GgufTensor& t = f.tensors()[i];
        CAPTURE(all[i].first);
        CHECK(t.name == all[i].first);
        CHECK(t.type == gl::Type::F32);
        REQUIRE(t.n_dims == static_cast<int>(all[i].second.size()));
        for (int d = 0; d < t.n_dims; d++) CHECK(t.ne[d] == all[i].second[d]);
        for (int d = t.n_dims; d < 4; d++) CHECK(t.ne[d] == 1);
    }
    CHECK(f.tensor("token_embd.weight")->shape_str() == "[64, 512]");
    CHECK(f.tensor("blk.4.ffn_down.weight")->shape_str() == "[172, 64]");

    // Data: where it starts, its first values, and the last tensor ending at EOF.
    const GgufTensor* emb = f.tensor("token_embd.weight");
    CHECK(emb->offset == 14176);
    CHECK(emb->nbytes == 64 * 512 * 4);
    float x[4];
    std::memcpy(x, emb->data, sizeof x);
    CHECK(x[0] == doctest::Approx(-0.29474878).epsilon(1e-6));
    CHECK(x[1] == doctest::Approx(0.56189561).epsilon(1e-6));
    CHECK(x[3] == doctest::Approx(0.34057361).epsilon(1e-6));
    const GgufTensor& last = f.tensors().back();
    CHECK(last.name == "blk.4.ffn_norm.weight");
    CHECK(last.offset + last.nbytes == f.file_size());
    float y;
    std::memcpy(&y, static_cast<const uint8_t*>(last.data) + last.nbytes - 4, 4);
    CHECK(y == doctest::Approx(1.23426116).epsilon(1e-6));
    CHECK(f.tensor("blk.1.attn_k.weight")->offset == 14176 + 460544);
}

TEST_CASE("gguf: writer round trip with every value type and a non-default alignment") {
    GgufWriter w(64);
    auto put_int = [&](const char* k, GgufType t, int64_t i, uint64_t u) {
        GgufValue v;
        v.type = t;
        v.i = i;
        v.u = u;
        w.copy_kv(k, v);
    };
    put_int("t.u8", GgufType::u8, 0, 200);
    put_int("t.i8", GgufType::i8, -100, 0);
    put_int("t.u16", GgufType::u16, 0, 60000);
    put_int("t.i16", GgufType::i16, -30000, 0);
    w.set_u32("t.u32", 4000000000u);
    w.set_i32("t.i32", -2000000000);
    w.set_u64("t.u64", (1ull << 63) | 5);
    put_int("t.i64", GgufType::i64, std::numeric_limits<int64_t>::min() + 7, 0);
    w.set_f32("t.f32", 3.25f);
    GgufValue f64;
    f64.type = GgufType::f64;
    f64.f = 0.1;
    w.copy_kv("t.f64", f64);
    w.set_bool("t.true", true);
    w.set_bool("t.false", false);
    const std::string with_nul("a\0b\xc3\xa9", 5);
    w.set_str("t.str", with_nul);
    w.set_str("t.empty", "");
    w.set_f32_array("t.arr_f32", {1.5f, -2.0f, 1e30f});
    w.set_i32_array("t.arr_i32", {-1, 0, std::numeric_limits<int32_t>::max()});
    const std::vector<std::string> strs = {"", "x", "h\xc3\xa9llo", std::string(1000, 'z')};
    w.set_str_array("t.arr_str", strs);
    // Numeric arrays of the other element types, through copy_kv.
    const uint8_t u8s[] = {0, 1, 255};
    const uint16_t u16s[] = {0, 65535};
    const int64_t i64s[] = {-5, std::numeric_limits<int64_t>::max()};
    const double f64s[] = {0.25, -1e300};
    const uint8_t bools[] = {1, 0, 1};
    auto num_array = [](GgufType elem, const void* p, uint64_t n) {
        GgufValue a;
        a.type = GgufType::array;
        a.elem_type = elem;
        a.count = n;
        a.raw = static_cast<const uint8_t*>(p);
        return a;
    };
    w.copy_kv("t.arr_u8", num_array(GgufType::u8, u8s, 3));
    w.copy_kv("t.arr_u16", num_array(GgufType::u16, u16s, 2));
    w.copy_kv("t.arr_i64", num_array(GgufType::i64, i64s, 2));
    w.copy_kv("t.arr_f64", num_array(GgufType::f64, f64s, 2));
    w.copy_kv("t.arr_bool", num_array(GgufType::boolean, bools, 3));
    w.copy_kv("t.arr_empty", num_array(GgufType::u32, nullptr, 0));
    // [[1, 2, 3] (i32), ["a", "bc"], [] (u8), [[7] (u64)]]
    const int32_t i32s[] = {1, 2, 3};
    const uint64_t sevens[] = {7};
    GgufValue nested;
    nested.type = GgufType::array;
    nested.elem_type = GgufType::array;
    nested.items.push_back(num_array(GgufType::i32, i32s, 3));
    GgufValue sa;
    sa.type = GgufType::array;
    sa.elem_type = GgufType::string;
    sa.strs = {"a", "bc"};
    sa.count = 2;
    nested.items.push_back(sa);
    nested.items.push_back(num_array(GgufType::u8, nullptr, 0));
    GgufValue inner;
    inner.type = GgufType::array;
    inner.elem_type = GgufType::array;
    inner.items.push_back(num_array(GgufType::u64, sevens, 1));
    inner.count = 1;
    nested.items.push_back(inner);
    nested.count = nested.items.size();
    w.copy_kv("t.nested", nested);

    // Two tensors whose sizes are not multiples of the alignment.
    std::vector<float> a(15);
    for (size_t i = 0; i < a.size(); i++) a[i] = 0.5f * static_cast<float>(i) - 3.0f;
    const Bytes b = tensor_data(gl::Type::Q8_0, 64, 2, 99);
    w.add_tensor("a", gl::Type::F32, {3, 5}, a.data(), a.size() * 4);
    w.add_tensor("blk.0.b", gl::Type::Q8_0, {64, 2}, b.data(), b.size());

    const Bytes file = w.bytes();
    TempDir dir;
    const std::string path = (dir.path / "rt.gguf").string();
    w.write(path);
    CHECK(slurp(path) == file);

    for (int from_disk = 0; from_disk < 2; from_disk++) {
        CAPTURE(from_disk);
        GgufFile f = from_disk ? GgufFile::open(path) : GgufFile::parse(file.data(), file.size());
        CHECK(f.version() == 3);
        CHECK(f.alignment() == 64);
        CHECK(f.need_u64("general.alignment") == 64);
        CHECK(f.data_offset() % 64 == 0);

        auto get = [&](const char* k, GgufType t) -> const GgufValue& {
            const GgufValue* x = f.find(k);
            REQUIRE_MESSAGE(x, k);
            CHECK_MESSAGE(x->type == t, k);
            return *x;
        };
        CHECK(get("t.u8", GgufType::u8).u == 200);
        CHECK(get("t.i8", GgufType::i8).i == -100);
        CHECK(get("t.u16", GgufType::u16).u == 60000);
        CHECK(get("t.i16", GgufType::i16).i == -30000);
        CHECK(get("t.u32", GgufType::u32).u == 4000000000u);
        CHECK(get("t.i32", GgufType::i32).i == -2000000000);
        CHECK(get("t.u64", GgufType::u64).u == ((1ull << 63) | 5));
        CHECK(get("t.i64", GgufType::i64).i == std::numeric_limits<int64_t>::min() + 7);
        CHECK(get("t.f32", GgufType::f32).f == 3.25);
        CHECK(get("t.f64", GgufType::f64).f == 0.1);
        CHECK(get("t.true", GgufType::boolean).u == 1);
        CHECK(get("t.false", GgufType::boolean).u == 0);
        CHECK(*f.get_bool("t.true"));
        CHECK(!*f.get_bool("t.false"));
        CHECK(get("t.str", GgufType::string).s == with_nul);
        CHECK(f.need_str("t.empty").empty());

        const GgufValue& af = get("t.arr_f32", GgufType::array);
        REQUIRE(af.count == 3);
        CHECK(af.elem_type == GgufType::f32);
        CHECK(af.array_f64(0) == 1.5);
        CHECK(af.array_f64(1) == -2.0);
        CHECK(af.array_f64(2) == static_cast<double>(1e30f));
        const GgufValue& ai = get("t.arr_i32", GgufType::array);
        REQUIRE(ai.count == 3);
        CHECK(ai.array_i64(0) == -1);
        CHECK(ai.array_i64(2) == std::numeric_limits<int32_t>::max());
        const GgufValue& as = get("t.arr_str", GgufType::array);
        CHECK(as.elem_type == GgufType::string);
        REQUIRE(as.strs.size() == strs.size());
        for (size_t i = 0; i < strs.size(); i++) CHECK(as.strs[i] == strs[i]);
        const GgufValue& au8 = get("t.arr_u8", GgufType::array);
        REQUIRE(au8.count == 3);
        CHECK(std::memcmp(au8.raw, u8s, 3) == 0);
        CHECK(au8.array_i64(2) == 255);
        const GgufValue& au16 = get("t.arr_u16", GgufType::array);
        REQUIRE(au16.count == 2);
        CHECK(au16.array_i64(1) == 65535);
        const GgufValue& ai64 = get("t.arr_i64", GgufType::array);
        REQUIRE(ai64.count == 2);
        CHECK(ai64.array_i64(0) == -5);
        CHECK(ai64.array_i64(1) == std::numeric_limits<int64_t>::max());
        const GgufValue& af64 = get("t.arr_f64", GgufType::array);
        REQUIRE(af64.count == 2);
        CHECK(af64.array_f64(0) == 0.25);
        CHECK(af64.array_f64(1) == -1e300);
        const GgufValue& ab = get("t.arr_bool", GgufType::array);
        REQUIRE(ab.count == 3);
        CHECK(ab.elem_type == GgufType::boolean);
        CHECK(ab.array_i64(0) == 1);
        CHECK(ab.array_i64(1) == 0);
        const GgufValue& ae = get("t.arr_empty", GgufType::array);
        CHECK(ae.elem_type == GgufType::u32);
        CHECK(ae.count == 0);

        const GgufValue& n = get("t.nested", GgufType::array);
        CHECK(n.elem_type == GgufType::array);
        REQUIRE(n.count == 4);
        REQUIRE(n.items.size() == 4);
        CHECK(n.items[0].elem_type == GgufType::i32);
        REQUIRE(n.items[0].count == 3);
        CHECK(n.items[0].array_i64(2) == 3);
        CHECK(n.items[1].elem_type == GgufType::string);
        REQUIRE(n.items[1].strs.size() == 2);
        CHECK(n.items[1].strs[1] == "bc");
        CHECK(n.items[2].elem_type == GgufType::u8);
        CHECK(n.items[2].count == 0);
        CHECK(n.items[3].elem_type == GgufType::array);
        REQUIRE(n.items[3].items.size() == 1);
        CHECK(n.items[3].items[0].elem_type == GgufType::u64);
        REQUIRE(n.items[3].items[0].count == 1);
        CHECK(n.items[3].items[0].array_i64(0) == 7);

        // Insertion order kept; general.alignment appended by the writer.
        CHECK(f.metadata().front().first == "t.u8");
        CHECK(f.metadata().back().first == "general.alignment");

        REQUIRE(f.tensors().size() == 2);
        const GgufTensor* ta = f.tensor("a");
        const GgufTensor* tb = f.tensor("blk.0.b");
        REQUIRE(ta);
        REQUIRE(tb);
        CHECK(ta->type == gl::Type::F32);
        CHECK(ta->n_dims == 2);
        CHECK(ta->shape_str() == "[3, 5]");
        CHECK(ta->nbytes == 60);
        CHECK(tb->type == gl::Type::Q8_0);
        CHECK(tb->shape_str() == "[64, 2]");
        CHECK(tb->nbytes == 4 * 34);
        for (const GgufTensor* t : {ta, tb}) {
            CHECK(t->offset % 64 == 0);
            if (from_disk) // the mapping is page-aligned, so the data is 64-aligned in memory
                CHECK(reinterpret_cast<uintptr_t>(t->data) % 64 == 0);
            else
                CHECK(static_cast<const uint8_t*>(t->data) == file.data() + t->offset);
        }
        CHECK(tb->offset == ta->offset + 64); // 60 bytes padded to the alignment
        CHECK(std::memcmp(ta->data, a.data(), 60) == 0);
        CHECK(std::memcmp(tb->data, b.data(), b.size()) == 0);
        CHECK(tb->offset + 192 == f.file_size()); // 136 bytes padded to 192
    }

    // Copying every key from the parsed file gives the same metadata bytes.
    GgufFile f = GgufFile::parse(file.data(), file.size());
    GgufWriter w2(64);
    for (const auto& [k, val] : f.metadata())
        if (k != "general.alignment") w2.copy_kv(k, val);
    w2.add_tensor("a", gl::Type::F32, {3, 5}, a.data(), a.size() * 4);
    w2.add_tensor("blk.0.b", gl::Type::Q8_0, {64, 2}, b.data(), b.size());
    CHECK(w2.bytes() == file);
}

TEST_CASE("gguf: typed look-ups reject the wrong type and name the key") {
    GgufWriter w;
    w.set_str("k.str", "x");
    w.set_i32("k.neg", -3);
    w.set_i32_array("k.ints", {1, 2});
    w.set_f32("k.float", 2.5f);
    const Bytes file = w.bytes();
    GgufFile f = GgufFile::parse(file.data(), file.size(), "typed.gguf");
    CHECK(contains(expect_bad_model([&] { f.get_u64("k.str"); }), "k.str"));
    CHECK(contains(expect_bad_model([&] { f.get_u64("k.neg"); }), "k.neg"));
    CHECK(contains(expect_bad_model([&] { f.get_str("k.ints"); }), "k.ints"));
    CHECK(contains(expect_bad_model([&] { f.get_bool("k.str"); }), "k.str"));
    CHECK(contains(expect_bad_model([&] { f.get_u64("k.float"); }), "k.float"));
    CHECK(contains(expect_bad_model([&] { f.need_u64("k.missing"); }), "k.missing"));
    CHECK(contains(expect_bad_model([&] { f.need_str("k.missing2"); }), "k.missing2"));
    CHECK(contains(expect_bad_model([&] { f.need_array("k.str", GgufType::u32); }), "k.str"));
    CHECK(contains(expect_bad_model([&] { f.need_array("k.ints", GgufType::string); }), "k.ints"));
    CHECK(f.get_f64("k.float") == 2.5);
    CHECK(f.need_array("k.ints", GgufType::u32).count == 2); // any numeric array is accepted
    CHECK(f.tensors().empty());
}

TEST_CASE("gguf: float arrays read as integers saturate instead of overflowing") {
    // A hostile file may put any float where integers are expected (e.g. token
    // types, which accept any numeric array): converting must stay defined.
    GgufWriter w;
    w.set_f32_array("k.f32", {1e31f, -1e31f, std::numeric_limits<float>::quiet_NaN(), 2.9f, -2.9f,
                              std::numeric_limits<float>::infinity()});
    const double f64s[] = {9.3e18, -9.3e18, 9223372036854775808.0, -1e300, 42.5};
    GgufValue a;
    a.type = GgufType::array;
    a.elem_type = GgufType::f64;
    a.count = 5;
    a.raw = reinterpret_cast<const uint8_t*>(f64s);
    w.copy_kv("k.f64", a);
    const Bytes file = w.bytes();
    GgufFile f = GgufFile::parse(file.data(), file.size());
    constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
    constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
    const GgufValue& x = f.need_array("k.f32", GgufType::i32);
    CHECK(x.array_i64(0) == kMax);
    CHECK(x.array_i64(1) == kMin);
    CHECK(x.array_i64(2) == 0);
    CHECK(x.array_i64(3) == 2);
    CHECK(x.array_i64(4) == -2);
    CHECK(x.array_i64(5) == kMax);
    const GgufValue& y = f.need_array("k.f64", GgufType::i64);
    CHECK(y.array_i64(0) == kMax);
    CHECK(y.array_i64(1) == kMin);
    CHECK(y.array_i64(2) == kMax);
    CHECK(y.array_i64(3) == kMin);
    CHECK(y.array_i64(4) == 42);
}

TEST_CASE("gguf: open() rejects missing, empty and non-regular files") {
    TempDir dir;
    CHECK(contains(expect_bad_model([&] { GgufFile::open((dir.path / "nope.gguf").string()); }),
                   "nope.gguf"));
    expect_bad_model([&] { GgufFile::open(dir.path.string()); });
    const std::string empty = dir.file("empty.gguf", {});
    CHECK(contains(expect_bad_model([&] { GgufFile::open(empty); }), "empty.gguf"));
    const Bytes real = slurp(kvtest::shared("models/stories260K.gguf"));
    const std::string cut = dir.file("cut.gguf", Bytes(real.begin(), real.end() - 1));
    CHECK(contains(expect_bad_model([&] { GgufFile::open(cut); }), "cut.gguf"));
    const std::string whole = dir.file("whole.gguf", real);
    CHECK(GgufFile::open(whole).tensors().size() == 48);
}

TEST_CASE("gguf: the hostile-input fixtures are valid until broken") {
    // The cases below each break one field of these; here they parse.
    const Bytes one = OneTensor{}.bytes();
    GgufFile f = GgufFile::parse(one.data(), one.size());
    REQUIRE(f.tensors().size() == 1);
    CHECK(f.tensors()[0].nbytes == 64);
    CHECK(f.tensors()[0].offset + 64 == one.size());
    OneTensor al;
    al.alignment = 64;
    const Bytes b64 = al.bytes();
    CHECK(GgufFile::parse(b64.data(), b64.size()).alignment() == 64);
    OneTensor q;
    q.type = 8;
    q.ne = {64, 1};
    q.data = 68;
    const Bytes bq = q.bytes();
    CHECK(GgufFile::parse(bq.data(), bq.size()).tensors()[0].type == gl::Type::Q8_0);
    const Bytes n3 = one_key("test.nested", GgufType::array, nested_array_value(3));
    GgufFile fn = GgufFile::parse(n3.data(), n3.size());
    const GgufValue* v = fn.find("test.nested");
    REQUIRE(v);
    REQUIRE(v->items.size() == 1);
    REQUIRE(v->items[0].items.size() == 1);
    CHECK(v->items[0].items[0].array_i64(0) == 7);
    const Bytes u = one_key("test.u32", GgufType::u32, Raw{}.u32(5).b);
    CHECK(GgufFile::parse(u.data(), u.size()).need_u64("test.u32") == 5);
}

TEST_CASE("gguf: hostile inputs throw Error(bad_model) naming the problem") {
    struct Case {
        std::string what;
        Bytes bytes;
        std::vector<std::string> needles; // each must appear in the message
    };
    std::vector<Case> cases;
    auto one = [&](const std::string& what, auto&& edit, std::vector<std::string> needles) {
        OneTensor t;
        edit(t);
        cases.push_back({what, t.bytes(), std::move(needles)});
    };
    const std::string tn = "blk.0.attn_q.weight";
    static constexpr uint64_t p60 = 1ull << 60, p62 = 1ull << 62, p63 = 1ull << 63;
    using T = OneTensor;

    one("bad magic", [](T& t) { t.magic = 0x47475546; }, {"magic"});
    one("version 1", [](T& t) { t.version = 1; }, {"version 1"});
    one("version 4", [](T& t) { t.version = 4; }, {"version 4"});
    one("version 2^32-1", [](T& t) { t.version = 0xffffffffu; }, {"4294967295"});
    one("n_tensors 2^60", [](T& t) { t.n_tensors = p60; }, {std::to_string(p60)});
    one("n_kv 2^60", [](T& t) { t.n_kv = p60; }, {std::to_string(p60)});
    one("n_kv one too many", [](T& t) { t.n_kv = 2; }, {});
    one("n_tensors one too many", [](T& t) { t.n_tensors = 2; }, {});
    one("unknown tensor type 99", [](T& t) { t.type = 99; }, {tn, "99"});
    one("unknown tensor type 4", [](T& t) { t.type = 4; }, {tn});
    one("tensor type 2^32-1", [](T& t) { t.type = 0xffffffffu; }, {tn});
    one("n_dims 0", [](T& t) { t.ne = {}; }, {tn});
    one("n_dims 5", [](T& t) { t.ne = {2, 2, 2, 2, 1}; }, {tn});
    one("a dimension of 0", [](T& t) { t.ne = {8, 0}; }, {tn});
    one("dims whose product overflows", [](T& t) { t.ne = {1ull << 32, 1ull << 32}; }, {tn});
    one("dims whose product overflows int64",
        [](T& t) {
            t.ne = {1ull << 21, 1ull << 21, 1ull << 22};
        },
        {tn});
    one("one dimension of 2^63", [](T& t) { t.ne = {p63}; }, {tn});
    one("q8_0 row of 33",
        [](T& t) {
            t.type = 8;
            t.ne = {33, 1};
        },
        {tn, "33"});
    one("offset past the end", [](T& t) { t.offset = 1u << 20; }, {tn});
    one("data one byte short", [](T& t) { t.data = 63; }, {tn});
    one("offset + size wraps", [](T& t) { t.offset = ~uint64_t{31}; }, {tn});
    one("misaligned offset",
        [](T& t) {
            t.offset = 4; // inside the file
            t.data = 128;
        },
        {tn});
    one("general.alignment 0", [](T& t) { t.alignment = 0; }, {"general.alignment"});
    one("general.alignment 3", [](T& t) { t.alignment = 3; }, {"general.alignment"});
    one("general.alignment 48", [](T& t) { t.alignment = 48; }, {"general.alignment"});
    one("misaligned for general.alignment 64",
        [](T& t) {
            t.alignment = 64;
            t.offset = 32;
            t.data = 128;
        },
        {tn});

    const Bytes long_len = Raw{}.u64(p63).b;
    cases.push_back({"key length 2^63", Raw{}.header(0, 1).u64(p63).u32(4).u32(1).b, {}});
    cases.push_back({"string value length 2^63",
                     one_key("test.str", GgufType::string, long_len),
                     {"test.str"}});
    cases.push_back({"string value 1 byte past the end",
                     one_key("test.str", GgufType::string, Raw{}.str("abcd").b),
                     {"test.str"}});
    cases.back().bytes.pop_back();
    cases.push_back({"tensor name length 2^63", Raw{}.header(1, 0).u64(p63).zeros(64).b, {}});
    auto arr = [](GgufType elem, uint64_t n) {
        return Raw{}.u32(static_cast<uint32_t>(elem)).u64(n).zeros(64).b;
    };
    cases.push_back({"u32 array of 2^62",
                     one_key("test.arr", GgufType::array, arr(GgufType::u32, p62)),
                     {"test.arr", std::to_string(p62)}});
    cases.push_back({"f64 array of 2^62",
                     one_key("test.arr", GgufType::array, arr(GgufType::f64, p62)),
                     {"test.arr"}});
    cases.push_back({"string array of 2^62",
                     one_key("test.arr", GgufType::array, arr(GgufType::string, p62)),
                     {"test.arr", std::to_string(p62)}});
    cases.push_back({"array array of 2^62",
                     one_key("test.arr", GgufType::array, arr(GgufType::array, p62)),
                     {"test.arr"}});
    cases.push_back({"string array of 2^64-1",
                     one_key("test.arr", GgufType::array, arr(GgufType::string, ~uint64_t{0})),
                     {"test.arr"}});
    cases.push_back(
        {"string array with an element of length 2^63",
         one_key("test.arr", GgufType::array,
                 Raw{}.u32(static_cast<uint32_t>(GgufType::string)).u64(2).str("ok").u64(p63).b),
         {"test.arr"}});
    cases.push_back({"nested arrays 100 deep",
                     one_key("test.nested", GgufType::array, nested_array_value(100)),
                     {"test.nested"}});
    cases.push_back({"nested arrays 100000 deep",
                     one_key("test.nested", GgufType::array, nested_array_value(100000)),
                     {"test.nested"}});
    cases.push_back({"unknown value type 13",
                     one_key("test.bad", static_cast<GgufType>(13), Raw{}.u32(0).b),
                     {"test.bad", "13"}});
    cases.push_back({"unknown value type 2^32-1",
                     one_key("test.bad", static_cast<GgufType>(0xffffffffu), Raw{}.u32(0).b),
                     {"test.bad"}});
    cases.push_back({"unknown array element type 13",
                     one_key("test.bad", GgufType::array, Raw{}.u32(13).u64(1).u32(0).b),
                     {"test.bad"}});
    cases.push_back({"general.alignment as a string",
                     one_key("general.alignment", GgufType::string, Raw{}.str("32").b),
                     {"general.alignment"}});
    {
        Raw r;
        r.header(0, 3).kv_str("general.architecture", "llama").kv_u32("llama.block_count", 1);
        r.kv_u32("llama.block_count", 2);
        cases.push_back({"duplicate keys", r.b, {"llama.block_count"}});
    }
    {
        Raw r;
        r.header(2, 1).kv_str("general.architecture", "llama");
        r.tensor(tn, {8, 2}, 0, 0).tensor(tn, {8, 2}, 0, 64).pad(32).zeros(128);
        cases.push_back({"duplicate tensor names", r.b, {tn}});
    }
    cases.push_back({"empty input", {}, {}});
    cases.push_back({"three bytes of magic", {'G', 'G', 'U'}, {}});
    cases.push_back({"version cut short", {'G', 'G', 'U', 'F', 3, 0}, {}});
    cases.push_back({"counts cut short", Raw{}.u32(kMagic).u32(3).u64(0).u32(0).b, {}});

    AddressSpaceCap cap(kHeadroom);
    for (const Case& c : cases) {
        INFO(c.what);
        const std::string msg = expect_bad_bytes(c.bytes, "hostile.gguf");
        CAPTURE(msg);
        CHECK(contains(msg, "hostile.gguf"));
        for (const std::string& n : c.needles)
            CHECK_MESSAGE(contains(msg, n), "missing '" << n << "'");
    }
}

TEST_CASE("gguf: every truncation of a writer-made model is rejected") {
    const Bytes file = TinyModel{}.bytes();
    GgufFile whole = GgufFile::parse(file.data(), file.size());
    uint64_t data_end = 0; // where the last tensor's data ends (the writer pads after it)
    for (const GgufTensor& t : whole.tensors()) data_end = std::max(data_end, t.offset + t.nbytes);
    REQUIRE(data_end > whole.data_offset());
    REQUIRE(data_end <= file.size());

    AddressSpaceCap cap(kHeadroom);
    size_t bad = 0;
    std::string first;
    for (size_t n = 0; n < data_end; n++) {
        Rejection r = try_reject([&] { parse_prefix(file, n, "cut.gguf"); });
        if (!r.threw_error || r.code != Exit::bad_model || !contains(r.message, "cut.gguf")) {
            if (bad++ == 0)
                first = "at " + std::to_string(n) + ": " + (r.threw_error ? r.message : r.other);
        }
    }
    CHECK_MESSAGE(bad == 0, bad << " truncations not rejected; first " << first);
    // Cutting only the padding after the last tensor loses nothing.
    for (size_t n = data_end; n <= file.size(); n++) CHECK_NOTHROW(parse_prefix(file, n));
}

TEST_CASE("gguf: truncations of stories260K are rejected") {
    const Bytes file = slurp(kvtest::shared("models/stories260K.gguf"));
    REQUIRE(file.size() == 1185376);
    // The last tensor ends at the end of the file, so every shorter prefix is
    // broken: all of them through the header and tensor table, ~200 across the rest.
    std::vector<size_t> cuts;
    for (size_t n = 0; n <= 14176; n++) cuts.push_back(n);
    std::mt19937_64 rng(260);
    for (int i = 0; i < 200; i++) cuts.push_back(14176 + rng() % (file.size() - 14176));
    cuts.push_back(file.size() - 1);

    AddressSpaceCap cap(kHeadroom);
    size_t bad = 0;
    std::string first;
    for (size_t n : cuts) {
        Rejection r = try_reject([&] { parse_prefix(file, n, "stories-cut.gguf"); });
        if (!r.threw_error || r.code != Exit::bad_model || !contains(r.message, "stories-cut.gguf"))
            if (bad++ == 0)
                first = "at " + std::to_string(n) + ": " + (r.threw_error ? r.message : r.other);
    }
    CHECK_MESSAGE(bad == 0,
                  bad << " of " << cuts.size() << " truncations not rejected; first " << first);
    CHECK_NOTHROW(parse_prefix(file, file.size()));
}

TEST_CASE("gguf: random byte flips either parse or throw Error(bad_model)") {
    const Bytes file = TinyModel{}.bytes();
    uint64_t data_offset = 0;
    {
        GgufFile f = GgufFile::parse(file.data(), file.size());
        data_offset = f.data_offset();
        CHECK_NOTHROW(Model::load(f));
    }
    AddressSpaceCap cap(kHeadroom);
    std::mt19937 rng(20240229);
    int parsed = 0, rejected = 0, loaded = 0, load_rejected = 0, wrong = 0;
    std::string first_wrong;
    unsigned acc = 0;
    for (int it = 0; it < 2000; it++) {
        Bytes b = file;
        const int flips = 1 + static_cast<int>(rng() % 4);
        for (int k = 0; k < flips; k++) {
            // Mostly in the header, metadata and tensor table, where flips matter.
            const size_t pos = rng() % 4 ? rng() % data_offset : rng() % b.size();
            b[pos] ^= static_cast<uint8_t>(1 + rng() % 255);
        }
        try {
            GgufFile f = GgufFile::parse(b.data(), b.size(), "flipped.gguf");
            parsed++;
            acc += touch_tensors(f);
            try {
                Model m = Model::load(f);
                loaded++;
                acc += *m.token_embd.row(0) + m.output_norm.size();
            } catch (const Error& e) {
                load_rejected++;
                if (e.code() != Exit::bad_model && wrong++ == 0) first_wrong = e.what();
            }
        } catch (const Error& e) {
            rejected++;
            if (e.code() != Exit::bad_model && wrong++ == 0) first_wrong = e.what();
        } catch (const std::exception& e) {
            if (wrong++ == 0) first_wrong = std::string("non-kvrun exception: ") + e.what();
        }
    }
    (void)acc;
    MESSAGE("byte flips: " << parsed << " parsed (" << loaded << " loaded, " << load_rejected
                           << " rejected by the loader), " << rejected
                           << " rejected by the parser");
    CHECK_MESSAGE(wrong == 0, first_wrong);
    CHECK(parsed + rejected == 2000);
    // Both outcomes occur, so the loop exercised the error paths and the success path.
    CHECK(rejected > 100);
    CHECK(parsed > 100);
    CHECK(load_rejected > 0);
    CHECK(loaded > 0);
}

TEST_CASE("model: the tiny writer-made model binds") {
    const Bytes file = TinyModel{}.bytes();
    GgufFile f = GgufFile::parse(file.data(), file.size(), "tiny.gguf");
    Model m = Model::load(f);
    CHECK(m.hp.arch == "llama");
    CHECK(m.hp.n_embd == 32);
    CHECK(m.hp.n_layer == 1);
    CHECK(m.hp.n_head == 4);
    CHECK(m.hp.n_head_kv == 2);
    CHECK(m.hp.head_dim == 8);
    CHECK(m.hp.n_ff == 32);
    CHECK(m.hp.n_vocab == 32);
    CHECK(m.hp.n_ctx_train == 64);
    CHECK(m.hp.rope_dims == 8);
    CHECK(m.output.type == gl::Type::Q8_0);
    CHECK(m.output.data == f.tensor("output.weight")->data);
    CHECK(m.layers.size() == 1);
    CHECK(m.layers[0].bq.empty());
    uint64_t total = 0;
    for (const GgufTensor& t : f.tensors()) total += t.nbytes;
    CHECK(m.weight_bytes == total);

    // Without output.weight the embedding is tied.
    TinyModel tied;
    tied.skip_tensor = "output.weight";
    const Bytes tb = tied.bytes();
    GgufFile ft = GgufFile::parse(tb.data(), tb.size());
    Model mt = Model::load(ft);
    CHECK(mt.output.data == mt.token_embd.data);

    TinyModel q;
    q.arch = "qwen2";
    q.biases = true;
    const Bytes qb = q.bytes();
    GgufFile fq = GgufFile::parse(qb.data(), qb.size());
    Model mq = Model::load(fq);
    CHECK(mq.hp.rope_neox);
    CHECK(mq.layers[0].bk.size() == 16);
}

TEST_CASE("model: missing keys and tensors, wrong shapes and architectures are named") {
    auto load_error = [](const TinyModel& spec) {
        const Bytes b = spec.bytes();
        return expect_bad_model([&] {
            GgufFile f = GgufFile::parse(b.data(), b.size(), "tiny.gguf");
            Model::load(f);
        });
    };
    for (const char* key : {"embedding_length", "block_count", "feed_forward_length",
                            "attention.head_count", "context_length"}) {
        TinyModel t;
        t.skip_key = key;
        const std::string msg = load_error(t);
        CAPTURE(msg);
        CHECK(contains(msg, std::string("llama.") + key));
        CHECK(contains(msg, "tiny.gguf"));
    }
    {
        TinyModel t;
        t.embd_as_string = "thirty-two";
        CHECK(contains(load_error(t), "llama.embedding_length"));
    }
    for (const TinyTensor& tt : TinyModel{}.tensor_list()) {
        if (tt.name == "output.weight") continue; // optional: tied to the embedding
        CAPTURE(tt.name);
        TinyModel missing;
        missing.skip_tensor = tt.name;
        CHECK(contains(load_error(missing), tt.name));
        TinyModel shaped;
        shaped.reshape = tt.name;
        const std::string msg = load_error(shaped);
        CAPTURE(msg);
        CHECK(contains(msg, tt.name));
    }
    {
        TinyModel t;
        t.reshape = "output.weight";
        CHECK(contains(load_error(t), "output.weight"));
    }
    {
        TinyModel t; // qwen2 needs Q/K/V biases
        t.arch = "qwen2";
        CHECK(contains(load_error(t), "blk.0.attn_q.bias"));
    }
    for (const char* arch : {"mamba", "gpt2", ""}) {
        TinyModel t;
        t.arch = arch;
        const std::string msg = load_error(t);
        CAPTURE(msg);
        CHECK(contains(msg, std::string("'") + arch + "'"));
    }
    {
        GgufWriter w; // no architecture at all
        w.set_u32("llama.block_count", 1);
        const Bytes b = w.bytes();
        GgufFile f = GgufFile::parse(b.data(), b.size());
        CHECK(contains(expect_bad_model([&] { Model::load(f); }), "general.architecture"));
    }
    {
        // A vocabulary-only file is not a runnable model.
        GgufFile f = GgufFile::open(kvtest::shared("vocab/ggml-vocab-llama-spm.gguf"));
        CHECK(contains(expect_bad_model([&] { Model::load(f); }), "token_embd.weight"));
    }
}

TEST_CASE("gguf: tensors moved onto huge pages are the same bytes, resident, and survive a move") {
    const std::string path = kvtest::shared("models/stories260K.gguf");
    GgufFile mapped = GgufFile::open(path);
    GgufFile moved = GgufFile::open(path);
    const uint8_t* map_begin = moved.bytes();
    const uint8_t* map_end = map_begin + moved.file_size();
    auto in_map = [&](const void* p) {
        return static_cast<const uint8_t*>(p) >= map_begin && static_cast<const uint8_t*>(p) < map_end;
    };
    // Everything but the token embedding moves.
    auto keep = [](const GgufTensor& t) { return t.name == "token_embd.weight"; };
    REQUIRE(moved.move_data_to_huge_pages(keep));
    CHECK(moved.data_moved());
    CHECK(!moved.move_data_to_huge_pages()); // once only
    // A move keeps the copy, and the tensors pointing into it.
    GgufFile kept = std::move(moved);
    REQUIRE(kept.tensors().size() == mapped.tensors().size());
    REQUIRE(kept.tensors().size() > 2);
    for (size_t i = 0; i < kept.tensors().size(); i++) {
        const GgufTensor& a = kept.tensors()[i];
        const GgufTensor& b = mapped.tensors()[i];
        INFO(a.name);
        CHECK(in_map(a.data) == keep(a));
        CHECK(a.nbytes == b.nbytes);
        CHECK(std::memcmp(a.data, b.data, a.nbytes) == 0);
        if (!keep(a)) CHECK(resident_bytes(a.data, a.nbytes) == a.nbytes);
        CHECK(reinterpret_cast<uintptr_t>(a.data) % 32 == 0); // SIMD loads as from the file
    }
    // The metadata is still read from the mapping.
    CHECK(kept.need_str("general.architecture") == mapped.need_str("general.architecture"));
    // A model bound to the moved file reads the copy.
    const Model m = Model::load(kept);
    CHECK(in_map(m.token_embd.data));
    CHECK(!in_map(m.layers.front().wq.data));
    CHECK(m.layers.front().wq.data == kept.tensor("blk.0.attn_q.weight")->data);
    // Nothing to move: false, nothing changed.
    GgufFile none = GgufFile::open(path);
    CHECK(!none.move_data_to_huge_pages([](const GgufTensor&) { return true; }));
    CHECK(!none.data_moved());
}
