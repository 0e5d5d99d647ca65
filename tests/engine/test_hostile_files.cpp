// Files and hostile inputs: what kvrun reads must be a regular file of the
// right kind (FIFOs, directories and /dev/zero are one-line errors, never a
// hang or an unbounded read), what it writes never replaces a file of another
// kind nor follows a planted symlink, an optional prompt cache never costs the
// answer, caches are tied to the weights, and hostile model values (overlapping
// tensors, infinite epsilons, windows of 2^63) are refused as bad models.
#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "chat_session.h"
#include "file_io.h"
#include "gguf.h"
#include "ggml-like/backend.h"
#include "gguf_writer.h"
#include "loader.h"
#include "random_model.h"
#include "test_util.h"
#include "weights_digest.h"

namespace fs = std::filesystem;

namespace {

const std::string kStories = kvtest::shared("models/stories260K.gguf");
const std::string kPrompt =
    "Once upon a time, there was a little girl named Lily. She liked to play";

struct TempDir {
    fs::path path;
    TempDir() {
        char tmpl[] = "/tmp/kvrun-files-XXXXXX";
        path = mkdtemp(tmpl);
    }
    ~TempDir() {
        std::error_code ec;
        fs::permissions(path, fs::perms::owner_all, ec);
        fs::remove_all(path, ec);
    }
    std::string file(const std::string& name) const { return (path / name).string(); }
};

std::string slurp(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}
void spit(const std::string& path, const std::string& bytes) {
    std::ofstream(path, std::ios::binary) << bytes;
}
bool contains(const std::string& s, const std::string& n) {
    return s.find(n) != std::string::npos;
}
size_t count_lines(const std::string& s) {
    return kvtest::lines(s).size();
}

// kvrun under `timeout`, so a hang is a failure (status 124), not a stuck run.
kvtest::RunResult run_bounded(std::vector<std::string> args,
                              const std::vector<std::string>& env = {}) {
    std::vector<std::string> full = {"10", "env"};
    full.insert(full.end(), env.begin(), env.end());
    full.push_back(KVRUN_BINARY);
    full.insert(full.end(), args.begin(), args.end());
    return kvtest::run_binary("/usr/bin/timeout", full);
}

kvtest::RunResult gen_with(const std::string& model, const std::string& prompt,
                           std::vector<std::string> extra = {},
                           const std::vector<std::string>& env = {}) {
    std::vector<std::string> args = {"-m", model,    "-p", prompt,   "-n",
                                     "8",  "--temp", "0",  "--quiet"};
    args.insert(args.end(), extra.begin(), extra.end());
    return run_bounded(args, env);
}
kvtest::RunResult gen(const std::string& model, std::vector<std::string> extra = {},
                      const std::vector<std::string>& env = {}) {
    std::vector<std::string> args = {"-m", model,    "-p", kPrompt,  "-n",
                                     "8",  "--temp", "0",  "--quiet"};
    args.insert(args.end(), extra.begin(), extra.end());
    return run_bounded(args, env);
}

// stories260K rewritten: `kv` may replace or add metadata, `tensor` may change
// a tensor's bytes (F32 tensors as floats).
struct Rewrite {
    std::vector<std::pair<std::string, std::function<void(kvrun::GgufWriter&)>>> kv;
    std::function<void(const std::string& name, std::vector<float>& data)> tensor;
    std::function<bool(const std::string& name)> drop; // tensors left out
};
Rewrite with_kv(const std::string& key, std::function<void(kvrun::GgufWriter&)> set) {
    Rewrite rw;
    rw.kv.emplace_back(key, std::move(set));
    return rw;
}
Rewrite with_tensor(std::function<void(const std::string& name, std::vector<float>& data)> edit) {
    Rewrite rw;
    rw.tensor = std::move(edit);
    return rw;
}
void rewrite(const std::string& out, const Rewrite& rw = Rewrite(),
             const std::string& from = kStories) {
    kvrun::GgufFile f = kvrun::GgufFile::open(from);
    kvrun::GgufWriter w;
    for (const auto& [k, v] : f.metadata()) {
        bool replaced = false;
        for (const auto& [rk, set] : rw.kv)
            if (rk == k) replaced = true;
        if (!replaced) w.copy_kv(k, v);
    }
    for (const auto& [rk, set] : rw.kv) set(w);
    for (const auto& t : f.tensors()) {
        if (rw.drop && rw.drop(t.name)) continue;
        std::vector<uint8_t> bytes(static_cast<const uint8_t*>(t.data),
                                   static_cast<const uint8_t*>(t.data) + t.nbytes);
        if (rw.tensor && t.type == gl::Type::F32) {
            std::vector<float> x(t.nbytes / 4);
            std::memcpy(x.data(), bytes.data(), t.nbytes);
            rw.tensor(t.name, x);
            std::memcpy(bytes.data(), x.data(), t.nbytes);
        }
        w.add_tensor(t.name, t.type, std::vector<int64_t>(t.ne, t.ne + t.n_dims), std::move(bytes));
    }
    w.write(out);
}

Rewrite with_u32(const std::string& key, uint32_t v) {
    return with_kv(key, [=](kvrun::GgufWriter& w) { w.set_u32(key, v); });
}
Rewrite without_tensor(const std::string& tensor) {
    Rewrite rw;
    rw.drop = [=](const std::string& name) { return name == tensor; };
    return rw;
}
Rewrite without_key(const std::string& key) {
    Rewrite rw;
    rw.kv.emplace_back(key, [](kvrun::GgufWriter&) {});
    return rw;
}
// An F32 tensor's first value replaced.
Rewrite with_first_float(const std::string& tensor, float v) {
    return with_tensor([=](const std::string& name, std::vector<float>& x) {
        if (name == tensor) x[0] = v;
    });
}

struct BadCase {
    const char* what;
    Rewrite rw;
    const char* says; // in the one-line error
};
// Each rewrite of `from` is a bad model (status 3) named in one line.
void check_bad_models(const std::string& from, const std::vector<BadCase>& cases) {
    TempDir d;
    for (const BadCase& c : cases) {
        CAPTURE(std::string(c.what));
        const std::string m = d.file("bad.gguf");
        fs::remove(m);
        rewrite(m, c.rw, from);
        const auto r = gen(m);
        CHECK(r.status == 3);
        CHECK(contains(r.err, c.says));
        CHECK(count_lines(r.err) == 1);
    }
}

} // namespace

