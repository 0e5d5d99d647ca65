#include "loader.h"
#include "tensor_names.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <string_view>

#include "error.h"
#include "system_memory.h"

namespace kvrun {

namespace {

// Weights on transparent huge pages (GgufFile::move_data_to_huge_pages):
// generation streams every weight once per token, and on 4 KiB file pages
// TinyLlama Q4_0 generated 36.3 instead of 45.2 tok/s (2 threads, a Xeon VM,
// where every TLB miss is a nested page walk). Not when Linux's THP is off,
// for small weights (their pages fit the TLB) or when the copy would not
// leave 512 MiB. KVRUN_HUGEPAGES=0 never moves them (the copy costs 0.1-0.7 s
// at load for 600 MB); =1 moves them whatever their size and the THP mode
// (the tests, on small models).
bool want_huge_pages(const GgufFile& f) {
#if defined(__linux__)
    const char* env = std::getenv("KVRUN_HUGEPAGES");
    if (env && std::string_view(env) == "0") return false;
    const bool forced = env && std::string_view(env) == "1";
    const uint64_t n = f.file_size() - std::min(f.data_offset(), f.file_size());
    if (!forced) {
        if (n < (uint64_t{64} << 20)) return false;
        std::ifstream thp("/sys/kernel/mm/transparent_hugepage/enabled");
        std::string mode;
        std::getline(thp, mode);
        if (mode.find("[always]") == std::string::npos &&
            mode.find("[madvise]") == std::string::npos)
            return false;
    }
    return mem_available_bytes() > n + (uint64_t{512} << 20);
#else
    (void)f;
    return false;
#endif
}

} // namespace

std::unique_ptr<LoadedModel> LoadedModel::load(const std::string& path, Layers layers,
                                               bool pack_matrices) {
    GgufFile f = GgufFile::open(path);
    // All but an untied token embedding, of which a token reads one row: the
    // mapping serves it as well, and a copy would make the whole table
    // resident (+37 MB for TinyLlama Q4_0, +70 MB Q8_0).
    const bool tied = f.tensor(std::string(tensor_names::output)) == nullptr;
    const bool pack = pack_matrices && layers == Layers::cpu;
    if (layers != Layers::gpu && want_huge_pages(f))
        // Tables read a row per token stay in the mapping: an untied
        // embedding, and Gemma 4's per-layer embeddings (E2B: 1.3 GB in Q4_0,
        // 35 layers' rows of 256 for each of 262144 tokens). So do the
        // matrices to be packed, which get a copy of their own: a tied
        // embedding among them, whose rows are then read from the mapping.
        // So do a mixture's experts, of which a token reads a few: the ones
        // never routed to cost no memory (Qwen3-30B-A3B: 8 of 128 a token).
        f.move_data_to_huge_pages([tied, pack](const GgufTensor& t) {
            return (!tied && t.name == tensor_names::token_embd) ||
                   t.name == tensor_names::per_layer_token_embd ||
                   (t.n_dims == 3 && tensor_names::is_experts(t.name)) ||
                   (pack && t.n_dims == 2 && PackedWeights::packs(t.type));
        });
    Model m = Model::load(f);
    PackedWeights packed = pack ? PackedWeights::pack(m, f) : PackedWeights();
    Tokenizer t(Vocab::from_gguf(f));
    if (t.n_vocab() != m.hp.n_vocab)
        fail(Exit::bad_model, "{}: the vocabulary has {} tokens but the embedding has {} rows",
             path, t.n_vocab(), m.hp.n_vocab);
    return std::unique_ptr<LoadedModel>(
        new LoadedModel{std::move(f), std::move(m), std::move(t), std::move(packed)});
}

} // namespace kvrun
