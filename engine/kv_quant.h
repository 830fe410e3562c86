// Quantization of KV cache rows and groups in the layouts described in
// kernels/attention.h (the attention kernel reads them without dequantizing the
// cache), their exact inverses for tests and re-packing, and the GEAR error
// correction. Scales are rounded up and mins down, so that every input inside
// a grid's range stays within half a step: 8-bit and value grids span their
// data, key grids may be clipped (kvq_key_grid_search); 4-/2-bit grids are
// stored as 8-bit codes against two f16 steps (kvq_grid_codes).
#pragma once
#include <cstdint>

#include "kernels/attention.h"

namespace zk {

// ---- 8-bit, per token: blocks of KV_Q8_BLOCK channels, symmetric ----
// x [r] -> codes [r], d [blocks(r)]
void kvq_quantize_q8_row(const float* x, int r, int8_t* codes, uint16_t* d);
void kvq_dequantize_q8_row(const int8_t* codes, const uint16_t* d, int r, float* x);

// ---- 4-bit and 2-bit (KIVI) ----
// Codes of `bits` = 4 or 2 bits, 8 / bits per byte, channel c at byte
// c * bits / 8, lowest bits first; rows of kv_qb_row_bytes(bits, r) bytes.
// Asymmetric grids of 2^bits levels: x = s * code + m.
inline int kv_qb_row_bytes(int bits, int r) { return kv_kivi_row_bytes(bits, r); }

// Values, per token in blocks of KV_Q4_VBLOCK channels, a group of n tokens at
// a time: each (token, block) grid spans its values and is coded against the
// group's steps (kvq_grid_codes; Qwen2.5-Coder-1.5B, 2-bit cache: 3 -> 2.5
// bits a value; blocks of 64 rather than 32: 2.26 bits, KLD 0.0299 against
// 0.0297; blocks of 128: 0.0427). X [n x r] (row stride r) -> codes
// [n x row_bytes(r)], grid [n x vblocks(r)], step [KV_GRID_STEPS];
// n x vblocks(r) <= KV_VALUE_MAX_GRIDS.
// skip (optional, [n x r]): as for keys.
void kvq_quantize_values(int bits, const float* X, int n, int r, uint8_t* codes, uint16_t* grid, uint16_t* step,
                         const uint8_t* skip = nullptr);
void kvq_dequantize_values(int bits, const uint8_t* codes, const uint16_t* grid, const uint16_t* step, int n, int r,
                           float* X);
// One token: a group of one; its row of a group (the group's steps).
inline void kvq_quantize_vrow(int bits, const float* x, int r, uint8_t* codes, uint16_t* grid, uint16_t* step) {
    kvq_quantize_values(bits, x, 1, r, codes, grid, step);
}
void kvq_dequantize_vrow(int bits, const uint8_t* codes, const uint16_t* grid, const uint16_t* step, int r,
                         float* x);

// Keys, per channel over a group of n tokens, X [n x r] (row stride r) ->
// codes [n x row_bytes(r)], grid [r] (packed scale and min codes, see
// kernels/attention.h) and step [KV_GRID_STEPS] (the group's f16 ds, dm).
// A channel's grid is clipped where that lowers its squared error
// (kvq_key_grid_search), then coded against the group's steps
// (kvq_grid_codes, which rounds mins down and scales up, so the clipped
// range stays inside the grid). skip (optional, [n x r]): elements left out of
// the grid (GEAR outliers; their codes are clamped and a sparse correction
// restores them).
// tail: the last `tail` channels (at most KV_KEY_TAIL_MAX) in 1-bit codes
// after the others (kernels/attention.h), their two levels from
// kvq_key_levels_1bit; rows of kv_key_row_bytes(bits, r, tail, zero) bytes.
// zero: the last `zero` channels have no codes, each the mean of its (kept)
// values, their min codes after the others' grid codes (grid then holds
// kv_key_grid_words(r, zero) words); the tail comes before them.
// mid (4-bit keys): the `mid` channels before the tail in 2-bit codes, their
// grids searched as 2-bit ones (kernels/attention.h).
void kvq_quantize_keys(int bits, const float* X, int n, int r, uint8_t* codes, uint16_t* grid, uint16_t* step,
                       const uint8_t* skip = nullptr, int tail = 0, int zero = 0, int mid = 0);
void kvq_dequantize_keys(int bits, const uint8_t* codes, const uint16_t* grid, const uint16_t* step, int n, int r,
                         float* X, int tail = 0, int zero = 0, int mid = 0);
// The two levels [lo, hi] of a 1-bit key channel: Lloyd's iterations from the
// range's ends (each level the mean of the values nearer to it), which the
// clipped grid search of wider codes only approximates.
void kvq_key_levels_1bit(const float* x, int n, int64_t stride, const uint8_t* skip, int64_t skip_stride,
                         float* lo, float* hi);

// The clipped grid of one key channel. KIVI quantizes keys per channel over a
// group of tokens, so one outlying token widens every other token's steps; at
// 2 bits that costs more than clipping it. The grid [lo, hi] is the one among
// [mn + a R s, mx - b R s] (R = mx - mn, s = KV_KEY_CLIP_STEP, a, b = 0 ..
// KV_KEY_CLIP_STEPS) with the least squared error over the channel's n values
// x[t * stride] (skipped ones excluded). Qwen2.5-Coder-1.5B, 2-bit cache, 4K
// context: KL to the f16 cache 0.0376 -> 0.0298. kernels/cuda/kv_append.cu
// computes the same bits: the errors are explicit fmas summed in 8 lanes (token
// t in lane t % 8) reduced in a fixed tree, the codes rounded half to even.
// ref: the scalar errors only (the AVX2 path gives the same bits; tests).
void kvq_key_grid_search(int bits, const float* x, int n, int64_t stride, const uint8_t* skip,
                         int64_t skip_stride, float* lo, float* hi, bool ref = false);
float kvq_key_grid_sse(int bits, const float* x, int n, int64_t stride, const uint8_t* skip, int64_t skip_stride,
                       float lo, float hi);
// kvq_key_grid_search of channels [0, nc) of X [n x r] (skip: [n x r] or null):
// lo, hi [nc]. With AVX2, eight channels at a time (a vector is a row's eight
// channels), the same grids bit for bit; ref: one channel at a time.
void kvq_key_grid_search_rows(int bits, const float* X, int n, int r, int nc, const uint8_t* skip, float* lo,
                              float* hi, bool ref = false);
// The grids [lo_c, hi_c] of r channels (value blocks) as codes against the
// group's (token's) steps:
// dm = max |lo| / 127 and m_c = dm floor(lo_c / dm), then ds = max (hi_c - m_c)
// / (2^bits - 1) / 255 and s_c = ds ceil(.. / ds); steps rounded up to f16.
// The `tail` channels before the last `zero` are 1-bit (one step: s_c spans
// hi_c - m_c), the `mid` before the tail 2-bit (three steps); the last `zero`
// have only a min code, the nearest to lo_c (their level), stored as bytes
// after the r - zero grid codes.
void kvq_grid_codes(int bits, const float* lo, const float* hi, int r, uint16_t* grid, uint16_t* step,
                    int tail = 0, int zero = 0, int mid = 0);

// The 4-bit forms.
inline void kvq_quantize_q4_vrow(const float* x, int r, uint8_t* codes, uint16_t* grid, uint16_t* step) {
    kvq_quantize_vrow(4, x, r, codes, grid, step);
}
inline void kvq_dequantize_q4_vrow(const uint8_t* codes, const uint16_t* grid, const uint16_t* step, int r,
                                   float* x) {
    kvq_dequantize_vrow(4, codes, grid, step, r, x);
}
inline void kvq_quantize_q4_keys(const float* X, int n, int r, uint8_t* codes, uint16_t* grid, uint16_t* step,
                                 const uint8_t* skip = nullptr) {
    kvq_quantize_keys(4, X, n, r, codes, grid, step, skip);
}
inline void kvq_dequantize_q4_keys(const uint8_t* codes, const uint16_t* grid, const uint16_t* step, int n, int r,
                                   float* X) {
    kvq_dequantize_keys(4, codes, grid, step, n, r, X);
}

// ---- GEAR: low-rank + sparse correction of a quantized group ----
struct kvq_gear_out {
    uint16_t* a;        // [n x rank] f16
    uint16_t* b;        // [r x rank] f16
    uint16_t* out_idx;  // [n_out] t * r + c
    uint16_t* out_val;  // [n_out] f16
};

// Number of sparse outliers for a group of n x r elements at fraction frac.
int kvq_gear_n_outliers(int n, int r, float frac);

// Quantizes the group X [n x r] at `bits` (4 or 2; keys per channel when per_channel, else values
// per token) and fills the GEAR correction: the n_out elements farthest from
// their quantization group's mean are left out of the scales and stored exactly
// as sparse corrections; the remaining residual X - deq(X) gets a rank-`rank`
// approximation A B^T by power iteration with deflation (deterministic start).
// work: at least kvq_gear_work(n, r) floats. s, m: as kvq_quantize_keys's grid
// and step when per_channel, else as kvq_quantize_values's.
int64_t kvq_gear_work(int n, int r);
void kvq_quantize_gear(const float* X, int n, int r, bool per_channel, int rank, int n_out, uint8_t* codes,
                       uint16_t* s, uint16_t* m, const kvq_gear_out& g, float* work, int bits = 4);

// X [n x r] as the kernel sees it: deq(X) + A B^T + sparse (tests, re-packing).
void kvq_dequantize_gear(const uint8_t* codes, const uint16_t* s, const uint16_t* m, int n, int r,
                         bool per_channel, int rank, int n_out, const uint16_t* a, const uint16_t* b,
                         const uint16_t* out_idx, const uint16_t* out_val, float* X, int bits = 4);

}  // namespace zk
