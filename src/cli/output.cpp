#include "cli/output.h"

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <unistd.h>

#include <fmt/format.h>

#include "error.h"

namespace kvrun::cli {

namespace {
int g_stdout_errno = 0; // the first failed write's errno; 0 while all went well

bool note_failure() {
    if (g_stdout_errno == 0) g_stdout_errno = errno != 0 ? errno : EIO;
    return false;
}
} // namespace

void guard_standard_streams() {
    std::signal(SIGPIPE, SIG_DFL);
    for (int fd = 0; fd <= 2; fd++) {
        if (::fcntl(fd, F_GETFD) != -1 || errno != EBADF) continue;
        // Read-only even for stdout: writes to it must fail, as they did.
        const int got = ::open("/dev/null", fd == 2 ? O_WRONLY : O_RDONLY);
        if (got >= 0 && got != fd) {
            ::dup2(got, fd);
            ::close(got);
        }
    }
}

bool write_stdout(std::string_view s) {
    if (g_stdout_errno != 0) return false;
    if (s.empty()) return true;
    errno = 0;
    if (std::fwrite(s.data(), 1, s.size(), stdout) != s.size() || std::fflush(stdout) != 0)
        return note_failure();
    return true;
}

bool stdout_failed() {
    return g_stdout_errno != 0;
}

int finish_stdout(int status) {
    errno = 0;
    if (std::fflush(stdout) != 0 || std::ferror(stdout)) note_failure();
    if (g_stdout_errno == 0) return status;
    fmt::print(stderr, "kvrun: error: cannot write to stdout: {}\n", std::strerror(g_stdout_errno));
    return static_cast<int>(Exit::error);
}

} // namespace kvrun::cli
