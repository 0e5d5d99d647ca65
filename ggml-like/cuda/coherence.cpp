#include "ggml-like/cuda/coherence.h"

#include <algorithm>

namespace gl {

// ---- IntervalSet ----------------------------------------------------------------------

void IntervalSet::add(size_t a, size_t b) {
    if (a >= b) return;
    // Already covered (the steady state of a decode step): no allocation.
    for (const auto& [x, y] : iv_)
        if (x <= a && b <= y) return;
    std::vector<std::pair<size_t, size_t>> out;
    out.reserve(iv_.size() + 1);
    bool placed = false;
    for (const auto& [x, y] : iv_) {
        if (y < a) {
            out.emplace_back(x, y); // wholly before, not touching
        } else if (x > b) {
            if (!placed) out.emplace_back(a, b), placed = true;
            out.emplace_back(x, y);
        } else {
            a = std::min(a, x); // overlapping or touching: absorb
            b = std::max(b, y);
        }
    }
    if (!placed) out.emplace_back(a, b);
    iv_ = std::move(out);
}

void IntervalSet::remove(size_t a, size_t b) {
    if (a >= b || !intersects(a, b)) return;
    std::vector<std::pair<size_t, size_t>> out;
    out.reserve(iv_.size() + 1);
    for (const auto& [x, y] : iv_) {
        if (y <= a || x >= b) {
            out.emplace_back(x, y);
            continue;
        }
        if (x < a) out.emplace_back(x, a);
        if (y > b) out.emplace_back(b, y);
    }
    iv_ = std::move(out);
}

bool IntervalSet::intersects(size_t a, size_t b) const {
    for (const auto& [x, y] : iv_)
        if (x < b && y > a && a < b) return true;
    return false;
}

std::vector<std::pair<size_t, size_t>> IntervalSet::within(size_t a, size_t b) const {
    std::vector<std::pair<size_t, size_t>> out;
    for (const auto& [x, y] : iv_) {
        const size_t lo = std::max(a, x), hi = std::min(b, y);
        if (lo < hi) out.emplace_back(lo, hi);
    }
    return out;
}

size_t IntervalSet::total() const {
    size_t n = 0;
    for (const auto& [x, y] : iv_) n += y - x;
    return n;
}

// ---- Coherence ------------------------------------------------------------------------

Coherence::~Coherence() {
    for (auto& [start, r] : regions_) dev_.free(r.dev);
}

template <class F> void Coherence::overlapping(uintptr_t p, size_t bytes, F&& f) {
    if (bytes == 0) return;
    auto it = regions_.upper_bound(p);
    if (it != regions_.begin()) {
        auto prev = std::prev(it);
        if (prev->first + prev->second.bytes > p) it = prev;
    }
    for (; it != regions_.end() && it->first < p + bytes; ++it) f(it->first, it->second);
}

Coherence::Map::iterator Coherence::containing(uintptr_t p, size_t bytes) {
    if (bytes == 0 || regions_.empty()) return regions_.end();
    auto it = regions_.upper_bound(p);
    if (it == regions_.begin()) return regions_.end();
    --it;
    if (p + bytes <= it->first + it->second.bytes) return it;
    return regions_.end();
}

bool Coherence::track(const void* host, size_t bytes) {
    if (!host || bytes == 0) return false;
    untrack(host, bytes);
    void* d = dev_.alloc(bytes);
    if (!d) return false;
    Region r;
    r.bytes = bytes;
    r.dev = d;
    r.host_dirty.add(0, bytes);
    regions_.emplace(reinterpret_cast<uintptr_t>(host), std::move(r));
    return true;
}

void Coherence::untrack(const void* host, size_t bytes) {
    const auto p = reinterpret_cast<uintptr_t>(host);
    std::vector<uintptr_t> gone;
    if (bytes == 0) {
        if (regions_.count(p)) gone.push_back(p);
    } else {
        overlapping(p, bytes, [&](uintptr_t start, Region&) { gone.push_back(start); });
    }
    for (uintptr_t s : gone) {
        dev_.free(regions_[s].dev);
        regions_.erase(s);
    }
}

const void* Coherence::device_in(const void* p, size_t bytes) {
    const auto a = reinterpret_cast<uintptr_t>(p);
    auto it = containing(a, bytes);
    if (it == regions_.end()) return nullptr;
    Region& r = it->second;
    const size_t off = a - it->first;
    for (const auto& [x, y] : r.host_dirty.within(off, off + bytes))
        dev_.upload(static_cast<uint8_t*>(r.dev) + x,
                    reinterpret_cast<const uint8_t*>(it->first) + x, y - x);
    r.host_dirty.remove(off, off + bytes);
    return static_cast<uint8_t*>(r.dev) + off;
}

void* Coherence::device_out(void* p, size_t bytes) {
    const auto a = reinterpret_cast<uintptr_t>(p);
    auto it = containing(a, bytes);
    if (it == regions_.end()) return nullptr;
    Region& r = it->second;
    const size_t off = a - it->first;
    r.host_dirty.remove(off, off + bytes);
    r.dev_dirty.add(off, off + bytes);
    return static_cast<uint8_t*>(r.dev) + off;
}

void* Coherence::device_inout(void* p, size_t bytes) {
    if (!device_in(p, bytes)) return nullptr;
    return device_out(p, bytes);
}

void Coherence::host_wrote(const void* p, size_t bytes) {
    const auto a = reinterpret_cast<uintptr_t>(p);
    overlapping(a, bytes, [&](uintptr_t start, Region& r) {
        const size_t lo = a > start ? a - start : 0;
        const size_t hi = std::min(r.bytes, a + bytes - start);
        r.dev_dirty.remove(lo, hi);
        r.host_dirty.add(lo, hi);
    });
}

bool Coherence::host_read(const void* p, size_t bytes) {
    const auto a = reinterpret_cast<uintptr_t>(p);
    bool any = false;
    overlapping(a, bytes, [&](uintptr_t start, Region& r) {
        const size_t lo = a > start ? a - start : 0;
        const size_t hi = std::min(r.bytes, a + bytes - start);
        for (const auto& [x, y] : r.dev_dirty.within(lo, hi)) {
            dev_.download(reinterpret_cast<uint8_t*>(start) + x, static_cast<uint8_t*>(r.dev) + x,
                          y - x);
            any = true;
        }
        r.dev_dirty.remove(lo, hi);
    });
    return any;
}

bool Coherence::device_dirty(const void* p, size_t bytes) const {
    const auto a = reinterpret_cast<uintptr_t>(p);
    bool any = false;
    const_cast<Coherence*>(this)->overlapping(a, bytes, [&](uintptr_t start, Region& r) {
        const size_t lo = a > start ? a - start : 0;
        const size_t hi = std::min(r.bytes, a + bytes - start);
        any = any || r.dev_dirty.intersects(lo, hi);
    });
    return any;
}

void Coherence::forget_device() {
    for (auto& [start, r] : regions_) {
        r.dev_dirty.clear();
        r.host_dirty.clear();
        r.host_dirty.add(0, r.bytes);
    }
}

uint64_t Coherence::tracked_bytes() const {
    uint64_t n = 0;
    for (const auto& [start, r] : regions_) n += r.bytes;
    return n;
}

} // namespace gl
