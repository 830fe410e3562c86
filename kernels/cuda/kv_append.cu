#include "kernels/cuda/kv_append.h"

#include "ggml-like/error.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_device.h"

namespace zk {
namespace cuda {

namespace {

constexpr int k_kv_block = 128;  // 4 warps

__device__ __forceinline__ float row_elem(const cuda_rows& s, int64_t t, int c) {
    return s.f32 ? (float)s.f32[t * s.stride + c] : h2f(s.f16[t * s.stride + c]);
}

// The next f16 above h (finite values), as engine/kv_quant.cpp steps.
__device__ __forceinline__ uint16_t f16_next_up(uint16_t h) {
    if (h == 0x8000) return 0x0001;
    return (h & 0x8000) ? (uint16_t)(h - 1) : (uint16_t)(h + 1);
}
// The f16 nearest x, moved up until it is >= x.
__device__ inline uint16_t f16_ceil(float x) {
    uint16_t h = f2h(x);
    while (h2f(h) < x) h = f16_next_up(h);
    return h;
}

// round half away from zero, clamped to [lo, hi]
__device__ __forceinline__ int q_round(float v, int lo, int hi) {
    const int c = (int)roundf(v);
    return c < lo ? lo : (c > hi ? hi : c);
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

// The block's n grids [lo_i, hi_i] (shared, each thread its own i's) coded as
// kvq_grid_codes does: steps dm (max |lo| / 127, mabs: this thread's part of
// that maximum) and ds, rounded up to f16, written to step; the codes to grid
// [n]. Then lo_i and hi_i hold the coded min and scale. Ends with a barrier.
__device__ inline void code_grids(int bits, int n, sptr<float> lo, sptr<float> hi, float mabs, sptr<float> red,
                                  dptr<uint16_t> grid, dptr<uint16_t> step) {
    const int top = (1 << bits) - 1;
    const uint16_t dm16 = f16_ceil(block_max(mabs, red) / 127.0f);
    const float dm = h2f(dm16);
    float smax = 0;
    for (int i = threadIdx.x; i < n; i += k_kv_block) {
        const float mc = dm > 0 ? fminf(fmaxf(floorf(lo[i] / dm), -127.0f), 127.0f) : 0.0f;
        smax = fmaxf(smax, fmaf(-dm, mc, hi[i]) / (float)top);
    }
    const uint16_t ds16 = f16_ceil(block_max(smax, red) / 255.0f);
    const float ds = h2f(ds16);
    for (int i = threadIdx.x; i < n; i += k_kv_block) {
        const float mc = dm > 0 ? fminf(fmaxf(floorf(lo[i] / dm), -127.0f), 127.0f) : 0.0f;
        const float need = fmaf(-dm, mc, hi[i]) / (float)top;
        const int sc = ds > 0 ? (int)fminf(fmaxf(ceilf(need / ds), 0.0f), 255.0f) : 0;
        grid[i] = (uint16_t)(sc | (((int)mc & 0xff) << 8));
        lo[i] = __fmul_rn(dm, mc);  // the coded min and scale from here on
        hi[i] = __fmul_rn(ds, (float)sc);
    }
    if (threadIdx.x == 0) step[0] = ds16, step[1] = dm16;
    __syncthreads();
}

// One block per group: a warp per token (strided) finds its blocks' ranges
// (warp maxima; a lane takes every 32nd channel of a block of KV_Q4_VBLOCK),
// the block codes the (token, block) grids against the group's steps
// (code_grids), then a warp per token writes its codes, a lane per channel of
// each 32; the 8 / bits lanes of a code byte pass their codes to its first lane
// (32 is a multiple of 8 / bits). lo, hi: dynamic shared [n x nb] floats each.
__global__ void __launch_bounds__(k_kv_block)
    kivi_values_kernel(int bits, cuda_rows src, dptr<uint8_t> codes, dptr<uint16_t> grid, dptr<uint16_t> step,
                       int64_t slot0) {
    ZK_SHARED_DYNAMIC(smem);
    ZK_SHARED(float, red, 32);
    constexpr int warps = k_kv_block / 32;
    static_assert(KV_Q4_VBLOCK % 32 == 0, "whole warps a value block");
    const int nb = (src.r + KV_Q4_VBLOCK - 1) / KV_Q4_VBLOCK, n = (int)src.n, per = 8 / bits, top = (1 << bits) - 1;
    const int lane = threadIdx.x % 32, wid = threadIdx.x / 32, rb = (src.r * bits + 7) / 8;
    const auto lo = smem_take<float>(smem, n * nb, "lo");
    const auto hi = smem_take<float>(smem, n * nb, "hi");
    for (int t = wid; t < n; t += warps)
        for (int b = 0; b < nb; b++) {
            float mx = -INFINITY, mn = INFINITY;
            for (int c = KV_Q4_VBLOCK * b + lane; c < KV_Q4_VBLOCK * (b + 1) && c < src.r; c += 32) {
                const float x = row_elem(src, t, c);
                mx = fmaxf(mx, x), mn = fminf(mn, x);
            }
            mx = warp_max(mx), mn = -warp_max(-mn);
            if (lane == 0) lo[t * nb + b] = mn, hi[t * nb + b] = mx;
        }
    __syncthreads();  // the ranges written
    float mabs = 0;
    for (int i = threadIdx.x; i < n * nb; i += k_kv_block) mabs = fmaxf(mabs, fabsf(lo[i]));
    code_grids(bits, n * nb, lo, hi, mabs, red, grid + slot0 * nb, step);
    for (int t = wid; t < n; t += warps)
        for (int c0 = 0; c0 < src.r; c0 += 32) {
            const int c = c0 + lane, b = c0 / KV_Q4_VBLOCK;
            const bool in = c < src.r;
            const float m = lo[t * nb + b], sv = hi[t * nb + b];
            const float inv = sv > 0 ? 1.0f / sv : 0.0f;
            const int q = in ? q_round((row_elem(src, t, c) - m) * inv, 0, top) : 0;
            int byte = q;
            for (int k = 1; k < per; k++) byte |= __shfl_down_sync(k_full_mask, q, k) << (bits * k);
            if (in && lane % per == 0) codes[(slot0 + t) * rb + c / per] = (uint8_t)byte;
        }
}

// The squared error of grid [lo, hi] over a key channel's n values, as
// engine/kv_quant.cpp's kvq_key_grid_sse computes it bit for bit: explicit
// fmas, codes rounded half to even, 8 lanes (token t in lane t % 8) reduced in
// a fixed tree.
__device__ inline float key_grid_sse(int bits, const cuda_rows& src, int c, float lo, float hi) {
    const int top = (1 << bits) - 1;
    const float st = (hi - lo) / (float)top, inv = 1.0f / st;
    float e[8] = {0, 0, 0, 0, 0, 0, 0, 0};  // in registers: lanes unrolled
    for (int64_t t0 = 0; t0 < src.n; t0 += 8) {
        ZK_UNROLL
        for (int l = 0; l < 8; l++) {
            if (t0 + l < src.n) {
                const float v = row_elem(src, t0 + l, c);
                const float q = fminf(fmaxf(rintf((v - lo) * inv), 0.0f), (float)top);
                const float d = v - fmaf(st, q, lo);
                e[l] = fmaf(d, d, e[l]);
            }
        }
    }
    return ((e[0] + e[1]) + (e[2] + e[3])) + ((e[4] + e[5]) + (e[6] + e[7]));
}

// The clipped grid of channel c (kvq_key_grid_search's twin).
__device__ inline void key_grid_search(int bits, const cuda_rows& src, int c, float& lo, float& hi) {
    float mn = INFINITY, mx = -INFINITY;
    for (int64_t t = 0; t < src.n; t++) {
        const float v = row_elem(src, t, c);
        mn = fminf(mn, v);
        mx = fmaxf(mx, v);
    }
    lo = mn, hi = mx;
    if (!(mx > mn)) return;
    const float R = mx - mn;
    float be = key_grid_sse(bits, src, c, mn, mx);
    for (int a = 0; a <= KV_KEY_CLIP_STEPS; a++)
        for (int b = 0; b <= KV_KEY_CLIP_STEPS; b++) {
            if (a == 0 && b == 0) continue;
            const float l = fmaf(R, KV_KEY_CLIP_STEP * (float)a, mn), h = fmaf(R, -KV_KEY_CLIP_STEP * (float)b, mx);
            if (!(h > l)) continue;
            const float e = key_grid_sse(bits, src, c, l, h);
            if (e < be) be = e, lo = l, hi = h;
        }
}

// One block per group: a thread per channel (strided) finds its clipped grid
// (key_grid_search), the block agrees on the group's steps (maxima), each
// channel's grid is coded as kvq_grid_codes does, then a thread per code
// byte writes its byte of every token. lo, hi: dynamic shared [r] floats each.
__global__ void __launch_bounds__(k_kv_block)
    kivi_keys_kernel(int bits, cuda_rows src, dptr<uint8_t> codes, dptr<uint16_t> grid, dptr<uint16_t> step,
                     int64_t slot0) {
    ZK_SHARED_DYNAMIC(smem);
    ZK_SHARED(float, red, 32);
    const auto lo = smem_take<float>(smem, src.r, "lo");
    const auto hi = smem_take<float>(smem, src.r, "hi");
    const int per = 8 / bits, top = (1 << bits) - 1, r = src.r;
    float mabs = 0;
    for (int c = threadIdx.x; c < r; c += k_kv_block) {
        float l, h;
        key_grid_search(bits, src, c, l, h);
        lo[c] = l, hi[c] = h;
        mabs = fmaxf(mabs, fabsf(l));
    }
    code_grids(bits, r, lo, hi, mabs, red, grid, step);
    const int rb = (r * bits + 7) / 8;
    for (int cb = threadIdx.x; cb < rb; cb += k_kv_block) {
        float m[4], inv[4];  // per channel of the byte (per <= 4)
        ZK_UNROLL
        for (int h = 0; h < 4; h++) {
            const int c = cb * per + h;
            const bool in = h < per && c < r;
            m[h] = in ? lo[c] : 0.0f;
            inv[h] = in && hi[c] > 0 ? 1.0f / hi[c] : 0.0f;
        }
        for (int64_t t = 0; t < src.n; t++) {
            int byte = 0;
            ZK_UNROLL
            for (int h = 0; h < 4; h++) {
                const int c = cb * per + h;
                if (h < per && c < r) byte |= q_round((row_elem(src, t, c) - m[h]) * inv[h], 0, top) << (bits * h);
            }
            codes[(slot0 + t) * rb + cb] = (uint8_t)byte;
        }
    }
}

void check_rows(const cuda_rows& s, const char* what) {
    if (!s.f32 == !s.f16) ZK_THROW("%s: exactly one of the f32 and f16 source rows must be given", what);
    if (s.r < 1 || s.n < 0) ZK_THROW("%s: %lld rows of %d channels", what, (long long)s.n, s.r);
}

void check_bits(int bits, const char* what) {
    if (bits != 4 && bits != 2) ZK_THROW("%s: %d-bit KIVI codes (4 or 2)", what, bits);
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

void cuda_kv_quantize_kivi_values(int bits, const cuda_rows& src, dptr<uint8_t> codes, dptr<uint16_t> grid,
                                  dptr<uint16_t> step, int64_t slot0, cuda_stream stream) {
    check_rows(src, "cuda_kv_quantize_kivi_values");
    check_bits(bits, "cuda_kv_quantize_kivi_values");
    const int64_t ng = src.n * ((src.r + KV_Q4_VBLOCK - 1) / KV_Q4_VBLOCK);
    if (src.n < 1) ZK_THROW("cuda_kv_quantize_kivi_values: an empty group");
    if (ng > KV_VALUE_MAX_GRIDS)
        ZK_THROW("cuda_kv_quantize_kivi_values: %lld tokens x %d channels (at most %d blocks of %d)", (long long)src.n,
                 src.r, KV_VALUE_MAX_GRIDS, KV_Q4_VBLOCK);
    ZK_LAUNCH(kivi_values_kernel, dim3(1), dim3(k_kv_block), 2 * sizeof(float) * ng, stream, bits, src, codes, grid,
              step, slot0);
}

void cuda_kv_quantize_kivi_keys(int bits, const cuda_rows& src, dptr<uint8_t> codes, dptr<uint16_t> grid,
                                dptr<uint16_t> step, int64_t slot0, cuda_stream stream) {
    check_rows(src, "cuda_kv_quantize_kivi_keys");
    check_bits(bits, "cuda_kv_quantize_kivi_keys");
    if (src.n < 1) ZK_THROW("cuda_kv_quantize_kivi_keys: an empty group");
    if (src.r > KV_KEY_MAX_R) ZK_THROW("cuda_kv_quantize_kivi_keys: %d channels (at most %d)", src.r, KV_KEY_MAX_R);
    ZK_LAUNCH(kivi_keys_kernel, dim3(1), dim3(k_kv_block), 2 * sizeof(float) * src.r, stream, bits, src, codes, grid,
              step, slot0);
}

// ---- per side, as kv_side::append / flush ----

namespace {

bool side_kivi(const cuda_kv_side_store& d) { return d.layout == KV_LAYOUT_Q4 || d.layout == KV_LAYOUT_Q2; }

// Rows [0, n) of the side's window (or rows) as a source.
cuda_rows window_rows(const cuda_kv_side_store& d, int64_t n) {
    cuda_rows s;
    s.f32 = d.rows32;
    s.f16 = d.rows16;
    s.stride = d.r;
    s.n = n;
    s.r = d.r;
    return s;
}

// Quantizes src into the side's codes at slot s0 (group g: KIVI keys' scales).
void quantize(const cuda_kv_side_store& d, const cuda_rows& src, int64_t g, int64_t s0, cuda_stream stream) {
    if (d.layout == KV_LAYOUT_Q8) {
        cuda_kv_quantize_q8(src, dptr_as<int8_t>(d.codes), d.scale, s0, stream);
    } else if (d.keys) {
        cuda_kv_quantize_kivi_keys(d.layout == KV_LAYOUT_Q4 ? 4 : 2, src, d.codes, d.scale + g * d.r,
                                   d.min + g * KV_GRID_STEPS, s0, stream);
    } else {
        cuda_kv_quantize_kivi_values(d.layout == KV_LAYOUT_Q4 ? 4 : 2, src, d.codes, d.scale, d.min + g * KV_GRID_STEPS,
                                     s0, stream);
    }
}

}  // namespace

void cuda_kv_side_append(const cuda_kv_side_store& d, const cuda_rows& src, int64_t s0, int64_t rs0,
                         cuda_stream stream) {
    if (d.layout < KV_LAYOUT_ROWS || d.layout >= KV_LAYOUT_COUNT || (side_kivi(d) && !d.windowed))
        ZK_THROW("cuda_kv_side_append: layout %d in a %s block", d.layout, d.windowed ? "windowed" : "plain");
    if (d.layout == KV_LAYOUT_ROWS)
        cuda_kv_store_rows(src, d.rows32, d.rows16, s0, stream);
    else if (d.windowed)
        cuda_kv_store_rows(src, d.rows32, d.rows16, rs0, stream);
    else
        quantize(d, src, -1, s0, stream);  // 8-bit, each token as it arrives
}

void cuda_kv_side_flush(const cuda_kv_side_store& d, int64_t g, int64_t s0, int n, int64_t rest, void* scratch,
                        cuda_stream stream) {
    if (d.layout == KV_LAYOUT_ROWS) return;  // every slot is a row already
    if (!d.windowed) ZK_THROW("cuda_kv_side_flush: layout %d in a block without a window", d.layout);
    quantize(d, window_rows(d, n), g, s0, stream);
    if (rest <= 0) return;
    const size_t es = d.rows32 ? sizeof(float) : sizeof(uint16_t), row = (size_t)d.r * es;
    char* base = d.rows32 ? (char*)dptr_addr(d.rows32) : (char*)dptr_addr(d.rows16);
    cuda_copy_on_device(scratch, base + (size_t)n * row, (size_t)rest * row, stream);
    cuda_copy_on_device(base, scratch, (size_t)rest * row, stream);
}

}  // namespace cuda
}  // namespace zk
