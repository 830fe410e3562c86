// Small inline SIMD helpers shared by the CPU kernels. AVX2+FMA+F16C paths when
// the build targets them (-march=native on the host), scalar otherwise.
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define ZK_SIMD_AVX2 1
#endif

#include "ggml-like/dtype.h"

namespace zk {
namespace simd {

#ifdef ZK_SIMD_AVX2
inline float hsum(__m256 v) {
    __m128 lo = _mm256_castps256_ps128(v);
    __m128 hi = _mm256_extractf128_ps(v, 1);
    lo = _mm_add_ps(lo, hi);
    __m128 sh = _mm_movehdup_ps(lo);
    lo = _mm_add_ps(lo, sh);
    sh = _mm_movehl_ps(sh, lo);
    lo = _mm_add_ss(lo, sh);
    return _mm_cvtss_f32(lo);
}

inline float hmax(__m256 v) {
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

// x[i] = row i of an 8 x 8 float block -> x[i] = column i (lane j: row j's element i).
inline void transpose8_f32(__m256 (&x)[8]) {
    __m256 t[8], u[8];
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_ps(x[2 * i], x[2 * i + 1]);  // a0 b0 a1 b1 | a4 b4 a5 b5
        t[2 * i + 1] = _mm256_unpackhi_ps(x[2 * i], x[2 * i + 1]);  // a2 b2 a3 b3 | a6 b6 a7 b7
    }
    for (int i = 0; i < 2; i++) {  // rows 4i .. 4i + 3, elements e, e + 4 of each
        u[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(1, 0, 1, 0));      // 0 | 4
        u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(3, 2, 3, 2));  // 1 | 5
        u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(1, 0, 1, 0));  // 2 | 6
        u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(3, 2, 3, 2));  // 3 | 7
    }
    for (int e = 0; e < 4; e++) {
        x[e] = _mm256_permute2f128_ps(u[e], u[4 + e], 0x20);
        x[e + 4] = _mm256_permute2f128_ps(u[e], u[4 + e], 0x31);
    }
}

// The constants of exp8 and exp16 (one table, so the two widths cannot drift
// apart): x clamped to [lo, hi], x = n ln2 + r with ln2 in two parts, and the
// Horner coefficients of e^r, highest degree first.
struct exp_consts {
    static constexpr float hi = 88.3762626647949f, lo = -87.0f, log2e = 1.44269504088896341f;
    static constexpr float ln2_hi = 0.693359375f, ln2_lo = -2.12194440e-4f;
    static constexpr float poly[7] = {1.0f / 720.0f, 1.0f / 120.0f, 1.0f / 24.0f, 1.0f / 6.0f, 0.5f, 1.0f, 1.0f};
};

// e^x for 8 floats: x = n ln2 + r, |r| <= ln2/2, degree-6 polynomial for e^r
// (relative error ~2e-7); inputs below -87 flush to 0.
inline __m256 exp8(__m256 x) {
    using C = exp_consts;
    x = _mm256_min_ps(x, _mm256_set1_ps(C::hi));
    const __m256 under = _mm256_cmp_ps(x, _mm256_set1_ps(C::lo), _CMP_LT_OQ);
    x = _mm256_max_ps(x, _mm256_set1_ps(C::lo));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(C::log2e)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(C::ln2_hi), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(C::ln2_lo), r);
    __m256 p = _mm256_set1_ps(C::poly[0]);
#pragma GCC unroll 6
    for (int k = 1; k < 7; k++) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(C::poly[k]));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    const __m256 res = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
    return _mm256_andnot_ps(under, res);
}
#endif

#if defined(ZK_SIMD_AVX2) && defined(__AVX512F__)
#define ZK_SIMD_AVX512 1
// (The maskz forms, with every lane on: the plain ones pass GCC 12's headers an
// undefined vector that warns where they are inlined, PR 105593.)
constexpr __mmask16 all16 = 0xFFFF;

