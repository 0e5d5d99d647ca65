// stdout as a pipeline needs it: a write that fails (a full disk, a closed
// stdout) is an error with status 1, never a silent loss, and a reader that
// goes away (`| head`) ends kvrun quietly by SIGPIPE in every subcommand.
#pragma once

#include <string_view>

namespace kvrun::cli {

// At start-up: SIGPIPE back to its default whatever the parent left it as,
// and /dev/null on any of fds 0-2 that is closed, so that no file kvrun opens
// later becomes its stdout (a closed stdout then fails every write, EBADF).
void guard_standard_streams();

// Write and flush now (a pipe reader sees each token as it comes). False when
// stdout failed, now or before; the first failure's errno is kept.
bool write_stdout(std::string_view s);
// Whether a write to stdout has failed (generation loops stop on it).
bool stdout_failed();

// At exit: flush stdout; when any write failed, print one line
// `kvrun: error: cannot write to stdout: REASON` and return 1, else status.
int finish_stdout(int status);

} // namespace kvrun::cli
