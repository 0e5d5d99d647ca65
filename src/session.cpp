#include "session.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <string_view>
#include <sys/resource.h>

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
        if (mode.find("[always]") == std::string::npos && mode.find("[madvise]") == std::string::npos)
            return false;
    }
    return mem_available_bytes() > n + (uint64_t{512} << 20);
#else
    (void)f;
    return false;
#endif
}

} // namespace

std::unique_ptr<LoadedModel> LoadedModel::load(const std::string& path, bool weights_on_cpu) {
    GgufFile f = GgufFile::open(path);
    // All but an untied token embedding, of which a token reads one row: the
    // mapping serves it as well, and a copy would make the whole table
    // resident (+37 MB for TinyLlama Q4_0, +70 MB Q8_0).
    const bool tied = f.tensor("output.weight") == nullptr;
    if (weights_on_cpu && want_huge_pages(f))
        f.move_data_to_huge_pages([tied](const GgufTensor& t) { return !tied && t.name == "token_embd.weight"; });
    Model m = Model::load(f);
    Tokenizer t(Vocab::from_gguf(f));
    if (t.n_vocab() != m.hp.n_vocab)
        fail(Exit::bad_model, "{}: the vocabulary has {} tokens but the embedding has {} rows", path, t.n_vocab(),
             m.hp.n_vocab);
    return std::unique_ptr<LoadedModel>(new LoadedModel{std::move(f), std::move(m), std::move(t)});
}

int auto_context(int64_t n_prompt, int64_t n_predict, int64_t n_ctx_train) {
    if (n_prompt > n_ctx_train && n_ctx_train > 0)
        fail(Exit::context_overflow, "the prompt has {} tokens but the model's context is {} tokens", n_prompt,
             n_ctx_train);
    const int64_t extra = n_predict >= 0 ? n_predict : std::max<int64_t>(2 * n_prompt, 512);
    int64_t want = (n_prompt + extra + 255) / 256 * 256;
    want = std::min(want, n_ctx_train);
    return static_cast<int>(std::max<int64_t>(want, std::min<int64_t>(n_ctx_train, 2)));
}

void check_prompt_fits(int64_t n_prompt, int64_t n_ctx) {
    if (n_prompt > n_ctx)
        fail(Exit::context_overflow,
             "the prompt has {} tokens but the context (-c) holds {}: use -c {} or more, or -c auto", n_prompt,
             n_ctx, n_prompt);
}

uint64_t peak_rss_bytes() {
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    return static_cast<uint64_t>(ru.ru_maxrss) * 1024; // Linux reports KiB
}

bool valid_utf8(std::string_view s, size_t* bad_at) {
    size_t i = 0;
    while (i < s.size()) {
        const auto c = static_cast<unsigned char>(s[i]);
        int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        bool ok = len > 0 && i + len <= s.size();
        uint32_t cp = len == 1 ? c : len == 2 ? c & 0x1f : len == 3 ? c & 0x0f : c & 0x07;
        for (int k = 1; ok && k < len; k++) {
            const auto d = static_cast<unsigned char>(s[i + k]);
            ok = (d >> 6) == 2;
            cp = (cp << 6) | (d & 0x3f);
        }
        // reject overlong forms, surrogates and code points past U+10FFFF
        if (ok && ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) ||
                   (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF))
            ok = false;
        if (!ok) {
            if (bad_at) *bad_at = i;
            return false;
        }
        i += len;
    }
    return true;
}

} // namespace kvrun
