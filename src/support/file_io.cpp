#include "file_io.h"

#include <atomic>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <random>
#include <csignal>
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace kvrun {

namespace {

// Opens without following into a blocking FIFO open and checks the type.
// Returns the fd, or -1 with `why` (and errno's ENOENT as `missing`).
int open_regular(const std::string& path, struct stat& st, std::string& why, bool& missing) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        missing = errno == ENOENT;
        why = std::strerror(errno);
        return -1;
    }
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        ::close(fd);
        why = S_ISDIR(st.st_mode) ? "it is a directory" : "not a regular file";
        return -1;
    }
    // Reads of a regular file never block; clear the flag all the same.
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    return fd;
}

// Reads exactly n bytes from the start (the file may shrink meanwhile: then
// what was read). False with errno on an error.
bool read_bytes(int fd, uint64_t n, std::string& out) {
    out.resize(n);
    uint64_t got = 0;
    while (got < n) {
        const ssize_t r = ::pread(fd, out.data() + got, n - got, static_cast<off_t>(got));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return false;
        if (r == 0) break;
        got += static_cast<uint64_t>(r);
    }
    out.resize(got);
    return true;
}

// A writer killed between creating its temporary and renaming it (SIGKILL,
// a power cut) leaves PATH.tmp.PID.XXXXXXXX behind. The next writer of PATH
// removes those whose process is gone: regular files of this user only,
// never a live writer's (kill(pid, 0) finds it), never through a symlink.
void remove_dead_temporaries(const std::string& path) {
    const size_t slash = path.rfind('/');
    const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash + 1);
    const std::string prefix =
        (slash == std::string::npos ? path : path.substr(slash + 1)) + ".tmp.";
    DIR* d = ::opendir(dir.c_str());
    if (!d) return;
    while (const dirent* e = ::readdir(d)) {
        const std::string name = e->d_name;
        if (name.rfind(prefix, 0) != 0) continue;
        // PID.XXXXXXXX: digits, a dot, eight hex digits.
        const std::string rest = name.substr(prefix.size());
        const size_t dot = rest.find('.');
        if (dot == 0 || dot == std::string::npos || dot > 10 || rest.size() != dot + 9) continue;
        if (rest.find_first_not_of("0123456789") != dot) continue;
        if (rest.find_first_not_of("0123456789abcdef", dot + 1) != std::string::npos) continue;
        const long pid = std::strtol(rest.c_str(), nullptr, 10);
        if (pid <= 0 || pid == ::getpid()) continue;
        if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
        const std::string full = (slash == std::string::npos ? "" : dir) + name;
        struct stat st {};
        if (::lstat(full.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != ::getuid())
            continue;
        ::unlink(full.c_str());
    }
    ::closedir(d);
}

// The temporaries being written, for remove_pending_temporaries: a signal
// handler cannot walk a container, so a fixed table of pointers to the
// AtomicFiles' own names (kvrun writes one or two files at a time; a writer
// that finds the table full is only not removed by a signal).
constexpr int kPendingSlots = 16;
std::atomic<const char*> g_pending[kPendingSlots];

int register_pending(const char* tmp) {
    for (int i = 0; i < kPendingSlots; i++) {
        const char* empty = nullptr;
        if (g_pending[i].compare_exchange_strong(empty, tmp)) return i;
    }
    return -1;
}

void unregister_pending(int slot) {
    if (slot >= 0) g_pending[slot].store(nullptr);
}

} // namespace

void remove_pending_temporaries() noexcept {
    for (auto& slot : g_pending)
        if (const char* tmp = slot.exchange(nullptr)) ::unlink(tmp);
}

RegularFile::RegularFile(const std::string& path, const char* what, Exit code)
    : path_(path), what_(what), code_(code) {
    struct stat st {};
    std::string why;
    bool missing = false;
    fd_ = open_regular(path, st, why, missing);
    if (fd_ < 0) fail(code, "cannot read {} '{}': {}", what, path, why);
    size_ = static_cast<uint64_t>(st.st_size);
}

RegularFile::~RegularFile() {
    if (fd_ >= 0) ::close(fd_);
}

std::string RegularFile::read_all(uint64_t max_bytes) const {
    if (size_ > max_bytes)
        fail(code_, "{} '{}' is larger than kvrun reads ({} bytes, at most {})", what_, path_,
             size_, max_bytes);
    std::string data;
    if (!read_bytes(fd_, size_, data))
        fail(code_, "cannot read {} '{}': {}", what_, path_, std::strerror(errno));
    return data;
}

