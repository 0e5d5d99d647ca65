// The CUDA backend's device-resident activations: Forward's tracked buffers
// get device twins (coherence.h decides which copy is newer), and each op's
// inputs and outputs resolve to a twin or to a scratch copy. Kept apart from
// the ops (backend.cu) because this is the bookkeeping that decides what
// crosses the bus; docs/cuda.md ("Design": Activations) says why.
#include <cstdio>
#include <cstring>
#include <exception>
#include <initializer_list>

#include "ggml-like/cuda/backend_impl.h"

namespace gl::cuda_impl {

// ---- Backend's twin interface (backend.h) ------------------------------------------

void CudaBackend::track(void* host, size_t bytes) {
    if (!coh_->track(host, bytes) && debug_)
        std::fprintf(stderr,
                     "kvrun: CUDA: no device room for a %zu-byte activation buffer; "
                     "it is copied at each op\n",
                     bytes);
}

void CudaBackend::host_read(const void* p, size_t bytes) {
    if (step_lost_) return; // the step is done again; nothing here is used
    begin_op();
    end_capture(false);
    if (step_lost_) return;
    coh_->host_read(p, bytes);
    sync();
}

void CudaBackend::copy_to_host(const void* src, void* dst, size_t bytes) {
    if (bytes == 0) return;
    op(OpKind::copy, [&] {
        if (coh_->device_dirty(src, bytes)) {
            // On the device only: into the pinned staging buffer now, on
            // to dst at the next sync().
            if (const void* d = coh_->device_in(src, bytes)) {
                if (uint8_t* st = stage(bytes)) {
                    GL_CUDA(cudaMemcpyAsync(st, d, bytes, cudaMemcpyDeviceToHost, s_));
                    pending_.push_back({st, dst, bytes});
                    note_download(bytes);
                    return;
                }
            }
            end_capture(true);
            if (step_lost_) return;
            coh_->host_read(src, bytes);
            sync();
        } else if (!pending_.empty()) {
            sync(); // an earlier pending copy must not land over this one
        }
        std::memcpy(dst, src, bytes);
    });
}

// An op input: the device twin of a tracked buffer (uploading what the
// host has newer), else a copy in scratch buffer `id`.
const void* CudaBackend::in(const void* host, size_t bytes, int id) {
    if (const void* d = coh_->device_in(host, bytes)) return d;
    if (coh_->device_dirty(host, bytes)) { // overlaps a twin but is not inside one
        end_capture(true);
        coh_->host_read(host, bytes);
        sync();
    }
    void* d = buf(id, bytes);
    h2d(d, host, bytes);
    return d;
}

// An op output: the twin (now newer than the host copy), else scratch
// `id`, downloaded by finish().
CudaBackend::Out CudaBackend::out(void* host, size_t bytes, int id) {
    if (void* d = coh_->device_out(host, bytes)) return {d, host, bytes, true};
    return {buf(id, bytes), host, bytes, false};
}

CudaBackend::Out CudaBackend::inout(void* host, size_t bytes, int id) {
    if (void* d = coh_->device_inout(host, bytes)) return {d, host, bytes, true};
    void* d = const_cast<void*>(in(host, bytes, id));
    return {d, host, bytes, false};
}

// After the kernels: untracked outputs come back now (and wait).
void CudaBackend::finish(std::initializer_list<Out> outs) {
    bool any = false;
    for (const Out& o : outs)
        if (!o.tracked) {
            if (!any) end_capture(true);
            any = true;
            GL_CUDA(cudaMemcpyAsync(o.host, o.dev, o.bytes, cudaMemcpyDeviceToHost, s_));
            note_download(o.bytes);
        }
    if (!any) return;
    sync();
    for (const Out& o : outs)
        if (!o.tracked) coh_->host_wrote(o.host, o.bytes); // in case it overlaps a twin
}

// ---- the twins' device memory ----------------------------------------------------

void* CudaBackend::Twins::alloc(size_t bytes) {
    try {
        return b_.alloc(bytes, "activations");
    } catch (const std::exception&) {
        return nullptr; // the buffer stays untracked: copied at each op
    }
}
void CudaBackend::Twins::free(void* dev) {
    if (!b_.destroying_) b_.sync();
    cudaFree(dev);
}
void CudaBackend::Twins::upload(void* dev, const void* host, size_t bytes) {
    b_.h2d(dev, host, bytes);
}
void CudaBackend::Twins::download(void* host, const void* dev, size_t bytes) {
    b_.note_download(bytes);
    GL_CUDA(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, b_.s_));
}

} // namespace gl::cuda_impl
