// The type table (types.h) against everything that used to keep its own copy
// of the type lists: the block structs, the reference kernels, the KV cache
// and the CLI's --ctk/--ctv. A new type that is listed but not wired up (or
// wired up but not listed) fails here rather than at some distant call.
#include <doctest/doctest.h>

#include <CLI/CLI.hpp>

#include <string>

#include "cli/common.h"
#include "error.h"
#include "ggml-like/blocks_k.h"
#include "ggml-like/kernels.h"
#include "kv_cache.h"

namespace {

using gl::Type;

template <size_t N> bool listed(const Type (&list)[N], Type t) {
    for (Type x : list)
        if (x == t) return true;
    return false;
}

// sizeof the struct that holds one block of t; 0 when the test knows none.
// Kept by hand on purpose: it is the independent witness the table is checked
// against (a compute type missing here fails the test below).
size_t block_struct_size(Type t) {
    switch (t) {
    case Type::F32:
        return sizeof(float);
    case Type::F16:
    case Type::BF16:
        return sizeof(uint16_t);
    case Type::Q8_0:
        return sizeof(gl::BlockQ8_0);
    case Type::Q4_0:
        return sizeof(gl::BlockQ4_0);
    case Type::Q4_1:
        return sizeof(gl::BlockQ4_1);
    case Type::Q5_0:
        return sizeof(gl::BlockQ5_0);
    case Type::Q5_1:
        return sizeof(gl::BlockQ5_1);
    case Type::IQ4_NL:
        return sizeof(gl::BlockIQ4_NL);
    case Type::Q2_K:
        return sizeof(gl::BlockQ2_K);
    case Type::Q3_K:
        return sizeof(gl::BlockQ3_K);
    case Type::Q4_K:
        return sizeof(gl::BlockQ4_K);
    case Type::Q5_K:
        return sizeof(gl::BlockQ5_K);
    case Type::Q6_K:
        return sizeof(gl::BlockQ6_K);
    case Type::Q8_K:
        return sizeof(gl::BlockQ8_K);
    case Type::Q8_1:
        return sizeof(gl::BlockQ8_1);
    default:
        return 0;
    }
}

std::string kv_names_from_list() {
    std::string s;
    for (Type t : gl::kKvTypes) s += (s.empty() ? "" : ", ") + std::string(gl::type_name(t));
    return s;
}

} // namespace

TEST_CASE("type table: the compute list, the supported flag and the block structs agree") {
    for (Type t : gl::kComputeTypes) {
        INFO("type ", std::string(gl::type_name(t)));
        const gl::TypeInfo& ti = gl::type_info(t);
        REQUIRE(ti.name != nullptr);
        CHECK(ti.supported);
        CHECK(ti.block_size > 0);
        CHECK(ti.type_size == block_struct_size(t));
        // Float weights dot with F32 activations, block weights with a
        // quantized activation of the same block size.
        const Type at = gl::vec_dot_type(t);
        if (ti.block_size == 1) {
            CHECK(at == Type::F32);
        } else {
            CHECK(at != Type::F32);
            CHECK(gl::type_info(at).block_size == ti.block_size);
            CHECK(gl::type_info(at).type_size == block_struct_size(at));
        }
    }
    // And nothing is supported without being listed (the flag is derived from
    // the list, so this guards the derivation).
    for (uint32_t id = 0; id < gl::kTypeIdLimit; id++) {
        const auto t = static_cast<Type>(id);
        INFO("id ", id);
        CHECK(gl::type_info(id).supported == listed(gl::kComputeTypes, t));
        CHECK(gl::type_info(id).kv_cache == listed(gl::kKvTypes, t));
        if (!gl::type_info(id).supported) CHECK(gl::vec_dot_type(t) == Type::F32);
    }
}

TEST_CASE("type table: every compute type round-trips through the reference kernels") {
    // Each listed type has a dequantizer, a quantizer and a dot product in
    // gl::ref (which would abort otherwise), and its activation type a
    // quantizer: quantize a row, dot it with a quantized all-ones row.
    for (Type t : gl::kComputeTypes) {
        INFO("type ", std::string(gl::type_name(t)));
        const int64_t n = 256; // a multiple of every block size in the table
        std::vector<float> x(n), back(n), ones(n, 1.0f);
        for (int64_t i = 0; i < n; i++) x[i] = static_cast<float>(i % 7) - 3.0f;
        std::vector<uint8_t> w(gl::row_size(t, n)), a(gl::row_size(gl::vec_dot_type(t), n));
        gl::ref::quantize_row(t, x.data(), w.data(), n);
        gl::ref::dequantize_row(t, w.data(), back.data(), n);
        gl::ref::quantize_row(gl::vec_dot_type(t), ones.data(), a.data(), n);
        double sum = 0;
        for (float v : back) sum += v;
        CHECK(gl::ref::vec_dot(t, n, w.data(), a.data()) == doctest::Approx(sum).epsilon(0.01));
    }
}

TEST_CASE("type table: KV types are compute types, and the CLI accepts exactly them") {
    for (Type t : gl::kKvTypes) {
        INFO("type ", std::string(gl::type_name(t)));
        CHECK(listed(gl::kComputeTypes, t));
        CHECK(kvrun::kv_cache_type_ok(t));
    }
    CHECK(std::string(kvrun::kv_cache_type_names()) == kv_names_from_list());
    // Today's list, spelled out once: the help and error texts must not change
    // without someone noticing.
    CHECK(std::string(gl::kv_type_names()) == "f32, f16, bf16, q8_0, q4_0");

    // Every name the table knows: accepted as a cache type iff listed.
    for (uint32_t id = 0; id < gl::kTypeIdLimit; id++) {
        const char* name = gl::type_info(id).name;
        if (!name) continue;
        INFO("type ", name);
        const bool want = listed(gl::kKvTypes, static_cast<Type>(id));
        CHECK(kvrun::kv_cache_type_ok(static_cast<Type>(id)) == want);
        if (want) {
            CHECK(kvrun::cli::parse_cache_type(name, "--ctk") == static_cast<Type>(id));
        } else {
            try {
                kvrun::cli::parse_cache_type(name, "--ctk");
                FAIL("accepted");
            } catch (const kvrun::Error& e) {
                CHECK(e.code() == kvrun::Exit::usage);
                CHECK(std::string(e.what()) == std::string("--ctk ") + name +
                                                   ": unsupported KV cache type (use " +
                                                   kv_names_from_list() + ")");
            }
        }
    }

    CLI::App app;
    kvrun::cli::CommonOptions o;
    kvrun::cli::add_runtime_options(app, o);
    CHECK(app.get_option("--ctk")->get_description() ==
          "KV cache type for K: " + kv_names_from_list());
    CHECK(app.get_option("--ctv")->get_description() ==
          "KV cache type for V: " + kv_names_from_list());
}