ReadResult try_read_regular_file(const std::string& path, uint64_t max_bytes, uint64_t head_bytes) {
    ReadResult r;
    struct stat st {};
    const int fd = open_regular(path, st, r.why, r.missing);
    if (fd < 0) return r;
    const uint64_t size = static_cast<uint64_t>(st.st_size);
    if (size > max_bytes) {
        r.too_large = true;
        r.why = "larger than expected (" + std::to_string(size) + " bytes)";
        if (!read_bytes(fd, std::min(size, head_bytes), r.data)) r.data.clear();
        ::close(fd);
        return r;
    }
    const bool ok = read_bytes(fd, size, r.data);
    const int err = errno;
    ::close(fd);
    if (!ok) {
        r.why = std::strerror(err);
        return r;
    }
    r.ok = true;
    return r;
}

std::string read_regular_file(const std::string& path, const char* what, Exit code,
                              uint64_t max_bytes) {
    return RegularFile(path, what, code).read_all(max_bytes);
}

AtomicFile::AtomicFile(std::string path, const char* what, const KindCheck& same_kind)
    : path_(std::move(path)), what_(what) {
    // An existing target: only a file of ours (or an empty one) is replaced.
    struct stat st {};
    if (::stat(path_.c_str(), &st) == 0) {
        if (!S_ISREG(st.st_mode))
            fail(Exit::error, "cannot write {} '{}': it exists and is not a regular file", what_,
                 path_);
        if (st.st_size > 0) {
            std::string why;
            bool missing = false;
            struct stat st2 {};
            const int fd = open_regular(path_, st2, why, missing);
            std::string head;
            if (fd >= 0) {
                read_bytes(fd, std::min<uint64_t>(static_cast<uint64_t>(st2.st_size), 4096), head);
                ::close(fd);
            }
            if (fd < 0 || !same_kind(head))
                fail(Exit::error, "'{}' exists and is not a {}: left as it is", path_, what_);
        }
    }
    remove_dead_temporaries(path_);
    // A fresh name each try: O_EXCL refuses anything already there, a
    // symlink included (O_NOFOLLOW says so for the last component).
    std::random_device rd;
    for (int attempt = 0; attempt < 16 && fd_ < 0; attempt++) {
        tmp_ = fmt::format("{}.tmp.{}.{:08x}", path_, ::getpid(), rd());
        fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
        if (fd_ < 0 && errno != EEXIST) break;
    }
    if (fd_ < 0) {
        const int err = errno;
        tmp_.clear();
        fail(Exit::error, "cannot write {} '{}': {}", what_, path_, std::strerror(err));
    }
    pending_slot_ = register_pending(tmp_.c_str());
}

AtomicFile::~AtomicFile() {
    unregister_pending(pending_slot_);
    if (fd_ >= 0) ::close(fd_);
    if (!committed_ && !tmp_.empty()) ::unlink(tmp_.c_str());
}

void AtomicFile::fail_io(int err) {
    unregister_pending(pending_slot_);
    pending_slot_ = -1;
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    if (!tmp_.empty()) ::unlink(tmp_.c_str());
    tmp_.clear();
    fail(Exit::error, "cannot write {} '{}': {}", what_, path_, std::strerror(err));
}

void AtomicFile::write(const void* data, size_t n) {
    KV_ASSERT(fd_ >= 0);
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
        const ssize_t w = ::write(fd_, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) fail_io(w < 0 ? errno : EIO);
        p += w;
        n -= static_cast<size_t>(w);
    }
}

void AtomicFile::commit() {
    KV_ASSERT(fd_ >= 0 && !committed_);
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) fail_io(errno);
    if (::rename(tmp_.c_str(), path_.c_str()) != 0) fail_io(errno);
    committed_ = true;
    // (A signal between the rename and this finds the name gone: unlink fails.)
    unregister_pending(pending_slot_);
    pending_slot_ = -1;
}

FileIdentity identity_of_fd(int fd) {
    FileIdentity id;
    struct stat st {};
    if (::fstat(fd, &st) != 0) return id;
    id.dev = static_cast<uint64_t>(st.st_dev);
    id.ino = static_cast<uint64_t>(st.st_ino);
    id.size = static_cast<uint64_t>(st.st_size);
    id.mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
    id.ctime_ns = static_cast<int64_t>(st.st_ctim.tv_sec) * 1000000000 + st.st_ctim.tv_nsec;
    id.known = true;
    return id;
}

} // namespace kvrun
