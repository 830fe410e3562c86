// Register-blocked float loops of the decode attention kernel (AVX2), shared by
// the f16/f32 rows (attention_rows.cpp) and the 8-bit codes (attention_q8.cpp):
// the element type T (float, f16 as uint16_t, int8 codes before their scale)
// only changes how 8 or 4 channels are loaded.
// Scores and value sums with the accumulators in registers: 4 slots x G query
// heads share each converted K chunk, and the value sum keeps G x 32 channels of
// accumulators live across slots, so a slot costs about (G + 1) r / 8 vector
// operations and no loads/stores of partial sums. Ranks are multiples of 4.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/attention_layout.h"

namespace zk {
namespace attn {

#ifdef ZK_SIMD_AVX2
template <typename T>
inline __m256 load8(const T* p);
template <>
inline __m256 load8<float>(const float* p) { return _mm256_loadu_ps(p); }
template <>
inline __m256 load8<uint16_t>(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p)); }
template <>  // 8-bit codes, before their per-block scale
inline __m256 load8<int8_t>(const int8_t* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)p)));
}
template <typename T>
inline __m128 load4(const T* p);
template <>
inline __m128 load4<float>(const float* p) { return _mm_loadu_ps(p); }
template <>
inline __m128 load4<uint16_t>(const uint16_t* p) { return _mm_cvtph_ps(_mm_loadl_epi64((const __m128i*)p)); }
template <>  // 8-bit codes, before their per-block scale
inline __m128 load4<int8_t>(const int8_t* p) {
    int32_t x;  // a 4-byte load: nothing past a row (or the buffer) is read
    std::memcpy(&x, p, 4);
    return _mm_cvtepi32_ps(_mm_cvtepi8_epi32(_mm_cvtsi32_si128(x)));
}

