// Internal to ggml-like/ and kernels/: the GGML block structs, the scalar
// reference routines (always compiled, used by the tests to check the SIMD
// paths) and the multi-row x multi-token dot used by kernel_matmul.
// Public entry points are in dtype.h.
#pragma once
#include <cstddef>
#include <cstdint>

#include "ggml-like/dtype.h"
#if defined(__F16C__)
#include <immintrin.h>
#endif

namespace zk {

// f16 -> f32 on the hot paths: one instruction with F16C, else the portable one.
inline float fp16_load(uint16_t h) {
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    return fp16_to_fp32(h);
#endif
}

// Byte-exact GGML layouts (see dtype.h for the value formulas). f16 fields are
// kept as raw uint16_t.
struct block_q4_0 {
    uint16_t d;
    uint8_t qs[16];  // element i in the low nibble of qs[i], element 16+i in the high
};
struct block_q4_1 {
    uint16_t d;
    uint16_t m;
    uint8_t qs[16];
};
// Q5_0 / Q5_1: the low 4 bits as in Q4_0 / Q4_1 (element i in the low nibble
// of qs[i], element 16+i in the high), the 5th bit of element i in bit i of qh
// (a little-endian u32 kept as bytes: the struct has no 4-byte alignment).
struct block_q5_0 {
    uint16_t d;
    uint8_t qh[4];
    uint8_t qs[16];
};
struct block_q5_1 {
    uint16_t d;
    uint16_t m;
    uint8_t qh[4];
    uint8_t qs[16];
};
struct block_q8_0 {
    uint16_t d;
    int8_t qs[32];
};
struct block_q8_1 {
    uint16_t d;
    uint16_t s;  // d * sum(qs)
    int8_t qs[32];
};
// 256 elements = 8 sub-blocks of 32, each with a 6-bit scale and a 6-bit min:
// x = d * sc_j * q - dmin * m_j. qs[32*k + l] holds element 64k+l (low nibble)
// and 64k+32+l (high nibble).
struct block_q4_K {
    uint16_t d;
    uint16_t dmin;
    uint8_t scales[12];
    uint8_t qs[128];
};
// Q5_K: Q4_K plus a 5th bit: element 32j + l (sub-block j) has bit j of qh[l].
struct block_q5_K {
    uint16_t d;
    uint16_t dmin;
    uint8_t scales[12];
    uint8_t qh[32];
    uint8_t qs[128];
};
// Q2_K: 16 groups of 16 with a 4-bit scale (low nibble of scales[g]) and a
// 4-bit min (high nibble): x = d * sc_g * q - dmin * m_g, q = 2 bits. Element
// 128h + 32s + l (h < 2, s < 4, l < 32) is bits 2s..2s+1 of qs[32h + l].
struct block_q2_K {
    uint8_t scales[16];
    uint8_t qs[64];
    uint16_t d;
    uint16_t dmin;
};
// Q3_K: 16 groups of 16 with 6-bit scales stored +32 (layout in q3_K_scales):
// x = d * (sc_g - 32) * q, q = low2 - 4 * (1 - high) in -4..3. The low 2 bits
// are packed as Q2_K's; the high bit of element 32k + l is bit k of hmask[l].
struct block_q3_K {
    uint8_t hmask[32];
    uint8_t qs[64];
    uint8_t scales[12];
    uint16_t d;
};
// 256 elements = 16 groups of 16 with int8 scales: x = d * sc_g * (q - 32),
// q = 6 bits: low 4 in ql, high 2 in qh (layout in quant.cpp, q6_K_unpack_half).
struct block_q6_K {
    uint8_t ql[128];
    uint8_t qh[64];
    int8_t scales[16];
    uint16_t d;
};
struct block_q8_K {
    float d;
    int8_t qs[256];
    int16_t bsums[16];  // sum of each group of 16 qs
};

static_assert(sizeof(block_q4_0) == 18, "block_q4_0 layout");
static_assert(sizeof(block_q4_1) == 20, "block_q4_1 layout");
static_assert(sizeof(block_q5_0) == 22, "block_q5_0 layout");
static_assert(sizeof(block_q5_1) == 24, "block_q5_1 layout");
static_assert(sizeof(block_q8_0) == 34, "block_q8_0 layout");
static_assert(sizeof(block_q8_1) == 36, "block_q8_1 layout");
static_assert(sizeof(block_q2_K) == 84, "block_q2_K layout");
static_assert(sizeof(block_q3_K) == 110, "block_q3_K layout");
static_assert(sizeof(block_q4_K) == 144, "block_q4_K layout");
static_assert(sizeof(block_q5_K) == 176, "block_q5_K layout");
static_assert(sizeof(block_q6_K) == 210, "block_q6_K layout");
static_assert(sizeof(block_q8_K) == 292, "block_q8_K layout");

// IQ4_NL: like Q4_0's nibbles, but each nibble indexes this table of int8
// values (non-uniform, denser near 0): x = d * k_iq4nl_values[q].
struct block_iq4_nl {
    uint16_t d;
    uint8_t qs[16];
};
static_assert(sizeof(block_iq4_nl) == 18, "block_iq4_nl layout");
extern const int8_t k_iq4nl_values[16];

// Unpacks the 6-bit scale and min of sub-block j (0..7) of a Q4_K/Q5_K block.
inline void q4_K_scale_min(const uint8_t* s, int j, int& sc, int& m) {
    if (j < 4) {
        sc = s[j] & 63;
        m = s[j + 4] & 63;
    } else {
        sc = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
        m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

// Q5_0 / Q5_1: the 32 quants 0..31 of a block (q5_pack: the inverse).
inline void q5_unpack(const uint8_t* qh, const uint8_t* qs, int* q /* 32 */) {
    const uint32_t h = (uint32_t)qh[0] | ((uint32_t)qh[1] << 8) | ((uint32_t)qh[2] << 16) | ((uint32_t)qh[3] << 24);
    for (int j = 0; j < 16; j++) {
        q[j] = (qs[j] & 0x0F) | (int)(((h >> j) & 1) << 4);
        q[j + 16] = (qs[j] >> 4) | (int)(((h >> (j + 16)) & 1) << 4);
    }
}
inline void q5_pack(const int* q /* 32 */, uint8_t* qh, uint8_t* qs) {
    uint32_t h = 0;
    for (int j = 0; j < 16; j++) {
        qs[j] = (uint8_t)((q[j] & 0x0F) | ((q[j + 16] & 0x0F) << 4));
        h |= (uint32_t)((q[j] >> 4) & 1) << j | (uint32_t)((q[j + 16] >> 4) & 1) << (j + 16);
    }
    for (int k = 0; k < 4; k++) qh[k] = (uint8_t)(h >> (8 * k));
}

// The 16 6-bit scales of a Q3_K block, stored +32 (returned as -32..31). Scale
// g's low 4 bits are the low nibble of s[g] for g < 8, the high nibble of
// s[g - 8] for g >= 8; its high 2 bits are bits 2(g / 4)..+1 of s[8 + g % 4].
inline void q3_K_scales(const uint8_t* s, int* sc /* 16 */) {
    for (int g = 0; g < 16; g++) {
        const int lo = g < 8 ? (s[g] & 0x0F) : (s[g - 8] >> 4);
        const int hi = (s[8 + g % 4] >> (2 * (g / 4))) & 3;
        sc[g] = (lo | (hi << 4)) - 32;
    }
}

// Scalar reference quantizer (what dtype_quantize_row computes, byte for byte).
void quant_quantize_ref(dtype t, const float* src, void* dst, int64_t n);
// SIMD quantizer for the activation types of this build (Q8_0, Q8_1 with
// AVX2); returns false, writing nothing, where there is none. Same bytes as
// quant_quantize_ref.
bool quant_quantize_simd(dtype t, const float* src, void* dst, int64_t n);

// Scalar reference dot product (the definition the SIMD paths are tested
// against): integer sums per block, scaled in float.
float quant_dot_ref(dtype weight, const void* w, const void* a, int64_t n);
// The SIMD dot product of this build (equals quant_dot_ref's result up to
// float summation order); the reference itself where there is no SIMD version.
float quant_dot_simd(dtype weight, const void* w, const void* a, int64_t n);
// True when this build has a SIMD path for the weight type (for test reports).
bool quant_has_simd(dtype weight);

// Up to 4 rows x 4 tokens of dot products sharing each loaded block:
//   y[t * y_stride + r] = dot(w + r * w_stride, a + t * a_stride)   (byte strides)
// for r < nr, t < nt; a holds dtype_vec_dot_type(weight) rows of n elements.
constexpr int k_tile_rows = 4;
constexpr int k_tile_toks = 4;
void quant_dot_tile(dtype weight, int64_t n, const void* w, size_t w_stride, int nr,
                    const void* a, size_t a_stride, int nt, float* y, size_t y_stride);

}  // namespace zk
