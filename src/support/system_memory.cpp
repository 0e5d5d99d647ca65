#include "system_memory.h"

#include <sys/resource.h>
#include <sys/sysinfo.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <string>
#include <sys/mman.h>
#include <unistd.h>
#include <vector>

namespace kvrun {

uint64_t mem_available_bytes() {
    if (const char* e = std::getenv("KVRUN_MEM_AVAILABLE")) return std::strtoull(e, nullptr, 10);
    std::ifstream in("/proc/meminfo");
    std::string key;
    uint64_t kb = 0;
    std::string unit;
    while (in >> key >> kb >> unit)
        if (key == "MemAvailable:") return kb * 1024;
    // No /proc (a bare chroot or container, where the static binary runs):
    // the kernel's free and buffer memory. It leaves out the reclaimable page
    // cache, so it says less than MemAvailable would, never more.
    struct sysinfo si {};
    if (sysinfo(&si) == 0) return (uint64_t{si.freeram} + si.bufferram) * si.mem_unit;
    return 0;
}

HugeBytes allocate_huge(size_t bytes) {
    constexpr size_t kHugePage = size_t{2} << 20;
    const bool huge = bytes >= kHugePage;
    const size_t align = huge ? kHugePage : 64;
    const size_t total = (std::max<size_t>(bytes, 1) + align - 1) / align * align;
    HugeBytes p(static_cast<uint8_t*>(std::aligned_alloc(align, total)));
#if defined(MADV_HUGEPAGE)
    if (p && huge) madvise(p.get(), total, MADV_HUGEPAGE);
#endif
    return p;
}

uint64_t resident_bytes(const void* p, uint64_t n) {
    if (!p || n == 0) return 0;
    const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
    const auto start = reinterpret_cast<uintptr_t>(p) / page * page;
    const uint64_t len = reinterpret_cast<uintptr_t>(p) + n - start;
    std::vector<unsigned char> vec((len + page - 1) / page);
    if (mincore(reinterpret_cast<void*>(start), len, vec.data()) != 0) return 0;
    uint64_t pages = 0;
    for (unsigned char v : vec) pages += v & 1;
    return std::min<uint64_t>(pages * page, n);
}

uint64_t peak_rss_bytes() {
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    return static_cast<uint64_t>(ru.ru_maxrss) * 1024; // Linux reports KiB
}

} // namespace kvrun
