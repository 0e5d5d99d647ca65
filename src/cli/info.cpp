// `kvrun info -m M [-c N]`: what the model is and what its context costs.
#include <cstdio>
#include <cerrno>
#include <cstdlib>
#include <algorithm>
#include <map>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/common.h"
#include "ggml-like/cpu/gemm.h"
#include "ggml-like/cpu/ops.h"
#include "ggml-like/cuda/cuda_backend.h"
#include "ggml-like/kernels.h"
#include "error.h"
#include "kv_cache.h"
#include "memory_plan.h"
#include "chat_template.h"
#include "context.h"
#include "model.h"
#include "model_summary.h"
#include "tokenizer.h"
#include "tensor_names.h"
#include "loader.h"

namespace kvrun::cli {

namespace {

// The template kvrun chat would use: the file's, inferred from the
// vocabulary, or the plain fallback; what is wrong with it otherwise.
std::string chat_template_name(const GgufFile& f) {
    try {
        const Tokenizer tok(Vocab::from_gguf(f));
        const ChatTemplate t = ChatTemplate::for_model(f, tok, "");
        return fmt::format("{} template{}", t.name(),
                           t.inferred() ? " (inferred from the vocabulary)"
                           : t.family() == ChatFamily::plain
                               ? " (plain fallback: the file has none)"
                               : "");
    } catch (const Error& e) {
        return fmt::format("none ({})", e.what());
    }
}

// What the header says of a file kvrun cannot run (an unknown architecture,
// a vocabulary-only file), then why: a launcher still learns what it is.
int describe_unrunnable(const GgufFile& file, const std::string& path, const Error& why,
                        bool json) {
    const ModelSummary ms = summarize_model(file);
    const std::string arch(file.get_str("general.architecture").value_or(""));
    const std::string tokenizer(file.get_str("tokenizer.ggml.model").value_or(""));
    const GgufValue* tokens = file.find("tokenizer.ggml.tokens");
    const uint64_t n_tokens = tokens ? tokens->count : 0;
    const bool has_template = file.get_str("tokenizer.chat_template").has_value();
    std::map<std::string, int> type_counts;
    for (const auto& t : file.tensors()) type_counts[gl::type_name(t.type)]++;
    if (json) {
        const nlohmann::json j = {{"architecture", arch},
                                  {"name", ms.name},
                                  {"file_type", ms.file_type},
                                  {"params", ms.params},
                                  {"n_tensors", file.tensors().size()},
                                  {"tensor_types", type_counts},
                                  {"file_bytes", file.file_size()},
                                  {"weight_bytes", ms.weight_bytes},
                                  {"tokenizer", tokenizer},
                                  {"n_vocab", n_tokens},
                                  {"chat_template", has_template},
                                  {"runnable", false},
                                  {"why", why.what()}};
        fmt::print("{}\n", j.dump(2));
    } else {
        std::string types;
        for (const auto& [name, count] : type_counts)
            types += fmt::format("{}{} × {}", types.empty() ? "" : ", ", count, name);
        fmt::print("model:        {}\n", path);
        if (!ms.name.empty()) fmt::print("name:         {}\n", ms.name);
        fmt::print("architecture: {} (GGUF v{})\n", arch.empty() ? "(none)" : arch, file.version());
        fmt::print(
            "tensors:      {} ({}){}\n", file.tensors().size(), types.empty() ? "none" : types,
            ms.params ? fmt::format("; {} parameters, {}", params_text(ms.params), ms.file_type)
                      : "");
        if (!tokenizer.empty())
            fmt::print("tokenizer:    {}, {} tokens{}\n", tokenizer, n_tokens,
                       has_template ? "; has a chat template" : "");
        fmt::print("file size:    {} ({} bytes)\n", human_bytes(file.file_size()),
                   file.file_size());
        fmt::print("runnable:     no ({})\n", why.what());
    }
    return static_cast<int>(why.code());
}

} // namespace

int run_info(int argc, char** argv) {
    CommonOptions c;
    std::string ctx;
    bool json = false;
    CLI::App app{"kvrun info: model architecture, tensor types, sizes and KV cache cost",
                 "kvrun info"};
    add_model_option(app, c);
    app.add_option("-c,--ctx-size", ctx,
                   "context size to cost (default: the model's trained context), or auto: what "
                   "kvrun chat would take (the model's, at most 4096; a run sizes it from its "
                   "prompt)");
    app.add_option("--cache-type-k,--ctk", c.cache_type_k,
                   "KV cache type for K, or auto: what a run would pick for this context in the "
                   "memory available now")
        ->capture_default_str();
    app.add_option("--cache-type-v,--ctv", c.cache_type_v, "KV cache type for V, or auto")
        ->capture_default_str();
    app.add_flag("--k-rotate", c.k_rotate, "keys rotated in Hadamard blocks (as run's --k-rotate)");
    app.add_option("--device", c.device,
                   "plan for this device: cpu, cuda or cuda:N (default: cpu, or cuda with -ngl)");
    add_offload_options(app, c);
    app.add_flag("--json", json, "print JSON");
    if (const auto done = parse_command_line(app, argc, argv)) return *done;
    ContextRequest req;
    set_cache_types(c, req, true);
    // Metadata only: info must work for files kvrun cannot run yet, and says why.
    GgufFile file = GgufFile::open(c.model);
    Hparams hp;
    try {
        hp = read_hparams(file);
    } catch (const Error& e) {
        return describe_unrunnable(file, c.model, e, json);
    }
    const ModelSummary summary = summarize_model(file);
    // -c auto: kvrun chat's choice (a run's depends on its prompt and -n).
    int64_t n_ctx = hp.n_ctx_train;
    const bool ctx_auto = is_auto(ctx);
    if (ctx_auto) {
        n_ctx = std::min<int64_t>(hp.n_ctx_train > 0 ? hp.n_ctx_train : 4096, 4096);
    } else if (!ctx.empty()) {
        char* end = nullptr;
        errno = 0;
        const long long v = std::strtoll(ctx.c_str(), &end, 10);
        if (*end != '\0' || errno != 0 || v < 1 || v > (int64_t{1} << 30))
            fail(Exit::usage, "-c {}: expected a number of tokens from 1 to {}, or auto", ctx,
                 int64_t{1} << 30);
        n_ctx = v;
    }
    if (n_ctx <= 0) n_ctx = 4096;
    // --ctk / --ctv auto: the first types of the ladder whose cache fits now.
    req.k_rotate = c.k_rotate;
    req.threads = resolve_threads(0);
    const CacheTypes chosen = choose_cache_types(file, hp, req, n_ctx);
    const gl::Type tk = chosen.k, tv = chosen.v;
    const bool types_auto = req.auto_k || req.auto_v;
    uint64_t weight_bytes = 0;
    std::string unsupported;
    for (const auto& t : file.tensors()) {
        weight_bytes += t.nbytes;
        if (!gl::type_info(t.type).supported &&
            unsupported.find(gl::type_name(t.type)) == std::string::npos)
            unsupported += std::string(unsupported.empty() ? "" : ", ") + gl::type_name(t.type);
    }

    std::map<std::string, int> type_counts;
    for (const auto& t : file.tensors()) type_counts[gl::type_name(t.type)]++;
    const size_t bytes_k = gl::row_size(tk, hp.kv_dim()), bytes_v = gl::row_size(tv, hp.kv_dim());
    const int k_rotate = chosen.k_rotate;
    const KvCacheConfig kv_cfg =
        KvCacheConfig::for_model(hp, static_cast<int>(n_ctx), 0, tk, tv, k_rotate);
    const uint64_t per_token = KvCache::bytes_per_token(kv_cfg);
    const uint64_t state_bytes = KvCache::state_bytes_for(kv_cfg);
    const uint64_t kv_total = KvCache::ring_bytes_for(kv_cfg) + state_bytes;
    int owning_layers = 0;
    for (int l = 0; l < hp.n_layer; l++) owning_layers += kv_cfg.owns(l);
    const uint64_t kv_uniform = per_token * static_cast<uint64_t>(n_ctx) + state_bytes; // every layer n_ctx slots
    // Per layer kind: how many layers, their slots and bytes.
    // Layers that read another layer's slots (Gemma 4) are a kind of their
    // own, with no slots: what they would have stored is the saving.
    struct KvKind {
        const char* kind;
        int layers = 0;
        int64_t slots = 0;
        int head_dim = 0;
        uint64_t bytes = 0;
        uint64_t saved = 0; // shared: the bytes their own slots would take
    };
    std::vector<KvKind> kinds;
    for (int l = 0; l < hp.n_layer; l++) {
        const char* kind = kv_cfg.is_recurrent(l) ? "recurrent"
                           : !kv_cfg.owns(l)       ? "shared"
                           : kv_cfg.is_swa(l)      ? "sliding_window"
                                                   : "global";
        auto k = std::find_if(kinds.begin(), kinds.end(),
                              [&](const KvKind& x) { return x.kind == kind; });
        if (k == kinds.end())
            k = kinds.insert(kinds.end(), KvKind{kind, 0, kv_cfg.owns(l) ? kv_cfg.slots(l) : 0,
                                                 kv_cfg.head_dim_of(l), 0, 0});
        k->layers++;
        k->bytes += kv_cfg.slot_bytes(l) * static_cast<uint64_t>(kv_cfg.slots(l));
        if (kv_cfg.is_recurrent(l))
            k->bytes += static_cast<uint64_t>(kv_cfg.conv_floats + kv_cfg.ssm_floats) * 4;
        if (!kv_cfg.owns(l))
            k->saved += kv_cfg.slot_bytes(kv_cfg.source(l)) * static_cast<uint64_t>(kv_cfg.slots(l));
    }
    std::stable_partition(kinds.begin(), kinds.end(),
                          [](const KvKind& k) { return k.kind == std::string("global"); });
    const uint64_t file_size = file.file_size();

    // Quantized weights' path (float weights skip AMX's bf16 tiles).
    const std::string prompt_path = gl::ops::batch_paths_summary();
    const MemoryPlan plan = plan_memory(file, hp, n_ctx, tk, tv, 512, resolve_threads(0));
    // kvrun batch: a ring and the recurrent states (kv_total) per sequence;
    // its pool holds the budget's worth of whole rings in blocks, which
    // sequences take as they grow: sequences of L tokens (prompt and answer,
    // nothing shared) that fit at once.
    const uint64_t per_sequence = kv_total;
    const uint64_t budget = batch_cache_budget(plan.mem_available);
    const KvPool::Blocks ring_blocks = KvPool::ring_blocks(kv_cfg);
    const double budget_rings =
        per_sequence > 0 ? static_cast<double>(budget) / static_cast<double>(per_sequence) : 0;
    auto fit_of_length = [&](int64_t len) {
        int64_t fit = -1;
        const KvPool::Blocks need = KvPool::blocks_for_tokens(kv_cfg, len);
        for (int k = 0; k < KvPool::kKinds; k++) {
            if (need[k] == 0) continue;
            const auto pool = static_cast<int64_t>(budget_rings * ring_blocks[k]);
            fit = fit < 0 ? pool / need[k] : std::min<int64_t>(fit, pool / need[k]);
        }
        // States are a sequence's whole: no fewer bytes for a shorter one.
        if (KvCache::state_bytes_for(kv_cfg) > 0)
            fit = std::min<int64_t>(fit, static_cast<int64_t>(budget / per_sequence));
        return std::max<int64_t>(fit, 0);
    };
    // The GPU side: the plan for -ngl / --kv-gpu-window (metadata only, so it
    // also works in a build or on a machine without CUDA), and the device's
    // memory when there is one.
    // -ngl auto: the plan that fills the device's free memory (fit_gpu:
    // attention and KV first, then a mixture's experts).
    const bool fit = c.n_gpu_layers == "auto";
    const int n_gpu = fit ? 0 : resolve_gpu_layers(c, hp.n_layer);
    if (c.kv_gpu_window > 0 && n_gpu == 0 && !fit)
        fail(Exit::usage, "--kv-gpu-window {} needs layers on the GPU (--device cuda or -ngl N)",
             c.kv_gpu_window);
    std::string no_gpu;
    uint64_t dev_free = 0, dev_total = 0;
    const int dev_id = cuda_device_index(c.device);
    const bool have_gpu =
        gl::cuda_available(&no_gpu) && gl::cuda_memory_info(dev_id, &dev_free, &dev_total);
    if (fit && !have_gpu)
        fail(Exit::usage, "-ngl auto fits the plan to a GPU's free memory: {}", no_gpu);
    const GpuPlan gp = fit ? fit_gpu(file, hp, n_ctx, 4, tk, tv, c.kv_gpu_window, 512, dev_free)
                           : plan_gpu(file, hp, n_ctx, 4, tk, tv, n_gpu, c.kv_gpu_window, 512,
                                      resolve_cpu_moe(c, hp.n_layer));
    if (json) {
        nlohmann::json j = {{"architecture", hp.arch},
                            {"name", summary.name},
                            {"file_type", summary.file_type},
                            {"params", summary.params},
                            {"chat_template", chat_template_name(file)},
                            {"n_vocab", hp.n_vocab},
                            {"n_embd", hp.n_embd},
                            {"n_layer", hp.n_layer},
                            {"n_head", hp.n_head},
                            {"n_head_kv", hp.n_head_kv},
                            {"head_dim", hp.head_dim},
                            {"n_ff", hp.n_ff},
                            {"active_params", summary.active_params},
                            {"weight_bytes_per_token", summary.bytes_per_token},
                            {"n_ctx_train", hp.n_ctx_train},
                            {"rope_base", hp.rope_base},
                            {"tensor_types", type_counts},
                            {"file_bytes", file_size},
                            {"weight_bytes", weight_bytes},
                            {"kv",
                             {{"n_ctx", n_ctx},
                              {"auto", ctx_auto},
                              {"types_auto", types_auto},
                              {"type_k", gl::type_name(tk)},
                              {"type_v", gl::type_name(tv)},
                              {"k_rotate", k_rotate},
                              {"bytes_per_token", per_token},
                              {"bytes", kv_total},
                              {"recurrent_state_bytes", state_bytes},
                              {"uniform_bytes", kv_uniform}}},
                            {"total_bytes", weight_bytes + kv_total},
                            {"runnable", unsupported.empty()},
                            {"unsupported_types", unsupported},
                            {"memory",
                             {{"available_bytes", plan.mem_available},
                              {"weights_resident_bytes", plan.weights_resident},
                              {"scratch_bytes", plan.scratch},
                              {"kv_bytes", plan.kv},
                              {"fits", plan.fits()},
                              {"max_ctx_that_fits", plan.max_ctx_that_fits}}},
                            {"batch",
                             {{"bytes_per_sequence", per_sequence},
                              {"sequences_that_fit",
                               batch_sequences_that_fit(plan.mem_available, per_sequence)}}}};
        if (hp.is_moe())
            j["experts"] = {{"count", hp.n_expert},
                            {"used", hp.n_expert_used},
                            {"n_ff", hp.n_ff_exp},
                            {"shared_n_ff", hp.n_ff_shexp}};
        nlohmann::json pool = {{"block_slots", KvPool::kBlockSlots},
                               {"budget_bytes", budget},
                               {"kinds", nlohmann::json::array()},
                               {"sequences_of_length", nlohmann::json::object()}};
        for (int k = 0; k < KvPool::kKinds; k++)
            if (ring_blocks[k] > 0)
                pool["kinds"].push_back(
                    {{"kind", k == 0 ? "global" : "sliding_window"},
                     {"block_bytes", KvPool::block_bytes_for(kv_cfg, k)},
                     {"blocks_per_sequence", ring_blocks[k]},
                     {"blocks", static_cast<int64_t>(budget_rings * ring_blocks[k])}});
        for (const int64_t len : {int64_t{512}, int64_t{2048}, int64_t{n_ctx}})
            pool["sequences_of_length"][std::to_string(len)] = fit_of_length(len);
        j["batch"]["pool"] = pool;
        nlohmann::json layer_kinds = nlohmann::json::array();
        for (const KvKind& k : kinds)
            layer_kinds.push_back({{"kind", k.kind},
                                   {"layers", k.layers},
                                   {"slots", k.slots},
                                   {"head_dim", k.head_dim},
                                   {"bytes", k.bytes},
                                   {"saved_bytes", k.saved}});
        j["kv"]["layer_kinds"] = layer_kinds;
        j["kernels"] = {{"isa", gl::cpu::isa_name()},
                        {"prompt_batches", prompt_path},
                        {"openblas", gl::gemm::blas_description()}};
        if (hp.swa_window > 0) j["kv"]["sliding_window"] = hp.swa_window;
        nlohmann::json dev = nullptr;
        if (have_gpu) dev = {{"id", dev_id}, {"free_bytes", dev_free}, {"total_bytes", dev_total}};
        j["gpu"] = {{"n_gpu_layers", gp.n_gpu_layers},
                    {"head_on_gpu", gp.head_on_gpu},
                    {"kv_window", gp.kv_window},
                    {"kv_slots_per_layer", gp.gpu_slots},
                    {"weights_bytes", gp.weights_gpu},
                    {"kv_bytes", gp.kv_gpu},
                    {"scratch_bytes", gp.scratch_gpu},
                    {"total_bytes", gp.gpu_total()},
                    {"host_weights_bytes", gp.weights_host},
                    {"host_kv_bytes", gp.kv_host},
                    {"cold_kv_bytes", gp.kv_cold},
                    {"n_cpu_moe", gp.n_cpu_moe},
                    {"experts_bytes", gp.experts_gpu},
                    {"host_experts_bytes", gp.experts_host},
                    {"device", dev},
                    {"unavailable", have_gpu ? nlohmann::json(nullptr) : nlohmann::json(no_gpu)}};
        if (have_gpu && gp.n_gpu_layers > 0) j["gpu"]["fits"] = gp.gpu_total() <= dev_free;
        fmt::print("{}\n", j.dump(2));
        return 0;
    }
    std::string types;
    for (const auto& [name, count] : type_counts)
        types += fmt::format("{}{} × {}", types.empty() ? "" : ", ", count, name);
    fmt::print("model:        {}\n", c.model);
    if (!summary.name.empty()) fmt::print("name:         {}\n", summary.name);
    fmt::print("architecture: {} (GGUF v{}); {} parameters, {}\n", hp.arch, file.version(),
               params_text(summary.params), summary.file_type);
    fmt::print("chat:         {}\n", chat_template_name(file));
    fmt::print(
        "dimensions:   {} layers, width {}, {} heads / {} KV heads of {}, FFN {}, vocab {}\n",
        hp.n_layer, hp.n_embd, hp.n_head, hp.n_head_kv, hp.head_dim, hp.n_ff, hp.n_vocab);
    if (hp.is_moe())
        fmt::print("experts:      {} per layer of width {}, {} used per token{}; {} of the {} "
                   "parameters active; a generated token reads {} of weights\n",
                   hp.n_expert, hp.n_ff_exp, hp.n_expert_used,
                   hp.n_ff_shexp ? fmt::format(", and a shared one of width {}", hp.n_ff_shexp) : "",
                   params_text(summary.active_params), params_text(summary.params),
                   human_bytes(summary.bytes_per_token));
    fmt::print("context:      {} tokens trained; RoPE base {}, {} dims{}\n", hp.n_ctx_train,
               hp.rope_base, hp.rope_dims, hp.rope_neox ? " (neox)" : "");
    if (file.tensor(std::string(tensor_names::rope_factors_long)))
        fmt::print("LongRoPE:     short factors up to {} tokens, long ones past it ({} at -c {}); "
                   "attention factor {:.4g}\n",
                   hp.rope_orig_ctx, n_ctx > hp.rope_orig_ctx ? "long" : "short", n_ctx,
                   hp.rope_attn_factor);
    fmt::print("tensors:      {}\n", types);
    if (!unsupported.empty())
        fmt::print("runnable:     no (tensor types not supported yet: {})\n", unsupported);
    fmt::print("file size:    {} ({} bytes); weights {}\n", human_bytes(file_size), file_size,
               human_bytes(weight_bytes));
    // Bytes per element, exact: a quantized block's scale shares the bytes
    // (q8_0: 34 bytes per 32 elements = 1.0625).
    const double el_k = static_cast<double>(bytes_k) / hp.kv_dim(),
                 el_v = static_cast<double>(bytes_v) / hp.kv_dim();
    const bool uniform =
        hp.head_dim_swa == 0 && hp.n_kv_shared == 0 && hp.recurrent_layers.empty();
    if (uniform)
        fmt::print(
            "KV per token: {} = {} layers × {} KV heads × {} dims × ({:g} + {:g} bytes) ({}{})\n",
            human_bytes(per_token), hp.n_layer, hp.n_head_kv, hp.head_dim, el_k, el_v,
            cache_types_text(tk, tv, k_rotate),
            k_rotate > 0 ? fmt::format(" in Hadamard blocks of {}", k_rotate) : std::string());
    else
        fmt::print("KV per token: {} over the {} layers that store K/V, {} KV heads of {}{} "
                   "dims ({}{})\n",
                   human_bytes(per_token), owning_layers, hp.n_head_kv, hp.head_dim,
                   hp.head_dim_swa ? fmt::format(" (global) and {} (window)", hp.head_dim_swa)
                                   : std::string(),
                   cache_types_text(tk, tv, k_rotate),
                   k_rotate > 0 ? fmt::format(" in Hadamard blocks of {}", k_rotate)
                                : std::string());
    if (kinds.size() > 1) {
        std::string parts;
        for (const KvKind& k : kinds) {
            const std::string kind = k.kind == std::string("global")         ? "global"
                                     : k.kind == std::string("sliding_window") ? "sliding-window"
                                                                               : "";
            if (k.kind == std::string("recurrent"))
                parts += fmt::format("{}{} recurrent with a fixed state = {}",
                                     parts.empty() ? "" : "; ", k.layers, human_bytes(k.bytes));
            else if (kind.empty())
                parts += fmt::format("{}{} sharing an earlier layer's K/V (saves {})",
                                     parts.empty() ? "" : "; ", k.layers, human_bytes(k.saved));
            else
                parts += fmt::format("{}{} {} × {} slots = {}", parts.empty() ? "" : "; ",
                                     k.layers, kind, k.slots, human_bytes(k.bytes));
        }
        fmt::print("KV layers:    {}{}\n", parts,
                   hp.swa_window > 0 ? fmt::format(" (window {})", hp.swa_window) : std::string());
    }
    if (types_auto)
        fmt::print("cache types:  {} ({} auto: the first that fits {} tokens now)\n",
                   cache_types_text(tk, tv, k_rotate),
                   req.auto_k && req.auto_v ? "--ctk and --ctv"
                   : req.auto_k             ? "--ctk"
                                            : "--ctv",
                   n_ctx);
    fmt::print("KV at -c {}{}: {} ({} bytes){}; weights + KV = {}\n", n_ctx,
               ctx_auto ? " (auto)" : "", human_bytes(kv_total), kv_total,
               kv_uniform != kv_total ? fmt::format(", {} with every layer at {} slots",
                                                    human_bytes(kv_uniform), n_ctx)
                                      : std::string(),
               human_bytes(weight_bytes + kv_total));
    fmt::print("memory:       {} available, weights {} resident; {}\n",
               human_bytes(plan.mem_available), human_bytes(plan.weights_resident),
               plan.fits() ? fmt::format("fits (up to -c {})", plan.max_ctx_that_fits)
                           : "does not fit: " + memory_advice(plan, hp, 0));
    fmt::print("batch:        {} sequences of -c {} at once in half the memory available "
               "(kvrun batch: a cache of {} each); in blocks of {} tokens, {} of 512 tokens\n",
               batch_sequences_that_fit(plan.mem_available, per_sequence), n_ctx,
               human_bytes(per_sequence), KvPool::kBlockSlots, fit_of_length(512));
    fmt::print("kernels:      {}; prompt batches on {} ({})\n", gl::cpu::isa_name(), prompt_path,
               gl::gemm::blas_description());
    if (gp.n_gpu_layers > 0) {
        fmt::print(
            "GPU plan:     {} of {} layers on the GPU, output head on the {}; KV on the GPU: {}\n",
            gp.n_gpu_layers, gp.n_layer, gp.head_on_gpu ? "GPU" : "CPU",
            gp.kv_window > 0 ? fmt::format("{} sinks + newest {} of {} slots per layer", gp.keep,
                                           gp.kv_window, gp.n_ctx)
                             : fmt::format("all {} slots per layer", gp.n_ctx));
        fmt::print("  on the GPU: weights {}, KV {}, scratch {} (estimate): {}\n",
                   human_bytes(gp.weights_gpu), human_bytes(gp.kv_gpu), human_bytes(gp.scratch_gpu),
                   human_bytes(gp.gpu_total()));
        fmt::print("  host:       weights {} (mapped), KV ring {} (every layer and slot){}\n",
                   human_bytes(gp.weights_host), human_bytes(gp.kv_host),
                   gp.kv_cold > 0 ? fmt::format("; {} of it attended on the CPU (cold)",
                                                human_bytes(gp.kv_cold))
                                  : "");
        if (hp.is_moe())
            fmt::print("  experts:    {} on the GPU; {} in host memory, run on the CPU (the "
                       "first {} layers' and those of layers on the CPU)\n",
                       human_bytes(gp.experts_gpu), human_bytes(gp.experts_host), gp.n_cpu_moe);
    }
    if (have_gpu)
        fmt::print("GPU memory:   cuda:{}: {} free of {}{}\n", dev_id, human_bytes(dev_free),
                   human_bytes(dev_total),
                   gp.n_gpu_layers == 0 ? ""
                   : gp.gpu_total() <= dev_free
                       ? "; the plan fits"
                       : "; the plan does NOT fit (fewer -ngl or a --kv-gpu-window)");
    else if (gp.n_gpu_layers > 0)
        fmt::print("GPU memory:   unknown here ({})\n", no_gpu);
    return 0;
}

} // namespace kvrun::cli
