// `kvrun bench -m M -p 512 -n 128 -t 2 -r 5 [-d DEPTH] [--roofline] [--json]`:
// prompt-processing (pp) and generation (tg) speed, mean ± standard deviation
// over repetitions, for one or more models and thread counts.
//
// pp: the prompt's tokens evaluated in batches from an empty cache.
// tg: tokens evaluated one at a time after DEPTH tokens already in the cache
//     (filled untimed), as generation does.
// --roofline measures this machine's read bandwidth with the same threads and
// prints, for tg, the bytes each token reads (weights + KV at that depth) and
// the fraction of the bandwidth achieved. --attention and --matrices time a
// token's attention and its weight matrices apart (bench_attention.h,
// bench_matrices.h).
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli/bench_attention.h"
#include "cli/bench_matrices.h"
#include "cli/common.h"
#include "cli/read_stream.h"
#include "error.h"
#include "forward.h"
#include "ggml-like/attention.h"
#include "ggml-like/cpu/gemm.h"
#include "ggml-like/kernels.h"
#include "ggml-like/cpu/thread_pool.h"
#include "loader.h"
#include "system_memory.h"

namespace kvrun::cli {

namespace {

using Clock = std::chrono::steady_clock;

struct Stat {
    double mean = 0, sd = 0;
};
Stat stat_of(const std::vector<double>& v) {
    Stat s;
    if (v.empty()) return s;
    s.mean = std::accumulate(v.begin(), v.end(), 0.0) / v.size();
    double ss = 0;
    for (double x : v) ss += (x - s.mean) * (x - s.mean);
    s.sd = v.size() > 1 ? std::sqrt(ss / (v.size() - 1)) : 0.0;
    return s;
}

std::vector<int> parse_int_list(const std::string& s, const char* what) {
    std::vector<int> v;
    std::stringstream ss(s);
    std::string item;
    while (std::getline(ss, item, ',')) {
        char* end = nullptr;
        long x = std::strtol(item.c_str(), &end, 10);
        if (item.empty() || *end || x < 0 || x > (1 << 24)) fail(Exit::usage, "{}: '{}' is not a count", what, item);
        v.push_back(static_cast<int>(x));
    }
    return v;
}

// Read bandwidth, bytes/s: sum a buffer far larger than the caches, with
// each thread streaming its own contiguous part. The best of several reads is
// kept: 64-bit words with software prefetches at several distances, and the
// kernels' own gl::cpu::sum_bytes (a vector load a line). Without prefetching
// one core cannot keep enough misses in flight (measured here: 15 GB/s per
// core without, 16.5 with 2 KiB ahead; 24 vs 31 GB/s on two cores), and the
// dot kernels do prefetch, so a plain loop would understate the roof and
// overstate the fraction. The
// buffer is on transparent huge pages where Linux allows, as kvrun's weights
// and KV cache are (see LoadedModel::load): on 4 KiB pages this loop read
// 31.6 instead of 34.9 GB/s here.
double measure_read_bandwidth(gl::ThreadPool& pool) {
    const size_t n = (1024ull << 20) / sizeof(uint64_t);
    const HugeBytes mem = allocate_huge(n * sizeof(uint64_t));
    if (!mem) fail(Exit::out_of_memory, "cannot allocate 1 GiB to measure the read bandwidth");
    auto* buf = reinterpret_cast<uint64_t*>(mem.get());
    pool.parallel_for(static_cast<int64_t>(n), [&](int64_t b, int64_t e, int) {
        for (int64_t i = b; i < e; i++) buf[i] = static_cast<uint64_t>(i) * 2654435761u;
    });
    using SumFn = uint64_t (*)(const uint64_t*, const uint64_t*);
    const SumFn variants[] = {sum_stream<0>, sum_stream<1024>, sum_stream<2048>, sum_stream<4096>,
                              [](const uint64_t* b, const uint64_t* e) {
                                  return gl::cpu::sum_bytes(b, (e - b) * int64_t{8});
                              }};
    double best = 0;
    for (SumFn sum : variants)
        for (int rep = 0; rep < 2; rep++) {
            std::vector<uint64_t> sums(pool.size(), 0);
            const uint64_t* src = buf;
            uint64_t* out = sums.data();
            const auto t0 = Clock::now();
            pool.parallel_for(static_cast<int64_t>(n), [src, out, sum](int64_t b, int64_t e, int ith) {
                out[ith] += sum(src + b, src + e);
            });
            const double s = std::chrono::duration<double>(Clock::now() - t0).count();
            volatile uint64_t sink = std::accumulate(sums.begin(), sums.end(), uint64_t{0});
            (void)sink;
            best = std::max(best, static_cast<double>(n * sizeof(uint64_t)) / s);
        }
    return best;
}

// One hand-off to the pool's workers and back (an empty parallel region),
// microseconds: the synchronisation each parallel loop of a token pays.
double measure_handoff_us(gl::ThreadPool& pool) {
    if (pool.size() == 1) return 0;
    constexpr int kRounds = 20000;
    double best = 1e30;
    for (int rep = 0; rep < 3; rep++) {
        const auto t0 = Clock::now();
        for (int i = 0; i < kRounds; i++) pool.run_chunks(pool.size(), [](void*, int64_t, int) {}, nullptr);
        best = std::min(best, std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / kRounds);
    }
    return best;
}

struct Row {
    std::string model;
    std::string test; // "pp512", "tg128", "tg128@d4096"
    int threads = 0;
    Stat tps;
    double bytes_per_token = 0; // tg only
    double bw_fraction = 0;     // tg with --roofline
    double handoffs_per_token = 0; // tg on the CPU: thread-pool hand-offs per token
    // With --profile: every op of the timed tokens, summed, and their count
    // and wall time (the ops' times add up to at most that).
    OpProfile profile{};
    double profiled_tokens = 0, profiled_seconds = 0;

