// SIMT harness: lets a CUDA kernel's own .cu source compile as host C++ and
// run a grid block by block, one user-space fiber per CUDA thread, so its
// indexing, shared memory, barriers, warp collectives, reductions, merges and
// boundary handling run in CI without a GPU. A test tool, not a second
// implementation: tests compile kernels/cuda/*.cu with ZK_SIMT defined and
// compare every kernel with its CPU twin.
//
// What it models (and checks, throwing simt::violation from the launch with
// the kernel, block, thread and source line):
//   threadIdx/blockIdx/blockDim/gridDim/warpSize; __global__/__device__/...
//   __syncthreads: a real barrier over the block's threads. Threads waiting at
//     different barriers, a barrier reached after a thread of the block exited
//     (or a thread exiting while others wait), and deadlock (nobody can run) are
//     errors.
//   Warp collectives (__shfl*_sync, __ballot/__any/__all_sync, __syncwarp): a
//     rendezvous of the lanes named in the mask, in lockstep: values are
//     exchanged only when every named lane has arrived. A lane not in the mask
//     calling, lanes of one mask at different intrinsics or masks, a named lane
//     that exited, and reading a lane outside the mask are errors.
//   Global memory through dptr<T> (kernels/cuda/cuda_common.cuh): under nvcc a
//     raw pointer; here a pointer bound to the device buffer it was made from
//     (simt::device_alloc registers buffers). Every access is checked against
//     that buffer: out of bounds (even if it lands in another buffer),
//     misaligned, null, freed.
//   Shared memory through ZK_SHARED / ZK_SHARED_DYNAMIC (static and dynamic;
//     dynamic above 48 KiB only after the opt-in attribute, as on a device),
//     bounds-checked per declared (or carved) array, and tracked per byte: which
//     thread wrote it in which barrier phase, who read it. A read of a byte never
//     written, or written in the same phase by another thread that no barrier
//     (or warp collective of both) orders before it, is an error; so are
//     write-write and write-after-read conflicts in one phase. Atomics on shared
//     memory do not conflict with each other.
//   Atomics, __half/__half2 and their conversions (round to nearest even), the
//     math intrinsics the kernels use.
// Not modelled: tensor-core instructions, cuBLAS, asynchronous copies, cluster
// and grid-wide sync, memory-model subtleties of global memory between blocks
// (blocks run one after another), timing. Kernels keep to what is here; the
// rest sits behind small functions mapped to CPU code in this build.
#pragma once
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "tests/simt/simt_mem.h"

