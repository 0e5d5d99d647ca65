// libFuzzer target for the GGUF reader and the model binder. Any input must
// either parse or be rejected with kvrun::Error(bad_model); a parsed file's
// strings, arrays and tensors must lie inside the input (their first and last
// bytes are read, so AddressSanitizer sees any escape), and binding a model
// must likewise succeed or throw kvrun::Error.
//
// Seeds: the GGUF files in ../shared (run with -max_len=2000000 so they are
// not cut), plus small models this binary writes when started with
// KVRUN_FUZZ_WRITE_SEEDS=DIR (see scripts/fuzz.sh): small inputs mutate fast.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "error.h"
#include "gguf.h"
#include "gguf_writer.h"
#include "model.h"
#include "fuzz_support.h"

using namespace kvrun;

namespace {

const uint8_t* g_begin = nullptr;
const uint8_t* g_end = nullptr;

// Abort (a crash libFuzzer reports) unless [p, p + n) lies inside the input.
void check_inside(const void* p, uint64_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    if (n == 0) return;
    if (b < g_begin || b > g_end || n > static_cast<uint64_t>(g_end - b)) {
        std::fprintf(stderr, "fuzz_gguf: %llu bytes at %p escape the input\n",
                     static_cast<unsigned long long>(n), p);
        std::abort();
    }
}

volatile uint8_t g_sink;

void touch(const void* p, uint64_t n) {
    if (n == 0) return;
    check_inside(p, n);
    const auto* b = static_cast<const uint8_t*>(p);
    g_sink = static_cast<uint8_t>(b[0] ^ b[n - 1]);
}

void touch_value(const GgufValue& v) {
    switch (v.type) {
    case GgufType::string:
        touch(v.s.data(), v.s.size());
        break;
    case GgufType::array:
        if (v.elem_type == GgufType::string) {
            if (v.strs.size() != v.count) std::abort();
            for (std::string_view s : v.strs) touch(s.data(), s.size());
        } else if (v.elem_type == GgufType::array) {
            if (v.items.size() != v.count) std::abort();
            for (const GgufValue& item : v.items) touch_value(item);
        } else if (v.count > 0) {
            g_sink = static_cast<uint8_t>(v.array_i64(0) ^ v.array_i64(v.count - 1));
            g_sink = static_cast<uint8_t>(v.array_f64(v.count - 1) != 0);
        }
        break;
    default:
        break;
    }
}

void touch_matrix(const gl::Tensor& t) {
    if (!t) return;
    touch(t.data, t.bytes());
}

// ---- seeds ------------------------------------------------------------------

std::vector<uint8_t> fill(gl::Type type, int64_t n, std::mt19937& rng) {
    std::vector<uint8_t> out(gl::row_size(type, n));
    if (type == gl::Type::F32) {
        for (int64_t i = 0; i < n; i++) {
            float x = static_cast<float>(rng() % 2001) / 1000.0f - 1.0f;
            std::memcpy(out.data() + 4 * i, &x, 4);
        }
    } else if (type == gl::Type::F16) {
        for (int64_t i = 0; i < n; i++) {
            uint16_t h = gl::fp32_to_fp16(static_cast<float>(rng() % 2001) / 1000.0f - 1.0f);
            std::memcpy(out.data() + 2 * i, &h, 2);
        }
    } else {
        for (auto& b : out) b = static_cast<uint8_t>(rng());
    }
    return out;
}

// A tiny model of the given architecture: width 32, 4 heads of 8, 2 KV heads.
std::vector<uint8_t> tiny_model(const std::string& arch, gl::Type matrix_type, uint64_t alignment) {
    std::mt19937 rng(42);
    GgufWriter w(alignment);
    w.set_str("general.architecture", arch);
    const std::string p = arch + ".";
    w.set_u32(p + "context_length", 64);
    w.set_u32(p + "embedding_length", 32);
    w.set_u32(p + "block_count", 1);
    w.set_u32(p + "feed_forward_length", 32);
    w.set_u32(p + "attention.head_count", 4);
    w.set_u32(p + "attention.head_count_kv", 2);
    w.set_u32(p + "rope.dimension_count", 8);
    w.set_f32(p + "attention.layer_norm_rms_epsilon", 1e-5f);
    w.set_str("tokenizer.ggml.model", arch == "qwen2" ? "gpt2" : "llama");
    std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
    while (tokens.size() < 32) tokens.push_back("t" + std::to_string(tokens.size()));
    w.set_str_array("tokenizer.ggml.tokens", tokens);
    w.set_f32_array("tokenizer.ggml.scores", std::vector<float>(32, 0.0f));
    w.set_i32_array("tokenizer.ggml.token_type", std::vector<int32_t>(32, 1));
    auto add = [&](const std::string& name, gl::Type t, std::vector<int64_t> ne) {
        int64_t n = 1;
        for (int64_t x : ne) n *= x;
        const std::vector<uint8_t> d = fill(t, n, rng);
        w.add_tensor(name, t, ne, d.data(), d.size());
    };
    add("token_embd.weight", matrix_type, {32, 32});
    add("output_norm.weight", gl::Type::F32, {32});
    add("blk.0.attn_norm.weight", gl::Type::F32, {32});
    add("blk.0.attn_q.weight", matrix_type, {32, 32});
    add("blk.0.attn_k.weight", matrix_type, {32, 16});
    add("blk.0.attn_v.weight", matrix_type, {32, 16});
    if (arch == "qwen2") {
        add("blk.0.attn_q.bias", gl::Type::F32, {32});
        add("blk.0.attn_k.bias", gl::Type::F32, {16});
        add("blk.0.attn_v.bias", gl::Type::F32, {16});
    }
    add("blk.0.attn_output.weight", matrix_type, {32, 32});
    add("blk.0.ffn_norm.weight", gl::Type::F32, {32});
    add("blk.0.ffn_gate.weight", matrix_type, {32, 32});
    add("blk.0.ffn_up.weight", matrix_type, {32, 32});
    add("blk.0.ffn_down.weight", matrix_type, {32, 32});
    return w.bytes();
}

// Metadata of every value type, nested arrays included, and no tensors.
std::vector<uint8_t> all_value_types() {
    GgufWriter w;
    w.set_str("general.architecture", "llama");
    const uint8_t raw[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
    for (uint32_t t = 0; t <= 12; t++) {
        const auto type = static_cast<GgufType>(t);
        if (type == GgufType::string || type == GgufType::array) continue;
        GgufValue v;
        v.type = type;
        v.u = 1;
        v.i = -1;
        v.f = 0.5;
        w.copy_kv(std::string("s.") + gguf_type_name(type), v);
        GgufValue a;
        a.type = GgufType::array;
        a.elem_type = type;
        a.count = 2;
        a.raw = raw;
        w.copy_kv(std::string("a.") + gguf_type_name(type), a);
    }
    w.set_str_array("a.string", {"x", "", "yz"});
    GgufValue inner;
    inner.type = GgufType::array;
    inner.elem_type = GgufType::u32;
    inner.count = 2;
    inner.raw = raw;
    GgufValue nested;
    nested.type = GgufType::array;
    nested.elem_type = GgufType::array;
    nested.items = {inner, inner};
    nested.count = 2;
    w.copy_kv("a.nested", nested);
    return w.bytes();
}

void write_seeds(const std::string& dir) {
    const std::vector<std::pair<std::string, std::vector<uint8_t>>> seeds = {
        {"tiny-llama-f32.gguf", tiny_model("llama", gl::Type::F32, 32)},
        {"tiny-llama-f16-align64.gguf", tiny_model("llama", gl::Type::F16, 64)},
        {"tiny-llama-q8_0.gguf", tiny_model("llama", gl::Type::Q8_0, 32)},
        {"tiny-llama-q4_0.gguf", tiny_model("llama", gl::Type::Q4_0, 32)},
        {"tiny-qwen2-f32.gguf", tiny_model("qwen2", gl::Type::F32, 32)},
        {"value-types.gguf", all_value_types()},
    };
    for (const auto& [name, bytes] : seeds) {
        const std::string path = dir + "/" + name;
        FILE* f = std::fopen(path.c_str(), "wb");
        if (!f || std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size() ||
            std::fclose(f) != 0) {
            std::fprintf(stderr, "fuzz_gguf: cannot write %s\n", path.c_str());
            std::exit(1);
        }
    }
    std::fprintf(stderr, "fuzz_gguf: wrote %zu seeds to %s\n", seeds.size(), dir.c_str());
}

} // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    return kvfuzz::write_seeds_or_fuzz(write_seeds);
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    g_begin = data;
    g_end = data + size;
    try {
        GgufFile f = GgufFile::parse(data, size, "fuzz.gguf");
        for (const auto& [key, v] : f.metadata()) {
            if (f.find(key) != &v) std::abort(); // keys are unique and indexed
            touch_value(v);
        }
        for (const GgufTensor& t : f.tensors()) {
            if (f.tensor(t.name) != &t) std::abort();
            if (t.offset + t.nbytes > size || t.offset < f.data_offset()) std::abort();
            touch(t.data, t.nbytes);
        }
        try {
            Model m = Model::load(f);
            touch_matrix(m.token_embd);
            touch_matrix(m.output);
            for (const LayerWeights& l : m.layers) {
                for (const gl::Tensor* t : l.matrices()) touch_matrix(*t);
                for (const gl::Tensor* t : l.expert_matrices()) touch_matrix(*t);
            }
        } catch (const Error& e) {
            if (e.code() != Exit::bad_model) std::abort();
        }
    } catch (const Error& e) {
        if (e.code() != Exit::bad_model) std::abort();
    }
    return 0;
}