    void attach(const OpProfile& p, double tokens, double seconds) {
        profile = p;
        profiled_tokens = tokens;
        profiled_seconds = seconds;
    }
};

// --profile, one pp or tg row: per op, calls, MB, ms per token, share of the
// time and the rate it read its bytes at ("of bandwidth" with --roofline),
// then the time outside every op (Forward's own bookkeeping). A prompt batch
// reads each weight once for all its tokens, so its MB and calls per token
// are a batch's divided by the batch's tokens.
void print_profile(const Row& r, double bandwidth) {
    const double tokens = r.profiled_tokens, per_token_s = r.profiled_seconds / tokens;
    fmt::print("\nprofile of {} on {}, {} threads: {:.2f} ms per token\n\n", r.test, r.model,
               r.threads, per_token_s * 1e3);
    fmt::print("| op | calls/token | MB/token | ms/token | share | GB/s read |{}\n",
               bandwidth > 0 ? " of bandwidth |" : "");
    fmt::print("| --- | ---: | ---: | ---: | ---: | ---: |{}\n", bandwidth > 0 ? " ---: |" : "");
    double in_ops = 0;
    for (size_t i = 0; i < r.profile.ops.size(); i++) {
        const OpProfile::Entry& e = r.profile.ops[i];
        if (e.calls == 0) continue;
        in_ops += e.seconds;
        const double s = e.seconds / tokens;
        std::string rate = " |", mb;
        if (e.bytes > 0) {
            mb = fmt::format("{:.1f}", e.bytes / tokens / 1e6);
            rate = fmt::format(" {:.1f} |", e.bytes / e.seconds / 1e9);
            if (bandwidth > 0)
                rate += fmt::format(" {:.0f}% |", 100 * e.bytes / e.seconds / bandwidth);
        } else if (bandwidth > 0) {
            rate += " |";
        }
        fmt::print("| {} | {:.3g} | {} | {:.3f} | {:.1f}% |{}\n", op_name(static_cast<Op>(i)),
                   e.calls / tokens, mb, s * 1e3, 100 * s / per_token_s, rate);
    }
    const double outside = std::max(0.0, r.profiled_seconds - in_ops) / tokens;
    fmt::print("| outside the ops | | | {:.3f} | {:.1f}% | |{}\n", outside * 1e3,
               100 * outside / per_token_s, bandwidth > 0 ? " |" : "");
}

nlohmann::json profile_json(const Row& r) {
    nlohmann::json ops = nlohmann::json::array();
    for (size_t i = 0; i < r.profile.ops.size(); i++) {
        const OpProfile::Entry& e = r.profile.ops[i];
        if (e.calls == 0) continue;
        ops.push_back({{"op", op_name(static_cast<Op>(i))},
                       {"calls_per_token", e.calls / r.profiled_tokens},
                       {"bytes_per_token", e.bytes / r.profiled_tokens},
                       {"seconds_per_token", e.seconds / r.profiled_tokens}});
    }
    return {{"seconds_per_token", r.profiled_seconds / r.profiled_tokens}, {"ops", ops}};
}

} // namespace

int run_bench(int argc, char** argv) {
    std::vector<std::string> models;
    std::string threads_s = "0", pp_s = "512", tg_s = "128", depth_s = "0", ctk = "f16", ctv = "f16";
    std::string device;    // "" = cpu, or cuda with -ngl
    CommonOptions offload; // -ngl, --kv-gpu-window
    int reps = 5, batch = 512;
    bool json = false, roofline = false, attention = false, matrices = false, profile = false;
    CLI::App app{"kvrun bench: prompt and generation speed (mean ± sd over repetitions)", "kvrun bench"};
    app.add_option("-m,--model", models, "GGUF model(s); repeat -m for several")->required();
    app.add_option("-p,--n-prompt", pp_s, "prompt lengths, comma-separated (0 = skip)")->capture_default_str();
    app.add_option("-n,--n-gen", tg_s, "generated tokens, comma-separated (0 = skip)")->capture_default_str();
    app.add_option("-d,--depth", depth_s, "tokens already in the cache before tg, comma-separated")->capture_default_str();
    app.add_option("-t,--threads", threads_s, "thread counts, comma-separated (0 = physical cores)")->capture_default_str();
    app.add_option("-r,--repetitions", reps, "repetitions")->capture_default_str()->check(CLI::Range(1, 1000));
    app.add_option("-b,--batch-size", batch, "prompt batch")->capture_default_str()->check(CLI::Range(1, 1 << 16));
    app.add_option("--ctk", ctk, "K cache type")->capture_default_str();
    app.add_option("--ctv", ctv, "V cache type")->capture_default_str();
    app.add_option("--device", device, "cpu, cuda or cuda:N (default: cpu, or cuda with -ngl)");
    add_offload_options(app, offload);
    app.add_flag("--roofline", roofline, "measure read bandwidth and thread hand-off cost; report tg bytes/token, its bandwidth fraction and hand-offs per token");
    app.add_flag("--attention", attention,
                 "also time a decode step's attention at each depth > 0 (CPU): the ring from DRAM after "
                 "each layer's weights, the ring in cache, and a plain read of the same bytes");
    app.add_flag("--matrices", matrices,
                 "also stream the weight matrices one token reads (CPU), in its order through the "
                 "same parallel loops: a plain read of each, and the matrix-vector kernels");
    app.add_flag(
        "--profile", profile,
        "time each op of the pp and tg runs (CPU): per weight matrix, attention, norms and the "
        "rest, with the bytes each reads and the rate it reads them at");
    app.add_flag("--json", json, "print JSON instead of a markdown table");
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        return app.exit(e) == 0 ? 0 : static_cast<int>(Exit::usage);
    }
    const gl::Type tk = parse_cache_type(ctk, "--ctk"), tv = parse_cache_type(ctv, "--ctv");
    const std::vector<int> pps = parse_int_list(pp_s, "-p"), tgs = parse_int_list(tg_s, "-n"),
                           depths = parse_int_list(depth_s, "-d"), thread_counts = parse_int_list(threads_s, "-t");
    const auto positive = [](const std::vector<int>& v) {
        return std::any_of(v.begin(), v.end(), [](int x) { return x > 0; });
    };
    if (!positive(pps) && !positive(tgs) && !matrices && !(attention && positive(depths)))
        fail(Exit::usage,
             "nothing to measure: -p and -n are 0 (add --matrices, or --attention with -d)");
    install_interrupt_handler();