// ---- F1, F7, F8: writers ------------------------------------------------------

TEST_CASE("files: --prompt-cache never replaces a file that is not a prompt cache") {
    TempDir d;
    const std::string model = d.file("own.gguf"), notes = d.file("notes.txt");
    fs::copy_file(kStories, model);
    spit(notes, "my notes\n");
    const std::string model_bytes = slurp(model);
    for (const std::string& target : {model, notes}) {
        CAPTURE(target);
        const auto r = gen(model, {"--prompt-cache", target});
        CHECK(r.status == 0);
        CHECK(!r.out.empty()); // the answer still comes
        CHECK(contains(r.err, "prompt cache not saved: '" + target +
                                  "' exists and is not a prompt cache"));
    }
    CHECK(slurp(model) == model_bytes);
    CHECK(slurp(notes) == "my notes\n");
    CHECK(gen(model).status == 0); // the model still loads
    // A cache of ours is replaced as before.
    const std::string pc = d.file("pc.bin");
    REQUIRE(gen(model, {"--prompt-cache", pc}).status == 0);
    const auto again = gen_with(model, kPrompt + " in the park", {"--prompt-cache", pc});
    CHECK(contains(again.err, "prompt cache: reused"));
    CHECK(!contains(again.err, "not saved"));
}

TEST_CASE("files: the temporary file is created exclusively, never through a planted symlink") {
    TempDir d;
    const std::string victim = d.file("victim.txt"), pc = d.file("c.bin");
    spit(victim, "precious\n");
    // The name kvrun used to write to (FILE.tmp.PID), planted before exec so
    // that the PID is the one kvrun will have.
    const std::string script =
        "ln -s \"$1\" \"$2.tmp.$$\" && exec \"$3\" -m \"$4\" -p 'Once upon a time' -n 4 "
        "--temp 0 --quiet --prompt-cache \"$2\"";
    const auto r =
        kvtest::run_binary("/bin/sh", {"-c", script, "sh", victim, pc, KVRUN_BINARY, kStories});
    CHECK(r.status == 0);
    CHECK(slurp(victim) == "precious\n");
    CHECK(fs::is_regular_file(fs::symlink_status(pc))); // a real file, not the link
    int tmp_files = 0;
    for (const auto& e : fs::directory_iterator(d.path))
        tmp_files +=
            contains(e.path().filename().string(), ".tmp.") && !fs::is_symlink(e.symlink_status());
    CHECK(tmp_files == 0);
}

TEST_CASE("files: temporaries a killed writer left are removed by the next write of the target; "
          "a live writer's, other names and symlinks stay") {
    TempDir d;
    const std::string pc = d.file("c.bin"), victim = d.file("victim.txt");
    spit(victim, "precious\n");
    // A pid that is gone: a child that has exited and been reaped.
    const pid_t child = fork();
    if (child == 0) _exit(0);
    REQUIRE(child > 0);
    int st = 0;
    REQUIRE(waitpid(child, &st, 0) == child);
    const std::string dead = pc + ".tmp." + std::to_string(child) + ".0badc0de";
    const std::string alive = pc + ".tmp." + std::to_string(getpid()) + ".0badc0de";
    const std::string other = pc + ".tmp.notes";
    const std::string link = pc + ".tmp." + std::to_string(child) + ".deadbeef";
    const std::string other_target = d.file("other.bin.tmp." + std::to_string(child) + ".0badc0de");
    for (const std::string& f : {dead, alive, other, other_target}) spit(f, "half a cache");
    fs::create_symlink(victim, link);
    REQUIRE(gen(kStories, {"--prompt-cache", pc}).status == 0);
    CHECK(!fs::exists(dead));
    CHECK(fs::exists(alive));        // its writer may still rename it
    CHECK(fs::exists(other));        // not a name kvrun writes
    CHECK(fs::exists(other_target)); // another target's
    CHECK(fs::is_symlink(fs::symlink_status(link)));
    CHECK(slurp(victim) == "precious\n");
    CHECK(fs::is_regular_file(pc));
}

TEST_CASE("files: a prompt cache that cannot be written costs a warning, not the answer") {
    const auto plain = gen(kStories);
    REQUIRE(plain.status == 0);
    const auto r = gen(kStories, {"--prompt-cache", "/nonexistent/dir/pc.bin"});
    CHECK(r.status == 0);
    CHECK(r.out == plain.out);
    CHECK(contains(
        r.err,
        "prompt cache not saved: cannot write prompt cache '/nonexistent/dir/pc.bin': No such "
        "file or directory"));
    CHECK(!contains(r.err, ".tmp."));
}

TEST_CASE("files: quantize names the output the user gave and leaves a non-GGUF file alone") {
    TempDir d;
    const auto missing = kvtest::run_kvrun({"quantize", kStories, "/nonexistent/out.gguf", "Q8_0"});
    CHECK(missing.status != 0);
    CHECK(contains(missing.err, "'/nonexistent/out.gguf'"));
    CHECK(!contains(missing.err, ".tmp."));
    const std::string doc = d.file("doc.txt");
    spit(doc, "a document\n");
    const auto r = kvtest::run_kvrun({"quantize", kStories, doc, "Q8_0"});
    CHECK(r.status != 0);
    CHECK(contains(r.err, "exists and is not a GGUF file"));
    CHECK(slurp(doc) == "a document\n");
}

// ---- F9, F13: readers -----------------------------------------------------------

