// Block quantization, dequantization and the scalar reference dot products.
// The SIMD dot products live in quant_simd.cpp; this file also holds the
// public dispatchers declared in dtype.h.
//
// Quantizers round to nearest as ggml's reference quantizers do, so files we
// write hold the same bytes llama.cpp would write. Dequantizers evaluate in the
// same order as ggml / gguf-py (d * q, then + m), without fused multiply-adds,
// so dequantized values match them bit for bit.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "ggml-like/error.h"
#include "ggml-like/quant_ref.h"

namespace zk {

// IQ4_NL's 16 levels (the format's fixed table, as gguf-py's IQ4_NL.kvalues).
const int8_t k_iq4nl_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

namespace {

// Forces the product to be rounded to float before it is used, so the compiler
// cannot contract `a * b + c` into an fma (which rounds once and would differ
// from ggml / gguf-py in the last bit, or flip a quantizer's rounding).
inline float mul_rounded(float a, float b) {
    float p = a * b;
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
    __asm__("" : "+x"(p));
#elif defined(__GNUC__)
    __asm__("" : "+r"(p));
#else
    volatile float v = p;
    p = v;
#endif
    return p;
}

// Signed value of largest magnitude (its sign picks the side the full range
// -8..7 / -128..127 goes to) and that magnitude.
inline void signed_absmax(const float* x, int n, float& max, float& amax) {
    max = 0.0f;
    amax = 0.0f;
    for (int j = 0; j < n; j++) {
        const float ax = std::fabs(x[j]);
        if (ax > amax) {
            amax = ax;
            max = x[j];
        }
    }
}

// ---------------------------------------------------------------- quantize

void quantize_q4_0(const float* x, block_q4_0* y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 32) {
        float max, amax;
        signed_absmax(x, 32, max, amax);
        const float d = max / -8.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = fp32_to_fp16(d);
        for (int j = 0; j < 16; j++) {
            // x*id + 8.5 lies in [0.5, 16.5]; truncation rounds half up.
            const int q0 = std::min(15, (int)(int8_t)(mul_rounded(x[j], id) + 8.5f));
            const int q1 = std::min(15, (int)(int8_t)(mul_rounded(x[j + 16], id) + 8.5f));
            y[i].qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

void quantize_q4_1(const float* x, block_q4_1* y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 32) {
        float mn = x[0], mx = x[0];
        for (int j = 1; j < 32; j++) {
            mn = std::min(mn, x[j]);
            mx = std::max(mx, x[j]);
        }
        const float d = (mx - mn) / 15.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = fp32_to_fp16(d);
        y[i].m = fp32_to_fp16(mn);
        for (int j = 0; j < 16; j++) {
            const int q0 = std::min(15, (int)(int8_t)(mul_rounded(x[j] - mn, id) + 0.5f));
            const int q1 = std::min(15, (int)(int8_t)(mul_rounded(x[j + 16] - mn, id) + 0.5f));
            y[i].qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

// Shared by Q8_0 and Q8_1: d = amax / 127, q = round(x / d) (half away from 0).
// Returns sum(q).
inline int quantize_block_q8(const float* x, int8_t* qs, float& d) {
    float amax = 0.0f;
    for (int j = 0; j < 32; j++) amax = std::max(amax, std::fabs(x[j]));
    d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    int sum = 0;
    for (int j = 0; j < 32; j++) {
        qs[j] = (int8_t)std::round(x[j] * id);
        sum += qs[j];
    }
    return sum;
}

void quantize_q8_0(const float* x, block_q8_0* y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 32) {
        float d;
        quantize_block_q8(x, y[i].qs, d);
        y[i].d = fp32_to_fp16(d);
    }
}

void quantize_q8_1(const float* x, block_q8_1* y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 32) {
        float d;
        const int sum = quantize_block_q8(x, y[i].qs, d);
        y[i].d = fp32_to_fp16(d);
        y[i].s = fp32_to_fp16(d * (float)sum);
    }
}

// Q8_K: d = max / -128 (the signed extreme maps to -128), q = round-to-even,
// clamped to 127; bsums feed the min / offset terms of the K-quant dots.
void quantize_q8_K(const float* x, block_q8_K* y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 256) {
        float max, amax;
        signed_absmax(x, 256, max, amax);
        if (amax == 0.0f) {
            std::memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        const float iscale = -128.0f / max;
        for (int j = 0; j < 256; j++) {
            const int v = (int)std::nearbyint(iscale * x[j]);
            y[i].qs[j] = (int8_t)std::min(127, v);
        }
        for (int g = 0; g < 16; g++) {
            int s = 0;
            for (int j = 0; j < 16; j++) s += y[i].qs[16 * g + j];
            y[i].bsums[g] = (int16_t)s;
        }
        y[i].d = 1.0f / iscale;
    }
}

// ---------------------------------------------------------------- unpacking
// Integer quants of one block, shared by the dequantizers and the reference
// dots (the formats are documented at the block structs in quant_ref.h).

// IQ4_NL: 32 values of the non-linear table.
inline void iq4_nl_unpack(const uint8_t* qs, int* q /* 32 */) {
    for (int j = 0; j < 16; j++) {
        q[j] = k_iq4nl_values[qs[j] & 0x0F];
        q[j + 16] = k_iq4nl_values[qs[j] >> 4];
    }
}

// Q2_K: 256 quants 0..3; Q3_K: the same low bits minus 4 where the high bit is 0.
inline void q2_K_unpack(const uint8_t* qs, int* q /* 256 */) {
    for (int e = 0; e < 256; e++) q[e] = (qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
}

inline void q3_K_unpack(const block_q3_K& b, int* q /* 256 */) {
    q2_K_unpack(b.qs, q);
    for (int e = 0; e < 256; e++) q[e] -= ((b.hmask[e % 32] >> (e / 32)) & 1) ? 0 : 4;
}

// Q5_K: 256 quants 0..31 (sub-block j = elements 32j..32j+31).
inline void q5_K_unpack(const block_q5_K& b, int* q /* 256 */) {
    for (int e = 0; e < 256; e++) {
        const int j = e / 32, l = e % 32;
        const uint8_t byte = b.qs[32 * (j / 2) + l];
        q[e] = ((j & 1) ? (byte >> 4) : (byte & 0x0F)) | (((b.qh[l] >> j) & 1) << 4);
    }
}

// ---------------------------------------------------------------- dequantize

void dequantize_q4_0(const block_q4_0* x, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += 32) {
        const float d = fp16_to_fp32(x[i].d);
        for (int j = 0; j < 16; j++) {
            y[j] = d * (float)((x[i].qs[j] & 0x0F) - 8);
            y[j + 16] = d * (float)((x[i].qs[j] >> 4) - 8);
        }
    }
}

void dequantize_q4_1(const block_q4_1* x, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += 32) {
        const float d = fp16_to_fp32(x[i].d);
        const float m = fp16_to_fp32(x[i].m);
        for (int j = 0; j < 16; j++) {
            y[j] = mul_rounded(d, (float)(x[i].qs[j] & 0x0F)) + m;
            y[j + 16] = mul_rounded(d, (float)(x[i].qs[j] >> 4)) + m;
        }
    }
}

void dequantize_q5_0(const block_q5_0* x, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += 32) {
        const float d = fp16_to_fp32(x[i].d);
        int q[32];
        q5_unpack(x[i].qh, x[i].qs, q);
        for (int j = 0; j < 32; j++) y[j] = d * (float)(q[j] - 16);
    }
}

void dequantize_q5_1(const block_q5_1* x, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += 32) {
        const float d = fp16_to_fp32(x[i].d);
        const float m = fp16_to_fp32(x[i].m);
        int q[32];
        q5_unpack(x[i].qh, x[i].qs, q);
        for (int j = 0; j < 32; j++) y[j] = mul_rounded(d, (float)q[j]) + m;
    }
}

void dequantize_iq4_nl(const block_iq4_nl* x, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += 32) {
        const float d = fp16_to_fp32(x[i].d);
        int q[32];
        iq4_nl_unpack(x[i].qs, q);
        for (int j = 0; j < 32; j++) y[j] = d * (float)q[j];
    }
}

