// Host buffers with device twins, and which side holds the newest bytes.
//
// A device backend (ggml-like/cuda/) keeps the activations Forward uses on
// the device between operations instead of copying them in and out of the
// host std::vectors at every op. Forward registers those host buffers
// (Backend::track); each gets a device twin of the same size. For every
// byte range of a tracked buffer this table knows whether the host copy is
// newer ("host-dirty": the host wrote it since the device last saw it), the
// device copy is newer ("device-dirty": an op wrote it on the device and the
// host has not downloaded it), or both agree. Then
//   * an op input that is not host-dirty needs no upload;
//   * an op output is marked device-dirty and not downloaded;
//   * the host announces its writes (host_wrote) and its reads (host_read),
//     and only the device-dirty parts of a read are downloaded.
// Pointers that lie in no tracked buffer are not this table's business (the
// backend copies them in and out at each op, as before).
//
// Plain C++: the device is behind TwinDevice, so this bookkeeping is tested
// on the CPU with a fake device (tests/test_coherence.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <utility>
#include <vector>

namespace gl {

// Disjoint, sorted, half-open byte intervals [first, second), merged when
// they touch.
class IntervalSet {
  public:
    void add(size_t a, size_t b);
    void remove(size_t a, size_t b);
    void clear() { iv_.clear(); }
    bool empty() const { return iv_.empty(); }
    bool intersects(size_t a, size_t b) const;
    // The parts of the set inside [a, b).
    std::vector<std::pair<size_t, size_t>> within(size_t a, size_t b) const;
    size_t total() const;
    const std::vector<std::pair<size_t, size_t>>& intervals() const { return iv_; }

  private:
    std::vector<std::pair<size_t, size_t>> iv_;
};

// What the table needs from the device. upload/download only enqueue work;
// the backend synchronizes before the host reads a downloaded byte.
class TwinDevice {
  public:
    virtual ~TwinDevice() = default;
    // nullptr when the device has no room (the buffer then stays untracked).
    virtual void* alloc(size_t bytes) = 0;
    virtual void free(void* dev) = 0;
    virtual void upload(void* dev, const void* host, size_t bytes) = 0;
    virtual void download(void* host, const void* dev, size_t bytes) = 0;
};

class Coherence {
  public:
    explicit Coherence(TwinDevice& device) : dev_(device) {}
    ~Coherence();
    Coherence(const Coherence&) = delete;
    Coherence& operator=(const Coherence&) = delete;

    // Give [host, host + bytes) a device twin; the host copy is the newer one.
    // Tracked buffers that overlap it are dropped first (a buffer freed and
    // reallocated at an overlapping address: what their device held is
    // forgotten). False when the device had no room (left untracked).
    bool track(const void* host, size_t bytes);
    // Drop every tracked buffer overlapping [host, host + bytes) (bytes 0:
    // the one that starts at host), freeing its twin without downloading.
    void untrack(const void* host, size_t bytes = 0);

    // The device address of [p, p + bytes) when the range lies inside one
    // tracked buffer, else nullptr. in: uploads the host-dirty parts first.
    // out: the range becomes device-dirty (the op about to run writes all of
    // it). inout: both.
    const void* device_in(const void* p, size_t bytes);
    void* device_out(void* p, size_t bytes);
    void* device_inout(void* p, size_t bytes);

    // The host wrote [p, p + bytes): wherever tracked, the host copy is newer.
    void host_wrote(const void* p, size_t bytes);
    // The host is about to read [p, p + bytes): download every device-dirty
    // part of any tracked buffer it overlaps. Returns true when a download
    // was enqueued (the caller must synchronize before reading).
    bool host_read(const void* p, size_t bytes);
    // Whether some byte of [p, p + bytes) is newer on the device.
    bool device_dirty(const void* p, size_t bytes) const;
    // The device's contents are lost (a failed CUDA graph): every tracked
    // buffer's host copy becomes the newer one, device-dirty marks are
    // dropped. Only correct when the host copies hold what the next op needs,
    // or the work is redone from host data (Backend::end_step).
    void forget_device();

    size_t n_tracked() const { return regions_.size(); }
    uint64_t tracked_bytes() const;

  private:
    struct Region {
        size_t bytes = 0;
        void* dev = nullptr;
        IntervalSet host_dirty, dev_dirty; // offsets within the buffer
    };
    using Map = std::map<uintptr_t, Region>; // by host start address
    // The region holding all of [p, p + bytes), or end().
    Map::iterator containing(uintptr_t p, size_t bytes);
    // Calls f(start, region) for every region overlapping [p, p + bytes).
    template <class F> void overlapping(uintptr_t p, size_t bytes, F&& f);

    TwinDevice& dev_;
    Map regions_;
};

} // namespace gl
