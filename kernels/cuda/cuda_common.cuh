// Shared by every kernels/cuda/*.cu: the CUDA headers (or, in the SIMT
// harness build, tests/simt/simt.h in their place), shared-memory declarations
// the harness can track, the launch macro, error checking, and the small
// device helpers (f16 loads, warp and block reductions).
//
// Kernels keep to what the harness models (tests/simt/simt.h): scalar
// arithmetic, ZK_SHARED arrays, __syncthreads, full-mask warp collectives,
// atomics. Anything else (tensor cores, cuBLAS) goes behind a function with a
// CPU equivalent under ZK_SIMT.
#pragma once

#if defined(ZK_SIMT)
#include "tests/simt/simt.h"
#elif defined(__CUDACC__)
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#else
#error "kernels/cuda/*.cu compile with nvcc, or as C++ with ZK_SIMT (tests/simt)"
#endif

#include <cstdint>

#include "kernels/cuda/cuda_types.h"

namespace zk {
namespace cuda {

// ---------------------------------------------------------------- errors

// Throws zk::error naming the call and where it was made (cuda_device.cu).
void cuda_check_status(int status, const char* what, const char* file, int line);
#if defined(ZK_SIMT)
#define ZK_CUDA_CHECK(call) (void)0
#else
#define ZK_CUDA_CHECK(call) ::zk::cuda::cuda_check_status((int)(call), #call, __FILE__, __LINE__)
#endif

// ---------------------------------------------------------------- shared memory

// ZK_SHARED(T, name, n): a static __shared__ array of n T, used as name[i].
// ZK_SHARED_DYNAMIC(name): the block's dynamic shared memory as bytes; arrays
// are carved from it with smem_take.
#if defined(ZK_SIMT)
template <class T>
using sptr = simt::sptr<T>;
#define ZK_SHARED(T, name, n)                                                          \
    static const ::simt::shared_site name##_site_{#name, sizeof(T) * (n), alignof(T)}; \
    const ::zk::cuda::sptr<T> name = ::simt::shared_static<T>(name##_site_)
#define ZK_SHARED_DYNAMIC(name) ::zk::cuda::sptr<unsigned char> name = ::simt::shared_dynamic<unsigned char>(#name)
// n T from the cursor (aligned for T), which moves past them; `name` names
// the array in the harness's reports.
template <class T>
__device__ inline sptr<T> smem_take(sptr<unsigned char>& cur, int64_t n, const char* name = "smem") {
    const uintptr_t a = ((uintptr_t)cur.get() + alignof(T) - 1) & ~(uintptr_t)(alignof(T) - 1);
    sptr<unsigned char> at = cur + (int64_t)(a - (uintptr_t)cur.get());
    sptr<T> p = at.as<T>().narrow(n, name);
    cur = at + (int64_t)(sizeof(T) * n);
    return p;
}
#define ZK_LAUNCH(kernel, grid, block, smem, stream, ...) \
    ::simt::launch(#kernel, kernel, grid, block, smem, __VA_ARGS__)
#define ZK_SET_MAX_DYNAMIC_SMEM(kernel, bytes) ::simt::func_set_max_dynamic_smem((const void*)kernel, bytes)
#else
template <class T>
using sptr = T*;
#define ZK_SHARED(T, name, n) \
    __shared__ T name##_arr_[n]; \
    T* const name = name##_arr_
#define ZK_SHARED_DYNAMIC(name)                              \
    extern __shared__ __align__(16) unsigned char zk_smem_[]; \
    unsigned char* name = zk_smem_
// (the pointer moves by offsets, never through an integer: nvcc then knows it
// points into shared memory and emits LDS / STS with 32-bit addresses; a
// pointer rebuilt from an integer is generic, each access a 64-bit LD / ST)
template <class T>
__device__ __forceinline__ T* smem_take(unsigned char*& cur, int64_t n, const char* = nullptr) {
    const size_t pad = (alignof(T) - (size_t)((uintptr_t)cur % alignof(T))) % alignof(T);
    T* p = reinterpret_cast<T*>(cur + pad);
    cur = reinterpret_cast<unsigned char*>(p + n);
    return p;
}
#define ZK_LAUNCH(kernel, grid, block, smem, stream, ...)                               \
    do {                                                                                \
        kernel<<<grid, block, smem, (cudaStream_t)(stream)>>>(__VA_ARGS__);             \
        ::zk::cuda::cuda_check_status((int)cudaGetLastError(), #kernel, __FILE__, __LINE__); \
    } while (0)
#define ZK_SET_MAX_DYNAMIC_SMEM(kernel, bytes) \
    ZK_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)(bytes)))
#endif

// ---------------------------------------------------------------- helpers

// The same device memory viewed as another type (the harness keeps the
// buffer binding and checks the new type's alignment at every access).
#if defined(ZK_SIMT)
template <class U, class T>
__device__ inline dptr<U> dptr_cast(dptr<T> p) {
    return dptr<U>((U*)p.get(), p.buf());
}
#else
template <class U, class T>
__device__ __forceinline__ U* dptr_cast(T* p) {
    return (U*)p;
}
#endif

// The same shared memory viewed as another type (bounds stay the array's).
#if defined(ZK_SIMT)
template <class U, class T>
__device__ inline sptr<U> sptr_cast(sptr<T> p) {
    return p.template as<U>();
}
#else
template <class U, class T>
__device__ __forceinline__ U* sptr_cast(T* p) {
    return (U*)p;
}
#endif

constexpr unsigned k_full_mask = 0xffffffffu;

// Vector loads: one 16-, 8- or 4-byte access of aligned device memory (nvcc
// emits LDG.128 / .64 / .32 for them; the harness checks their alignment).
struct alignas(16) cu_v16 { uint32_t w[4]; };
struct alignas(8) cu_v8 { uint32_t w[2]; };
struct alignas(16) cu_f4 { float x[4]; };
struct alignas(8) cu_f2 { float x[2]; };
template <class V, class T>
__device__ __forceinline__ V cu_load(dptr<const T> p, int64_t i) {
    return dptr_cast<const V>(p + i)[0];
}
// The f16 in the low (hi = 0) or high half of a 32-bit word.
__device__ __forceinline__ float h2f_lo(uint32_t w) { return __half2float(__ushort_as_half((uint16_t)(w & 0xffffu))); }
__device__ __forceinline__ float h2f_hi(uint32_t w) { return __half2float(__ushort_as_half((uint16_t)(w >> 16))); }

// Full unrolling of a loop with a constant trip count (register arrays stay in
// registers only when every index is a compile-time constant).
#if defined(ZK_SIMT)
#define ZK_UNROLL _Pragma("GCC unroll 16")
#else
#define ZK_UNROLL _Pragma("unroll")
#endif

template <class T>
__device__ __forceinline__ T cu_min(T a, T b) { return a < b ? a : b; }
template <class T>
__device__ __forceinline__ T cu_max(T a, T b) { return a > b ? a : b; }

// An f16 stored as its bits (the caches and GGUF blocks keep uint16_t).
__device__ __forceinline__ float h2f(uint16_t h) { return __half2float(__ushort_as_half(h)); }
__device__ __forceinline__ uint16_t f2h(float f) { return __half_as_ushort(__float2half_rn(f)); }

// Sum / max over groups of `width` lanes (a power of two <= 32); every lane of
// the group gets the result. All 32 lanes of the warp must call.
__device__ __forceinline__ float warp_sum(float v, int width = 32) {
    for (int o = width / 2; o > 0; o /= 2) v += __shfl_xor_sync(k_full_mask, v, o, width);
    return v;
}
__device__ __forceinline__ float warp_max(float v, int width = 32) {
    for (int o = width / 2; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(k_full_mask, v, o, width));
    return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024): every thread
// gets it. red: 32 floats of shared scratch, free again on return.
__device__ inline float block_sum(float v, sptr<float> red) {
    const int lane = threadIdx.x % 32, wid = threadIdx.x / 32, nw = blockDim.x / 32;
    v = warp_sum(v);
    if (lane == 0) red[wid] = v;
    __syncthreads();
    float t = lane < nw ? (float)red[lane] : 0.0f;
    t = warp_sum(t);
    __syncthreads();  // red may be reused right after
    return t;
}
// The same in double (red: 32 doubles of shared scratch).
__device__ inline double block_sum_d(double v, sptr<double> red) {
    const int lane = threadIdx.x % 32, wid = threadIdx.x / 32, nw = blockDim.x / 32;
    for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(k_full_mask, v, o);
    if (lane == 0) red[wid] = v;
    __syncthreads();
    double t = lane < nw ? (double)red[lane] : 0.0;
    for (int o = 16; o > 0; o /= 2) t += __shfl_xor_sync(k_full_mask, t, o);
    __syncthreads();
    return t;
}
__device__ inline float block_max(float v, sptr<float> red) {
    const int lane = threadIdx.x % 32, wid = threadIdx.x / 32, nw = blockDim.x / 32;
    v = warp_max(v);
    if (lane == 0) red[wid] = v;
    __syncthreads();
    float t = lane < nw ? (float)red[lane] : -INFINITY;
    t = warp_max(t);
    __syncthreads();
    return t;
}

}  // namespace cuda
}  // namespace zk