template <typename B>
void dequantize_q8(const B* x, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += 32) {
        const float d = fp16_to_fp32(x[i].d);
        for (int j = 0; j < 32; j++) y[j] = (float)x[i].qs[j] * d;
    }
}

void dequantize_q4_K(const block_q4_K* x, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) {
        const float d = fp16_to_fp32(x[i].d);
        const float dmin = fp16_to_fp32(x[i].dmin);
        const uint8_t* q = x[i].qs;
        for (int k = 0; k < 4; k++, q += 32, y += 64) {
            int sc0, m0, sc1, m1;
            q4_K_scale_min(x[i].scales, 2 * k, sc0, m0);
            q4_K_scale_min(x[i].scales, 2 * k + 1, sc1, m1);
            const float d0 = d * (float)sc0, dm0 = dmin * (float)m0;
            const float d1 = d * (float)sc1, dm1 = dmin * (float)m1;
            for (int l = 0; l < 32; l++) {
                y[l] = mul_rounded(d0, (float)(q[l] & 0x0F)) - dm0;
                y[l + 32] = mul_rounded(d1, (float)(q[l] >> 4)) - dm1;
            }
        }
    }
}

void dequantize_q2_K(const block_q2_K* x, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += 256) {
        const float d = fp16_to_fp32(x[i].d);
        const float dmin = fp16_to_fp32(x[i].dmin);
        int q[256];
        q2_K_unpack(x[i].qs, q);
        for (int g = 0; g < 16; g++) {
            const float dl = d * (float)(x[i].scales[g] & 0x0F);
            const float ml = dmin * (float)(x[i].scales[g] >> 4);
            for (int l = 0; l < 16; l++) y[16 * g + l] = mul_rounded(dl, (float)q[16 * g + l]) - ml;
        }
    }
}