    std::vector<Row> rows;
    struct AttentionRow {
        std::string model;
        int threads = 0, depth = 0;
        AttentionTimes t;
    };
    std::vector<AttentionRow> attention_rows;
    struct MatrixRow {
        std::string model;
        int threads = 0;
        MatrixTimes t;
    };
    std::vector<MatrixRow> matrix_rows;
    std::map<int, double> bandwidth;  // per thread count
    std::map<int, double> handoff_us; // per thread count
    for (const std::string& path : models) {
        CommonOptions placement;
        placement.device = device;
        placement.n_gpu_layers = offload.n_gpu_layers;
        auto lm = LoadedModel::load(path, !offloads_every_layer(placement));
        const Hparams& hp = lm->model.hp;
        const std::string name = path.substr(path.find_last_of('/') + 1);
        // Bytes one generated token reads: every weight matrix once, one embedding row.
        double weight_bytes_per_token = static_cast<double>(lm->model.token_embd.row_bytes);
        for (const auto& L : lm->model.layers)
            for (const gl::Tensor* w : L.matrices())
                weight_bytes_per_token += static_cast<double>(w->bytes());
        weight_bytes_per_token += static_cast<double>(lm->model.output.bytes());

        // Which kernels the figures below come from (the same model runs 2-3x
        // apart between paths).
        const gl::Type wt = lm->model.layers.front().w_up.type;
        fmt::print(stderr,
                   "kvrun bench: {}: {} weights, {} kernels, prompt batches on {}, generated "
                   "tokens' F16 attention in {} products\n",
                   name, gl::type_name(wt), gl::cpu::isa_name(),
                   gl::gemm::path_name(gl::gemm::path_for(wt, hp.n_embd, batch)),
                   gl::attention_half_products() ? "f16" : "f32");
        std::mt19937 rng(42);
        const int max_pp = pps.empty() ? 0 : *std::max_element(pps.begin(), pps.end());
        const int max_tg = tgs.empty() ? 0 : *std::max_element(tgs.begin(), tgs.end());
        const int max_depth = depths.empty() ? 0 : *std::max_element(depths.begin(), depths.end());
        std::vector<int32_t> toks(std::max(max_pp, max_depth + max_tg) + 1);
        for (auto& t : toks) t = static_cast<int32_t>(rng() % hp.n_vocab);
        const int n_ctx = std::max(max_pp, max_depth + max_tg) + 1;
        // Nothing to evaluate (-p 0 -n 0, for --attention or --matrices alone):
        // no cache or forward pass to set up.
        const bool evaluates = max_pp > 0 || max_tg > 0;

        for (int tc : evaluates ? thread_counts : std::vector<int>{}) {
            const int threads = resolve_threads(tc);
            CommonOptions co;
            co.device = device;
            co.n_gpu_layers = offload.n_gpu_layers;
            co.kv_gpu_window = offload.kv_gpu_window;
            const Backends be = make_backends(co, threads, hp.n_layer);
            if (profile && be.gpu)
                fail(Exit::usage,
                     "--profile times ops on the CPU; a GPU queues its work and returns "
                     "before it is done (run without -ngl and --device cuda)");
            KvCache kv({hp.n_layer, hp.n_head_kv, hp.head_dim, n_ctx, 4, tk, tv});
            Forward fwd(lm->model, kv, be.placement(), std::min(batch, n_ctx));
            // One timed repetition, seconds; under --profile its ops are timed into `prof`.
            auto timed = [&](OpProfile& prof, auto&& body) {
                if (profile) fwd.set_profile(&prof);
                const auto t0 = Clock::now();
                body();
                const double s = std::chrono::duration<double>(Clock::now() - t0).count();
                fwd.set_profile(nullptr);
                return s;
            };
            auto eval_all = [&](const int32_t* t, int n) {
                for (int i = 0; i < n;) {
                    const int nb = std::min(fwd.max_batch(), n - i);
                    fwd.eval(t + i, nb, false);
                    i += nb;
                }
            };
            eval_all(toks.data(), std::min<int>(16, static_cast<int>(toks.size()))); // warm-up: fault weights in
            if (roofline && !bandwidth.count(threads)) {
                gl::ThreadPool pool(threads);
                bandwidth[threads] = measure_read_bandwidth(pool);
                handoff_us[threads] = measure_handoff_us(pool);
            }
            for (int pp : pps) {
                if (pp == 0) continue;
                std::vector<double> v;
                OpProfile prof;
                double timed_s = 0;
                for (int r = 0; r < reps && !interrupted(); r++) {
                    kv.clear();
                    const double s = timed(prof, [&] { eval_all(toks.data(), pp); });
                    v.push_back(pp / s);
                    timed_s += s;
                }
                Row row{name, "pp" + std::to_string(pp), threads, stat_of(v), 0, 0};
                if (profile) row.attach(prof, static_cast<double>(pp) * v.size(), timed_s);
                rows.push_back(row);
            }
            for (int depth : depths)
                for (int tg : tgs) {
                    if (tg == 0) continue;
                    std::vector<double> v;
                    double handoffs = 0;
                    OpProfile prof;
                    double timed_s = 0;
                    for (int r = 0; r < reps && !interrupted(); r++) {
                        // The depth's tokens are evaluated once: later repetitions
                        // cut the cache back to them (a 4096-token prefill is a
                        // minute on a 2-core AVX2 machine).
                        if (r == 0 || !kv.truncate(depth)) {
                            kv.clear();
                            eval_all(toks.data(), depth);
                        }
                        const uint64_t h0 = be.cpu ? be.cpu->handoffs() : 0;
                        const double s = timed(prof, [&] {
                            for (int i = 0; i < tg; i++) fwd.eval_generated(toks[depth + i]);
                        });
                        v.push_back(tg / s);
                        timed_s += s;
                        handoffs = static_cast<double>((be.cpu ? be.cpu->handoffs() : 0) - h0) / tg;
                    }
                    Row row{name, "tg" + std::to_string(tg) + (depth ? "@d" + std::to_string(depth) : ""), threads,
                            stat_of(v), 0, 0};
                    // KV read per token at the mean depth of the run
                    const double kv_bytes = static_cast<double>(hp.n_layer) * (depth + tg / 2.0) *
                                            (gl::row_size(tk, hp.kv_dim()) + gl::row_size(tv, hp.kv_dim()));
                    row.bytes_per_token = weight_bytes_per_token + kv_bytes;
                    if (roofline) row.bw_fraction = row.tps.mean * row.bytes_per_token / bandwidth[threads];
                    row.handoffs_per_token = handoffs;
                    if (profile) row.attach(prof, static_cast<double>(tg) * v.size(), timed_s);
                    rows.push_back(row);
                }
        }
        // After the runs above, whose caches are gone by now: the attention
        // benchmark fills a ring of its own.
        if (attention)
            for (int tc : thread_counts) {
                const int threads = resolve_threads(tc);
                for (int depth : depths)
                    if (depth > 0 && !interrupted())
                        attention_rows.push_back(
                            {name, threads, depth, bench_attention(lm->model, tk, tv, depth, threads, reps)});
            }
        if (matrices)
            for (int tc : thread_counts)
                if (!interrupted()) {
                    const int threads = resolve_threads(tc);
                    matrix_rows.push_back(
                        {name, threads, bench_matrices(lm->model, threads, reps)});
                }
    }

