// What the system says about memory: how much is available, and which of a
// range's pages are resident. Used by the memory plan (-c auto) and by model
// loading (whether the weights' copy onto huge pages leaves room).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>

namespace kvrun {

// MemAvailable from /proc/meminfo (page cache counts: it is reclaimable);
// without /proc, free plus buffer memory (sysinfo); 0 if unknown.
// KVRUN_MEM_AVAILABLE=<bytes> overrides it (tests, containers).
uint64_t mem_available_bytes();
// Bytes of [p, p + n) currently resident (mincore); 0 if unknown.
uint64_t resident_bytes(const void* p, uint64_t n);

struct FreeBytes {
    void operator()(uint8_t* p) const { std::free(p); }
};
using HugeBytes = std::unique_ptr<uint8_t[], FreeBytes>;
// `bytes` of uninitialised memory, 64-byte aligned; from 2 MiB up, 2 MiB
// aligned, rounded up to whole 2 MiB pages and advised onto transparent huge
// pages (Linux; advice only: the kernel may refuse). Streaming through 4 KiB
// pages costs a TLB walk per page, a nested one under a hypervisor. The
// rounding is never touched by callers, so it costs at most one page
// resident. Null when the memory cannot be had.
HugeBytes allocate_huge(size_t bytes);

// Peak resident set size of this process, bytes.
uint64_t peak_rss_bytes();

} // namespace kvrun