void dequantize_q3_K(const block_q3_K* x, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += 256) {
        const float d = fp16_to_fp32(x[i].d);
        int sc[16], q[256];
        q3_K_scales(x[i].scales, sc);
        q3_K_unpack(x[i], q);
        for (int g = 0; g < 16; g++) {
            const float dl = d * (float)sc[g];
            for (int l = 0; l < 16; l++) y[16 * g + l] = dl * (float)q[16 * g + l];
        }
    }
}

void dequantize_q5_K(const block_q5_K* x, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += 256) {
        const float d = fp16_to_fp32(x[i].d);
        const float dmin = fp16_to_fp32(x[i].dmin);
        int q[256];
        q5_K_unpack(x[i], q);
        for (int j = 0; j < 8; j++) {
            int sc, m;
            q4_K_scale_min(x[i].scales, j, sc, m);
            const float dj = d * (float)sc, dm = dmin * (float)m;
            for (int l = 0; l < 32; l++) y[32 * j + l] = mul_rounded(dj, (float)q[32 * j + l]) - dm;
        }
    }
}

// Q6_K layout, per half of 128 elements (ql += 64, qh += 32 per half), l < 32:
//   element l      : ql[l]      low nibble, qh[l] bits 0-1
//   element l + 32 : ql[l + 32] low nibble, qh[l] bits 2-3
//   element l + 64 : ql[l]      high nibble, qh[l] bits 4-5
//   element l + 96 : ql[l + 32] high nibble, qh[l] bits 6-7
// Group g (16 elements, g = element / 16) has scale scales[g].
inline void q6_K_unpack_half(const uint8_t* ql, const uint8_t* qh, int* q /* 128 */) {
    for (int l = 0; l < 32; l++) {
        q[l] = ((ql[l] & 0x0F) | (((qh[l] >> 0) & 3) << 4)) - 32;
        q[l + 32] = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) - 32;
        q[l + 64] = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        q[l + 96] = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
    }
}

