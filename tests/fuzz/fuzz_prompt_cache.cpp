// libFuzzer target for the prompt-cache loader: any bytes, read from a file,
// must load or be refused with a reason (never a crash, an abort or an
// escape from the buffers). Half the inputs get their checksum recomputed
// first (the first byte's low bit says which), so the mutations reach the
// checks behind it: sizes, token ids, ring slots and sink copies.
//
// The model is stories260K (relative to the project root, or
// $KVRUN_FUZZ_MODEL); the cache has 64 slots, keep 4 (and a keep-0 cache
// for every other input). Seeds: real caches this binary writes when started
// with KVRUN_FUZZ_WRITE_SEEDS=DIR (scripts/fuzz.sh does).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>
#include <sys/mman.h>
#include <unistd.h>

#include "error.h"
#include "ggml-like/backend.h"
#include "loader.h"
#include "prompt_cache.h"
#include "session.h"
#include "fuzz_support.h"

using namespace kvrun;

namespace {

struct Fixture {
    std::unique_ptr<LoadedModel> lm;
    std::unique_ptr<gl::Backend> cpu;
    std::unique_ptr<Session> keep4, keep0;
    std::vector<int32_t> prompt;
    int fd = -1;
    std::string path;
};

Fixture& fixture() {
    static Fixture f = [] {
        Fixture x;
        x.lm = kvfuzz::load_model("fuzz_prompt_cache");
        x.cpu = gl::make_cpu_backend(1);
        const Hparams& hp = x.lm->model.hp;
        auto session = [&](int keep) {
            return std::make_unique<Session>(
                *x.lm, KvCacheConfig::for_model(hp, 64, keep, gl::Type::F16, gl::Type::F16),
                Placement::all(*x.cpu, hp.n_layer), 64);
        };
        x.keep4 = session(4);
        x.keep0 = session(0);
        x.prompt = x.lm->tokenizer.encode("Once upon a time, there was a little girl named Lily.",
                                          true, false);
        // An in-memory regular file, read through its /proc path.
        x.fd = memfd_create("fuzz-prompt-cache", 0);
        if (x.fd < 0) std::abort();
        x.path = "/proc/self/fd/" + std::to_string(x.fd);
        return x;
    }();
    return f;
}

uint64_t fnv1a(const uint8_t* p, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

void write_seeds(const std::string& dir) {
    Fixture& x = fixture();
    int k = 0;
    for (Session* s : {x.keep4.get(), x.keep0.get()})
        for (size_t n : {size_t{2}, size_t{5}, x.prompt.size()}) {
            s->clear();
            s->eval(std::span<const int32_t>(x.prompt.data(), n));
            s->save_prompt_cache(dir + "/seed-" + std::to_string(k++), s->model_digest());
        }
}

} // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    return kvfuzz::write_seeds_or_fuzz(write_seeds);
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    Fixture& x = fixture();
    std::vector<uint8_t> bytes(data, data + size);
    if (size > 8 && (data[0] & 1)) {
        const uint64_t sum = fnv1a(bytes.data(), size - 8);
        std::memcpy(bytes.data() + size - 8, &sum, 8);
    }
    if (ftruncate(x.fd, 0) != 0 ||
        (size > 0 && pwrite(x.fd, bytes.data(), size, 0) != static_cast<ssize_t>(size)))
        std::abort();
    Session& s = (size > 1 && (data[1] & 1)) ? *x.keep0 : *x.keep4;
    try {
        const PromptCacheLoad r = s.load_prompt_cache(x.path, s.model_digest(), x.prompt);
        if (r.ok && (r.reused <= 0 || r.reused >= static_cast<int64_t>(x.prompt.size())))
            std::abort();
        if (!r.ok && r.why.empty()) std::abort();
    } catch (const Error&) {
        std::abort(); // loading never throws: a bad file is a reason
    }
    return 0;
}
