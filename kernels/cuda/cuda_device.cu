#include "kernels/cuda/cuda_device.h"

#include <cstdlib>
#include <cstring>

#include "ggml-like/error.h"
#include "kernels/cuda/cuda_common.cuh"

namespace zk {
namespace cuda {

#if defined(ZK_SIMT)

void cuda_check_status(int status, const char* what, const char* file, int line) {
    if (status != 0) ZK_THROW("CUDA error %d in %s (%s:%d)", status, what, file, line);
}
int cuda_device_count() { return 1; }
cuda_device_info cuda_device_query() {
    cuda_device_info d;
    d.name = "SIMT harness (host)";
    d.sm_count = 4;
    d.smem_per_block_optin = 227 * 1024;
    d.simt = true;
    return d;
}
void* cuda_malloc(size_t bytes, const char* what) { return simt::device_alloc(bytes, what); }
void cuda_free(void* p) { simt::device_free(p); }
// Copies check both ends against their buffers (a harness build's host code
// goes through here too).
static void check_range(const void* p, size_t n, const char* what) {
    if (n == 0) return;
    const simt::buffer* b = simt::buffer_find(p);
    if (!b) ZK_THROW("%s: %p is not in a device buffer", what, p);
    simt::check_global(b, p, n, 1, __FILE__, __LINE__);
}
void cuda_copy_to_device(void* dst, const void* src, size_t bytes, cuda_stream) {
    check_range(dst, bytes, "cuda_copy_to_device");
    if (bytes) std::memcpy(dst, src, bytes);
}
void cuda_copy_to_host(void* dst, const void* src, size_t bytes, cuda_stream) {
    check_range(src, bytes, "cuda_copy_to_host");
    if (bytes) std::memcpy(dst, src, bytes);
}
void cuda_copy_on_device(void* dst, const void* src, size_t bytes, cuda_stream) {
    check_range(dst, bytes, "cuda_copy_on_device");
    check_range(src, bytes, "cuda_copy_on_device");
    // cudaMemcpyAsync of overlapping ranges is undefined: refuse it here too
    const char *d = (const char*)dst, *c = (const char*)src;
    if (bytes && d < c + bytes && c < d + bytes) ZK_THROW("cuda_copy_on_device: overlapping ranges (%zu bytes)", bytes);
    if (bytes) std::memcpy(dst, src, bytes);
}
void cuda_memset(void* dst, int value, size_t bytes, cuda_stream) {
    check_range(dst, bytes, "cuda_memset");
    if (bytes) std::memset(dst, value, bytes);
}
void* cuda_host_alloc(size_t bytes, const char* what) {
    void* p = std::malloc(bytes ? bytes : 1);
    if (!p) ZK_THROW("host allocation of %zu bytes for %s failed", bytes, what);
    return p;
}
void cuda_host_free(void* p) { std::free(p); }
void cuda_copy_to_device_async(void* dst, const void* src, size_t bytes, cuda_stream s) {
    cuda_copy_to_device(dst, src, bytes, s);
}
void cuda_stream_sync(cuda_stream) {}
cuda_stream cuda_stream_create() { return nullptr; }
void cuda_stream_destroy(cuda_stream) {}

#else

void cuda_check_status(int status, const char* what, const char* file, int line) {
    if (status != (int)cudaSuccess)
        ZK_THROW("CUDA error %s (%s) in %s (%s:%d)", cudaGetErrorName((cudaError_t)status),
                 cudaGetErrorString((cudaError_t)status), what, file, line);
}
int cuda_device_count() {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();  // clear the sticky "no device" error
        return 0;
    }
    return n;
}
cuda_device_info cuda_device_query() {
    int dev = 0;
    ZK_CUDA_CHECK(cudaGetDevice(&dev));
    cudaDeviceProp p;
    ZK_CUDA_CHECK(cudaGetDeviceProperties(&p, dev));
    cuda_device_info d;
    d.name = p.name;
    d.sm_count = p.multiProcessorCount;
    d.smem_per_block_optin = p.sharedMemPerBlockOptin;
    return d;
}
void* cuda_malloc(size_t bytes, const char* what) {
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
    if (e != cudaSuccess) ZK_THROW("cudaMalloc of %zu bytes for %s: %s", bytes, what, cudaGetErrorString(e));
    return p;
}
void cuda_free(void* p) {
    if (p) ZK_CUDA_CHECK(cudaFree(p));
}
void cuda_copy_to_device(void* dst, const void* src, size_t bytes, cuda_stream s) {
    ZK_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, (cudaStream_t)s));
    if (!s) ZK_CUDA_CHECK(cudaStreamSynchronize(nullptr));
}
void cuda_copy_to_host(void* dst, const void* src, size_t bytes, cuda_stream s) {
    ZK_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, (cudaStream_t)s));
    ZK_CUDA_CHECK(cudaStreamSynchronize((cudaStream_t)s));
}
void cuda_copy_on_device(void* dst, const void* src, size_t bytes, cuda_stream s) {
    ZK_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, (cudaStream_t)s));
}
void cuda_memset(void* dst, int value, size_t bytes, cuda_stream s) {
    ZK_CUDA_CHECK(cudaMemsetAsync(dst, value, bytes, (cudaStream_t)s));
}
void* cuda_host_alloc(size_t bytes, const char* what) {
    void* p = nullptr;
    const cudaError_t e = cudaMallocHost(&p, bytes ? bytes : 1);
    if (e != cudaSuccess) ZK_THROW("cudaMallocHost of %zu bytes for %s: %s", bytes, what, cudaGetErrorString(e));
    return p;
}
void cuda_host_free(void* p) {
    if (p) ZK_CUDA_CHECK(cudaFreeHost(p));
}
void cuda_copy_to_device_async(void* dst, const void* src, size_t bytes, cuda_stream s) {
    ZK_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, (cudaStream_t)s));
}
void cuda_stream_sync(cuda_stream s) { ZK_CUDA_CHECK(cudaStreamSynchronize((cudaStream_t)s)); }
cuda_stream cuda_stream_create() {
    cudaStream_t s = nullptr;
    ZK_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    return (cuda_stream)s;
}
void cuda_stream_destroy(cuda_stream s) {
    if (s) ZK_CUDA_CHECK(cudaStreamDestroy((cudaStream_t)s));
}

#endif

}  // namespace cuda
}  // namespace zk
