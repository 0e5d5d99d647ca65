// Device-resident activations, checked on the CPU.
//
// 1. gl::Coherence (ggml-like/coherence.h) against a fake device that counts
//    its transfers: what is uploaded and downloaded, and that every read sees
//    the newest bytes after any mix of host and device writes (a random
//    sequence checked byte by byte against a plain model).
// 2. Forward's hooks (Backend::track/host_wrote/host_read/copy_to_host,
//    begin_step/end_step) with a backend that runs the CPU kernels on "device"
//    twins: op outputs never reach the host copies unless Forward asks, and
//    host copies of op outputs are poisoned with NaN. If Forward read a buffer
//    without host_read, or wrote one without host_wrote, the logits would
//    differ; they must equal the plain CPU backend's bit for bit, all layers
//    on the fake device or split with a CPU backend (-ngl), and also when a
//    recorded step is lost and redone (a failed CUDA graph).
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "forward.h"
#include "ggml-like/backend.h"
#include "ggml-like/cuda/coherence.h"
#include "kv_cache.h"
#include "loader.h"
#include "fake_device.h"
#include "forward_util.h"
#include "test_util.h"

using namespace kvrun;
using kvtest::FakeDevice;
using kvtest::FakeDeviceBackend;

TEST_CASE("coherence: interval sets merge, split and clip") {
    gl::IntervalSet s;
    s.add(10, 20);
    s.add(30, 40);
    s.add(20, 25); // touches: merged
    REQUIRE(s.intervals().size() == 2);
    CHECK(s.intervals()[0] == std::pair<size_t, size_t>(10, 25));
    s.add(5, 35); // swallows the first, joins the second
    REQUIRE(s.intervals().size() == 1);
    CHECK(s.intervals()[0] == std::pair<size_t, size_t>(5, 40));
    s.remove(10, 12);
    REQUIRE(s.intervals().size() == 2);
    CHECK(s.total() == 33);
    CHECK(s.intersects(11, 12) == false);
    CHECK(s.intersects(11, 13) == true);
    const auto w = s.within(0, 11);
    REQUIRE(w.size() == 1);
    CHECK(w[0] == std::pair<size_t, size_t>(5, 10));
    s.remove(0, 100);
    CHECK(s.empty());
    s.add(3, 3); // empty: ignored
    CHECK(s.empty());
}

TEST_CASE("coherence: uploads and downloads only what is stale, and only once") {
    FakeDevice dev;
    std::vector<float> a(100), b(50);
    for (size_t i = 0; i < a.size(); i++) a[i] = static_cast<float>(i);
    {
        gl::Coherence c(dev);
        REQUIRE(c.track(a.data(), sizeof(float) * a.size()));
        REQUIRE(c.track(b.data(), sizeof(float) * b.size()));
        CHECK(c.n_tracked() == 2);
        CHECK(c.tracked_bytes() == 600);

        // First read on the device uploads the range asked for; a second, nothing.
        const auto* d = static_cast<const float*>(c.device_in(a.data() + 10, 40));
        REQUIRE(d);
        CHECK(dev.uploads == 1);
        CHECK(dev.up_bytes == 40);
        CHECK(d[0] == 10.0f);
        CHECK(c.device_in(a.data() + 10, 40) == d);
        CHECK(dev.uploads == 1);
        // A wider read uploads only the parts still stale on the device.
        c.device_in(a.data(), 400);
        CHECK(dev.uploads == 3);
        CHECK(dev.up_bytes == 400);

        // An op writes on the device: nothing comes back until the host reads.
        auto* o = static_cast<float*>(c.device_out(a.data() + 20, 8));
        o[0] = -1.0f, o[1] = -2.0f;
        CHECK(a[20] == 20.0f);
        CHECK(c.device_dirty(a.data(), 400));
        CHECK(!c.device_dirty(a.data(), 80));
        CHECK(!c.host_read(a.data(), 80)); // outside the device-dirty part
        CHECK(dev.downloads == 0);
        CHECK(c.host_read(a.data(), 400));
        CHECK(dev.downloads == 1);
        CHECK(dev.down_bytes == 8);
        CHECK(a[20] == -1.0f);
        CHECK(a[21] == -2.0f);
        CHECK(!c.host_read(a.data(), 400)); // already current
        CHECK(dev.downloads == 1);
        // ...and the device copy is still current: no upload to read it again.
        c.device_in(a.data(), 400);
        CHECK(dev.uploads == 3);

        // The host writes one row: only that row is uploaded next time.
        a[50] = 500.0f;
        c.host_wrote(a.data() + 50, 4);
        const auto* d2 = static_cast<const float*>(c.device_in(a.data(), 400));
        CHECK(dev.uploads == 4);
        CHECK(d2[50] == 500.0f);

        // Untracked memory: no device address, no transfers.
        float lone[4] = {};
        CHECK(c.device_in(lone, sizeof lone) == nullptr);
        CHECK(c.device_out(lone, sizeof lone) == nullptr);
        CHECK(!c.host_read(lone, sizeof lone));
        c.host_wrote(lone, sizeof lone);
        CHECK(dev.uploads == 4);
        // A range running past the end of a tracked buffer is not the device's.
        CHECK(c.device_in(a.data() + 90, 80) == nullptr);
    }
    CHECK(dev.frees == dev.allocs); // the destructor frees every twin
}

