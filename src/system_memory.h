// What the system says about memory: how much is available, and which of a
// range's pages are resident. Used by the memory plan (-c auto) and by model
// loading (whether the weights' copy onto huge pages leaves room).
#pragma once

#include <cstdint>

namespace kvrun {

// MemAvailable from /proc/meminfo (page cache counts: it is reclaimable),
// 0 if unknown; KVRUN_MEM_AVAILABLE=<bytes> overrides it (tests, containers).
uint64_t mem_available_bytes();
// Bytes of [p, p + n) currently resident (mincore); 0 if unknown.
uint64_t resident_bytes(const void* p, uint64_t n);

} // namespace kvrun
