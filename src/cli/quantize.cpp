// `kvrun quantize IN.gguf OUT.gguf TYPE`: re-encode a model's weights.
//
// TYPE is a recipe, as in the files people download: Q4_K_M mixes types per
// tensor (Q6_K for the output matrix and for attn_v, a fused attn_qkv and
// ffn_down in the layers that matter most, Q4_K elsewhere); Q4_0 keeps a Q6_K output matrix. Rows
// whose length is not a multiple of a type's block fall back to a type whose
// block fits. 1-D tensors (norms, biases) stay F32. The result is a standard
// GGUF file that other readers load.
#include <cstdio>
#include <cstdlib>

#include "cli/common.h"
#include "cli/quant_recipe.h"
#include "tensor_names.h"
#include "error.h"
#include "ggml-like/kernels.h"
#include "ggml-like/cpu/thread_pool.h"
#include "gguf.h"
#include "gguf_writer.h"

namespace kvrun::cli {

int run_quantize(int argc, char** argv) {
    std::string in, out, type;
    int threads = 0;
    bool allow_requantize = false;
    CLI::App app{"kvrun quantize: re-encode a GGUF model's weights (F16, Q8_0, Q4_0, Q4_K_M, Q6_K)",
                 "kvrun quantize"};
    app.add_option("input", in, "input GGUF")->required();
    app.add_option("output", out, "output GGUF")->required();
    app.add_option("type", type, "F16, Q8_0, Q4_0, Q4_K_M or Q6_K")->required();
    app.add_option("-t,--threads", threads, "threads")->check(int_in(0, 1024));
    app.add_flag("--allow-requantize", allow_requantize,
                 "re-encode weights that are already quantized (each step loses precision)");
    if (const auto done = parse_command_line(app, argc, argv)) return *done;
    const QuantRecipe* r = find_quant_recipe(type);
    if (!r) fail(Exit::usage, "quantize type '{}' is not one of {}", type, quant_recipe_names());
    if (in == out) fail(Exit::usage, "input and output are the same file");

    GgufFile f = GgufFile::open(in);
    // Quantizing quantized weights compounds two rounding errors, and a
    // 4-bit file "upgraded" to Q8_0 only grows: say so unless asked.
    if (!allow_requantize)
        for (const GgufTensor& t : f.tensors())
            if (t.n_dims >= 2 && t.type != gl::Type::F32 && t.type != gl::Type::F16 && t.type != gl::Type::BF16)
                fail(Exit::usage,
                     "{} is already quantized (tensor '{}' is {}): re-encoding loses precision; "
                     "use --allow-requantize to do it anyway",
                     in, t.name, gl::type_name(t.type));
    const std::string arch(f.need_str("general.architecture"));
    const int n_layer = static_cast<int>(f.need_u64(arch + ".block_count"));
    GgufWriter w(f.alignment());
    for (const auto& [k, v] : f.metadata()) {
        if (k == "general.file_type" || k == "general.alignment") continue;
        w.copy_kv(k, v);
    }
    w.set_u32("general.file_type", r->file_type);

    gl::ThreadPool pool(resolve_threads(threads));
    uint64_t bytes_in = 0, bytes_out = 0;
    for (const GgufTensor& t : f.tensors()) {
        if (!gl::type_info(t.type).supported)
            fail(Exit::bad_model, "{}: tensor '{}' has type {}, which kvrun cannot read yet", in, t.name,
                 gl::type_name(t.type));
        const int64_t n0 = t.ne[0], rows = t.n_elements() / n0;
        const gl::Type target =
            t.n_dims >= 2 ? recipe_type(*r, t.name, n0, n_layer) : gl::Type::F32;
        const size_t in_rb = gl::row_size(t.type, n0), out_rb = gl::row_size(target, n0);
        std::vector<uint8_t> data(out_rb * rows);
        const auto* src = static_cast<const uint8_t*>(t.data);
        pool.parallel_for(rows, [&](int64_t b, int64_t e, int) {
            std::vector<float> row(n0);
            for (int64_t i = b; i < e; i++) {
                gl::ref::dequantize_row(t.type, src + i * in_rb, row.data(), n0);
                gl::ref::quantize_row(target, row.data(), data.data() + i * out_rb, n0);
            }
        });
        bytes_in += t.nbytes;
        bytes_out += data.size();
        w.add_tensor(t.name, target, std::vector<int64_t>(t.ne, t.ne + t.n_dims), std::move(data));
    }
    w.write(out);
    std::fprintf(stderr, "kvrun quantize: %s -> %s (%s): weights %.1f MiB -> %.1f MiB\n", in.c_str(), out.c_str(),
                 r->name, bytes_in / 1048576.0, bytes_out / 1048576.0);
    return 0;
}

} // namespace kvrun::cli