TEST_CASE("coherence: device writes, then a host write inside them, then a read") {
    FakeDevice dev;
    std::vector<float> a(16, 1.0f);
    gl::Coherence c(dev);
    REQUIRE(c.track(a.data(), sizeof(float) * a.size()));
    auto* d =
        static_cast<float*>(c.device_out(a.data(), sizeof(float) * 8)); // rows 0..7 on the device
    for (int i = 0; i < 8; i++) d[i] = 2.0f;
    a[3] = 3.0f; // the host overwrites one of them: its value wins
    c.host_wrote(a.data() + 3, sizeof(float));
    CHECK(c.host_read(a.data(), sizeof(float) * 16));
    CHECK(dev.downloads == 2); // [0, 3) and [4, 8): never over the host's write
    for (int i = 0; i < 16; i++) CHECK(a[i] == (i == 3 ? 3.0f : i < 8 ? 2.0f : 1.0f));
    // The device sees the host's value too.
    const auto* d2 = static_cast<const float*>(c.device_in(a.data(), sizeof(float) * 16));
    CHECK(d2[3] == 3.0f);
    CHECK(d2[2] == 2.0f);
    CHECK(d2[12] == 1.0f);
}

TEST_CASE("coherence: re-tracking overlapping or resized buffers, untrack, no room") {
    FakeDevice dev;
    std::vector<uint8_t> mem(1000, 7);
    gl::Coherence c(dev);
    REQUIRE(c.track(mem.data(), 100));
    REQUIRE(c.track(mem.data() + 200, 100));
    // The same start, a different size (a vector that grew in place): replaced.
    REQUIRE(c.track(mem.data(), 150));
    CHECK(c.n_tracked() == 2);
    CHECK(c.tracked_bytes() == 250);
    // Overlapping both: both dropped, whatever their devices held.
    c.device_out(mem.data() + 10, 5);
    REQUIRE(c.track(mem.data() + 100, 150));
    CHECK(c.n_tracked() == 1);
    CHECK(!c.device_dirty(mem.data(), 1000));
    CHECK(c.device_in(mem.data() + 10, 5) == nullptr);
    // The new buffer starts host-current: the first device read uploads it.
    dev.reset_counts();
    REQUIRE(c.device_in(mem.data() + 100, 150));
    CHECK(dev.up_bytes == 150);
    // A host read spanning two tracked buffers downloads from both.
    REQUIRE(c.track(mem.data() + 300, 100));
    c.device_out(mem.data() + 240, 10);
    c.device_out(mem.data() + 300, 10);
    CHECK(c.host_read(mem.data() + 200, 200));
    CHECK(dev.downloads == 2);
    // untrack by start, or by a range.
    c.untrack(mem.data() + 300);
    CHECK(c.n_tracked() == 1);
    c.untrack(mem.data() + 120, 1); // any overlap
    CHECK(c.n_tracked() == 0);
    CHECK(dev.frees == dev.allocs);
    // No room on the device: the buffer stays untracked.
    dev.room = 10;
    CHECK(!c.track(mem.data(), 100));
    CHECK(c.device_in(mem.data(), 10) == nullptr);
}

TEST_CASE("coherence: forget_device makes every host copy the newer one") {
    FakeDevice dev;
    std::vector<float> a(8, 1.0f);
    gl::Coherence c(dev);
    REQUIRE(c.track(a.data(), 32));
    c.device_in(a.data(), 32);
    c.device_out(a.data(), 16);
    c.forget_device();
    CHECK(!c.device_dirty(a.data(), 32));
    CHECK(!c.host_read(a.data(), 32));
    dev.reset_counts();
    c.device_in(a.data(), 32);
    CHECK(dev.up_bytes == 32);
}

