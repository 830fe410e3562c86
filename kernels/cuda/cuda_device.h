// Device memory, streams and the device's properties for the CUDA launchers'
// callers (a backend, the tests). In the SIMT harness build the "device" is the
// host: buffers are registered with the harness, copies are memcpy, launches
// run to completion before they return.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_types.h"

namespace zk {
namespace cuda {

struct cuda_device_info {
    std::string name;
    int sm_count = 0;                  // streaming multiprocessors (the harness: 4)
    size_t smem_per_block_optin = 0;   // dynamic shared memory a block may opt in to
    bool simt = false;                 // the SIMT harness, not a GPU
};

// Devices visible (the harness build: 1). Never throws.
int cuda_device_count();
// Properties of the current device; throws zk::error without one.
cuda_device_info cuda_device_query();

// Throw zk::error with what and the size when the device refuses.
void* cuda_malloc(size_t bytes, const char* what);
void cuda_free(void* p);
void cuda_copy_to_device(void* dst, const void* src, size_t bytes, cuda_stream s = nullptr);
void cuda_copy_to_host(void* dst, const void* src, size_t bytes, cuda_stream s = nullptr);
void cuda_copy_on_device(void* dst, const void* src, size_t bytes, cuda_stream s = nullptr);
void cuda_memset(void* dst, int value, size_t bytes, cuda_stream s = nullptr);
// Page-locked host memory (the harness build: ordinary memory), and a copy
// from it that returns without waiting: src must stay unchanged until the
// stream has run the copy. cuda_copy_to_device waits for the stream instead
// (from pageable memory an asynchronous copy may wait anyway).
void* cuda_host_alloc(size_t bytes, const char* what);
void cuda_host_free(void* p);
void cuda_copy_to_device_async(void* dst, const void* src, size_t bytes, cuda_stream s = nullptr);
void cuda_stream_sync(cuda_stream s = nullptr);
cuda_stream cuda_stream_create();
void cuda_stream_destroy(cuda_stream s);

// An owned device array of n T (move-only).
template <class T>
class device_array {
public:
    device_array() = default;
    explicit device_array(size_t n, const char* what = "device_array")
        : p_(n ? (T*)cuda_malloc(n * sizeof(T), what) : nullptr), n_(n) {}
    explicit device_array(const std::vector<T>& h, const char* what = "device_array") : device_array(h.size(), what) {
        upload(h);
    }
    device_array(device_array&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr, o.n_ = 0; }
    device_array& operator=(device_array&& o) noexcept {
        if (this != &o) {
            cuda_free(p_);
            p_ = o.p_, n_ = o.n_;
            o.p_ = nullptr, o.n_ = 0;
        }
        return *this;
    }
    device_array(const device_array&) = delete;
    device_array& operator=(const device_array&) = delete;
    ~device_array() { cuda_free(p_); }

    void upload(const std::vector<T>& h) { upload(h.data(), h.size()); }
    void upload(const T* h, size_t n) {
        if (n) cuda_copy_to_device(p_, h, n * sizeof(T));
    }
    std::vector<T> download() const {
        std::vector<T> h(n_);
        if (n_) cuda_copy_to_host(h.data(), p_, n_ * sizeof(T));
        return h;
    }
    T* data() const { return p_; }
    size_t size() const { return n_; }
    // The pointer kernels take (bound to this buffer in the harness build).
    dptr<T> ptr() const { return dptr<T>(p_); }
    dptr<const T> cptr() const { return dptr<const T>(p_); }

private:
    T* p_ = nullptr;
    size_t n_ = 0;
};

}  // namespace cuda
}  // namespace zk
