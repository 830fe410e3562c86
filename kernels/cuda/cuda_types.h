// Types the CUDA launchers' host API shares with their callers (a backend, the
// tests): device pointers and streams. Plain C++: no CUDA header needed.
//   dptr<T>  a pointer to device memory. Under nvcc (and in any build that does
//            not define ZK_SIMT) a raw T*; in the SIMT harness build
//            (tests/simt) a pointer bound to the buffer it points into, so every
//            kernel access is bounds-checked.
//   cuda_stream  a cudaStream_t (nullptr: the default stream).
#pragma once
#include <cstdint>

#if defined(ZK_SIMT)
#include "tests/simt/simt_mem.h"
#endif

namespace zk {
namespace cuda {

#if defined(ZK_SIMT)
template <class T>
using dptr = simt::gptr<T>;
#else
template <class T>
using dptr = T*;
#endif

using cuda_stream = void*;

// Host code: the address a device pointer holds (copies, memsets), and the
// same device memory viewed as another type (the harness keeps the binding).
#if defined(ZK_SIMT)
template <class T>
inline T* dptr_addr(dptr<T> p) {
    return p.get();
}
template <class U, class T>
inline dptr<U> dptr_as(dptr<T> p) {
    return dptr<U>((U*)p.get(), p.buf());
}
#else
template <class T>
inline T* dptr_addr(T* p) {
    return p;
}
template <class U, class T>
inline U* dptr_as(T* p) {
    return (U*)p;
}
#endif

}  // namespace cuda
}  // namespace zk
