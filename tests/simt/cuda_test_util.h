// Helpers of the CUDA kernel tests (harness and device builds alike): a CPU
// kv_cache block copied to device memory at its used size (through its
// attn_kv_view), and comparisons with a stated tolerance.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/kv_cache.h"
#include "engine/kv_quant.h"
#include "ggml-like/error.h"
#include "kernels/attention.h"
#include "kernels/cuda/attention_decode.h"
#include "kernels/cuda/kv_head.h"
#include "kernels/cuda/cuda_device.h"

namespace zk {
namespace cuda_test {

using cuda::dptr;

// Device buffers that live as long as the object (type-erased owners).
class device_pool {
public:
    template <class T>
    dptr<const T> up(const T* h, size_t n, const char* name) {
        if (n == 0 || !h) return dptr<const T>();
        T* d = (T*)cuda::cuda_malloc(n * sizeof(T), name);
        own_.emplace_back(d, [](void* p) { cuda::cuda_free(p); });
        cuda::cuda_copy_to_device(d, h, n * sizeof(T));
        return dptr<const T>(d);
    }
    void* up_bytes(const void* h, size_t bytes, const char* name) {
        if (bytes == 0 || !h) return nullptr;
        void* d = cuda::cuda_malloc(bytes, name);
        own_.emplace_back(d, [](void* p) { cuda::cuda_free(p); });
        cuda::cuda_copy_to_device(d, h, bytes);
        return d;
    }
    template <class T>
    dptr<const T> up(const std::vector<T>& h, const char* name) {
        return up(h.data(), h.size(), name);
    }
    template <class T>
    dptr<T> zeros(size_t n, const char* name) {
        T* d = (T*)cuda::cuda_malloc(n * sizeof(T), name);
        own_.emplace_back(d, [](void* p) { cuda::cuda_free(p); });
        cuda::cuda_memset(d, 0, n * sizeof(T));
        return dptr<T>(d);
    }
    template <class T>
    std::vector<T> down(dptr<T> d, size_t n) {
        std::vector<typename std::remove_const<T>::type> h(n);
        if (n) cuda::cuda_copy_to_host(h.data(), (const void*)cuda::dptr_addr(d), n * sizeof(T));
        return h;
    }

private:
    std::vector<std::unique_ptr<void, void (*)(void*)>> own_;
};

// Block (layer, head) of c in device memory, from its attn_kv_view: every
// array at exactly the size the block uses (cuda_kv_side_extent_of), so a read
// past the last slot, group or row is out of bounds in the harness.
inline cuda::cuda_kv_head upload_kv_block(device_pool& pool, const kv_cache& c, int layer, int head) {
    return cuda::cuda_kv_head_from_view(c.view(layer, head), [&](const void* h, size_t bytes, const char* name) {
        return pool.up_bytes(h, bytes, name);
    });
}

// The bits of a float (bit-exact comparisons).
inline uint32_t simt_bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}

// max |a - b| / (1 + max |b|): the error relative to the reference's scale.
inline double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
    double e = 0, m = 0;
    for (size_t i = 0; i < a.size(); i++) {
        if (std::isinf(a[i]) || std::isinf(b[i])) {
            if (a[i] != b[i]) return INFINITY;
            continue;
        }
        e = std::max(e, (double)std::fabs(a[i] - b[i]));
        m = std::max(m, (double)std::fabs(b[i]));
    }
    return e / (1.0 + m);
}

}  // namespace cuda_test
}  // namespace zk