TEST_CASE(
    "files: FIFOs, directories and /dev/zero are one-line errors, not hangs or unbounded reads") {
    TempDir d;
    const std::string fifo = d.file("fifo");
    REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
    struct Case {
        std::vector<std::string> args;
        int status;
        std::string says;
    };
    const std::vector<Case> cases = {
        {{"-m", fifo, "-p", "x"}, 3, "is not a regular file"},
        {{"info", "-m", fifo}, 3, "is not a regular file"},
        {{"-m", kStories, "-f", fifo},
         2,
         "cannot read prompt file '" + fifo + "': not a regular file"},
        {{"-m", kStories, "-f", d.path.string()},
         2,
         "cannot read prompt file '" + d.path.string() + "': it is a directory"},
        {{"-m", kStories, "-f", "/dev/zero"}, 2, "not a regular file"},
        {{"-m", kStories, "--chat", "-p", "hi", "--system-file", fifo},
         2,
         "cannot read system prompt file"},
        {{"-m", kStories, "--chat", "-p", "hi", "--system-file", "/dev/zero"},
         2,
         "cannot read system prompt file"},
        {{"chat", "-m", kStories, "-p", "hi", "--system-file", d.path.string()},
         2,
         "it is a directory"},
    };
    for (const Case& c : cases) {
        CAPTURE(c.args);
        const auto r = run_bounded(c.args);
        CHECK(r.status == c.status);
        CHECK(contains(r.err, c.says));
        CHECK(count_lines(r.err) == 1);
        CHECK(r.err.rfind("kvrun: error: ", 0) == 0);
    }
    // A prompt cache that is no regular file is not used and not replaced;
    // the answer comes as without one.
    const auto plain = gen(kStories);
    for (const std::string& pc : {fifo, d.path.string(), std::string("/dev/zero")}) {
        CAPTURE(pc);
        const auto r = gen(kStories, {"--prompt-cache", pc});
        CHECK(r.status == 0);
        CHECK(r.out == plain.out);
        CHECK(contains(r.err, "not used"));
        CHECK(contains(r.err, "not saved"));
    }
    CHECK(fs::is_fifo(fifo));
}

TEST_CASE("files: system prompts must be UTF-8 like -p") {
    TempDir d;
    const std::string sys = d.file("sys.txt");
    spit(sys, "Be \xff nice");
    for (const auto& args : std::vector<std::vector<std::string>>{
             {"-m", kStories, "--chat", "-p", "hi", "--system", "Be \xff nice", "-n", "4"},
             {"-m", kStories, "--chat", "-p", "hi", "--system-file", sys, "-n", "4"},
             {"chat", "-m", kStories, "-p", "hi", "--system", "Be \xff nice", "-n", "4"},
             {"chat", "-m", kStories, "-p", "hi", "--system-file", sys, "-n", "4"}}) {
        CAPTURE(args);
        const std::string in = "hello";
        const auto r = kvtest::run_kvrun(args, &in);
        CHECK(r.status == 2);
        CHECK(contains(r.err, "the system prompt is not valid UTF-8 (bad byte at offset 3)"));
    }
}

// ---- F3: the cache is tied to the weights ---------------------------------------------

TEST_CASE("files: a prompt cache is refused for a model with the same header and other weights") {
    TempDir d;
    const std::string a = d.file("a.gguf"), b = d.file("b.gguf"), pc = d.file("pc.bin");
    rewrite(a);
    rewrite(b, with_tensor([](const std::string& name, std::vector<float>& x) {
                if (name == "output_norm.weight")
                    for (float& v : x) v *= -3.0f;
            }));
    {
        kvrun::GgufFile fa = kvrun::GgufFile::open(a), fb = kvrun::GgufFile::open(b);
        REQUIRE(fa.data_offset() == fb.data_offset());
        REQUIRE(std::memcmp(fa.bytes(), fb.bytes(), fa.data_offset()) == 0); // the same header
        REQUIRE(fa.file_size() == fb.file_size());
    }
    const auto plain_b = gen(b);
    REQUIRE(plain_b.status == 0);

    auto check_refused = [&](const std::vector<std::string>& env) {
        REQUIRE(gen(a, {"--prompt-cache", pc}, env).status == 0);
        const auto reuse_a =
            gen(a, {"--prompt-cache", pc}, env); // the memo (when any) does not break reuse
        CHECK(contains(reuse_a.err, "prompt cache: reused"));
        const auto r = gen(b, {"--prompt-cache", pc}, env);
        CHECK(r.status == 0);
        CHECK(contains(r.err, "not used (made with a different model)"));
        CHECK(r.out == plain_b.out);
    };
    SUBCASE("with the digest memo") {
        const std::string cache_home = d.file("cache");
        ::sleep(1); // files changed within the last second are not remembered (weights_digest.cpp)
        check_refused({"XDG_CACHE_HOME=" + cache_home});
        CHECK(fs::exists(cache_home + "/kvrun/weights-digests"));
        // Modified in place (same inode, same size): the memo must not answer for it.
        fs::remove(pc);
        REQUIRE(gen(a, {"--prompt-cache", pc}, {"XDG_CACHE_HOME=" + cache_home}).status == 0);
        std::fstream(a, std::ios::in | std::ios::out | std::ios::binary) << slurp(b);
        const auto r = gen(a, {"--prompt-cache", pc}, {"XDG_CACHE_HOME=" + cache_home});
        CHECK(contains(r.err, "not used (made with a different model)"));
        CHECK(r.out == plain_b.out);
    }
    SUBCASE("with a memo that is not a memo: it is replaced by one") {
        const std::string cache_home = d.file("cache");
        fs::create_directories(cache_home + "/kvrun");
        const std::string memo = cache_home + "/kvrun/weights-digests";
        std::string junk(4096, '\0');
        std::mt19937 rng(3);
        for (char& c : junk) c = static_cast<char>(rng());
        spit(memo, junk);
        ::sleep(1);
        check_refused({"XDG_CACHE_HOME=" + cache_home});
        CHECK(slurp(memo).rfind("kvrun weights digests ", 0) == 0);
    }
    SUBCASE("with the memo directory unwritable") {
        const std::string ro = d.file("ro");
        fs::create_directory(ro);
        fs::permissions(ro, fs::perms::owner_read | fs::perms::owner_exec);
        check_refused({"XDG_CACHE_HOME=" + ro});
        if (::geteuid() != 0) CHECK(!fs::exists(ro + "/kvrun"));
    }
    SUBCASE("with the memo path a file, and with no cache home at all") {
        const std::string file = d.file("not-a-dir");
        spit(file, "x");
        check_refused({"XDG_CACHE_HOME=" + file});
        fs::remove(pc);
        check_refused({"-u", "XDG_CACHE_HOME", "-u", "HOME"});
    }
}