    if (json) {
        nlohmann::json j = nlohmann::json::array();
        for (const Row& r : rows) {
            nlohmann::json o = {{"model", r.model}, {"test", r.test}, {"threads", r.threads},
                                {"tokens_per_second", r.tps.mean}, {"stddev", r.tps.sd}};
            if (r.bytes_per_token > 0) o["bytes_per_token"] = r.bytes_per_token;
            if (roofline && r.bytes_per_token > 0) {
                o["bandwidth_fraction"] = r.bw_fraction;
                o["read_bandwidth_bytes_per_second"] = bandwidth[r.threads];
                o["handoffs_per_token"] = r.handoffs_per_token;
                o["handoff_seconds"] = handoff_us[r.threads] * 1e-6;
            }
            if (r.profiled_tokens > 0) o["profile"] = profile_json(r);
            j.push_back(o);
        }
        for (const AttentionRow& r : attention_rows)
            j.push_back({{"model", r.model},
                         {"test", "attention@d" + std::to_string(r.depth)},
                         {"threads", r.threads},
                         {"ms_per_token_ring_from_dram", r.t.from_dram},
                         {"ms_per_token_ring_in_cache", r.t.from_cache},
                         {"ms_per_token_read_only", r.t.read_only},
                         {"ring_bytes_per_token", r.t.ring_bytes}});
        for (const MatrixRow& r : matrix_rows)
            j.push_back({{"model", r.model},
                         {"test", "matrices"},
                         {"threads", r.threads},
                         {"matrix_bytes_per_token", r.t.bytes},
                         {"ms_per_token_read", r.t.read_ms},
                         {"ms_per_token_matmul", r.t.matmul_ms}});
        fmt::print("{}\n", j.dump(2));
        return 0;
    }
    if (!rows.empty()) {
        fmt::print("| model | test | threads | tok/s | {}\n",
                   roofline ? "MB/token | GB/s read | of bandwidth | thread sync per token |" : "");
        fmt::print("| --- | --- | ---: | ---: | {}\n", roofline ? "---: | ---: | ---: | ---: |" : "");
    }
    for (const Row& r : rows) {
        std::string extra;
        if (roofline)
            extra = r.bytes_per_token > 0
                        ? fmt::format("{:.1f} | {:.1f} | {:.0f}% of {:.1f} GB/s | {:.0f} x {:.2f} us = {:.1f}% |",
                                      r.bytes_per_token / 1e6, r.tps.mean * r.bytes_per_token / 1e9,
                                      100 * r.bw_fraction, bandwidth[r.threads] / 1e9, r.handoffs_per_token,
                                      handoff_us[r.threads],
                                      100 * r.handoffs_per_token * handoff_us[r.threads] * 1e-6 * r.tps.mean)
                        : "| | | |";
        fmt::print("| {} | {} | {} | {:.2f} ± {:.2f} | {}\n", r.model, r.test, r.threads, r.tps.mean, r.tps.sd, extra);
    }
    if (!attention_rows.empty()) {
        fmt::print("{}attention of one decode step, ms per token (mean of {} repetitions):\n\n",
                   rows.empty() ? "" : "\n", reps);
        fmt::print("| model | threads | depth | K/V read | ring from DRAM | ring in cache | plain read of the ring |\n");
        fmt::print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n");
        for (const AttentionRow& r : attention_rows)
            fmt::print("| {} | {} | {} | {:.1f} MB | {:.2f} | {:.2f} | {:.2f} ({:.1f} GB/s) |\n", r.model, r.threads,
                       r.depth, r.t.ring_bytes / 1e6, r.t.from_dram, r.t.from_cache, r.t.read_only,
                       r.t.ring_bytes / (r.t.read_only * 1e6));
    }
    if (!matrix_rows.empty()) {
        fmt::print("{}weight matrices of one token, in its order, ms per token (mean of {} "
                   "repetitions):\n\n",
                   rows.empty() && attention_rows.empty() ? "" : "\n", reps);
        fmt::print("| model | threads | bytes | plain read | ops::matmul | matmul / read |\n");
        fmt::print("| --- | ---: | ---: | ---: | ---: | ---: |\n");
        for (const MatrixRow& r : matrix_rows)
            fmt::print(
                "| {} | {} | {:.1f} MB | {:.2f} ({:.1f} GB/s) | {:.2f} ({:.1f} GB/s) | {:.0f}% |\n",
                r.model, r.threads, r.t.bytes / 1e6, r.t.read_ms, r.t.bytes / (r.t.read_ms * 1e6),
                r.t.matmul_ms, r.t.bytes / (r.t.matmul_ms * 1e6),
                100 * r.t.read_ms / r.t.matmul_ms);
    }
    for (const Row& r : rows)
        if (r.profiled_tokens > 0) print_profile(r, roofline ? bandwidth[r.threads] : 0);
    return 0;
}

} // namespace kvrun::cli
