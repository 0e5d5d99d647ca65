// libFuzzer target for chat /load: a conversation save (FILE.json and the
// binary cache FILE) from any bytes must load or be refused with a
// kvrun::Error whose message is one line; the session stays usable either
// way. The input is split: the first two bytes give the JSON's length, the
// JSON follows, the rest is the binary cache.
//
// The model is stories260K (relative to the project root, or
// $KVRUN_FUZZ_MODEL). Seeds: real saves this binary writes when started with
// KVRUN_FUZZ_WRITE_SEEDS=DIR (scripts/fuzz.sh does).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "chat_session.h"
#include "error.h"
#include "ggml-like/backend.h"
#include "loader.h"
#include "fuzz_support.h"

using namespace kvrun;

namespace {

char g_dir[64]; // the fixture's temporary folder, removed at exit

struct Fixture {
    std::unique_ptr<LoadedModel> lm;
    std::unique_ptr<gl::Backend> cpu;
    std::unique_ptr<ChatSession> chat;
    std::string dir;
};

Fixture& fixture() {
    static Fixture f = [] {
        Fixture x;
        x.lm = kvfuzz::load_model("fuzz_chat_load");
        x.cpu = gl::make_cpu_backend(1);
        ChatConfig cfg;
        cfg.n_predict = 4;
        cfg.sampling.temp = 0;
        x.chat = std::make_unique<ChatSession>(
            *x.lm, ChatTemplate::for_model(x.lm->file, x.lm->tokenizer, ""), 128, gl::Type::F16,
            gl::Type::F16, Placement::all(*x.cpu, x.lm->model.hp.n_layer), cfg);
        char tmpl[] = "/tmp/fuzz-chat-load-XXXXXX";
        if (!mkdtemp(tmpl)) std::abort();
        x.dir = tmpl;
        // A copy: the fixture is destroyed before this handler runs.
        std::snprintf(g_dir, sizeof g_dir, "%s", tmpl);
        std::atexit([] { std::filesystem::remove_all(g_dir); });
        return x;
    }();
    return f;
}

std::string slurp(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void write_seeds(const std::string& dir) {
    Fixture& x = fixture();
    int k = 0;
    for (const char* msg : {"Hello", "Tell me a story about a cat", "And then?"}) {
        x.chat->respond(msg, {});
        const std::string save = x.dir + "/seed";
        x.chat->save(save);
        const std::string json = slurp(save + ".json"), bin = slurp(save);
        std::ofstream out(dir + "/seed-" + std::to_string(k++), std::ios::binary);
        const unsigned n = static_cast<unsigned>(json.size());
        out.put(static_cast<char>(n & 0xff)).put(static_cast<char>(n >> 8)) << json << bin;
    }
}

} // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    return kvfuzz::write_seeds_or_fuzz(write_seeds);
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    Fixture& x = fixture();
    if (size < 2) return 0;
    const size_t n_json = std::min<size_t>(size - 2, data[0] | (size_t{data[1]} << 8));
    const std::string save = x.dir + "/s";
    std::ofstream(save + ".json", std::ios::binary)
        .write(reinterpret_cast<const char*>(data + 2), static_cast<std::streamsize>(n_json));
    std::ofstream(save, std::ios::binary)
        .write(reinterpret_cast<const char*>(data + 2 + n_json),
               static_cast<std::streamsize>(size - 2 - n_json));
    try {
        const std::string said = x.chat->load(save);
        if (said.find('\n') != std::string::npos) std::abort();
    } catch (const Error& e) {
        if (std::string(e.what()).find('\n') != std::string::npos) std::abort();
    }
    // Whatever happened, the session's state is consistent.
    if (x.chat->first_live_turn() > x.chat->turns().size()) std::abort();
    if (x.chat->cached_tokens() > x.chat->n_ctx()) std::abort();
    return 0;
}