TEST_CASE("files: the weights digest sees one changed tensor; the memo answers per file identity") {
    TempDir d;
    const std::string a = d.file("a.gguf"), b = d.file("b.gguf");
    rewrite(a);
    rewrite(b, with_tensor([](const std::string& name, std::vector<float>& x) {
                if (name == "blk.0.attn_norm.weight") x[3] += 1.0f;
            }));
    kvrun::GgufFile fa = kvrun::GgufFile::open(a), fb = kvrun::GgufFile::open(b);
    CHECK(kvrun::hash_weights(fa) != kvrun::hash_weights(fb));
    CHECK(kvrun::hash_weights(fa) == kvrun::hash_weights(kvrun::GgufFile::open(a)));
    CHECK(fa.identity().known);
    CHECK(!(fa.identity() == fb.identity()));
}

// ---- F2: sliding windows ------------------------------------------------------------------

TEST_CASE("files: a sliding-window model with a prompt longer than its window saves no cache, and "
          "no abort") {
    TempDir d;
    const std::string sw = d.file("sw16.gguf"), pc = d.file("pc.bin");
    rewrite(sw, with_kv("llama.attention.sliding_window", [](kvrun::GgufWriter& w) {
                w.set_u32("llama.attention.sliding_window", 16);
            }));
    for (const char* ctx : {"auto", "64"}) {
        CAPTURE(ctx);
        const auto r = gen(sw, {"--prompt-cache", pc, "-c", ctx});
        CHECK(r.status == 0);
        CHECK(!r.out.empty());
        CHECK(contains(r.err, "prompt cache not saved: the prompt ("));
        CHECK(!fs::exists(pc));
    }
}

TEST_CASE(
    "files: sliding_window out of range is a bad model; a fixed -c still refuses a long prompt") {
    TempDir d;
    for (uint64_t w : {uint64_t{1}, uint64_t{1} << 63, ~uint64_t{0}}) {
        CAPTURE(w);
        const std::string m = d.file("sw.gguf");
        fs::remove(m);
        rewrite(m, with_kv("llama.attention.sliding_window", [w](kvrun::GgufWriter& g) {
                    g.set_u64("llama.attention.sliding_window", w);
                }));
        const auto r = gen(m, {"-c", "8"});
        CHECK(r.status == 3);
        CHECK(contains(r.err, "sliding_window' = "));
    }
    // A window larger than the prompt does not lift -c's limit.
    const std::string m = d.file("sw-big.gguf");
    rewrite(m, with_kv("llama.attention.sliding_window", [](kvrun::GgufWriter& g) {
                g.set_u32("llama.attention.sliding_window", 1000);
            }));
    CHECK(gen(m, {"-c", "8"}).status == 4);
}

// ---- F6, F16: hostile model values --------------------------------------------------------

TEST_CASE("files: tensors whose bytes overlap are a bad model") {
    TempDir d;
    const std::string m = d.file("overlap.gguf");
    rewrite(m);
    // Point output_norm's data offset at token_embd's.
    std::string bytes = slurp(m);
    kvrun::GgufFile f = kvrun::GgufFile::open(m);
    const uint64_t embd = f.tensor("token_embd.weight")->offset - f.data_offset();
    const std::string name = "output_norm.weight";
    const size_t at = bytes.find(name);
    REQUIRE(at != std::string::npos);
    uint32_t n_dims;
    std::memcpy(&n_dims, bytes.data() + at + name.size(), 4);
    const size_t offset_at = at + name.size() + 4 + 8 * n_dims + 4;
    std::memcpy(bytes.data() + offset_at, &embd, 8);
    spit(m, bytes);
    const auto r = gen(m);
    CHECK(r.status == 3);
    CHECK(contains(r.err, "overlap in the file"));
    CHECK(contains(r.err, "'token_embd.weight'"));
    CHECK(contains(r.err, "'output_norm.weight'"));
    CHECK(count_lines(r.err) == 1);
}

TEST_CASE("files: infinite epsilons, bad rope_freqs and wrapped value lengths are bad models") {
    TempDir d;
    const float inf = INFINITY, nan = NAN;
    struct Case {
        const char* what;
        Rewrite rw;
        const char* says;
    };
    const std::vector<Case> cases = {
        {"rms_eps inf",
         with_kv("llama.attention.layer_norm_rms_epsilon",
                 [=](kvrun::GgufWriter& w) {
                     w.set_f32("llama.attention.layer_norm_rms_epsilon", inf);
                 }),
         "RMS epsilon"},
        {"value_length 2^32 + 8",
         with_kv("llama.attention.value_length",
                 [](kvrun::GgufWriter& w) {
                     w.set_u64("llama.attention.value_length", (uint64_t{1} << 32) + 8);
                 }),
         "value length"},
        {"rope.freq_base inf",
         with_kv("llama.rope.freq_base",
                 [=](kvrun::GgufWriter& w) { w.set_f32("llama.rope.freq_base", inf); }),
         "freq_base"},
    };
    for (const Case& c : cases) {
        CAPTURE(c.what);
        const std::string m = d.file("bad.gguf");
        fs::remove(m);
        rewrite(m, c.rw);
        const auto r = gen(m);
        CHECK(r.status == 3);
        CHECK(contains(r.err, c.says));
    }
    // rope_freqs of [0, NaN, -1, inf, ...]
    kvrun::GgufFile f = kvrun::GgufFile::open(kStories);
    const int64_t n_pairs =
        static_cast<int64_t>(f.get_u64("llama.rope.dimension_count")
                                 .value_or(f.need_u64("llama.embedding_length") /
                                           f.need_u64("llama.attention.head_count"))) /
        2;
    for (float bad : {0.0f, nan, -1.0f, inf}) {
        CAPTURE(bad);
        const std::string m = d.file("rope-freqs.gguf");
        fs::remove(m);
        kvrun::GgufWriter w;
        for (const auto& [k, v] : f.metadata()) w.copy_kv(k, v);
        for (const auto& t : f.tensors())
            w.add_tensor(t.name, t.type, std::vector<int64_t>(t.ne, t.ne + t.n_dims), t.data,
                         t.nbytes);
        std::vector<float> freqs(n_pairs, 1.0f);
        freqs[1] = bad;
        w.add_tensor("rope_freqs.weight", gl::Type::F32, {n_pairs}, freqs.data(), freqs.size() * 4);
        w.write(m);
        const auto r = gen(m);
        CHECK(r.status == 3);
        CHECK(contains(r.err, "rope_freqs"));
    }
}

