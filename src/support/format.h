// Numbers as people read them, for logs, stats lines and error messages.
#pragma once

#include <cstdint>
#include <string>

namespace kvrun {

// "1.50 GiB", "600.00 MiB", "160.0 KiB", "12 B".
std::string human_bytes(uint64_t b);

} // namespace kvrun
