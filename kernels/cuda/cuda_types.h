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

}  // namespace cuda
}  // namespace zk