template <int H>
inline __m256 half16(__m512 v) {  // (not the cast for the low half: it too extracts with an undefined vector)
    return _mm256_castpd_ps(_mm512_maskz_extractf64x4_pd(0xF, _mm512_castps_pd(v), H));
}
inline __m256 half_sum16(__m512 v) { return _mm256_add_ps(half16<0>(v), half16<1>(v)); }
inline __m256 half_max16(__m512 v) { return _mm256_max_ps(half16<0>(v), half16<1>(v)); }

// exp8 on 16 floats: the same operations lane by lane, so the same results.
inline __m512 exp16(__m512 x) {
    using C = exp_consts;
    x = _mm512_maskz_min_ps(all16, x, _mm512_set1_ps(C::hi));
    const __mmask16 under = _mm512_cmp_ps_mask(x, _mm512_set1_ps(C::lo), _CMP_LT_OQ);
    x = _mm512_maskz_max_ps(all16, x, _mm512_set1_ps(C::lo));
    const __m512 n = _mm512_maskz_roundscale_ps(all16, _mm512_mul_ps(x, _mm512_set1_ps(C::log2e)),
                                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(C::ln2_hi), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(C::ln2_lo), r);
    __m512 p = _mm512_set1_ps(C::poly[0]);
#pragma GCC unroll 6
    for (int k = 1; k < 7; k++) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(C::poly[k]));
    const __m512i e = _mm512_maskz_slli_epi32(
        all16, _mm512_add_epi32(_mm512_maskz_cvtps_epi32(all16, n), _mm512_set1_epi32(127)), 23);
    return _mm512_maskz_mul_ps((__mmask16)~under, p, _mm512_castsi512_ps(e));
}
#endif

// Asks for [p, p + bytes) in L2 (prefetcht1, a hint: no fault past a buffer's
// end). Decode attention reads each layer's cache once per token, after the
// weights have pushed it out of the caches, in runs of a few KiB per KV head
// that the hardware prefetchers pick up late; L2, not L1, so the requests do
// not hold the L1 fill buffers the demand loads need (quant_simd.cpp). A
// request still waits for a free fill buffer when too many are out: loops ask
// for a few lines per step as they go, not a whole block at once
// (attention_kivi.h, KIVI_SCORE_PREFETCH_SLOTS).
inline void prefetch_l2(const void* p, size_t bytes) {
    for (size_t k = 0; k < bytes; k += 64) __builtin_prefetch((const char*)p + k, 0, 2);
}

inline float dot_f32(const float* a, const float* b, int n) {
    int i = 0;
    float s = 0;
#ifdef ZK_SIMD_AVX2
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (; i + 16 <= n; i += 16) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
    }
    for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    s = hsum(_mm256_add_ps(acc0, acc1));
#endif
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

// y += a * x over n floats.
inline void axpy_f32(float a, const float* x, float* y, int n) {
    int i = 0;
#ifdef ZK_SIMD_AVX2
    const __m256 va = _mm256_set1_ps(a);
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
#endif
    for (; i < n; i++) y[i] += a * x[i];
}

// z[i] = x[i] * y[i] over n floats.
inline void mul_f32(const float* x, const float* y, float* z, int n) {
    int i = 0;
#ifdef ZK_SIMD_AVX2
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(z + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
#endif
    for (; i < n; i++) z[i] = x[i] * y[i];
}

inline void f16_to_f32_row(const uint16_t* src, float* dst, int n) {
    int i = 0;
#ifdef ZK_SIMD_AVX2
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(src + i))));
    for (; i < n; i++) dst[i] = _cvtsh_ss(src[i]);
#endif
    for (; i < n; i++) dst[i] = fp16_to_fp32(src[i]);
}

inline void f32_to_f16_row(const float* src, uint16_t* dst, int n) {
    int i = 0;
#ifdef ZK_SIMD_AVX2
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i*)(dst + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
#endif
    for (; i < n; i++) dst[i] = fp32_to_fp16(src[i]);
}