TEST_CASE("coherence: random host and device writes, every read sees the newest bytes") {
    // Two tracked buffers next to an untracked gap inside one allocation;
    // the model ("truth") is what the last writer wrote to each byte.
    std::mt19937 rng(7);
    for (int round = 0; round < 20; round++) {
        FakeDevice dev;
        const size_t n = 256;
        std::vector<uint8_t> host(n, 0), truth(n, 0);
        gl::Coherence c(dev);
        REQUIRE(c.track(host.data(), 100));
        REQUIRE(c.track(host.data() + 140, 116));
        auto region = [&](size_t& a, size_t& len) { // a range inside one tracked buffer
            const bool first = rng() % 2;
            const size_t base = first ? 0 : 140, size = first ? 100 : 116;
            a = base + rng() % size;
            len = 1 + rng() % (base + size - a);
        };
        for (int step = 0; step < 300; step++) {
            const uint8_t v = static_cast<uint8_t>(rng());
            switch (rng() % 4) {
            case 0: { // host write, anywhere (may span the gap and both buffers)
                const size_t a = rng() % n, len = 1 + rng() % (n - a);
                std::memset(host.data() + a, v, len);
                std::memset(truth.data() + a, v, len);
                c.host_wrote(host.data() + a, len);
                break;
            }
            case 1: { // a device op writes a range
                size_t a, len;
                region(a, len);
                auto* d = static_cast<uint8_t*>(c.device_out(host.data() + a, len));
                REQUIRE(d);
                std::memset(d, v, len);
                std::memset(truth.data() + a, v, len);
                break;
            }
            case 2: { // a device op reads a range
                size_t a, len;
                region(a, len);
                const auto* d = static_cast<const uint8_t*>(c.device_in(host.data() + a, len));
                REQUIRE(d);
                CHECK(std::memcmp(d, truth.data() + a, len) == 0);
                break;
            }
            case 3: { // the host reads a range, anywhere
                const size_t a = rng() % n, len = 1 + rng() % (n - a);
                c.host_read(host.data() + a, len);
                CHECK(std::memcmp(host.data() + a, truth.data() + a, len) == 0);
                break;
            }
            }
        }
        c.host_read(host.data(), n);
        CHECK(host == truth);
    }
}

using kvtest::differences;

TEST_CASE("coherence: Forward on device-resident activations equals the CPU, all or split") {
    auto lm = LoadedModel::load(kvtest::shared("models/stories260K.gguf"));
    const Hparams& hp = lm->model.hp;
    const int n_layer = hp.n_layer;
    std::vector<int32_t> toks(60);
    std::mt19937 rng(5);
    for (auto& t : toks) t = static_cast<int32_t>(rng() % hp.n_vocab);
    auto none = [](int) {};

    auto cpu = gl::make_cpu_backend(2);
    const std::vector<float> want =
        kvtest::logits_of_all(*lm, Placement::all(*cpu, n_layer), toks, none);

    SUBCASE("every layer and the head on the device") {
        FakeDeviceBackend fake(2);
        int decode_steps = 0;
        const std::vector<float> got =
            kvtest::logits_of_all(*lm, Placement::all(fake, n_layer), toks, [&](int n) {
                // A decode step past the sinks moves one embedding row, its
                // cos/sin and position up, and the logits down; the K/V rows
                // go to the ring by copy_to_host, nothing else crosses.
                if (n == 1) {
                    decode_steps++;
                    CHECK(fake.device().uploads == 4);
                    CHECK(fake.device().downloads == 1);
                    CHECK(fake.device().down_bytes == sizeof(float) * hp.n_vocab);
                    CHECK(fake.host_reads == 1);
                }
                fake.device().reset_counts();
                fake.host_reads = 0;
            });
        CHECK(differences(got, want) == 0);
        CHECK(decode_steps == 25);
        CHECK(fake.table().n_tracked() == 0); // the Forward untracked its buffers
    }

    SUBCASE("-ngl: the first k layers on the device, the rest and the head on the CPU") {
        for (int k : {0, 1, n_layer - 1, n_layer}) {
            CAPTURE(k);
            FakeDeviceBackend fake(2);
            auto rest = gl::make_cpu_backend(2);
            const std::vector<float> got = kvtest::logits_of_all(
                *lm, Placement::split(fake, *rest, k, n_layer), toks, [&](int n) {
                    // The residual stream comes down once where the layers
                    // cross to the CPU (the head's logits are computed there).
                    if (n == 1 && k > 0 && k < n_layer) {
                        CHECK(fake.device().downloads == 1);
                        CHECK(fake.device().down_bytes == sizeof(float) * hp.n_embd);
                    }
                    fake.device().reset_counts();
                });
            CHECK(differences(got, want) == 0);
        }
    }

    SUBCASE("-ngl the other way round: CPU layers first, then the device") {
        FakeDeviceBackend fake(2);
        auto first = gl::make_cpu_backend(2);
        const std::vector<float> got =
            kvtest::logits_of_all(*lm, Placement::split(*first, fake, 2, n_layer), toks, none);
        CHECK(differences(got, want) == 0);
    }

    SUBCASE("a lost step is redone from the host and gives the same logits") {
        FakeDeviceBackend fake(2);
        int evals = 0;
        const std::vector<float> got =
            kvtest::logits_of_all(*lm, Placement::all(fake, n_layer), toks, [&](int) {
                evals++;
                // Lose a prompt batch and a few decode steps (one past the slide).
                fake.lose_next_step = evals == 2 || evals == 8 || evals == 29;
            });
        CHECK(differences(got, want) == 0);
        CHECK(fake.steps == evals + 3);
    }

    // The Forward untracks its buffers when it goes.
    FakeDeviceBackend fake(1);
    {
        KvCache kv({hp.n_layer, hp.n_head_kv, hp.head_dim, 40, 4, gl::Type::F16, gl::Type::F16});
        Forward fwd(lm->model, kv, fake, 3);
        CHECK(fake.table().n_tracked() == 15);
    }
    CHECK(fake.table().n_tracked() == 0);
    CHECK(fake.device().frees == fake.device().allocs);
}