void dequantize_q6_K(const block_q6_K* x, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) {
        const float d = fp16_to_fp32(x[i].d);
        for (int h = 0; h < 2; h++, y += 128) {
            int q[128];
            q6_K_unpack_half(x[i].ql + 64 * h, x[i].qh + 32 * h, q);
            for (int l = 0; l < 128; l++)
                y[l] = (d * (float)x[i].scales[8 * h + l / 16]) * (float)q[l];
        }
    }
}

void dequantize_q8_K(const block_q8_K* x, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += 256)
        for (int j = 0; j < 256; j++) y[j] = (float)x[i].qs[j] * x[i].d;
}

// ---------------------------------------------------------------- reference dots

float dot_ref_q4_0(const block_q4_0* w, const block_q8_0* a, int64_t nb) {
    float sum = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int sumi = 0;
        for (int j = 0; j < 16; j++)
            sumi += ((w[i].qs[j] & 0x0F) - 8) * a[i].qs[j] + ((w[i].qs[j] >> 4) - 8) * a[i].qs[j + 16];
        sum += (float)sumi * (fp16_to_fp32(w[i].d) * fp16_to_fp32(a[i].d));
    }
    return sum;
}

float dot_ref_q4_1(const block_q4_1* w, const block_q8_1* a, int64_t nb) {
    float sum = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int sumi = 0;
        for (int j = 0; j < 16; j++)
            sumi += (w[i].qs[j] & 0x0F) * a[i].qs[j] + (w[i].qs[j] >> 4) * a[i].qs[j + 16];
        // sum_j (d q_j + m) a_j = d da sum q_j qa_j + m * (da sum qa_j) = ... + m * s
        sum += (float)sumi * (fp16_to_fp32(w[i].d) * fp16_to_fp32(a[i].d)) +
               fp16_to_fp32(w[i].m) * fp16_to_fp32(a[i].s);
    }
    return sum;
}

float dot_ref_q5_0(const block_q5_0* w, const block_q8_0* a, int64_t nb) {
    float sum = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int q[32], sumi = 0;
        q5_unpack(w[i].qh, w[i].qs, q);
        for (int j = 0; j < 32; j++) sumi += (q[j] - 16) * a[i].qs[j];
        sum = std::fma(fp16_to_fp32(w[i].d) * fp16_to_fp32(a[i].d), (float)sumi, sum);  // see quant_pack_dot_ref
    }
    return sum;
}

float dot_ref_q5_1(const block_q5_1* w, const block_q8_1* a, int64_t nb) {
    float sum = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int q[32], sumi = 0;
        q5_unpack(w[i].qh, w[i].qs, q);
        for (int j = 0; j < 32; j++) sumi += q[j] * a[i].qs[j];
        // As Q4_1: the min meets the activation block's sum s = da * sum(qa).
        sum += (float)sumi * (fp16_to_fp32(w[i].d) * fp16_to_fp32(a[i].d)) +
               fp16_to_fp32(w[i].m) * fp16_to_fp32(a[i].s);
    }
    return sum;
}

float dot_ref_iq4_nl(const block_iq4_nl* w, const block_q8_0* a, int64_t nb) {
    float sum = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int q[32], sumi = 0;
        iq4_nl_unpack(w[i].qs, q);
        for (int j = 0; j < 32; j++) sumi += q[j] * a[i].qs[j];
        sum += (float)sumi * (fp16_to_fp32(w[i].d) * fp16_to_fp32(a[i].d));
    }
    return sum;
}

float dot_ref_q8_0(const block_q8_0* w, const block_q8_0* a, int64_t nb) {
    float sum = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int sumi = 0;
        for (int j = 0; j < 32; j++) sumi += w[i].qs[j] * a[i].qs[j];
        sum = std::fma(fp16_to_fp32(w[i].d) * fp16_to_fp32(a[i].d), (float)sumi, sum);  // see quant_pack_dot_ref
    }
    return sum;
}

