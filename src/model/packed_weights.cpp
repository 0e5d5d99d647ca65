#include "packed_weights.h"

#include <algorithm>
#include <cstdlib>
#include <string_view>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <vector>

#include "error.h"
#include "ggml-like/cpu/gemm.h"
#include "ggml-like/kernels.h"

namespace kvrun {

bool PackedWeights::enabled() {
    const char* env = std::getenv("KVRUN_PACK");
    return !(env && std::string_view(env) == "0");
}

bool PackedWeights::packs(gl::Type type) {
    // Where AMX tiles take prompts (Xeons from Sapphire Rapids on), they are
    // faster than the packed GEMM and read the plain rows: nothing is packed,
    // so the weights are not held twice.
    return enabled() && gl::packable(type) && gl::cpu::has_packed_gemm(type) &&
           gl::gemm::path_for(type, 4096, 512) != gl::gemm::Path::Amx;
}

PackedWeights PackedWeights::pack(Model& m, const GgufFile& f) {
    PackedWeights out;
    if (!enabled()) return out;
    std::vector<gl::Tensor*> mats;
    for (LayerWeights& L : m.layers)
        for (gl::Tensor* w : L.matrices()) mats.push_back(w);
    for (gl::Tensor* w : {&m.output, &m.per_layer_model_proj})
        if (*w) mats.push_back(w);
    // Each distinct matrix once (views of the same rows share a copy),
    // 64-byte aligned, in pieces of whole panels up to 8 MiB each, shared
    // among up to four threads: new pages' faults are much of the time.
    struct Job {
        gl::Tensor* t;
        uint64_t at;
    };
    struct Piece {
        const gl::Tensor* t;
        uint64_t at;
        int64_t r0, n;
    };
    std::vector<Job> jobs;
    std::vector<Piece> pieces;
    std::unordered_map<const void*, const Job*> seen;
    jobs.reserve(mats.size());
    uint64_t total = 0;
    for (gl::Tensor* w : mats) {
        if (!packs(w->type) || w->row_bytes != gl::row_size(w->type, w->ne0)) continue;
        if (auto it = seen.find(w->data); it != seen.end()) {
            // The same rows seen before (never another shape: the binder
            // rejects overlapping tensors, and views start apart).
            KV_ASSERT(it->second->t->ne0 == w->ne0 && it->second->t->ne1 == w->ne1);
            jobs.push_back({w, it->second->at});
            continue;
        }
        jobs.push_back({w, total});
        seen[w->data] = &jobs.back();
        const int64_t step =
            std::max<int64_t>(1, (int64_t{8} << 20) /
                                     static_cast<int64_t>(gl::kPackedPanelRows * w->row_bytes)) *
            gl::kPackedPanelRows;
        for (int64_t r0 = 0; r0 < w->ne1; r0 += step)
            pieces.push_back({w, total, r0, std::min(step, w->ne1 - r0)});
        total += (gl::packed_bytes(w->type, w->ne0, w->ne1) + 63) / 64 * 64;
    }
    if (total == 0) return out;
    out.block_ = allocate_huge(total);
    if (!out.block_) return out;
    const unsigned n_threads = std::clamp(std::thread::hardware_concurrency(), 1u, 4u);
    auto work = [&](unsigned first) {
        for (size_t k = first; k < pieces.size(); k += n_threads) {
            const Piece& p = pieces[k];
            const gl::Tensor& t = *p.t;
            gl::pack_rows(t.type, t.ne0, t.row(p.r0), t.row_bytes, p.n,
                          out.block_.get() + p.at + p.r0 * t.row_bytes);
            f.drop_mapped_pages(t.row(p.r0), p.n * t.row_bytes);
        }
    };
    std::vector<std::thread> helpers;
    helpers.reserve(n_threads); // no allocation while threads run
    for (unsigned i = 1; i < n_threads; i++) {
        try {
            helpers.emplace_back(work, i);
        } catch (const std::system_error&) {
            work(i); // no thread to spare: this one does that share too
        }
    }
    work(0);
    for (std::thread& h : helpers) h.join();
    for (const Job& j : jobs) j.t->packed = out.block_.get() + j.at;
    return out;
}

} // namespace kvrun