TEST_CASE("files: rope bases, scales, window flags, vocab sizes and LongRoPE factors out of range "
          "are bad models") {
    TempDir d;
    const float inf = INFINITY, nan = NAN;
    // Gemma 3 and Phi-3 (LongRoPE) random models as the sources of the rewrites.
    const std::string gemma = d.file("gemma3.gguf"), phi3 = d.file("phi3.gguf");
    {
        const auto g = kvtest::random_model({"gemma3", 64, 4, 2, 96, 3, gl::Type::F32}, 7);
        spit(gemma, std::string(g.begin(), g.end()));
        const auto ph = kvtest::random_model({"phi3", 64, 4, 4, 96, 2, gl::Type::F32}, 7, 64);
        spit(phi3, std::string(ph.begin(), ph.end()));
    }
    REQUIRE(gen(gemma).status == 0);
    REQUIRE(gen(phi3).status == 0);
    auto f32 = [](const std::string& key, float v) {
        return with_kv(key, [=](kvrun::GgufWriter& w) { w.set_f32(key, v); });
    };
    auto i32s = [](const std::string& key, std::vector<int32_t> v) {
        return with_kv(key, [=](kvrun::GgufWriter& w) { w.set_i32_array(key, v); });
    };
    auto linear = [](float factor) {
        Rewrite rw = with_kv("llama.rope.scaling.type", [](kvrun::GgufWriter& w) {
            w.set_str("llama.rope.scaling.type", "linear");
        });
        rw.kv.emplace_back("llama.rope.scaling.factor", [=](kvrun::GgufWriter& w) {
            w.set_f32("llama.rope.scaling.factor", factor);
        });
        return rw;
    };
    struct Case {
        const char* what;
        std::string from;
        Rewrite rw;
        const char* says;
    };
    const std::vector<Case> cases = {
        {"gemma3 attention.scale NaN", gemma, f32("gemma3.attention.scale", nan),
         "attention.scale"},
        {"gemma3 attention.scale -1", gemma, f32("gemma3.attention.scale", -1.0f),
         "attention.scale"},
        {"gemma3 rope.freq_base_swa inf", gemma, f32("gemma3.rope.freq_base_swa", inf),
         "freq_base_swa"},
        {"gemma3 rope.freq_base 0", gemma, f32("gemma3.rope.freq_base", 0.0f), "freq_base"},
        {"gemma3 pattern flag 2", gemma, i32s("gemma3.attention.sliding_window_pattern", {1, 2, 0}),
         "expected 0 or 1"},
        {"gemma3 pattern flag -1", gemma,
         i32s("gemma3.attention.sliding_window_pattern", {1, -1, 0}), "expected 0 or 1"},
        {"gemma3 pattern of 2 flags for 3 layers", gemma,
         i32s("gemma3.attention.sliding_window_pattern", {1, 0}), "one flag per layer"},
        {"llama linear rope.scaling.factor NaN", kStories, linear(nan), "rope.scaling.factor"},
        {"llama linear rope.scaling.factor 0", kStories, linear(0.0f), "rope.scaling.factor"},
        {"llama vocab_size 1000", kStories,
         with_kv("llama.vocab_size",
                 [](kvrun::GgufWriter& w) { w.set_u32("llama.vocab_size", 1000); }),
         "vocab_size"},
        {"phi3 vocab_size 511", phi3,
         with_kv("phi3.vocab_size",
                 [](kvrun::GgufWriter& w) { w.set_u32("phi3.vocab_size", 511); }),
         "vocab_size"},
    };
    for (const Case& c : cases) {
        CAPTURE(std::string(c.what));
        const std::string m = d.file("bad.gguf");
        fs::remove(m);
        rewrite(m, c.rw, c.from);
        const auto r = gen(m);
        CHECK(r.status == 3);
        CHECK(contains(r.err, c.says));
        CHECK(count_lines(r.err) == 1);
    }
    // The flags as the file gives them still run, and a vocab_size that agrees is fine.
    {
        const std::string m = d.file("good.gguf");
        rewrite(m, i32s("gemma3.attention.sliding_window_pattern", {1, 1, 0}), gemma);
        CHECK(gen(m).status == 0);
        fs::remove(m);
        rewrite(m, with_kv("llama.vocab_size",
                           [](kvrun::GgufWriter& w) { w.set_u32("llama.vocab_size", 512); }));
        CHECK(gen(m).status == 0);
    }
    // LongRoPE factors of 1e9 or 1e-9 turn every angle into noise.
    for (float bad : {1e9f, 1e-9f}) {
        CAPTURE(bad);
        const std::string m = d.file("longrope.gguf");
        fs::remove(m);
        rewrite(m, with_tensor([&](const std::string& name, std::vector<float>& x) {
                    if (name == "rope_factors_long.weight") x[0] = bad;
                }),
                phi3);
        const auto r = gen(m);
        CHECK(r.status == 3);
        CHECK(contains(r.err, "rope_factors_long"));
    }
}

