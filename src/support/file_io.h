// Reading and writing the files a user names, safely.
//
// Reading: a path must be a regular file. It is opened without blocking (a
// FIFO would otherwise hang the open) and checked with fstat before a byte is
// read, and no more than its size (and the caller's bound) is read, so a
// FIFO, a directory or /dev/zero is a one-line error, never a hang or an
// unbounded read.
//
// Writing: every file kvrun writes goes to a temporary name created
// exclusively next to it (O_CREAT|O_EXCL|O_NOFOLLOW: a planted symlink or an
// existing file is never written through), then renamed over the target; a
// reader never sees half a file. An existing target is replaced only when it
// is empty or already a file of the same kind (its first bytes say so): a
// swapped argument must not destroy a model or a document. Errors name the
// path the user gave, not the temporary one, and the temporary is removed on
// any failure.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <sys/types.h>

#include "error.h"

namespace kvrun {

// A file opened for reading that is known to be a regular file.
class RegularFile {
  public:
    // Throws Error(code) with "cannot read WHAT 'PATH': reason" or "WHAT 'PATH'
    // is not a regular file".
    RegularFile(const std::string& path, const char* what, Exit code);
    RegularFile(const RegularFile&) = delete;
    RegularFile& operator=(const RegularFile&) = delete;
    ~RegularFile();

    int fd() const { return fd_; }
    uint64_t size() const { return size_; }
    // The whole file, when it holds at most max_bytes (else Error(code)).
    std::string read_all(uint64_t max_bytes) const;

  private:
    std::string path_, what_;
    Exit code_;
    int fd_ = -1;
    uint64_t size_ = 0;
};

// Where a regular file cannot be opened, why: "" when it can. For optional
// files (a prompt cache) that are skipped with a warning instead of an error.
struct ReadResult {
    bool ok = false;
    bool missing = false;   // no such file
    bool too_large = false; // larger than max_bytes: data holds its first head_bytes
    std::string why;        // when !ok
    std::string data;
};
ReadResult try_read_regular_file(const std::string& path, uint64_t max_bytes,
                                 uint64_t head_bytes = 0);

// The whole text file at `path` (a prompt, a system prompt): Error(code) when
// it is not a readable regular file or holds more than max_bytes.
std::string read_regular_file(const std::string& path, const char* what, Exit code,
                              uint64_t max_bytes = uint64_t{256} << 20);

// Whether an existing file may be replaced by one of this kind: its first
// bytes (up to 4 KiB) as the argument; true when they show our kind.
using KindCheck = std::function<bool(std::string_view head)>;

// A file being written: created exclusively at a fresh temporary name in the
// target's directory; commit() renames it over the target. Destroyed
// uncommitted, the temporary is removed.
class AtomicFile {
  public:
    // `what` names the file in errors ("prompt cache"). Throws Error(Exit::error)
    // when the target exists and is not empty and `same_kind` refuses its
    // head, or is not a regular file, or the temporary cannot be created.
    AtomicFile(std::string path, const char* what, const KindCheck& same_kind);
    AtomicFile(const AtomicFile&) = delete;
    AtomicFile& operator=(const AtomicFile&) = delete;
    ~AtomicFile();

    void write(const void* data, size_t n);
    void write(std::string_view s) { write(s.data(), s.size()); }
    // Close and rename over the target; Error(Exit::error) naming the target.
    void commit();

  private:
    [[noreturn]] void fail_io(int err);
    std::string path_, tmp_, what_;
    int fd_ = -1;
    int pending_slot_ = -1; // in the table remove_pending_temporaries walks
    bool committed_ = false;
};

// Removes the temporaries of every AtomicFile still being written, from a
// signal handler that is about to end the process (async-signal-safe: no
// allocation, no locks, only unlink). A killed writer leaves nothing.
void remove_pending_temporaries() noexcept;

// The identity of a file as the filesystem sees it: a file replaced or
// modified in place (even with its mtime reset) has another one.
struct FileIdentity {
    uint64_t dev = 0, ino = 0, size = 0;
    int64_t mtime_ns = 0, ctime_ns = 0;
    bool known = false; // false for a buffer that is no file
    bool operator==(const FileIdentity&) const = default;
};
FileIdentity identity_of_fd(int fd);

} // namespace kvrun