namespace simt {

// ---------------------------------------------------------------- dims

struct uint3 {
    unsigned x, y, z;
};
struct dim3 {
    unsigned x = 1, y = 1, z = 1;
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

// ---------------------------------------------------------------- thread context

struct thread_ctx {
    uint3 tid, bid;
    dim3 bdim, gdim;
    int linear;  // thread index within the block
    int warp, lane;
};
extern thread_local thread_ctx* g_cur;
inline thread_ctx& cur() {
    if (!g_cur) fail(__FILE__, __LINE__, "threadIdx/blockIdx used outside a kernel");
    return *g_cur;
}

void sync_threads(const char* file, int line);

enum coll_kind : int {
    COLL_SYNCWARP,
    COLL_SHFL_IDX,
    COLL_SHFL_XOR,
    COLL_SHFL_DOWN,
    COLL_SHFL_UP,
    COLL_BALLOT,
    COLL_ANY,
    COLL_ALL,
};
// One lane's part in a warp collective; returns its result once every lane of
// the mask has arrived.
uint64_t warp_collective(coll_kind kind, unsigned mask, uint64_t value, int arg, int width, const char* file,
                         int line);

// ---------------------------------------------------------------- shared memory

enum shared_access_kind : int { SHARED_READ, SHARED_WRITE, SHARED_ATOMIC };
void shared_check(const void* p, size_t n, shared_access_kind kind, const char* lo, const char* hi,
                  const char* name, const char* file, int line);

template <class T>
class sptr;

// One element of shared memory: reads and writes go through the tracker.
template <class T>
class sref {
public:
    sref(T* p, const sptr<T>* a, const char* file, int line) : p_(p), lo_(a->lo()), hi_(a->hi()), name_(a->name()), file_(file), line_(line) {}
    operator T() const {
        shared_check(p_, sizeof(T), SHARED_READ, lo_, hi_, name_, file_, line_);
        return *p_;
    }
    const sref& operator=(const T& v) const {
        shared_check(p_, sizeof(T), SHARED_WRITE, lo_, hi_, name_, file_, line_);
        *p_ = v;
        return *this;
    }
    const sref& operator=(const sref& o) const { return *this = (T)o; }
    const sref& operator+=(const T& v) const { return *this = (T)(T(*this) + v); }
    const sref& operator-=(const T& v) const { return *this = (T)(T(*this) - v); }
    const sref& operator*=(const T& v) const { return *this = (T)(T(*this) * v); }
    const sref& operator/=(const T& v) const { return *this = (T)(T(*this) / v); }
    const sref& operator|=(const T& v) const { return *this = (T)(T(*this) | v); }
    const sref& operator&=(const T& v) const { return *this = (T)(T(*this) & v); }
    // &s[i]: a one-element-or-more pointer that keeps the array's bounds
    sptr<T> operator&() const;
    T* raw() const { return p_; }

private:
    T* p_;
    const char *lo_, *hi_, *name_;
    const char* file_;
    int line_;
};

// A pointer into a shared array (static, dynamic or carved from dynamic),
// bounded by that array.
template <class T>
class sptr {
public:
    sptr() = default;
    sptr(T* p, const char* lo, const char* hi, const char* name) : p_(p), lo_(lo), hi_(hi), name_(name) {}
    sref<T> operator[](index i) const { return sref<T>(p_ + i.i, this, i.file, i.line); }
    sref<T> operator*() const { return (*this)[0]; }
    sptr operator+(int64_t d) const { return sptr(p_ + d, lo_, hi_, name_); }
    sptr operator-(int64_t d) const { return sptr(p_ - d, lo_, hi_, name_); }
    sptr& operator+=(int64_t d) { p_ += d; return *this; }
    int64_t operator-(const sptr& o) const { return p_ - o.p_; }
    // a view of the same bytes as U (bounds stay the array's)
    template <class U>
    sptr<U> as() const { return sptr<U>((U*)p_, lo_, hi_, name_); }
    // the first n elements as an array of their own (tighter bounds), named
    sptr narrow(int64_t n, const char* name = nullptr) const {
        if ((const char*)(p_ + n) > hi_ || (const char*)p_ < lo_)
            fail(__FILE__, __LINE__, std::string("carving ") + (name ? name : name_) + " past the end of its shared region");
        return sptr(p_, (const char*)p_, (const char*)(p_ + n), name ? name : name_);
    }
    T* get() const { return p_; }
    const char* lo() const { return lo_; }
    const char* hi() const { return hi_; }
    const char* name() const { return name_; }

private:
    T* p_ = nullptr;
    const char *lo_ = nullptr, *hi_ = nullptr, *name_ = "";
};

template <class T>
sptr<T> sref<T>::operator&() const {
    return sptr<T>(p_, lo_, hi_, name_);
}

// A static __shared__ array: one per declaration, laid out at the block's
// first use (same address for every thread of the block).
struct shared_site {
    const char* name;
    size_t bytes;
    size_t align;
};
char* shared_static_bytes(const shared_site& s);
char* shared_dynamic_bytes(size_t* size);

template <class T>
sptr<T> shared_static(const shared_site& s) {
    char* p = shared_static_bytes(s);
    return sptr<T>((T*)p, p, p + s.bytes, s.name);
}
template <class T>
sptr<T> shared_dynamic(const char* name) {
    size_t n = 0;
    char* p = shared_dynamic_bytes(&n);
    return sptr<T>((T*)p, p, p + n, name);
}

// Dynamic shared memory above 48 KiB needs this first (cudaFuncSetAttribute).
void func_set_max_dynamic_smem(const void* fn, size_t bytes);

// ---------------------------------------------------------------- launch

void launch_impl(const char* name, const void* fn, dim3 grid, dim3 block, size_t smem,
                 const std::function<void()>& body);

// kernel(args...) on grid x block threads; the arguments are converted to the
// kernel's parameter types once (raw pointers bind to their device buffers
// here), and every thread gets its own copy of them.
template <class... P, class... A>
void launch(const char* name, void (*fn)(P...), dim3 grid, dim3 block, size_t smem, A&&... args) {
    static_assert(sizeof...(P) == sizeof...(A), "kernel argument count");
    std::tuple<typename std::decay<P>::type...> params(std::forward<A>(args)...);
    launch_impl(name, (const void*)fn, grid, block, smem, [&]() { std::apply(fn, params); });
}

// Launches run so far and their blocks (tests report them).
uint64_t launches_run();

// ---------------------------------------------------------------- atomics
// Fibers of a block share one OS thread, so these are atomic by construction;
// the __atomic builtins keep them so if blocks ever run in parallel.

template <class T>
T atomic_rmw(T* p, T v, int op) {
    T old = __atomic_load_n(p, __ATOMIC_RELAXED), nv;
    do {
        switch (op) {
            case 0: nv = (T)(old + v); break;
            case 1: nv = old > v ? old : v; break;
            case 2: nv = old < v ? old : v; break;
            default: nv = v; break;
        }
    } while (!__atomic_compare_exchange_n(p, &old, nv, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
    return old;
}
inline float atomic_rmw(float* p, float v, int op) {
    uint32_t* u = (uint32_t*)p;
    uint32_t old = __atomic_load_n(u, __ATOMIC_RELAXED), nv;
    do {
        float o;
        std::memcpy(&o, &old, 4);
        const float n = op == 0 ? o + v : op == 1 ? std::fmax(o, v) : op == 2 ? std::fmin(o, v) : v;
        std::memcpy(&nv, &n, 4);
    } while (!__atomic_compare_exchange_n(u, &old, nv, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
    float o;
    std::memcpy(&o, &old, 4);
    return o;
}
template <class T>
T atomic_rmw(const sptr<T>& p, T v, int op, const char* file, int line) {
    shared_check(p.get(), sizeof(T), SHARED_ATOMIC, p.lo(), p.hi(), p.name(), file, line);
    return atomic_rmw(p.get(), v, op);
}

// ---------------------------------------------------------------- half precision

uint16_t f32_to_f16_rn(float f);
float f16_to_f32(uint16_t h);

}  // namespace simt

// ================================================================= CUDA names

using simt::dim3;
using simt::uint3;

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __launch_bounds__(...)
#define __restrict__ __restrict
#define __align__(n) alignas(n)
#define __shared__ static thread_local  // untracked: kernels use ZK_SHARED

#define threadIdx (::simt::cur().tid)
#define blockIdx (::simt::cur().bid)
#define blockDim (::simt::cur().bdim)
#define gridDim (::simt::cur().gdim)
constexpr int warpSize = 32;

#define __syncthreads() ::simt::sync_threads(__FILE__, __LINE__)
#define __syncwarp(...) ::simt::syncwarp_at(__FILE__, __LINE__, ##__VA_ARGS__)

namespace simt {
inline void syncwarp_at(const char* file, int line, unsigned mask = 0xffffffffu) {
    warp_collective(COLL_SYNCWARP, mask, 0, 0, 32, file, line);
}
template <class T>
inline uint64_t to_bits(T v) {
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "shuffled type");
    uint64_t u = 0;
    std::memcpy(&u, &v, sizeof(T));
    return u;
}
template <class T>
inline T from_bits(uint64_t u) {
    T v;
    std::memcpy(&v, &u, sizeof(T));
    return v;
}
template <class T>
T shfl(coll_kind k, unsigned mask, T v, int arg, int width, const char* file, int line) {
    return from_bits<T>(warp_collective(k, mask, to_bits(v), arg, width, file, line));
}
}  // namespace simt

#define __shfl_sync(mask, v, src, ...) ::simt::shfl_at(::simt::COLL_SHFL_IDX, mask, v, src, __FILE__, __LINE__, ##__VA_ARGS__)
#define __shfl_xor_sync(mask, v, m, ...) ::simt::shfl_at(::simt::COLL_SHFL_XOR, mask, v, m, __FILE__, __LINE__, ##__VA_ARGS__)
#define __shfl_down_sync(mask, v, d, ...) ::simt::shfl_at(::simt::COLL_SHFL_DOWN, mask, v, d, __FILE__, __LINE__, ##__VA_ARGS__)
#define __shfl_up_sync(mask, v, d, ...) ::simt::shfl_at(::simt::COLL_SHFL_UP, mask, v, d, __FILE__, __LINE__, ##__VA_ARGS__)
#define __ballot_sync(mask, p) ((unsigned)::simt::warp_collective(::simt::COLL_BALLOT, mask, (p) ? 1 : 0, 0, 32, __FILE__, __LINE__))
#define __any_sync(mask, p) ((int)::simt::warp_collective(::simt::COLL_ANY, mask, (p) ? 1 : 0, 0, 32, __FILE__, __LINE__))
#define __all_sync(mask, p) ((int)::simt::warp_collective(::simt::COLL_ALL, mask, (p) ? 1 : 0, 0, 32, __FILE__, __LINE__))

namespace simt {
template <class T>
T shfl_at(coll_kind k, unsigned mask, T v, int arg, const char* file, int line, int width = 32) {
    return shfl(k, mask, v, arg, width, file, line);
}
}  // namespace simt

// atomics: raw pointers (global memory, reached through a checked dptr) and
// tracked shared pointers
template <class T>
inline T atomicAdd(T* p, T v) { return simt::atomic_rmw(p, v, 0); }
template <class T>
inline T atomicMax(T* p, T v) { return simt::atomic_rmw(p, v, 1); }
template <class T>
inline T atomicMin(T* p, T v) { return simt::atomic_rmw(p, v, 2); }
template <class T>
inline T atomicExch(T* p, T v) { return simt::atomic_rmw(p, v, 3); }
#define SIMT_SHARED_ATOMIC(name, op)                                                               \
    template <class T>                                                                              \
    inline T name(const simt::sptr<T>& p, T v, const char* file = __builtin_FILE(), int line = __builtin_LINE()) { \
        return simt::atomic_rmw(p, v, op, file, line);                                              \
    }
SIMT_SHARED_ATOMIC(atomicAdd, 0)
SIMT_SHARED_ATOMIC(atomicMax, 1)
SIMT_SHARED_ATOMIC(atomicMin, 2)
SIMT_SHARED_ATOMIC(atomicExch, 3)
#undef SIMT_SHARED_ATOMIC
template <class T>
inline T atomicCAS(T* p, T cmp, T v) {
    __atomic_compare_exchange_n(p, &cmp, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
    return cmp;
}

// half precision: storage and explicit conversions (what the kernels use)
struct __half {
    uint16_t x;
};
struct __half2 {
    __half x, y;
};
inline __half __float2half_rn(float f) { return __half{simt::f32_to_f16_rn(f)}; }
inline __half __float2half(float f) { return __float2half_rn(f); }
inline float __half2float(__half h) { return simt::f16_to_f32(h.x); }
inline __half __ushort_as_half(unsigned short u) { return __half{u}; }
inline unsigned short __half_as_ushort(__half h) { return h.x; }
inline __half2 __halves2half2(__half a, __half b) { return __half2{a, b}; }
inline __half2 __floats2half2_rn(float a, float b) { return __half2{__float2half_rn(a), __float2half_rn(b)}; }
inline float __low2float(__half2 h) { return __half2float(h.x); }
inline float __high2float(__half2 h) { return __half2float(h.y); }

// math intrinsics (the full-precision host functions: the device ones differ
// by a few ulp, which the tests' tolerances cover)
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __fdividef(float a, float b) { return a / b; }
// rounded operations the compiler may not contract into an fma (as on a device)
inline float simt_no_contract(float p) {
#if defined(__x86_64__)
    __asm__("" : "+x"(p));
#else
    __asm__("" : "+r"(p));
#endif
    return p;
}
inline float __fmul_rn(float a, float b) { return simt_no_contract(a * b); }
inline float __fadd_rn(float a, float b) { return simt_no_contract(a + b); }
inline float __fsub_rn(float a, float b) { return simt_no_contract(a - b); }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }
inline int __float2int_rn(float x) { return (int)std::nearbyint(x); }
inline float __int_as_float(int x) { return simt::from_bits<float>((uint32_t)x); }
inline int __float_as_int(float x) { return (int)(uint32_t)simt::to_bits(x); }
inline unsigned __float_as_uint(float x) { return (uint32_t)simt::to_bits(x); }
inline float __uint_as_float(unsigned x) { return simt::from_bits<float>(x); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
// byte n of the result: byte (s >> 4n) & 7 of the 8 bytes y:x (x bytes 0-3, y 4-7); PRMT's default mode
// (a selector's bit 3, sign replication there, is not modelled: kernels keep it clear)
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    const uint64_t v = (uint64_t)y << 32 | x;
    unsigned r = 0;
    for (int n = 0; n < 4; n++) r |= (unsigned)((v >> (8 * ((s >> (4 * n)) & 7u))) & 0xFFu) << (8 * n);
    return r;
}
// c + the dot product of a's and b's four signed bytes (DP4A)
inline int __dp4a(int a, int b, int c) {
    for (int i = 0; i < 4; i++) c += (int)(int8_t)((uint32_t)a >> (8 * i)) * (int)(int8_t)((uint32_t)b >> (8 * i));
    return c;
}
inline int __ffs(unsigned x) { return __builtin_ffs((int)x); }
inline int __clz(unsigned x) { return x ? __builtin_clz(x) : 32; }
template <class T>
inline T __ldg(const T* p) { return *p; }
