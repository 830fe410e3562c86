#include "kernels/cuda/kv_append.h"

#include "ggml-like/error.h"
#include "kernels/cuda/cuda_common.cuh"

namespace zk {
namespace cuda {

namespace {

constexpr int k_kv_block = 128;  // 4 warps

__device__ __forceinline__ float row_elem(const cuda_rows& s, int64_t t, int c) {
    return s.f32 ? (float)s.f32[t * s.stride + c] : h2f(s.f16[t * s.stride + c]);
}

// The next f16 above / below h (finite values), as engine/kv_quant.cpp steps.
__device__ __forceinline__ uint16_t f16_next_up(uint16_t h) {
    if (h == 0x8000) return 0x0001;
    return (h & 0x8000) ? (uint16_t)(h - 1) : (uint16_t)(h + 1);
}
__device__ __forceinline__ uint16_t f16_next_down(uint16_t h) {
    if (h == 0x0000) return 0x8001;
    return (h & 0x8000) ? (uint16_t)(h + 1) : (uint16_t)(h - 1);
}
// The f16 nearest x, moved up (down) until it is >= x (<= x).
__device__ inline uint16_t f16_ceil(float x) {
    uint16_t h = f2h(x);
    while (h2f(h) < x) h = f16_next_up(h);
    return h;
}
__device__ inline uint16_t f16_floor(float x) {
    uint16_t h = f2h(x);
    while (h2f(h) > x) h = f16_next_down(h);
    return h;
}

// round half away from zero, clamped to [lo, hi]
__device__ __forceinline__ int q_round(float v, int lo, int hi) {
    const int c = (int)roundf(v);
    return c < lo ? lo : (c > hi ? hi : c);
}

// 4-bit grid of values v (min mn, max mx): scale s16, min m16, and the
// reciprocal step the codes use.
__device__ inline void q4_grid(float mn, float mx, uint16_t& s16, uint16_t& m16, float& m, float& inv) {
    m16 = f16_floor(mn);
    m = h2f(m16);
    s16 = f16_ceil((mx - m) / 15.0f);
    const float s = h2f(s16);
    inv = s > 0 ? 1.0f / s : 0.0f;
}

__global__ void __launch_bounds__(k_kv_block)
    store_rows_kernel(cuda_rows src, dptr<float> dst32, dptr<uint16_t> dst16, int64_t slot0) {
    const int64_t k = (int64_t)blockIdx.x * k_kv_block + threadIdx.x;
    if (k >= src.n * src.r) return;
    const int64_t t = k / src.r;
    const int c = (int)(k % src.r);
    const float v = row_elem(src, t, c);
    const int64_t o = (slot0 + t) * src.r + c;
    if (dst32)
        dst32[o] = v;
    else
        dst16[o] = f2h(v);
}

// A warp per (token, block of 32 channels), a lane per channel.
__global__ void __launch_bounds__(k_kv_block)
    q8_kernel(cuda_rows src, dptr<int8_t> codes, dptr<uint16_t> scales, int64_t slot0) {
    const int nb = (src.r + 31) / 32;
    const int64_t wi = (int64_t)blockIdx.x * (k_kv_block / 32) + threadIdx.x / 32;
    if (wi >= src.n * nb) return;  // whole warps
    const int64_t t = wi / nb;
    const int b = (int)(wi % nb), c = 32 * b + (int)(threadIdx.x % 32);
    const float x = c < src.r ? row_elem(src, t, c) : 0.0f;
    const float amax = warp_max(fabsf(x));
    const uint16_t d = f16_ceil(amax / 127.0f);
    const float dv = h2f(d), inv = dv > 0 ? 1.0f / dv : 0.0f;
    const int64_t s = slot0 + t;
    if (c < src.r) codes[s * src.r + c] = (int8_t)q_round(x * inv, -127, 127);
    if (c == 32 * b) scales[s * nb + b] = d;
}

// A warp per (token, block of 32 channels); lane pairs share a code byte.
__global__ void __launch_bounds__(k_kv_block)
    q4_values_kernel(cuda_rows src, dptr<uint8_t> codes, dptr<uint16_t> scales, dptr<uint16_t> mins, int64_t slot0) {
    const int nb = (src.r + 31) / 32;
    const int64_t wi = (int64_t)blockIdx.x * (k_kv_block / 32) + threadIdx.x / 32;
    if (wi >= src.n * nb) return;
    const int64_t t = wi / nb;
    const int lane = threadIdx.x % 32, b = (int)(wi % nb), c = 32 * b + lane;
    const bool in = c < src.r;
    const float x = in ? row_elem(src, t, c) : 0.0f;
    const float mx = warp_max(in ? x : -INFINITY), mn = -warp_max(in ? -x : -INFINITY);
    uint16_t s16, m16;
    float m, inv;
    q4_grid(mn, mx, s16, m16, m, inv);
    const int q = in ? q_round((x - m) * inv, 0, 15) : 0;
    const int hi = __shfl_down_sync(k_full_mask, q, 1);
    const int64_t s = slot0 + t;
    if (in && lane % 2 == 0) codes[s * ((src.r + 1) / 2) + c / 2] = (uint8_t)(q | (hi << 4));
    if (lane == 0) scales[s * nb + b] = s16, mins[s * nb + b] = m16;
}

// A thread per pair of channels (one code byte per token).
__global__ void __launch_bounds__(k_kv_block)
    q4_keys_kernel(cuda_rows src, dptr<uint8_t> codes, dptr<uint16_t> gscales, dptr<uint16_t> gmins, int64_t slot0) {
    const int cp = blockIdx.x * k_kv_block + threadIdx.x;
    if (2 * cp >= src.r) return;
    const int rb = (src.r + 1) / 2;
    uint16_t s16[2], m16[2];
    float m[2], inv[2];
    for (int h = 0; h < 2; h++) {
        const int c = 2 * cp + h;
        if (c >= src.r) {
            m[h] = inv[h] = 0.0f;
            continue;
        }
        float mn = INFINITY, mx = -INFINITY;
        for (int64_t t = 0; t < src.n; t++) {
            const float v = row_elem(src, t, c);
            mn = fminf(mn, v);
            mx = fmaxf(mx, v);
        }
        q4_grid(mn, mx, s16[h], m16[h], m[h], inv[h]);
        gscales[c] = s16[h];
        gmins[c] = m16[h];
    }
    for (int64_t t = 0; t < src.n; t++) {
        const int lo = q_round((row_elem(src, t, 2 * cp) - m[0]) * inv[0], 0, 15);
        const int hi = 2 * cp + 1 < src.r ? q_round((row_elem(src, t, 2 * cp + 1) - m[1]) * inv[1], 0, 15) : 0;
        codes[(slot0 + t) * rb + cp] = (uint8_t)(lo | (hi << 4));
    }
}

void check_rows(const cuda_rows& s, const char* what) {
    if (!s.f32 == !s.f16) ZK_THROW("%s: exactly one of the f32 and f16 source rows must be given", what);
    if (s.r < 1 || s.n < 0) ZK_THROW("%s: %lld rows of %d channels", what, (long long)s.n, s.r);
}

unsigned blocks_for(int64_t n) { return (unsigned)((n + k_kv_block - 1) / k_kv_block); }

}  // namespace

void cuda_kv_store_rows(const cuda_rows& src, dptr<float> dst32, dptr<uint16_t> dst16, int64_t slot0,
                        cuda_stream stream) {
    check_rows(src, "cuda_kv_store_rows");
    if (!dst32 == !dst16) ZK_THROW("cuda_kv_store_rows: exactly one of the f32 and f16 destinations must be given");
    if (src.n == 0) return;
    ZK_LAUNCH(store_rows_kernel, dim3(blocks_for(src.n * src.r)), dim3(k_kv_block), 0, stream, src, dst32, dst16,
              slot0);
}

void cuda_kv_quantize_q8(const cuda_rows& src, dptr<int8_t> codes, dptr<uint16_t> scales, int64_t slot0,
                         cuda_stream stream) {
    check_rows(src, "cuda_kv_quantize_q8");
    if (src.n == 0) return;
    const int64_t warps = src.n * ((src.r + 31) / 32);
    ZK_LAUNCH(q8_kernel, dim3(blocks_for(32 * warps)), dim3(k_kv_block), 0, stream, src, codes, scales, slot0);
}

void cuda_kv_quantize_q4_values(const cuda_rows& src, dptr<uint8_t> codes, dptr<uint16_t> scales,
                                dptr<uint16_t> mins, int64_t slot0, cuda_stream stream) {
    check_rows(src, "cuda_kv_quantize_q4_values");
    if (src.n == 0) return;
    const int64_t warps = src.n * ((src.r + 31) / 32);
    ZK_LAUNCH(q4_values_kernel, dim3(blocks_for(32 * warps)), dim3(k_kv_block), 0, stream, src, codes, scales, mins,
              slot0);
}

void cuda_kv_quantize_q4_keys(const cuda_rows& src, dptr<uint8_t> codes, dptr<uint16_t> gscales,
                              dptr<uint16_t> gmins, int64_t slot0, cuda_stream stream) {
    check_rows(src, "cuda_kv_quantize_q4_keys");
    if (src.n < 1) ZK_THROW("cuda_kv_quantize_q4_keys: an empty group");
    ZK_LAUNCH(q4_keys_kernel, dim3(blocks_for((src.r + 1) / 2)), dim3(k_kv_block), 0, stream, src, codes, gscales,
              gmins, slot0);
}

}  // namespace cuda
}  // namespace zk