// Gemma 4's keys and tensors: shared-layer counts the layers cannot hold, a
// shared layer whose source is of the other kind, missing per-layer tensors,
// a missing window head size, non-finite scales and RoPE factors.
TEST_CASE("files: Gemma 4 files with bad shared layers, missing tensors or bad values are bad "
          "models") {
    const std::string g4 = kvtest::shared("models/next/tiny-gemma4-Q4_K_M.gguf");
    REQUIRE(gen(g4).status == 0);
    check_bad_models(
        g4, {
                {"shared_kv_layers 5 of 6", with_u32("gemma4.attention.shared_kv_layers", 5),
                 "shared_kv_layers"},
                {"shared_kv_layers 1000", with_u32("gemma4.attention.shared_kv_layers", 1000),
                 "shared_kv_layers"},
                // Layer 4 (window) would read layer 2, made global here.
                {"a shared layer's source of the other kind",
                 with_kv("gemma4.attention.sliding_window_pattern",
                         [](kvrun::GgufWriter& w) {
                             w.set_i32_array("gemma4.attention.sliding_window_pattern",
                                             {1, 1, 0, 0, 1, 0});
                         }),
                 "of the other kind"},
                {"no key_length_swa", without_key("gemma4.attention.key_length_swa"),
                 "key_length_swa"},
                {"no inp_gate in layer 2", without_tensor("blk.2.inp_gate.weight"),
                 "blk.2.inp_gate.weight"},
                {"no per_layer_token_embd", without_tensor("per_layer_token_embd.weight"),
                 "per_layer_token_embd"},
                {"no attn_k in layer 3", without_tensor("blk.3.attn_k.weight"),
                 "blk.3.attn_k.weight"},
                {"layer_output_scale NaN", with_first_float("blk.1.layer_output_scale.weight", NAN),
                 "layer_output_scale"},
                {"rope_freqs NaN", with_first_float("rope_freqs.weight", NAN), "rope_freqs"},
                {"embedding_length_per_layer_input 0",
                 with_u32("gemma4.embedding_length_per_layer_input", 0),
                 "embedding_length_per_layer_input"},
                {"a mixture of experts (26B-A4B)", with_u32("gemma4.expert_count", 128),
                 "mixture of experts"},
            });
}

// Qwen 3.5's keys and tensors: a NaN or growing decay, missing DeltaNet
// tensors, state sizes that do not divide, layer patterns and RoPE sections
// out of range, MTP counts that leave no layer.
TEST_CASE("files: Qwen 3.5 files with bad state sizes, decays or missing tensors are bad models") {
    const std::string q35 = kvtest::shared("models/next/tiny-qwen35-Q4_K_M.gguf");
    REQUIRE(gen(q35).status == 0);
    check_bad_models(
        q35, {
                 {"NaN decay (ssm_a)", with_first_float("blk.0.ssm_a", NAN), "blk.0.ssm_a"},
                 {"a growing decay (ssm_a > 0)", with_first_float("blk.1.ssm_a", 0.5f),
                  "blk.1.ssm_a"},
                 {"NaN conv taps", with_first_float("blk.2.ssm_conv1d.weight", NAN),
                  "Gated DeltaNet"},
                 {"no ssm_conv1d in layer 0", without_tensor("blk.0.ssm_conv1d.weight"),
                  "blk.0.ssm_conv1d.weight"},
                 {"no attn_gate in layer 5", without_tensor("blk.5.attn_gate.weight"),
                  "blk.5.attn_gate.weight"},
                 {"no ssm.conv_kernel", without_key("qwen35.ssm.conv_kernel"), "ssm.conv_kernel"},
                 {"inner size over 3 value heads", with_u32("qwen35.ssm.time_step_rank", 3),
                  "inner_size"},
                 {"full_attention_interval 0", with_u32("qwen35.full_attention_interval", 0),
                  "full_attention_interval"},
                 {"RoPE sections of 40 dims",
                  with_kv("qwen35.rope.dimension_sections",
                          [](kvrun::GgufWriter& w) {
                              w.set_i32_array("qwen35.rope.dimension_sections", {10, 6, 4, 0});
                          }),
                  "dimension_sections"},
                 {"8 MTP layers of 8", with_u32("qwen35.nextn_predict_layers", 8),
                  "nextn_predict_layers"},
             });
}

// Mixture-of-experts headers (qwen3moe, qwen35moe): expert counts out of
// range or disagreeing with the tensors, experts used of 0 or more than the
// experts, a shared expert without its gate or its width.
TEST_CASE("files: MoE files with bad expert counts, shapes or shared experts are bad models") {
    const std::string q3 = kvtest::shared("models/next/tiny-qwen3moe-Q4_K_M.gguf");
    REQUIRE(gen(q3).status == 0);
    check_bad_models(
        q3,
        {
            {"0 experts used", with_u32("qwen3moe.expert_used_count", 0), "expert_used_count"},
            {"9 of 8 experts used", with_u32("qwen3moe.expert_used_count", 9), "expert_used_count"},
            {"no expert_used_count", without_key("qwen3moe.expert_used_count"),
             "expert_used_count"},
            {"0 experts", with_u32("qwen3moe.expert_count", 0), "expert_count"},
            {"7 experts, tensors of 8", with_u32("qwen3moe.expert_count", 7),
             "blk.0.ffn_gate_inp.weight"},
            {"expert width 64, tensors of 32", with_u32("qwen3moe.expert_feed_forward_length", 64),
             "blk.0.ffn_gate_exps.weight"},
            {"no router in layer 2", without_tensor("blk.2.ffn_gate_inp.weight"),
             "blk.2.ffn_gate_inp.weight"},
            {"no down experts in layer 3", without_tensor("blk.3.ffn_down_exps.weight"),
             "blk.3.ffn_down_exps.weight"},
        });
    const std::string q35 = kvtest::shared("models/next/tiny-qwen35moe-Q4_K_M.gguf");
    REQUIRE(gen(q35).status == 0);
    check_bad_models(
        q35, {
                 {"a shared expert without its gate",
                  without_tensor("blk.1.ffn_gate_inp_shexp.weight"), "has no gate"},
                 {"a shared expert without its width",
                  without_key("qwen35moe.expert_shared_feed_forward_length"),
                  "expert_shared_feed_forward_length"},
                 {"NaN in the shared expert's gate",
                  with_first_float("blk.0.ffn_gate_inp_shexp.weight", NAN),
                  "blk.0.ffn_gate_inp_shexp.weight"},
                 {"2 experts, 3 used", with_u32("qwen35moe.expert_count", 2), "expert_used_count"},
             });
}