float dot_ref_q4_K(const block_q4_K* w, const block_q8_K* a, int64_t nb) {
    float sum = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int isum = 0, msum = 0;
        for (int j = 0; j < 8; j++) {
            int sc, m;
            q4_K_scale_min(w[i].scales, j, sc, m);
            const uint8_t* q = w[i].qs + 32 * (j / 2);
            const int8_t* qa = a[i].qs + 32 * j;
            int s = 0;
            for (int l = 0; l < 32; l++) s += ((j & 1) ? (q[l] >> 4) : (q[l] & 0x0F)) * qa[l];
            isum += sc * s;
            msum += m * (a[i].bsums[2 * j] + a[i].bsums[2 * j + 1]);
        }
        sum = std::fma(fp16_to_fp32(w[i].d) * a[i].d, (float)isum, sum);  // see quant_pack_dot_ref
        sum = std::fma(-(fp16_to_fp32(w[i].dmin) * a[i].d), (float)msum, sum);
    }
    return sum;
}

// Q2_K: sum_g (d sc_g q - dmin m_g) . a_g = d da sum_g sc_g (q . qa_g) - dmin da sum_g m_g bsums_g.
float dot_ref_q2_K(const block_q2_K* w, const block_q8_K* a, int64_t nb) {
    float sum = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int q[256], isum = 0, msum = 0;
        q2_K_unpack(w[i].qs, q);
        for (int g = 0; g < 16; g++) {
            int s = 0;
            for (int l = 0; l < 16; l++) s += q[16 * g + l] * a[i].qs[16 * g + l];
            isum += (w[i].scales[g] & 0x0F) * s;
            msum += (w[i].scales[g] >> 4) * a[i].bsums[g];
        }
        sum += fp16_to_fp32(w[i].d) * a[i].d * (float)isum - fp16_to_fp32(w[i].dmin) * a[i].d * (float)msum;
    }
    return sum;
}

float dot_ref_q3_K(const block_q3_K* w, const block_q8_K* a, int64_t nb) {
    float sum = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int sc[16], q[256], isum = 0;
        q3_K_scales(w[i].scales, sc);
        q3_K_unpack(w[i], q);
        for (int g = 0; g < 16; g++) {
            int s = 0;
            for (int l = 0; l < 16; l++) s += q[16 * g + l] * a[i].qs[16 * g + l];
            isum += sc[g] * s;
        }
        sum += fp16_to_fp32(w[i].d) * a[i].d * (float)isum;
    }
    return sum;
}

// Q5_K: as Q4_K with 5-bit quants.
float dot_ref_q5_K(const block_q5_K* w, const block_q8_K* a, int64_t nb) {
    float sum = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int q[256], isum = 0, msum = 0;
        q5_K_unpack(w[i], q);
        for (int j = 0; j < 8; j++) {
            int sc, m;
            q4_K_scale_min(w[i].scales, j, sc, m);
            int s = 0;
            for (int l = 0; l < 32; l++) s += q[32 * j + l] * a[i].qs[32 * j + l];
            isum += sc * s;
            msum += m * (a[i].bsums[2 * j] + a[i].bsums[2 * j + 1]);
        }
        sum += fp16_to_fp32(w[i].d) * a[i].d * (float)isum - fp16_to_fp32(w[i].dmin) * a[i].d * (float)msum;
    }
    return sum;
}

float dot_ref_q6_K(const block_q6_K* w, const block_q8_K* a, int64_t nb) {
    float sum = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int isum = 0;
        for (int h = 0; h < 2; h++) {
            int q[128];
            q6_K_unpack_half(w[i].ql + 64 * h, w[i].qh + 32 * h, q);
            for (int g = 0; g < 8; g++) {
                int s = 0;
                for (int l = 0; l < 16; l++) s += q[16 * g + l] * a[i].qs[128 * h + 16 * g + l];
                isum += w[i].scales[8 * h + g] * s;
            }
        }
        sum = std::fma(fp16_to_fp32(w[i].d) * a[i].d, (float)isum, sum);  // see quant_pack_dot_ref
    }
    return sum;
}

