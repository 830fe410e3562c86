// Reading one side (keys or values) of a cache block on the device, in any
// layout (kv_head.h): a slot's row element by element as attention sees it
// (dequantized, GEAR's low-rank part added), GEAR's sparse corrections, the
// KIVI group of a slot, and a chunk of rows staged into shared memory. The
// decode and prefill kernels share these; the arithmetic is the CPU's
// (engine/kv_quant.h: x = s code + m, s and m coded against the group's steps;
// Q8: x = d code).
#pragma once

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/kv_head.h"

namespace zk {
namespace cuda {

constexpr int k_kv_chunk = 32;            // slots per staged chunk (a lane per slot in the softmax)
constexpr uint16_t k_gear_none = 0xFFFF;  // KV_GEAR_NONE

__device__ __forceinline__ bool kv_is_kivi(int layout) { return layout == KV_LAYOUT_Q4 || layout == KV_LAYOUT_Q2; }
__device__ __forceinline__ int kv_kivi_bits(int layout) { return layout == KV_LAYOUT_Q4 ? 4 : 2; }
__device__ __forceinline__ int kv_blocks32(int r) { return (r + 31) / 32; }
// KIVI value grids per slot: blocks of KV_Q4_VBLOCK channels
__device__ __forceinline__ int kv_vblocks(int r) { return (r + KV_Q4_VBLOCK - 1) / KV_Q4_VBLOCK; }

// The group holding quantized slot s: the last g with group_start[g] <= s
// (group_start[0] = 0).
__device__ inline int32_t kv_group_of(const cuda_kv_head& kv, int64_t s) {
    int64_t lo = 0, hi = kv.n_groups - 1;
    while (lo < hi) {
        const int64_t mid = (lo + hi + 1) / 2;
        if (kv.group_start[mid] <= s)
            lo = mid;
        else
            hi = mid - 1;
    }
    return (int32_t)lo;
}

// The slots of the block whose group a KIVI side needs: [0, this) (0 when no
// side is KIVI; both KIVI sides of a block share the block's n_quant).
__device__ __forceinline__ int64_t kv_grouped_slots(const cuda_kv_head& kv) {
    return kv_is_kivi(kv.k.layout) ? kv.k.n_quant : (kv_is_kivi(kv.v.layout) ? kv.v.n_quant : 0);
}

// Where slot s's row of one side lies, worked out once per slot and read per
// channel by kv_row_elem.
enum kv_row_kind : int { KV_ROW_F32, KV_ROW_F16, KV_ROW_Q8, KV_ROW_KIVI_K, KV_ROW_KIVI_V, KV_ROW_VQ };
struct kv_row_at {
    int kind;
    int bits;    // KIVI: 4 or 2
    int64_t o;   // first element (rows, Q8) or byte (KIVI) of the row
    int64_t so;  // first scale (Q8, KIVI values: the slot's; KIVI keys: the group's)
    int64_t st;  // KIVI: the group's first step
    int32_t g;   // KIVI: the slot's group and its index in the group (GEAR)
    int t;
};

// Slot s of side d (r channels; keys: KIVI per channel over the group). g, t:
// the slot's KIVI group and index in it (read only for quantized KIVI slots).
__device__ inline kv_row_at kv_row(const cuda_kv_side& d, int type, bool keys, int r, int64_t s, int32_t g, int t) {
    kv_row_at w;
    w.bits = 0;
    w.so = 0;
    w.st = 0;
    w.g = g;
    w.t = t;
    if (s >= d.n_quant) {
        w.kind = type == CUDA_KV_F32 ? KV_ROW_F32 : KV_ROW_F16;
        w.o = (s - d.n_quant) * r;
    } else if (d.layout == KV_LAYOUT_Q8) {
        w.kind = KV_ROW_Q8;
        w.o = s * r;
        w.so = s * kv_blocks32(r);
    } else if (d.layout == KV_LAYOUT_VQ) {
        w.kind = KV_ROW_VQ;
        w.o = s * kv_vq_row_bytes(r / d.vq_c, d.vq_bits);
        w.so = s;
    } else {
        w.bits = kv_kivi_bits(d.layout);
        w.kind = keys ? KV_ROW_KIVI_K : KV_ROW_KIVI_V;
        w.o = s * (keys ? kv_key_row_bytes(w.bits, r, d.tail, d.zero, d.mid) : kv_kivi_row_bytes(w.bits, r));
        w.so = keys ? (int64_t)g * kv_key_grid_words(r, d.zero) : s * kv_vblocks(r);
        w.st = (int64_t)g * KV_GRID_STEPS;
    }
    return w;
}

// A KIVI grid's scale and min (a key channel's in a group, a value block's in
// a token) from its packed code and the group's or token's steps
// (kernels/attention.h: kivi_grid_scale, kivi_grid_min).
__device__ __forceinline__ float kv_grid_scale(uint32_t grid, float ds) { return ds * (float)(grid & 0xffu); }
__device__ __forceinline__ float kv_grid_min(uint32_t grid, float dm) {
    return dm * (float)(int8_t)(uint8_t)((grid >> 8) & 0xffu);
}

// KIVI codes without integer-to-float conversions (those issue at a quarter
// of the FMA rate on sm_80 / sm_90, with a longer latency, and the fast decode
// kernel converted one a key element and one a value element): a code
// (0 <= code < 128) set into bits 16.. of the mantissa of 0.5f reads as the
// float f = 0.5 + code / 256, exactly, and a grid's s code + m is then
// S f + M with S = 256 s (exact) and M = m - 128 s (kv_grid_fold): one FMA,
// M rounded once (|M| is at most |m| + 128 |s|: an error of a few f32 ulps
// of the grid's range, far below its step s).
__device__ __forceinline__ float kv_code_f(uint32_t code) { return __uint_as_float(0x3F000000u | (code << 16)); }
// Byte b (0-3) of w, a code below 128, as kv_code_f does: one byte permute.
__device__ __forceinline__ float kv_byte_f(uint32_t w, int b) {
    return __uint_as_float(__byte_perm(w, 0x3F000000u, 0x7054u | ((uint32_t)b << 8)));
}
// The N (4 or 8) 4-bit codes of a little-endian word (code j in bits 4j..4j+3)
// as floats.
template <int N>
__device__ __forceinline__ void kv_nibbles_f(uint32_t w, float (&f)[N]) {
    static_assert(N == 4 || N == 8, "a 16- or 32-bit word of codes");
    const uint32_t lo = w & 0x0F0F0F0Fu, hi = (w >> 4) & 0x0F0F0F0Fu;
    ZK_UNROLL
    for (int b = 0; b < N / 2; b++) f[2 * b] = kv_byte_f(lo, b), f[2 * b + 1] = kv_byte_f(hi, b);
}
// The n (<= 8) 2-bit codes of w (code j in bits 2j, 2j + 1) as floats.
template <int N>
__device__ __forceinline__ void kv_crumbs_f(uint32_t w, float (&f)[N]) {
    ZK_UNROLL
    for (int j = 0; j < N; j++) f[j] = kv_code_f((w >> (2 * j)) & 3u);
}
// (S, M) of a grid (scale s, min m) for the codes of kv_code_f.
__device__ __forceinline__ void kv_grid_fold(float s, float m, float& S, float& M) {
    S = 256.0f * s;
    M = __fmaf_rn(-128.0f, s, m);
}

// GEAR's low-rank part of element (t, c) of group g: sum_i A[t, i] B[c, i].
__device__ inline float kv_gear_lowrank(const cuda_kv_side& d, int group, int r, int32_t g, int t, int c) {
    const int k = d.gear_rank;
    float x = 0;
    for (int i = 0; i < k; i++)
        x += h2f(d.gear_a[((int64_t)g * group + t) * k + i]) * h2f(d.gear_b[((int64_t)g * r + c) * k + i]);
    return x;
}

// Channel c of the row as attention sees it (GEAR's sparse part is added by
// kv_gear_sparse). KIVI codes: channel c in bits (c bits) % 8 of byte c bits / 8.
__device__ inline float kv_row_elem(const cuda_kv_side& d, const kv_row_at& w, int group, int r, int c) {
    switch (w.kind) {
        case KV_ROW_F32: return d.rows32[w.o + c];
        case KV_ROW_F16: return h2f(d.rows16[w.o + c]);
        case KV_ROW_Q8: return (float)(int8_t)d.codes[w.o + c] * h2f(d.scale[w.so + c / KV_Q8_BLOCK]);
        case KV_ROW_VQ: {  // scale_s book[g][code_g], channel c of code g = c / vq_c
            const int g = c / d.vq_c, at = g * d.vq_bits;
            uint32_t b = d.codes[w.o + (at >> 3)];
            if ((at & 7) + d.vq_bits > 8) b |= (uint32_t)d.codes[w.o + (at >> 3) + 1] << 8;  // within the row
            const int code = (int)((b >> (at & 7)) & ((1u << d.vq_bits) - 1));
            return h2f(d.scale[w.so]) * d.vq_book[((int64_t)g * d.vq_k + code) * d.vq_c + c % d.vq_c];
        }
        default: break;
    }
    int code;
    if (w.kind == KV_ROW_KIVI_K && (d.tail | d.zero | d.mid)) {
        // a plan's key row: h4 codes of `bits` bits, mid 2-bit, tail 1-bit
        // (tail channel i: bit i / tb of byte i % tb), zero without codes
        const int rc = r - d.zero, h = rc - d.tail, h4 = h - d.mid;
        if (c >= rc) {  // 0-bit: the group's mean, dm x an int8 code stored after the rc grid codes
            const int i = c - rc;
            const uint32_t wd = d.scale[w.so + rc + i / 2];
            return h2f(d.min[w.st + 1]) * (float)(int8_t)(uint8_t)((wd >> (8 * (i & 1))) & 0xffu);
        }
        const int64_t o4 = w.o + kv_kivi_row_bytes(w.bits, h4);  // first byte of the 2-bit part
        if (c < h4) {
            const int b = c * w.bits;
            code = (d.codes[w.o + (b >> 3)] >> (b & 7)) & ((1 << w.bits) - 1);
        } else if (c < h) {
            const int j = c - h4;
            code = (d.codes[o4 + j / 4] >> (2 * (j & 3))) & 3;
        } else {
            const int i = c - h, tb = kv_tail_bytes(d.tail);
            code = (d.codes[o4 + kv_kivi_row_bytes(2, d.mid) + i % tb] >> (i / tb)) & 1;
        }
    } else {
        const int b = c * w.bits;
        code = (d.codes[w.o + (b >> 3)] >> (b & 7)) & ((1 << w.bits) - 1);
    }
    float x;
    const uint32_t gc = d.scale[w.so + (w.kind == KV_ROW_KIVI_K ? c : c / KV_Q4_VBLOCK)];
    x = kv_grid_scale(gc, h2f(d.min[w.st])) * (float)code + kv_grid_min(gc, h2f(d.min[w.st + 1]));
    if (d.gear_rank > 0) x += kv_gear_lowrank(d, group, r, w.g, w.t, c);
    return x;
}

// First entry of a group's sparse GEAR list (sorted t * r + c, KV_GEAR_NONE
// pads the end) at or after element `from`.
__device__ inline int kv_gear_first(dptr<const uint16_t> idx, int n_out, int from) {
    int lo = 0, hi = n_out;
    while (lo < hi) {
        const int mid = (lo + hi) / 2;
        if ((int)idx[mid] < from)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

// f(c, value) for each sparse GEAR correction of token t of group g (r channels).
template <class F>
__device__ inline void kv_gear_sparse(const cuda_kv_side& d, int r, int32_t g, int t, F&& f) {
    dptr<const uint16_t> idx = d.gear_idx + (int64_t)g * d.gear_nout;
    dptr<const uint16_t> val = d.gear_val + (int64_t)g * d.gear_nout;
    for (int e = kv_gear_first(idx, d.gear_nout, t * r); e < d.gear_nout; e++) {
        const int i = idx[e];
        if (i == k_gear_none || i >= (t + 1) * r) break;
        f(i - t * r, h2f(val[e]));
    }
}

// Chunk slots [c0, c0 + n) (n <= k_kv_chunk): the KIVI group of each grouped
// slot and its index in the group, into sg/st [k_kv_chunk] (a thread per slot;
// the caller's barrier publishes them).
__device__ inline void kv_chunk_groups(const cuda_kv_head& kv, int64_t c0, int n, sptr<int32_t> sg,
                                       sptr<int32_t> st) {
    const int tid = threadIdx.x;
    if (tid < n && c0 + tid < kv_grouped_slots(kv)) {
        const int32_t g = kv_group_of(kv, c0 + tid);
        sg[tid] = g;
        st[tid] = (int)(c0 + tid - kv.group_start[g]);
    }
}

// Stages rows [c0, c0 + n) of side d (r channels) as f32 into dst [n x ld]
// (row sl at sl * ld, ld >= r), dequantized with GEAR's corrections; sink: the
// exact f32 rows of sink_dim = r channels instead (keys: sink_k). sg/st from
// kv_chunk_groups, already visible. Every thread of the block calls it (it has
// a barrier when the side has sparse corrections); the caller's barrier
// publishes dst.
__device__ inline void kv_stage_chunk(const cuda_kv_head& kv, const cuda_kv_side& d, bool keys, bool sink, int r,
                                      int64_t c0, int n, sptr<int32_t> sg, sptr<int32_t> st, sptr<float> dst, int ld,
                                      int n_threads) {
    const int tid = threadIdx.x;
    if (sink) {
        dptr<const float> rows = keys ? kv.sink_k : kv.sink_v;
        for (int i = tid; i < n * r; i += n_threads)
            dst[(i / r) * ld + i % r] = rows[(int64_t)kv.pos[c0 + i / r] * kv.sink_dim + i % r];
        return;
    }
    const bool kivi = kv_is_kivi(d.layout);
    for (int i = tid; i < n * r; i += n_threads) {
        const int sl = i / r, c = i % r;
        const int64_t s = c0 + sl;
        const bool grouped = kivi && s < d.n_quant;
        const kv_row_at w = kv_row(d, kv.type, keys, r, s, grouped ? (int32_t)sg[sl] : 0, grouped ? (int)st[sl] : 0);
        dst[sl * ld + c] = kv_row_elem(d, w, kv.group, r, c);
    }
    if (kivi && d.gear_nout > 0) {
        __syncthreads();  // dense part written
        // sparse corrections: a thread per slot, each touching its own row
        if (tid < n && c0 + tid < d.n_quant)
            kv_gear_sparse(d, r, sg[tid], st[tid], [&](int c, float x) { dst[tid * ld + c] += x; });
    }
}

}  // namespace cuda
}  // namespace zk