TEST_CASE("files: NaN weights that reach the logits stop generation with exit 3") {
    TempDir d;
    const std::string m = d.file("nan.gguf");
    rewrite(m, with_tensor([](const std::string& name, std::vector<float>& x) {
                if (name == "output_norm.weight") x[0] = NAN;
            }));
    const auto r = gen(m);
    CHECK(r.status == 3);
    CHECK(contains(r.err, "non-finite logits"));
    CHECK(count_lines(r.err) == 1);
}

// ---- F10: empty copies ------------------------------------------------------------------

// Without sinks (--keep 0) the sink copies are empty; under the sanitizers a
// memcpy to a null pointer aborted here.
TEST_CASE("files: a prompt cache with --keep 0 is saved and reused") {
    TempDir d;
    const std::string pc = d.file("pc.bin");
    REQUIRE(gen(kStories, {"--keep", "0", "--prompt-cache", pc}).status == 0);
    const auto r = gen_with(kStories, kPrompt + " outside", {"--keep", "0", "--prompt-cache", pc});
    CHECK(r.status == 0);
    CHECK(contains(r.err, "prompt cache: reused"));
}

// ---- F4, F5, #29: chat saves ----------------------------------------------------------------

namespace {

struct Chat {
    std::unique_ptr<kvrun::LoadedModel> lm = kvrun::LoadedModel::load(kStories);
    std::unique_ptr<gl::Backend> cpu = gl::make_cpu_backend(1);
    kvrun::ChatSession session{*lm,
                               kvrun::ChatTemplate::for_model(lm->file, lm->tokenizer, ""),
                               256,
                               gl::Type::F16,
                               gl::Type::F16,
                               kvrun::Placement::all(*cpu, lm->model.hp.n_layer),
                               [] {
                                   kvrun::ChatConfig c;
                                   c.n_predict = 6;
                                   c.sampling.temp = 0;
                                   return c;
                               }()};
};

} // namespace

TEST_CASE("files: chat /load of a malformed save keeps the session and says why") {
    TempDir d;
    Chat chat;
    chat.session.respond("Hello there", {});
    const std::string save = d.file("s");
    chat.session.save(save);
    const nlohmann::json good = nlohmann::json::parse(slurp(save + ".json"));
    CHECK(good.at("model_digest").is_string()); // #29: not a number past 2^53
    CHECK(chat.session.load(save).find("loaded 1 turn;") != std::string::npos);
    chat.session.respond("And then", {});
    const auto before = chat.session.turns().size();
    REQUIRE(before == 2);

    auto with = [&](const std::function<void(nlohmann::json&)>& edit) {
        nlohmann::json j = good;
        edit(j);
        return j.dump();
    };
    std::string deep;
    for (int i = 0; i < 100000; i++) deep += '[';
    const std::vector<std::pair<std::string, std::string>> cases = {
        {"turns missing", with([](nlohmann::json& j) { j.erase("turns"); })},
        {"turns a number", with([](nlohmann::json& j) { j["turns"] = 5; })},
        {"turns an object", with([](nlohmann::json& j) {
             j["turns"] = {{"a", 1}};
         })},
        {"user a number", with([](nlohmann::json& j) { j["turns"][0]["user"] = 1; })},
        {"reply missing", with([](nlohmann::json& j) { j["turns"][0].erase("reply"); })},
        {"system a number", with([](nlohmann::json& j) { j["system"] = 5; })},
        {"reply_tokens strings",
         with([](nlohmann::json& j) { j["turns"][0]["reply_tokens"] = {"x"}; })},
        {"token 2^32 + 5",
         with([](nlohmann::json& j) { j["turns"][0]["reply_tokens"] = {4294967301ull}; })},
        {"token -1", with([](nlohmann::json& j) { j["turns"][0]["reply_tokens"] = {-1}; })},
        {"first_live_turn a string", with([](nlohmann::json& j) { j["first_live_turn"] = "x"; })},
        {"model_digest junk", with([](nlohmann::json& j) { j["model_digest"] = "abc!"; })},
        {"an array", "[1, 2]"},
        {"deep nesting", deep},
        {"not JSON", "{"},
    };
    for (const auto& [what, text] : cases) {
        CAPTURE(what);
        spit(save + ".json", text);
        try {
            chat.session.load(save);
            FAIL("loaded");
        } catch (const kvrun::Error& e) {
            CHECK(std::string(e.what()).rfind("'" + save + ".json' is not a kvrun conversation (",
                                              0) == 0);
        }
        CHECK(chat.session.turns().size() == before);
    }
    // A directory or a FIFO in place of either file.
    fs::remove(save + ".json");
    fs::create_directory(save + ".json");
    CHECK_THROWS_WITH_AS(chat.session.load(save), doctest::Contains("it is a directory"),
                         kvrun::Error);
    fs::remove(save + ".json");
    REQUIRE(mkfifo((save + ".json").c_str(), 0600) == 0);
    CHECK_THROWS_WITH_AS(chat.session.load(save), doctest::Contains("not a regular file"),
                         kvrun::Error);
    fs::remove(save + ".json");
    spit(save + ".json", good.dump());
    fs::remove(save);
    REQUIRE(mkfifo(save.c_str(), 0600) == 0);
    CHECK(chat.session.load(save).find("cache not used (not a regular file)") != std::string::npos);
    // An old save with the digest as a number still loads, its tokens used.
    fs::remove(save);
    nlohmann::json old = good;
    old["model_digest"] = std::stoull(good.at("model_digest").get<std::string>(), nullptr, 16);
    spit(save + ".json", old.dump());
    CHECK(chat.session.load(save).find("loaded 1 turn;") != std::string::npos);
}

