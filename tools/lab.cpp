// kvrun-lab: the measurements behind docs/performance.md that a user of
// kvrun does not need, kept out of the product binary (issue #22) and built
// beside it (CMake target kvrun-lab, not installed):
//
//   kvrun-lab roofline -t 2 [--json]                 read roof, thread hand-off cost
//   kvrun-lab attention -m M -d 4096 -t 2 -r 5       a decode step's attention
//   kvrun-lab matrices -m M -t 2 -r 3                a token's weight matrices streamed
//
// Every probe runs on the CPU with the runtime's own kernels and thread pool.
// scripts/bench.sh joins the roof with `kvrun bench --json`.
#include <algorithm>
#include <cstdio>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "bench_attention.h"
#include "bench_matrices.h"
#include "cli/common.h"
#include "error.h"
#include "ggml-like/cpu/thread_pool.h"
#include "ggml-like/kernels.h"
#include "roofline.h"
#include "session.h"

namespace kvrun::lab {

namespace {

struct Options {
    std::vector<std::string> models;
    std::string threads = "0", depths, ctk = "f16", ctv = "f16";
    int reps = 5;
    int buffer_mib = 1024;
    bool json = false;
};

void add_threads(CLI::App& app, Options& o) {
    app.add_option("-t,--threads", o.threads, "thread counts, comma-separated (0 = physical cores)")
        ->capture_default_str();
}
void add_models(CLI::App& app, Options& o) {
    app.add_option("-m,--model", o.models, "GGUF model(s); repeat -m for several")->required();
    app.add_option("-r,--repetitions", o.reps, "repetitions")
        ->capture_default_str()
        ->check(CLI::Range(1, 1000));
}

std::vector<int> thread_counts(const Options& o) {
    std::vector<int> out;
    for (int tc : cli::parse_count_list(o.threads, "-t")) out.push_back(cli::resolve_threads(tc));
    return out;
}

std::string file_name(const std::string& path) {
    return path.substr(path.find_last_of('/') + 1);
}

// Loaded for the CPU (weights on huge pages where kvrun bench would put
// them), with the kernels the figures come from said on stderr.
std::unique_ptr<LoadedModel> load(const std::string& path) {
    auto lm = LoadedModel::load(path, LoadedModel::Layers::cpu);
    const LayerWeights& first = lm->model.layers.front();
    fmt::print(stderr, "kvrun-lab: {}: {} weights, {} kernels\n", file_name(path),
               gl::type_name((first.w_up ? first.w_up : first.exp_up.front()).type),
               gl::cpu::isa_name());
    return lm;
}

int roofline(const Options& o) {
    nlohmann::json j = nlohmann::json::array();
    if (!o.json) {
        fmt::print("| threads | read bandwidth | thread hand-off |\n");
        fmt::print("| ---: | ---: | ---: |\n");
    }
    for (int threads : thread_counts(o)) {
        if (cli::interrupted()) break;
        gl::ThreadPool pool(threads);
        const double bw = measure_read_bandwidth(pool, size_t(o.buffer_mib) << 20);
        const double handoff_us = measure_handoff_us(pool);
        if (o.json)
            j.push_back({{"test", "roofline"},
                         {"threads", threads},
                         {"read_bandwidth_bytes_per_second", bw},
                         {"handoff_seconds", handoff_us * 1e-6}});
        else
            fmt::print("| {} | {:.1f} GB/s | {:.2f} us |\n", threads, bw / 1e9, handoff_us);
    }
    if (o.json) fmt::print("{}\n", j.dump(2));
    return 0;
}

int attention(const Options& o) {
    const gl::Type tk = cli::parse_cache_type(o.ctk, "--ctk"),
                   tv = cli::parse_cache_type(o.ctv, "--ctv");
    const std::vector<int> depths = cli::parse_count_list(o.depths, "-d");
    const std::vector<int> threads = thread_counts(o);
    if (std::none_of(depths.begin(), depths.end(), [](int d) { return d > 0; }))
        fail(Exit::usage, "nothing to measure: give -d with a depth > 0");
    struct Row {
        std::string model;
        int threads = 0, depth = 0;
        AttentionTimes t;
    };
    std::vector<Row> rows;
    for (const std::string& path : o.models) {
        const auto lm = load(path);
        for (int t : threads)
            for (int depth : depths)
                if (depth > 0 && !cli::interrupted())
                    rows.push_back({file_name(path), t, depth,
                                    bench_attention(lm->model, tk, tv, depth, t, o.reps)});
    }
    if (o.json) {
        nlohmann::json j = nlohmann::json::array();
        for (const Row& r : rows)
            j.push_back({{"model", r.model},
                         {"test", "attention@d" + std::to_string(r.depth)},
                         {"threads", r.threads},
                         {"ms_per_token_ring_from_dram", r.t.from_dram},
                         {"ms_per_token_ring_in_cache", r.t.from_cache},
                         {"ms_per_token_read_only", r.t.read_only},
                         {"ring_bytes_per_token", r.t.ring_bytes}});
        fmt::print("{}\n", j.dump(2));
        return 0;
    }
    fmt::print("attention of one decode step, ms per token (mean of {} repetitions):\n\n", o.reps);
    fmt::print("| model | threads | depth | K/V read | ring from DRAM | ring in cache | plain read "
               "of the ring |\n");
    fmt::print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    for (const Row& r : rows)
        fmt::print("| {} | {} | {} | {:.1f} MB | {:.2f} | {:.2f} | {:.2f} ({:.1f} GB/s) |\n",
                   r.model, r.threads, r.depth, r.t.ring_bytes / 1e6, r.t.from_dram, r.t.from_cache,
                   r.t.read_only, r.t.ring_bytes / (r.t.read_only * 1e6));
    return 0;
}

int matrices(const Options& o) {
    const std::vector<int> threads = thread_counts(o);
    struct Row {
        std::string model;
        int threads = 0;
        MatrixTimes t;
    };
    std::vector<Row> rows;
    for (const std::string& path : o.models) {
        const auto lm = load(path);
        for (int t : threads)
            if (!cli::interrupted())
                rows.push_back({file_name(path), t, bench_matrices(lm->model, t, o.reps)});
    }
    if (o.json) {
        nlohmann::json j = nlohmann::json::array();
        for (const Row& r : rows)
            j.push_back({{"model", r.model},
                         {"test", "matrices"},
                         {"threads", r.threads},
                         {"matrix_bytes_per_token", r.t.bytes},
                         {"ms_per_token_read", r.t.read_ms},
                         {"ms_per_token_matmul", r.t.matmul_ms}});
        fmt::print("{}\n", j.dump(2));
        return 0;
    }
    fmt::print(
        "weight matrices of one token, in its order, ms per token (mean of {} repetitions):\n\n",
        o.reps);
    fmt::print("| model | threads | bytes | plain read | ops::matmul | matmul / read |\n");
    fmt::print("| --- | ---: | ---: | ---: | ---: | ---: |\n");
    for (const Row& r : rows)
        fmt::print(
            "| {} | {} | {:.1f} MB | {:.2f} ({:.1f} GB/s) | {:.2f} ({:.1f} GB/s) | {:.0f}% |\n",
            r.model, r.threads, r.t.bytes / 1e6, r.t.read_ms, r.t.bytes / (r.t.read_ms * 1e6),
            r.t.matmul_ms, r.t.bytes / (r.t.matmul_ms * 1e6), 100 * r.t.read_ms / r.t.matmul_ms);
    return 0;
}

int run(int argc, char** argv) {
    Options o;
    CLI::App app{"kvrun-lab: lab measurements behind kvrun's performance figures (CPU)",
                 "kvrun-lab"};
    app.require_subcommand(1);
    CLI::App* roof = app.add_subcommand(
        "roofline", "read bandwidth (best of plain and prefetching reads of a buffer far larger "
                    "than the caches, "
                    "on huge pages) and the thread pool's hand-off cost, per thread count");
    add_threads(*roof, o);
    roof->add_option("--buffer-mib", o.buffer_mib, "buffer read, MiB")
        ->capture_default_str()
        ->check(CLI::Range(1, 1 << 20));
    CLI::App* att =
        app.add_subcommand("attention", "a decode step's attention at each depth > 0: the ring "
                                        "from DRAM after each layer's weights, "
                                        "the ring in cache, and a plain read of the same bytes");
    add_models(*att, o);
    att->add_option("-d,--depth", o.depths, "tokens in the cache, comma-separated")->required();
    add_threads(*att, o);
    att->add_option("--ctk", o.ctk, "K cache type")->capture_default_str();
    att->add_option("--ctv", o.ctv, "V cache type")->capture_default_str();
    CLI::App* mat = app.add_subcommand(
        "matrices",
        "stream the weight matrices one token reads, in its order through the same parallel loops: "
        "a plain read of each, and the matrix-vector kernels");
    add_models(*mat, o);
    add_threads(*mat, o);
    for (CLI::App* sub : {roof, att, mat})
        sub->add_flag("--json", o.json, "print JSON instead of a markdown table");
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        return app.exit(e) == 0 ? 0 : static_cast<int>(Exit::usage);
    }
    cli::install_interrupt_handler();
    const cli::StopPoint stop_point; // the probes' loops poll interrupted()
    if (roof->parsed()) return roofline(o);
    if (att->parsed()) return attention(o);
    return matrices(o);
}

} // namespace

} // namespace kvrun::lab

// Errors as kvrun reports them: one line, and kvrun's exit statuses.
int main(int argc, char** argv) {
    using namespace kvrun;
    try {
        return lab::run(argc, argv);
    } catch (const Error& e) {
        std::fflush(stdout);
        fmt::print(stderr, "kvrun-lab: error: {}\n", e.what());
        return static_cast<int>(e.code());
    } catch (const std::bad_alloc&) {
        fmt::print(stderr, "kvrun-lab: error: out of memory\n");
        return static_cast<int>(Exit::out_of_memory);
    } catch (const std::exception& e) {
        fmt::print(stderr, "kvrun-lab: error: {}\n", e.what());
        return static_cast<int>(Exit::error);
    }
}
