// Quantization of KV cache rows and groups in the layouts described in
// kernels/attention.h (the attention kernel reads them without dequantizing the
// cache), their exact inverses for tests and re-packing, and the GEAR error
// correction. Scales and mins are f16; each is rounded so that every input lies
// inside the quantization grid (scale rounded up, min rounded down), so the
// error of a non-outlier element is at most half a step.
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

// Values, per token: blocks of KV_Q4_VBLOCK channels.
// x [r] -> codes [row_bytes(r)], s, m [vblocks(r)]
void kvq_quantize_vrow(int bits, const float* x, int r, uint8_t* codes, uint16_t* s, uint16_t* m);
void kvq_dequantize_vrow(int bits, const uint8_t* codes, const uint16_t* s, const uint16_t* m, int r, float* x);

// Keys, per channel over a group of n tokens.
// X [n x r] (row stride r) -> codes [n x row_bytes(r)], s, m [r]. skip (optional,
// [n x r]): elements left out of the min/max (GEAR outliers; their codes are
// clamped and a sparse correction restores them).
void kvq_quantize_keys(int bits, const float* X, int n, int r, uint8_t* codes, uint16_t* s, uint16_t* m,
                       const uint8_t* skip = nullptr);
void kvq_dequantize_keys(int bits, const uint8_t* codes, const uint16_t* s, const uint16_t* m, int n, int r,
                         float* X);

// The 4-bit forms.
inline void kvq_quantize_q4_vrow(const float* x, int r, uint8_t* codes, uint16_t* s, uint16_t* m) {
    kvq_quantize_vrow(4, x, r, codes, s, m);
}
inline void kvq_dequantize_q4_vrow(const uint8_t* codes, const uint16_t* s, const uint16_t* m, int r, float* x) {
    kvq_dequantize_vrow(4, codes, s, m, r, x);
}
inline void kvq_quantize_q4_keys(const float* X, int n, int r, uint8_t* codes, uint16_t* s, uint16_t* m,
                                 const uint8_t* skip = nullptr) {
    kvq_quantize_keys(4, X, n, r, codes, s, m, skip);
}
inline void kvq_dequantize_q4_keys(const uint8_t* codes, const uint16_t* s, const uint16_t* m, int n, int r,
                                   float* X) {
    kvq_dequantize_keys(4, codes, s, m, n, r, X);
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
// work: at least kvq_gear_work(n, r) floats.
int64_t kvq_gear_work(int n, int r);
void kvq_quantize_gear(const float* X, int n, int r, bool per_channel, int rank, int n_out, uint8_t* codes,
                       uint16_t* s, uint16_t* m, const kvq_gear_out& g, float* work, int bits = 4);

// X [n x r] as the kernel sees it: deq(X) + A B^T + sparse (tests, re-packing).
void kvq_dequantize_gear(const uint8_t* codes, const uint16_t* s, const uint16_t* m, int n, int r,
                         bool per_channel, int rank, int n_out, const uint16_t* a, const uint16_t* b,
                         const uint16_t* out_idx, const uint16_t* out_val, float* X, int bits = 4);

}  // namespace zk
