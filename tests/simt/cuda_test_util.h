// Helpers of the CUDA kernel tests (harness and device builds alike): a CPU
// kv_cache block copied to device memory at its used size, and comparisons
// with a stated tolerance.
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
        if (n) cuda::cuda_copy_to_host(h.data(), (const void*)&*d, n * sizeof(T));
        return h;
    }

private:
    std::vector<std::unique_ptr<void, void (*)(void*)>> own_;
};

// Block (layer, head) of c in device memory, every array at exactly the size
// the block uses (a read past the last slot, group or row is out of bounds in
// the harness).
inline cuda::cuda_kv_head upload_kv_block(device_pool& pool, const kv_cache& c, int layer, int head) {
    const kv_block& b = c.block(layer, head);
    const attn_kv_view v = c.view(layer, head);
    const kv_cache_params& p = c.params();
    cuda::cuda_kv_head h;
    h.type = v.type == dtype::F32 ? cuda::CUDA_KV_F32 : cuda::CUDA_KV_F16;
    h.quant = v.quant;
    h.r_k = v.r_k;
    h.r_v = v.r_v;
    h.n_slots = v.n_slots;
    h.n_quant = v.n_quant;
    h.pos = pool.up(b.pos.data(), (size_t)v.n_slots, "pos");
    const size_t nf = (size_t)(v.n_slots - v.n_quant);
    if (v.type == dtype::F32) {
        h.k32 = pool.up((const float*)b.k.data(), nf * v.r_k, "k rows");
        h.v32 = pool.up((const float*)b.v.data(), nf * v.r_v, "v rows");
    } else {
        h.k16 = pool.up((const uint16_t*)b.k.data(), nf * v.r_k, "k rows");
        h.v16 = pool.up((const uint16_t*)b.v.data(), nf * v.r_v, "v rows");
    }
    const size_t nq = (size_t)v.n_quant;
    if (v.quant == KV_QUANT_Q8) {
        h.kq8 = pool.up((const int8_t*)b.kq.data(), nq * v.r_k, "k codes");
        h.vq8 = pool.up((const int8_t*)b.vq.data(), nq * v.r_v, "v codes");
        h.ks = pool.up(b.ks.data(), nq * kv_n_blocks(v.r_k, KV_Q8_BLOCK), "k scales");
        h.vs = pool.up(b.vs.data(), nq * kv_n_blocks(v.r_v, KV_Q8_BLOCK), "v scales");
    } else if (v.quant == KV_QUANT_Q4) {
        const size_t ng = (size_t)v.n_groups;
        h.kq4 = pool.up(b.kq.data(), nq * kv_q4_row_bytes(v.r_k), "k codes");
        h.vq4 = pool.up(b.vq.data(), nq * kv_q4_row_bytes(v.r_v), "v codes");
        h.ks = pool.up(b.ks.data(), ng * v.r_k, "k scales");
        h.km = pool.up(b.km.data(), ng * v.r_k, "k mins");
        h.vs = pool.up(b.vs.data(), nq * kv_n_blocks(v.r_v, KV_Q4_VBLOCK), "v scales");
        h.vm = pool.up(b.vm.data(), nq * kv_n_blocks(v.r_v, KV_Q4_VBLOCK), "v mins");
        h.group = v.group;
        h.n_groups = v.n_groups;
        h.group_start = pool.up(b.group_start.data(), ng + 1, "group starts");
        if (v.gear_k.rank > 0 || v.gear_k.n_out > 0) {
            const int k = v.gear_k.rank;
            h.gear_rank = k;
            h.gear_nout_k = v.gear_k.n_out;
            h.gear_nout_v = v.gear_v.n_out;
            h.ka = pool.up(b.ka.data(), ng * v.group * k, "gear k A");
            h.kb = pool.up(b.kb.data(), ng * v.r_k * k, "gear k B");
            h.koi = pool.up(b.koi.data(), ng * v.gear_k.n_out, "gear k idx");
            h.kov = pool.up(b.kov.data(), ng * v.gear_k.n_out, "gear k val");
            h.va = pool.up(b.va.data(), ng * v.group * k, "gear v A");
            h.vb = pool.up(b.vb.data(), ng * v.r_v * k, "gear v B");
            h.voi = pool.up(b.voi.data(), ng * v.gear_v.n_out, "gear v idx");
            h.vov = pool.up(b.vov.data(), ng * v.gear_v.n_out, "gear v val");
        }
    }
    if (v.n_sink_slots > 0) {
        h.n_sink_slots = v.n_sink_slots;
        h.sink_dim = v.sink_dim;
        h.sink_k = pool.up(b.sink_k.data(), (size_t)p.sinks * p.sink_dim, "sink k");
        h.sink_v = pool.up(b.sink_v.data(), (size_t)p.sinks * p.sink_dim, "sink v");
    }
    return h;
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
