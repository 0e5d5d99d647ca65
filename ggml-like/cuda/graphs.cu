// The CUDA backend's copies, waits and graphs: host->device copies through a
// pinned staging buffer (so they are truly async and a graph may record them),
// the one wait (sync) that lands pending device->host copies, and the stream
// capture of a decode step into a CUDA graph that is updated in place and
// launched, with the fallback when a recording fails. Together because a
// graph may hold only staged copies and must end before any wait;
// docs/cuda.md ("Design": Pinned staging, CUDA graphs) says more.
#include <cstdio>
#include <cstring>
#include <string>

#include "ggml-like/cuda/backend_impl.h"

namespace gl::cuda_impl {

// ---- pinned staging and waits -------------------------------------------------------

// Host -> device, through the pinned staging buffer when it has room (an
// async copy, and the only kind a graph may record), else straight from
// pageable memory (ends a recording first).
void CudaBackend::h2d(void* dev, const void* host, size_t bytes) {
    if (bytes == 0) return;
    note_upload(bytes);
    if (uint8_t* st = stage(bytes)) {
        std::memcpy(st, host, bytes);
        GL_CUDA(cudaMemcpyAsync(dev, st, bytes, cudaMemcpyHostToDevice, s_));
        return;
    }
    end_capture(true);
    GL_CUDA(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, s_));
}

// `bytes` of the pinned staging buffer, valid until the next sync(); null
// when there is none or it is full (noted, so it grows after the step).
uint8_t* CudaBackend::stage(size_t bytes) {
    if (!stage_.p && !capturing_) grow_staging(kStagingStart);
    const size_t at = (stage_.used + 255) / 256 * 256;
    if (!stage_.p || at + bytes > stage_.cap) {
        if (stage_.p) stage_overflow_ = true;
        return nullptr;
    }
    stage_.used = at + bytes;
    return stage_.p + at;
}

bool CudaBackend::grow_staging(size_t bytes) {
    if (capturing_ || stage_failed_ || bytes > kStagingMax) return false;
    if (stage_.p) {
        sync();
        cudaFreeHost(stage_.p);
        stage_ = {};
    }
    void* p = nullptr;
    if (cudaHostAlloc(&p, bytes, cudaHostAllocDefault) != cudaSuccess) {
        cudaGetLastError();
        stage_failed_ = true; // pageable copies from now on (and no graphs)
        return false;
    }
    stage_.p = static_cast<uint8_t*>(p);
    stage_.cap = bytes;
    stage_.used = 0;
    return true;
}

// Wait for the stream; then the pending device->host copies land and
// the staging buffer is free again.
void CudaBackend::sync() {
    end_capture(true);
    GL_CUDA(cudaStreamSynchronize(s_));
    if (!step_lost_) // a lost recording never filled its staging
        for (const Pending& p : pending_) std::memcpy(p.dst, p.src, p.bytes);
    pending_.clear();
    stage_.used = 0;
}

// ---- CUDA graphs ---------------------------------------------------------------

// Stop recording and launch what was recorded (all of the step, or with
// `partial` the part before something a graph cannot hold: a wait, an
// allocation, a pageable copy; the rest of the step then runs eagerly).
void CudaBackend::end_capture(bool partial) {
    if (!capturing_) return;
    capturing_ = false;
    cudaGraph_t g = nullptr;
    cudaError_t e = cudaStreamEndCapture(s_, &g);
    if (e != cudaSuccess || !g) {
        if (g) cudaGraphDestroy(g);
        lose(std::string("cudaStreamEndCapture: ") + cudaGetErrorString(e));
        return;
    }
    if (++st_.captures == fail_at_) {
        cudaGraphDestroy(g);
        lose("KVRUN_CUDA_GRAPHS_TEST_FAIL=" + std::to_string(fail_at_));
        return;
    }
    if (partial && ++st_.partial > 3) graphs_off_later_ = true;
    // Same shape as last step's graph (the usual case): update its
    // parameters in place; otherwise instantiate anew.
    if (exec_) {
        cudaGraphExecUpdateResultInfo info{};
        if (cudaGraphExecUpdate(exec_, g, &info) == cudaSuccess) {
            st_.updates++;
        } else {
            cudaGetLastError();
            cudaGraphExecDestroy(exec_);
            exec_ = nullptr;
        }
    }
    if (!exec_) {
        e = cudaGraphInstantiate(&exec_, g, 0);
        if (e != cudaSuccess) {
            exec_ = nullptr;
            cudaGraphDestroy(g);
            lose(std::string("cudaGraphInstantiate: ") + cudaGetErrorString(e));
            return;
        }
        st_.instantiations++;
    }
    cudaGraphDestroy(g);
    const bool timed = debug_ && !partial; // the events exist whenever debug_ is set
    if (timed) {
        st_.record_ns += ns_since(step_t0_);
        cudaEventRecord(ev_launch_, s_);
    }
    e = cudaGraphLaunch(exec_, s_);
    if (e != cudaSuccess) {
        lose(std::string("cudaGraphLaunch: ") + cudaGetErrorString(e));
        return;
    }
    if (timed) graph_timed_ = cudaEventRecord(ev_done_, s_) == cudaSuccess;
    st_.launches++;
    if (graphs_off_later_) graphs_off("the decode step keeps breaking out of its graph");
}

// A recording failed: its work is gone. The step is reported lost
// (end_step) and done again by Forward with eager launches from now on.
void CudaBackend::lose(const std::string& why) {
    cudaGetLastError();
    step_lost_ = true;
    graphs_off(why);
}

void CudaBackend::abandon_capture(const std::string& why) {
    if (capturing_) {
        capturing_ = false;
        cudaGraph_t g = nullptr;
        cudaStreamEndCapture(s_, &g);
        if (g) cudaGraphDestroy(g);
    }
    lose(why);
}

void CudaBackend::graphs_off(const std::string& why) {
    if (!graphs_) return;
    graphs_ = false;
    std::fprintf(stderr, "kvrun: CUDA graphs off (%s); decoding with eager launches\n",
                 why.c_str());
    if (exec_) {
        cudaGraphExecDestroy(exec_);
        exec_ = nullptr;
    }
}

} // namespace gl::cuda_impl