TEST_CASE("files: chat /load refuses oversized conversations by size, loads long ones in one "
          "pass, and stops on Ctrl-C") {
    TempDir d;
    Chat chat;
    chat.session.respond("Hello there", {});
    const std::string save = d.file("s");
    chat.session.save(save);
    const nlohmann::json good = nlohmann::json::parse(slurp(save + ".json"));
    const nlohmann::json turn = good.at("turns").at(0);
    auto with_turns = [&](size_t n) {
        nlohmann::json j = good;
        j["turns"] = nlohmann::json::array();
        for (size_t i = 0; i < n; i++) j["turns"].push_back(turn);
        j["first_live_turn"] = n - 1;
        return j.dump();
    };
    // A million turns is over the cap: refused by its size, never parsed.
    spit(save + ".json", with_turns(1000000));
    REQUIRE(fs::file_size(save + ".json") > kvrun::ChatSession::kMaxConversationBytes);
    const auto t0 = std::chrono::steady_clock::now();
    // The real size, in bytes ("16.0 MiB, more than 16 MiB" said nothing).
    const std::string real_size =
        fmt::format("is {} bytes, more than a kvrun conversation can be ({} bytes",
                    fs::file_size(save + ".json"), kvrun::ChatSession::kMaxConversationBytes);
    CHECK_THROWS_WITH_AS(chat.session.load(save), doctest::Contains(real_size.c_str()),
                         kvrun::Error);
    // Generous for a sanitizer build on a loaded machine; parsing 30 MB takes
    // seconds there, a stat microseconds.
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(1));
    CHECK(chat.session.turns().size() == 1);
    // 60,000 turns under the cap: the live window is found without
    // tokenizing every suffix (the old quadratic search took minutes here).
    spit(save + ".json", with_turns(60000));
    REQUIRE(fs::file_size(save + ".json") < kvrun::ChatSession::kMaxConversationBytes);
    CHECK(chat.session.load(save).find("loaded 60000 turns") != std::string::npos);
    CHECK(chat.session.turns().size() == 60000);
    CHECK(chat.session.first_live_turn() >= 59990);
    CHECK(chat.session.cached_tokens() <= chat.session.n_ctx());
    chat.session.respond("And then", {});
    CHECK(chat.session.turns().size() == 60001);
    // Hundreds of thousands of short turns, just under the cap: one linear
    // pass (the parse was quadratic in the turns: 29 s for 300,000, minutes
    // under the sanitizers).
    {
        nlohmann::json j = good;
        j["turns"] = nlohmann::json::array();
        const nlohmann::json tiny = {
            {"user", "a"}, {"reply", ""}, {"reply_tokens", nlohmann::json::array()}};
        const size_t n = kvrun::ChatSession::kMaxConversationBytes / (tiny.dump().size() + 1) - 100;
        REQUIRE(n > 300000);
        for (size_t i = 0; i < n; i++) j["turns"].push_back(tiny);
        j["first_live_turn"] = n - 1;
        spit(save + ".json", j.dump());
        REQUIRE(fs::file_size(save + ".json") < kvrun::ChatSession::kMaxConversationBytes);
        CHECK(chat.session.load(save).find(fmt::format("loaded {} turns", n)) != std::string::npos);
        CHECK(chat.session.turns().size() == n);
        spit(save + ".json", with_turns(60000));
        chat.session.load(save);
        chat.session.respond("And then", {});
        REQUIRE(chat.session.turns().size() == 60001);
    }
    // A stop request part way leaves the conversation as it was.
    int polls = 0;
    const auto stop_soon = [&] { return ++polls > 3; };
    try {
        chat.session.load(save, stop_soon);
        FAIL("loaded");
    } catch (const kvrun::Error& e) {
        CHECK(e.code() == kvrun::Exit::interrupted);
        CHECK(std::string(e.what()).find("interrupted: the conversation is as it was") !=
              std::string::npos);
    }
    CHECK(chat.session.turns().size() == 60001);
    // The last turn is never evicted: a first live turn past the turns is refused.
    nlohmann::json past = good;
    past["first_live_turn"] = 5;
    spit(save + ".json", past.dump());
    CHECK_THROWS_WITH_AS(chat.session.load(save), doctest::Contains("first_live_turn 5 is past"),
                         kvrun::Error);
}

TEST_CASE("files: chat /save never replaces other files and leaves no temporaries") {
    TempDir d;
    Chat chat;
    chat.session.save(
        d.file("empty")); // nothing cached yet: empty copies (sanitizer builds check them)
    CHECK(chat.session.load(d.file("empty")).find("loaded 0 turns") != std::string::npos);
    chat.session.respond("Hello there", {});
    const std::string doc = d.file("doc"), doc_json = d.file("other");
    spit(doc, "a document\n");
    CHECK_THROWS_WITH_AS(chat.session.save(doc),
                         doctest::Contains("is not a prompt cache: left as it is"), kvrun::Error);
    CHECK(slurp(doc) == "a document\n");
    CHECK(!fs::exists(doc + ".json"));
    spit(doc_json + ".json", "{\"mine\": true}");
    CHECK_THROWS_WITH_AS(chat.session.save(doc_json), doctest::Contains("is not a conversation"),
                         kvrun::Error);
    CHECK(slurp(doc_json + ".json") == "{\"mine\": true}");
    CHECK(!fs::exists(doc_json));
    // A save replaces a save, whatever bytes the conversation holds.
    chat.session.set_system("Be \xff nice");
    chat.session.save(d.file("s"));
    chat.session.respond("More", {});
    chat.session.save(d.file("s"));
    int tmp_files = 0;
    for (const auto& e : fs::directory_iterator(d.path))
        tmp_files += contains(e.path().string(), ".tmp.");
    CHECK(tmp_files == 0);
}
