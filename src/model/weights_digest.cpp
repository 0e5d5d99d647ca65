#include "weights_digest.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <sstream>
#include <vector>
#include <sys/stat.h>

#include "file_io.h"

namespace kvrun {

namespace {

constexpr const char* kMemoHead = "kvrun weights digests 1\n";
constexpr size_t kMemoEntries = 64;           // most recently used first
constexpr uint64_t kMemoMaxBytes = 64u << 10; // far more than 64 lines need

uint64_t rotl(uint64_t x, int r) {
    return (x << r) | (x >> (64 - r));
}

uint64_t fmix(uint64_t h) {
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    return h ^ (h >> 33);
}

// Four independent lanes of 64-bit words: the multiplies overlap, so the
// hash runs at memory speed rather than one byte per step.
class Hasher {
  public:
    void add(const void* data, size_t n) {
        const auto* p = static_cast<const uint8_t*>(data);
        size_t i = 0;
        for (; i + 32 <= n; i += 32) block(p + i);
        uint8_t tail[32] = {};
        if (i < n) {
            std::memcpy(tail, p + i, n - i);
            block(tail);
        }
        total_ += n;
    }
    uint64_t digest() const {
        uint64_t h = fmix(total_);
        for (uint64_t l : lane_) h = fmix(h ^ l) * 0x9e3779b97f4a7c15ull;
        return fmix(h);
    }

  private:
    void block(const uint8_t* p) {
        for (int k = 0; k < 4; k++) {
            uint64_t w;
            std::memcpy(&w, p + 8 * k, 8);
            lane_[k] = rotl((lane_[k] ^ w) * 0x9e3779b97f4a7c15ull, 29 + k);
        }
    }
    uint64_t lane_[4] = {0x243f6a8885a308d3ull, 0x13198a2e03707344ull, 0xa4093822299f31d0ull,
                         0x082efa98ec4e6c89ull};
    uint64_t total_ = 0;
};

struct MemoEntry {
    FileIdentity id;
    uint64_t digest = 0;
};

std::vector<MemoEntry> read_memo(const std::string& path) {
    std::vector<MemoEntry> out;
    const ReadResult r = try_read_regular_file(path, kMemoMaxBytes);
    if (!r.ok || r.data.rfind(kMemoHead, 0) != 0) return out;
    std::istringstream in(r.data.substr(std::strlen(kMemoHead)));
    MemoEntry e;
    e.id.known = true;
    while (out.size() < kMemoEntries && (in >> e.id.dev >> e.id.ino >> e.id.size >> e.id.mtime_ns >>
                                         e.id.ctime_ns >> std::hex >> e.digest >> std::dec))
        out.push_back(e);
    return out;
}

// Best effort: a memo that cannot be written only costs the next run a hash.
void write_memo(const std::string& path, const std::vector<MemoEntry>& entries) {
    const std::string dir = path.substr(0, path.rfind('/'));
    const std::string parent = dir.substr(0, dir.rfind('/'));
    ::mkdir(parent.c_str(), 0755);
    ::mkdir(dir.c_str(), 0755);
    try {
        std::string text = kMemoHead;
        for (const MemoEntry& e : entries)
            text += fmt::format("{} {} {} {} {} {:016x}\n", e.id.dev, e.id.ino, e.id.size,
                                e.id.mtime_ns, e.id.ctime_ns, e.digest);
        // The path is kvrun's own cache file: whatever regular file holds it
        // (a damaged memo, random bytes) is replaced, or every later run
        // would hash the weights again. AtomicFile still refuses a FIFO or
        // a directory, and never writes through a symlink.
        AtomicFile f(path, "weights digest memo", [](std::string_view) { return true; });
        f.write(text);
        f.commit();
    } catch (const Error&) {
    }
}

} // namespace

uint64_t hash_weights(const GgufFile& f) {
    Hasher h;
    for (const GgufTensor& t : f.tensors()) {
        h.add(t.name.data(), t.name.size());
        h.add(&t.nbytes, sizeof t.nbytes);
        if (t.nbytes > 0) h.add(t.data, t.nbytes);
    }
    return h.digest();
}

std::string weights_memo_path() {
    const char* xdg = std::getenv("XDG_CACHE_HOME");
    if (xdg && xdg[0] == '/') return std::string(xdg) + "/kvrun/weights-digests";
    const char* home = std::getenv("HOME");
    if (home && home[0] == '/') return std::string(home) + "/.cache/kvrun/weights-digests";
    return {};
}

uint64_t weights_digest(const GgufFile& f) {
    const FileIdentity& id = f.identity();
    const std::string memo = weights_memo_path();
    if (!id.known || memo.empty()) return hash_weights(f);
    std::vector<MemoEntry> entries = read_memo(memo);
    for (const MemoEntry& e : entries)
        if (e.id == id) return e.digest;
    const uint64_t d = hash_weights(f);
    // A file changed within the filesystem's timestamp granularity of when it
    // was opened could be changed again with the same identity (the "racily
    // clean" case): remember only files that have been still for a second.
    timespec now{};
    clock_gettime(CLOCK_REALTIME, &now);
    const int64_t now_ns = static_cast<int64_t>(now.tv_sec) * 1000000000 + now.tv_nsec;
    if (now_ns - std::max(id.ctime_ns, id.mtime_ns) < 1000000000) return d;
    entries.insert(entries.begin(), MemoEntry{id, d});
    if (entries.size() > kMemoEntries) entries.resize(kMemoEntries);
    write_memo(memo, entries);
    return d;
}

} // namespace kvrun
