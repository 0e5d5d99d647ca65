// The thread pool's loops: every index exactly once, per-thread indices that
// never run twice at once, and chunks that a busy thread leaves behind are
// taken over by the others (a descheduled worker must not stall the loop).
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "ggml-like/cpu/thread_pool.h"

TEST_CASE("thread pool: parallel_for covers [0, n) once, with ith in range and never shared") {
    for (int nth : {1, 2, 3, 7}) {
        gl::ThreadPool pool(nth);
        std::vector<std::atomic<int>> busy(static_cast<size_t>(nth));
        for (int64_t n : {1, 2, 5, 27, 28, 29, 1000, 4099}) {
            std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
            std::atomic<bool> bad_ith{false}, shared_ith{false};
            pool.parallel_for(n, [&](int64_t b, int64_t e, int ith) {
                if (ith < 0 || ith >= nth) {
                    bad_ith = true;
                    return;
                }
                if (busy[static_cast<size_t>(ith)].fetch_add(1) != 0) shared_ith = true;
                for (int64_t i = b; i < e; i++) hits[static_cast<size_t>(i)]++;
                busy[static_cast<size_t>(ith)].fetch_sub(1);
            });
            INFO("threads ", nth, " n ", n);
            CHECK_FALSE(bad_ith.load());
            CHECK_FALSE(shared_ith.load());
            int64_t wrong = 0;
            for (auto& h : hits) wrong += h.load() != 1;
            CHECK(wrong == 0);
        }
    }
}

TEST_CASE("thread pool: many short loops in a row lose and repeat nothing") {
    gl::ThreadPool pool(3);
    std::atomic<int64_t> sum{0};
    int64_t want = 0;
    for (int loop = 0; loop < 20000; loop++) {
        const int64_t n = 1 + loop % 37;
        want += n * (n - 1) / 2;
        pool.parallel_for(n, [&](int64_t b, int64_t e, int) {
            int64_t s = 0;
            for (int64_t i = b; i < e; i++) s += i;
            sum += s;
        });
    }
    CHECK(sum.load() == want);
}

TEST_CASE("thread pool: the caller takes over the chunks a stalled worker does not claim") {
    // The worker's first chunk stalls (as if the OS had descheduled it); the
    // loop's other chunks must not wait for it. With one contiguous range per
    // thread the caller would do only half of them. The caller's chunks wait
    // (up to 10 s) until the worker has claimed one.
    gl::ThreadPool pool(2);
    const int64_t n = 2 * gl::ThreadPool::kChunksPerThread;
    std::atomic<int> by_caller{0}, by_worker{0};
    const auto t0 = std::chrono::steady_clock::now();
    pool.parallel_for(n, [&](int64_t b, int64_t e, int ith) {
        if (ith != 0) {
            by_worker += static_cast<int>(e - b);
            std::this_thread::sleep_for(std::chrono::milliseconds(400));
        } else {
            by_caller += static_cast<int>(e - b);
            while (by_worker.load() == 0 &&
                   std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10))
                std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
    });
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    CHECK(by_caller.load() + by_worker.load() == n);
    CHECK(by_worker.load() == 1);
    CHECK(ms >= 400); // the loop waited for the worker's claimed chunk
}

TEST_CASE("thread pool: each thread runs its own block of chunks in order, from its start") {
    // Streaming through consecutive memory is the point (see blocks_): the
    // caller's chunks of the first half come in order from 0, the worker's
    // of the second half in order from n / 2; others' chunks only as steals.
    // Each chunk takes 2 ms, so that both threads take part.
    gl::ThreadPool pool(2);
    const int64_t n = 2 * gl::ThreadPool::kChunksPerThread;
    int worker_took_part = 0;
    for (int rep = 0; rep < 10; rep++) {
        std::vector<int64_t> order[2];
        pool.parallel_for(n, [&](int64_t b, int64_t, int ith) {
            order[ith].push_back(b);
            std::this_thread::sleep_for(std::chrono::milliseconds(2));
        });
        worker_took_part += !order[1].empty();
        REQUIRE(order[0].size() + order[1].size() == static_cast<size_t>(n));
        REQUIRE(!order[0].empty());
        CHECK(order[0].front() == 0);
        for (int t = 0; t < 2; t++) {
            std::vector<int64_t> own;
            for (int64_t b : order[t])
                if ((b < n / 2) == (t == 0)) own.push_back(b);
            CHECK(std::is_sorted(own.begin(), own.end()));
            if (!own.empty()) CHECK(own.front() == (t == 0 ? 0 : n / 2));
        }
    }
    CHECK(worker_took_part > 0);
}
