#include "format.h"

#include <fmt/format.h>

namespace kvrun {

std::string human_bytes(uint64_t b) {
    if (b >= (1ull << 30)) return fmt::format("{:.2f} GiB", b / double(1ull << 30));
    if (b >= (1ull << 20)) return fmt::format("{:.2f} MiB", b / double(1ull << 20));
    if (b >= (1ull << 10)) return fmt::format("{:.1f} KiB", b / 1024.0);
    return fmt::format("{} B", b);
}

} // namespace kvrun