// Sums of 4 vectors' lanes: {sum a, sum b, sum c, sum d}.
inline __m128 hsum4(__m256 a, __m256 b, __m256 c, __m256 d) {
    const __m256 ab = _mm256_hadd_ps(a, b), cd = _mm256_hadd_ps(c, d);
    const __m256 abcd = _mm256_hadd_ps(ab, cd);
    return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

// Rows asked for ahead of the slot being read (simd::prefetch_l2): at r = 128
// f16, 4 KiB.
constexpr int64_t k_stripe_prefetch_slots = 16;

// sc[j * n + s - s0] = q_j . k_s for s in [a, b); r % 4 == 0. G is a template
// parameter so the 4 x G accumulators stay in registers.
// Scores of slots [a, b) for G <= 4 heads: 4 slots x G accumulators. With
// SCALED (8-bit codes), each 8-code chunk is multiplied by its slot's scale of
// block c / KV_Q8_BLOCK (d [slots x nb], row s - off) before the FMA, so the
// result is the dot product with the dequantized row up to rounding.
template <typename T, int G, bool SCALED>
void scores_fast_g(const T* K, const uint16_t* d, int nb, int64_t off, int64_t a, int64_t b, int64_t s0, int64_t n,
                   int r, const float* qt, int64_t qhs, float* sc) {
    // slot s is row s - off of K
    int64_t s = a;
    for (; s + 4 <= b; s += 4) {
        __m256 acc[G][4];
#pragma GCC unroll 8
        for (int j = 0; j < G; j++)
#pragma GCC unroll 8
            for (int u = 0; u < 4; u++) acc[j][u] = _mm256_setzero_ps();
        const T* k0 = K + (s - off) * r;
        const uint16_t* d0 = SCALED ? d + (s - off) * nb : nullptr;
        if (s + k_stripe_prefetch_slots + 4 <= b) {  // the 4 rows that many slots ahead
            simd::prefetch_l2(k0 + k_stripe_prefetch_slots * r, sizeof(T) * 4 * r);
            if (SCALED) simd::prefetch_l2(d0 + k_stripe_prefetch_slots * nb, sizeof(uint16_t) * 4 * nb);
        }
        __m256 sc0 = _mm256_set1_ps(1.0f), sc1 = sc0, sc2 = sc0, sc3 = sc0;
        auto scales_at = [&](int c) {  // the 4 slots' scales of the block holding channel c
            if (!SCALED || c % KV_Q8_BLOCK != 0) return;
            const int bi = c / KV_Q8_BLOCK;
            sc0 = _mm256_set1_ps(h2f(d0[bi])), sc1 = _mm256_set1_ps(h2f(d0[nb + bi]));
            sc2 = _mm256_set1_ps(h2f(d0[2 * nb + bi])), sc3 = _mm256_set1_ps(h2f(d0[3 * nb + bi]));
        };
        int c = 0;
        for (; c + 8 <= r; c += 8) {
            scales_at(c);
            __m256 kv0 = load8(k0 + c), kv1 = load8(k0 + r + c), kv2 = load8(k0 + 2 * r + c), kv3 = load8(k0 + 3 * r + c);
            if (SCALED) {
                kv0 = _mm256_mul_ps(sc0, kv0), kv1 = _mm256_mul_ps(sc1, kv1);
                kv2 = _mm256_mul_ps(sc2, kv2), kv3 = _mm256_mul_ps(sc3, kv3);
            }
#pragma GCC unroll 8
            for (int j = 0; j < G; j++) {
                const __m256 qv = _mm256_loadu_ps(qt + j * qhs + c);
                acc[j][0] = _mm256_fmadd_ps(qv, kv0, acc[j][0]);
                acc[j][1] = _mm256_fmadd_ps(qv, kv1, acc[j][1]);
                acc[j][2] = _mm256_fmadd_ps(qv, kv2, acc[j][2]);
                acc[j][3] = _mm256_fmadd_ps(qv, kv3, acc[j][3]);
            }
        }
        __m128 t0 = _mm_setzero_ps(), t1 = t0, t2 = t0, t3 = t0;
        if (c < r) {  // a 4-channel tail
            scales_at(c);
            t0 = load4(k0 + c), t1 = load4(k0 + r + c), t2 = load4(k0 + 2 * r + c), t3 = load4(k0 + 3 * r + c);
            if (SCALED) {
                t0 = _mm_mul_ps(_mm256_castps256_ps128(sc0), t0), t1 = _mm_mul_ps(_mm256_castps256_ps128(sc1), t1);
                t2 = _mm_mul_ps(_mm256_castps256_ps128(sc2), t2), t3 = _mm_mul_ps(_mm256_castps256_ps128(sc3), t3);
            }
        }
#pragma GCC unroll 8
        for (int j = 0; j < G; j++) {
            __m128 sum = hsum4(acc[j][0], acc[j][1], acc[j][2], acc[j][3]);
            if (c < r) {
                const __m128 qv = _mm_loadu_ps(qt + j * qhs + c);
                sum = _mm_add_ps(sum, _mm_hadd_ps(_mm_hadd_ps(_mm_mul_ps(qv, t0), _mm_mul_ps(qv, t1)),
                                                  _mm_hadd_ps(_mm_mul_ps(qv, t2), _mm_mul_ps(qv, t3))));
            }
            _mm_storeu_ps(sc + j * n + s - s0, sum);
        }
    }
    for (; s < b; s++) {
        float row[256];
        if (SCALED)
            q8_row_to_f32((const int8_t*)(K + (s - off) * r), d + (s - off) * nb, r, row);
        else
            for (int c = 0; c + 4 <= r; c += 4) _mm_storeu_ps(row + c, load4(K + (s - off) * r + c));
        for (int j = 0; j < G; j++) sc[j * n + s - s0] = simd::dot_f32(qt + j * qhs, row, r);
    }
}

// Any number of heads, in register-sized groups of at most 4; d = nullptr for
// f16/f32 rows, the block scales for 8-bit codes. r % 4 == 0, r <= 256.
template <typename T>
void scores_fast(const T* K, const uint16_t* d, int nb, int64_t off, int64_t a, int64_t b, int64_t s0, int64_t n,
                 int r, const float* qt, int64_t qhs, int G, float* sc) {
    for (int j0 = 0; j0 < G; j0 += 4) {
        const float* q = qt + j0 * qhs;
        float* o = sc + j0 * n;
        const int g = std::min(4, G - j0);
#define ZK_SCORES(GG)                                                                                      \
    (d ? scores_fast_g<T, GG, true>(K, d, nb, off, a, b, s0, n, r, q, qhs, o)                              \
       : scores_fast_g<T, GG, false>(K, d, nb, off, a, b, s0, n, r, q, qhs, o))
        switch (g) {
            case 1: ZK_SCORES(1); break;
            case 2: ZK_SCORES(2); break;
            case 3: ZK_SCORES(3); break;
            default: ZK_SCORES(4); break;
        }
#undef ZK_SCORES
    }
}

// One stripe of channels [c0, c0 + 8 NV (+ 4 if TAIL)) of the value sum, with
// G x NV accumulators held in registers over all slots of [a, b). The first
// stripe (c0 == 0) asks for whole rows ahead, which the others then find in L2.
template <typename T, int G, int NV, bool TAIL>
void values_stripe(const T* V, int64_t off, int64_t a, int64_t b, int64_t s0, int64_t n, int r, int c0,
                   const float* sc, float* acc) {
    const int64_t pf_end = c0 == 0 ? b - k_stripe_prefetch_slots : a;
    __m256 ac[G][NV > 0 ? NV : 1];
    __m128 at[G];
#pragma GCC unroll 8
    for (int j = 0; j < G; j++) {
#pragma GCC unroll 8
        for (int u = 0; u < NV; u++) ac[j][u] = _mm256_loadu_ps(acc + j * r + c0 + 8 * u);
        if (TAIL) at[j] = _mm_loadu_ps(acc + j * r + c0 + 8 * NV);
    }
    for (int64_t s = a; s < b; s++) {
        const T* v = V + (s - off) * r + c0;
        if (s < pf_end) simd::prefetch_l2(v + k_stripe_prefetch_slots * r, sizeof(T) * r);
        __m256 vv[NV > 0 ? NV : 1];
#pragma GCC unroll 8
        for (int u = 0; u < NV; u++) vv[u] = load8(v + 8 * u);
        const __m128 vt = TAIL ? load4(v + 8 * NV) : _mm_setzero_ps();
#pragma GCC unroll 8
        for (int j = 0; j < G; j++) {
            const float* pj = sc + j * n + s - s0;
            const __m256 p = _mm256_broadcast_ss(pj);
#pragma GCC unroll 8
            for (int u = 0; u < NV; u++) ac[j][u] = _mm256_fmadd_ps(p, vv[u], ac[j][u]);
            if (TAIL) at[j] = _mm_fmadd_ps(_mm_broadcast_ss(pj), vt, at[j]);
        }
    }
#pragma GCC unroll 8
    for (int j = 0; j < G; j++) {
#pragma GCC unroll 8
        for (int u = 0; u < NV; u++) _mm256_storeu_ps(acc + j * r + c0 + 8 * u, ac[j][u]);
        if (TAIL) _mm_storeu_ps(acc + j * r + c0 + 8 * NV, at[j]);
    }
}

// One stripe of len channels from c0 (len 4..32, a multiple of 4).
template <typename T, int G>
void values_stripe_len(int len, const T* V, int64_t off, int64_t a, int64_t b, int64_t s0, int64_t n, int r, int c0,
                       const float* sc, float* acc) {
    switch (len) {
        case 4: values_stripe<T, G, 0, true>(V, off, a, b, s0, n, r, c0, sc, acc); break;
        case 8: values_stripe<T, G, 1, false>(V, off, a, b, s0, n, r, c0, sc, acc); break;
        case 12: values_stripe<T, G, 1, true>(V, off, a, b, s0, n, r, c0, sc, acc); break;
        case 16: values_stripe<T, G, 2, false>(V, off, a, b, s0, n, r, c0, sc, acc); break;
        case 20: values_stripe<T, G, 2, true>(V, off, a, b, s0, n, r, c0, sc, acc); break;
        case 24: values_stripe<T, G, 3, false>(V, off, a, b, s0, n, r, c0, sc, acc); break;
        case 28: values_stripe<T, G, 3, true>(V, off, a, b, s0, n, r, c0, sc, acc); break;
        default: values_stripe<T, G, 4, false>(V, off, a, b, s0, n, r, c0, sc, acc); break;  // 32
    }
}

// acc_j[c] += sum_{s in [a, b)} p_j(s) v_s[c]; r % 4 == 0: stripes of 32
// channels, then one stripe for the remaining 4..28.
template <typename T, int G>
void values_fp_fast_g(const T* V, int64_t off, int64_t a, int64_t b, int64_t s0, int64_t n, int r,
                      const float* sc, float* acc) {
    for (int c0 = 0; c0 < r; c0 += 32) values_stripe_len<T, G>(std::min(32, r - c0), V, off, a, b, s0, n, r, c0, sc, acc);
}

// More than 4 heads go in passes over the rows of at most 4 heads each, as
// even as can be (6 = 3 + 3, 7 = 4 + 3): each pass keeps its heads'
// accumulators in registers.
template <typename T>
void values_fp_fast(const T* V, int64_t off, int64_t a, int64_t b, int64_t s0, int64_t n, int r, int G,
                    const float* sc, float* acc) {
    const int passes = (G + 3) / 4;
    for (int i = 0, j0 = 0; i < passes; i++) {
        const int g = (G - j0) / (passes - i);
        const float* sj = sc + j0 * n;
        float* aj = acc + j0 * r;
        switch (g) {
            case 1: values_fp_fast_g<T, 1>(V, off, a, b, s0, n, r, sj, aj); break;
            case 2: values_fp_fast_g<T, 2>(V, off, a, b, s0, n, r, sj, aj); break;
            case 3: values_fp_fast_g<T, 3>(V, off, a, b, s0, n, r, sj, aj); break;
            default: values_fp_fast_g<T, 4>(V, off, a, b, s0, n, r, sj, aj); break;
        }
        j0 += g;
    }
}
#endif

// True when the fast paths apply to a block of this shape.
inline bool fp_fast_ok(int G, int r) {
#ifdef ZK_SIMD_AVX2
    return G >= 1 && r % 4 == 0 && r <= 256;
#else
    return false;
#endif
}

}  // namespace attn
}  // namespace zk