template <float (*load)(uint16_t)>
float dot_ref_half(const uint16_t* w, const float* a, int64_t n) {
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) sum += (double)load(w[i]) * (double)a[i];
    return (float)sum;
}

float dot_ref_f32(const float* w, const float* a, int64_t n) {
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) sum += (double)w[i] * (double)a[i];
    return (float)sum;
}

// n must fill whole blocks of t; the message names both.
int64_t blocks_of(dtype t, int64_t n, const char* what) {
    const int64_t bs = dtype_get_traits(t).block_size;
    if (n < 0 || n % bs != 0)
        ZK_THROW("%s: %lld elements is not a multiple of the %s block size %lld", what,
                 (long long)n, dtype_name(t), (long long)bs);
    return n / bs;
}

}  // namespace

// ---------------------------------------------------------------- public API

void dtype_dequantize_row(dtype t, const void* src, float* dst, int64_t n) {
    const int64_t nb = blocks_of(t, n, "dtype_dequantize_row");
    switch (t) {
        case dtype::F32: std::memcpy(dst, src, (size_t)n * sizeof(float)); return;
        case dtype::F16:
            for (int64_t i = 0; i < n; i++) dst[i] = fp16_to_fp32(((const uint16_t*)src)[i]);
            return;
        case dtype::BF16:
            for (int64_t i = 0; i < n; i++) dst[i] = bf16_to_fp32(((const uint16_t*)src)[i]);
            return;
        case dtype::Q4_0: dequantize_q4_0((const block_q4_0*)src, dst, nb); return;
        case dtype::Q4_1: dequantize_q4_1((const block_q4_1*)src, dst, nb); return;
        case dtype::Q5_0: dequantize_q5_0((const block_q5_0*)src, dst, nb); return;
        case dtype::Q5_1: dequantize_q5_1((const block_q5_1*)src, dst, nb); return;
        case dtype::Q8_0: dequantize_q8((const block_q8_0*)src, dst, nb); return;
        case dtype::Q8_1: dequantize_q8((const block_q8_1*)src, dst, nb); return;
        case dtype::IQ4_NL: dequantize_iq4_nl((const block_iq4_nl*)src, dst, nb); return;
        case dtype::Q2_K: dequantize_q2_K((const block_q2_K*)src, dst, nb); return;
        case dtype::Q3_K: dequantize_q3_K((const block_q3_K*)src, dst, nb); return;
        case dtype::Q4_K: dequantize_q4_K((const block_q4_K*)src, dst, nb); return;
        case dtype::Q5_K: dequantize_q5_K((const block_q5_K*)src, dst, nb); return;
        case dtype::Q6_K: dequantize_q6_K((const block_q6_K*)src, dst, nb); return;
        case dtype::Q8_K: dequantize_q8_K((const block_q8_K*)src, dst, nb); return;
    }
    ZK_THROW("dtype_dequantize_row: zack cannot dequantize %s (supported: %s, Q8_1, Q8_K)", dtype_name(t),
             dtype_weight_names().c_str());
}

void quant_quantize_ref(dtype t, const float* src, void* dst, int64_t n) {
    const int64_t nb = blocks_of(t, n, "dtype_quantize_row");
    switch (t) {
        case dtype::F32: std::memcpy(dst, src, (size_t)n * sizeof(float)); return;
        case dtype::F16:
            for (int64_t i = 0; i < n; i++) ((uint16_t*)dst)[i] = fp32_to_fp16(src[i]);
            return;
        case dtype::BF16:
            for (int64_t i = 0; i < n; i++) ((uint16_t*)dst)[i] = fp32_to_bf16(src[i]);
            return;
        case dtype::Q4_0: quantize_q4_0(src, (block_q4_0*)dst, nb); return;
        case dtype::Q4_1: quantize_q4_1(src, (block_q4_1*)dst, nb); return;
        case dtype::Q8_0: quantize_q8_0(src, (block_q8_0*)dst, nb); return;
        case dtype::Q8_1: quantize_q8_1(src, (block_q8_1*)dst, nb); return;
        case dtype::Q8_K: quantize_q8_K(src, (block_q8_K*)dst, nb); return;
        default: break;
    }
    ZK_THROW("dtype_quantize_row: quantizing to %s is not supported", dtype_name(t));
}