inline float max_f32(const float* x, int n) {
    float m = -INFINITY;
    int i = 0;
#ifdef ZK_SIMD_AVX512
    if (n >= 64) {  // (decode attention's softmax: a range's scores per head)
        __m512 v = _mm512_loadu_ps(x), v1 = v, v2 = v, v3 = v;
        for (i = 16; i + 64 <= n; i += 64) {
            v = _mm512_maskz_max_ps(all16, v, _mm512_loadu_ps(x + i));
            v1 = _mm512_maskz_max_ps(all16, v1, _mm512_loadu_ps(x + i + 16));
            v2 = _mm512_maskz_max_ps(all16, v2, _mm512_loadu_ps(x + i + 32));
            v3 = _mm512_maskz_max_ps(all16, v3, _mm512_loadu_ps(x + i + 48));
        }
        v = _mm512_maskz_max_ps(all16, _mm512_maskz_max_ps(all16, v, v1), _mm512_maskz_max_ps(all16, v2, v3));
        for (; i + 16 <= n; i += 16) v = _mm512_maskz_max_ps(all16, v, _mm512_loadu_ps(x + i));
        m = hmax(half_max16(v));
    }
#endif
#ifdef ZK_SIMD_AVX2
    if (i == 0 && n >= 8) {
        // four independent chains: one max per load would wait on the previous one
        __m256 v = _mm256_loadu_ps(x), v1 = v, v2 = v, v3 = v;
        for (i = 8; i + 32 <= n; i += 32) {
            v = _mm256_max_ps(v, _mm256_loadu_ps(x + i));
            v1 = _mm256_max_ps(v1, _mm256_loadu_ps(x + i + 8));
            v2 = _mm256_max_ps(v2, _mm256_loadu_ps(x + i + 16));
            v3 = _mm256_max_ps(v3, _mm256_loadu_ps(x + i + 24));
        }
        v = _mm256_max_ps(_mm256_max_ps(v, v1), _mm256_max_ps(v2, v3));
        for (; i + 8 <= n; i += 8) v = _mm256_max_ps(v, _mm256_loadu_ps(x + i));
        m = hmax(v);
    }
#endif
    for (; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}

// x[i] *= a over n floats.
inline void scale_f32(float* x, int n, float a) {
    int i = 0;
#ifdef ZK_SIMD_AVX2
    const __m256 va = _mm256_set1_ps(a);
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(va, _mm256_loadu_ps(x + i)));
#endif
    for (; i < n; i++) x[i] *= a;
}

// x[i] = e^(x[i] - m) in place; returns the sum.
inline float exp_shift_sum(float* x, int n, float m) {
    int i = 0;
    float s = 0;
#ifdef ZK_SIMD_AVX512
    if (n >= 64) {
        // two sums: one add a vector would wait on the last (4 cycles a 16 floats)
        const __m512 vm = _mm512_set1_ps(m);
        __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
        for (; i + 32 <= n; i += 32) {
            const __m512 e0 = exp16(_mm512_sub_ps(_mm512_loadu_ps(x + i), vm));
            const __m512 e1 = exp16(_mm512_sub_ps(_mm512_loadu_ps(x + i + 16), vm));
            _mm512_storeu_ps(x + i, e0);
            _mm512_storeu_ps(x + i + 16, e1);
            a0 = _mm512_add_ps(a0, e0);
            a1 = _mm512_add_ps(a1, e1);
        }
        for (; i + 16 <= n; i += 16) {
            const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(x + i), vm));
            _mm512_storeu_ps(x + i, e);
            a0 = _mm512_add_ps(a0, e);
        }
        s = hsum(half_sum16(_mm512_add_ps(a0, a1)));
    }
#endif
#ifdef ZK_SIMD_AVX2
    const __m256 vm = _mm256_set1_ps(m);
    __m256 acc = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8) {
        const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm));
        _mm256_storeu_ps(x + i, e);
        acc = _mm256_add_ps(acc, e);
    }
    s += hsum(acc);
#endif
    for (; i < n; i++) {
        x[i] = std::exp(x[i] - m);
        s += x[i];
    }
    return s;
}

}  // namespace simd
}  // namespace zk