void dtype_quantize_row(dtype t, const float* src, void* dst, int64_t n) {
    blocks_of(t, n, "dtype_quantize_row");
    if (!quant_quantize_simd(t, src, dst, n)) quant_quantize_ref(t, src, dst, n);
}

dtype dtype_vec_dot_type(dtype weight) {
    switch (weight) {
        case dtype::Q4_0:
        case dtype::Q5_0:
        case dtype::Q8_0:
        case dtype::IQ4_NL: return dtype::Q8_0;
        case dtype::Q4_1:
        case dtype::Q5_1: return dtype::Q8_1;
        case dtype::Q2_K:
        case dtype::Q3_K:
        case dtype::Q4_K:
        case dtype::Q5_K:
        case dtype::Q6_K: return dtype::Q8_K;
        case dtype::F16:
        case dtype::BF16:
        case dtype::F32: return dtype::F32;
        case dtype::Q8_1:
        case dtype::Q8_K:
            ZK_THROW("no dot product for weight type %s (only activations are stored as it)",
                     dtype_name(weight));
    }
    ZK_THROW("no dot product for weight type %s (zack multiplies %s)", dtype_name(weight),
             dtype_weight_names().c_str());
}

float quant_dot_ref(dtype weight, const void* w, const void* a, int64_t n) {
    const int64_t nb = blocks_of(weight, n, "vec_dot");
    switch (weight) {
        case dtype::Q4_0: return dot_ref_q4_0((const block_q4_0*)w, (const block_q8_0*)a, nb);
        case dtype::Q4_1: return dot_ref_q4_1((const block_q4_1*)w, (const block_q8_1*)a, nb);
        case dtype::Q5_0: return dot_ref_q5_0((const block_q5_0*)w, (const block_q8_0*)a, nb);
        case dtype::Q5_1: return dot_ref_q5_1((const block_q5_1*)w, (const block_q8_1*)a, nb);
        case dtype::Q8_0: return dot_ref_q8_0((const block_q8_0*)w, (const block_q8_0*)a, nb);
        case dtype::IQ4_NL: return dot_ref_iq4_nl((const block_iq4_nl*)w, (const block_q8_0*)a, nb);
        case dtype::Q2_K: return dot_ref_q2_K((const block_q2_K*)w, (const block_q8_K*)a, nb);
        case dtype::Q3_K: return dot_ref_q3_K((const block_q3_K*)w, (const block_q8_K*)a, nb);
        case dtype::Q4_K: return dot_ref_q4_K((const block_q4_K*)w, (const block_q8_K*)a, nb);
        case dtype::Q5_K: return dot_ref_q5_K((const block_q5_K*)w, (const block_q8_K*)a, nb);
        case dtype::Q6_K: return dot_ref_q6_K((const block_q6_K*)w, (const block_q8_K*)a, nb);
        case dtype::F16: return dot_ref_half<fp16_to_fp32>((const uint16_t*)w, (const float*)a, n);
        case dtype::BF16: return dot_ref_half<bf16_to_fp32>((const uint16_t*)w, (const float*)a, n);
        case dtype::F32: return dot_ref_f32((const float*)w, (const float*)a, n);
        default: break;
    }
    dtype_vec_dot_type(weight);  // throws with the explanation
    ZK_THROW("vec_dot: unsupported weight type %s", dtype_name(weight));
}

float dtype_vec_dot(dtype weight, const void* w, const void* a, int64_t n) {
    blocks_of(weight, n, "dtype_vec_dot");
    return quant_dot_simd(weight, w, a, n);
}

}  // namespace zk
