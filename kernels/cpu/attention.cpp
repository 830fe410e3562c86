#include "kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "ggml-like/error.h"
#include "kernels/cpu/simd.h"

namespace zk {

namespace {

// ---- row decoders: one cached row to f32 in scratch (never a whole cache) ----

inline float h2f(uint16_t h) {
#ifdef ZK_SIMD_AVX2
    return _cvtsh_ss(h);
#else
    return fp16_to_fp32(h);
#endif
}

// Row s of a full-precision [n x r] block as f32 (a pointer into the block for
// F32, a conversion into tmp for F16).
inline const float* kv_row(dtype t, const void* base, int64_t s, int r, float* tmp) {
    if (t == dtype::F32) return (const float*)base + s * r;
    simd::f16_to_f32_row((const uint16_t*)base + s * r, tmp, r);
    return tmp;
}

// r 4-bit codes (low nibble first) to floats 0..15.
inline void q4_codes_to_f32(const uint8_t* src, int r, float* dst) {
    int i = 0;
#ifdef ZK_SIMD_AVX2
    const __m128i mask = _mm_set1_epi8(0x0F);
    for (; i + 16 <= r; i += 16) {
        const __m128i b = _mm_loadl_epi64((const __m128i*)(src + i / 2));
        const __m128i lo = _mm_and_si128(b, mask);
        const __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), mask);
        const __m128i x = _mm_unpacklo_epi8(lo, hi);  // 16 codes in channel order
        _mm256_storeu_ps(dst + i, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(x)));
        _mm256_storeu_ps(dst + i + 8, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(x, 8))));
    }
#endif
    for (; i < r; i++) dst[i] = (float)((src[i / 2] >> ((i & 1) * 4)) & 0x0F);
}

// int8 codes times one scale per block of KV_Q8_BLOCK channels.
inline void q8_row_to_f32(const int8_t* src, const uint16_t* d, int r, float* dst) {
    for (int b0 = 0, bi = 0; b0 < r; b0 += KV_Q8_BLOCK, bi++) {
        const int n = std::min(KV_Q8_BLOCK, r - b0);
        const float sc = h2f(d[bi]);
        int i = 0;
#ifdef ZK_SIMD_AVX2
        const __m256 vs = _mm256_set1_ps(sc);
        for (; i + 8 <= n; i += 8) {
            const __m128i c = _mm_loadl_epi64((const __m128i*)(src + b0 + i));
            _mm256_storeu_ps(dst + b0 + i, _mm256_mul_ps(vs, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(c))));
        }
#endif
        for (; i < n; i++) dst[b0 + i] = sc * (float)src[b0 + i];
    }
}

// Slots per chunk whose Q4 value weights are computed ahead of the slot loop.
constexpr int KV_Q4_WCHUNK = 64;

struct scratch_layout {
    float* sc;    // [G x n] scores, then probabilities
    float* krow;  // [r_k]
    float* vrow;  // [r_v]
    float* qs;    // [G x r_k] folded query (Q4 keys)
    float* bias;  // [G]
    float* qb;    // [G x rank] q . B[:, i] (GEAR keys), then p^T A (GEAR values)
    float* msum;  // [G x value blocks] sum of p m_b (Q4 values)
    int8_t* qi;   // [G x 32 chunks(r_k)] int8 folded query, zero-padded (Q4 keys)
    float* qd;    // [G] its scales
    float* tmp;   // [4 x 32] accumulators of a partial value block
    float* pw;    // [6 x KV_Q4_WCHUNK] value weights p_j s_b of a chunk of slots (rows j < 4), its scales and mins
    float* kmin;  // [r_k] a key group's mins
};

scratch_layout scratch_split(float* p, int G, int64_t n, int r_k, int r_v, int rank) {
    scratch_layout s;
    s.sc = p;
    s.krow = s.sc + G * n;
    s.vrow = s.krow + r_k;
    s.qs = s.vrow + r_v;
    s.bias = s.qs + (int64_t)G * r_k;
    s.qb = s.bias + G;
    s.msum = s.qb + (int64_t)G * rank;
    s.qd = s.msum + (int64_t)G * kv_n_blocks(r_v, KV_Q4_VBLOCK);
    s.tmp = s.qd + G;
    s.pw = s.tmp + 4 * 32;
    s.kmin = s.pw + 6 * KV_Q4_WCHUNK;
    s.qi = (int8_t*)(s.kmin + r_k);
    return s;
}

// ---- fast paths for full-precision slots (AVX2) ----
// Scores and value sums with the accumulators in registers: 4 slots x G query
// heads share each converted K chunk, and the value sum keeps G x 32 channels of
// accumulators live across slots, so a slot costs about (G + 1) r / 8 vector
// operations and no loads/stores of partial sums. Ranks are multiples of 4.
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
// G x NV accumulators held in registers over all slots of [a, b).
template <typename T, int G, int NV, bool TAIL>
void values_stripe(const T* V, int64_t off, int64_t a, int64_t b, int64_t s0, int64_t n, int r, int c0,
                   const float* sc, float* acc) {
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

template <typename T>
void values_fp_fast(const T* V, int64_t off, int64_t a, int64_t b, int64_t s0, int64_t n, int r, int G,
                    const float* sc, float* acc) {
    switch (G) {
        case 1: return values_fp_fast_g<T, 1>(V, off, a, b, s0, n, r, sc, acc);
        case 2: return values_fp_fast_g<T, 2>(V, off, a, b, s0, n, r, sc, acc);
        case 3: return values_fp_fast_g<T, 3>(V, off, a, b, s0, n, r, sc, acc);
        default: return values_fp_fast_g<T, 4>(V, off, a, b, s0, n, r, sc, acc);
    }
}
#endif

// True when the fast paths apply to a block of this shape.
inline bool fp_fast_ok(int G, int r) {
#ifdef ZK_SIMD_AVX2
    return G <= 4 && r % 4 == 0 && r <= 256;
#else
    return false;
#endif
}

#ifdef ZK_SIMD_AVX2
inline float hmax8(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps(m, m, 1)));
}

// 32 4-bit codes (16 bytes, low nibble first) as 32 bytes in channel order.
// Code buffers are readable KV_Q4_PAD bytes past their last row, so a partial
// last chunk may load the whole 16 bytes; what lies past the row is never used.
inline __m256i q4_load32(const uint8_t* p) {
    const __m128i b = _mm_loadu_si128((const __m128i*)p);
    const __m128i m = _mm_set1_epi8(0x0F);
    const __m128i lo = _mm_and_si128(b, m), hi = _mm_and_si128(_mm_srli_epi16(b, 4), m);
    return _mm256_set_m128i(_mm_unpackhi_epi8(lo, hi), _mm_unpacklo_epi8(lo, hi));
}

// The folded query qs [r] of one head rounded to int8 with one scale per head
// (d = max|qs| / 127; llama.cpp likewise rounds Q to 8 bits for a quantized
// cache), written as [nchunk x 32] with zeros past r, so a chunk that reads
// codes beyond the row adds nothing. Returns d.
inline float q4_quantize_query(const float* qs, int r, int nchunk, int8_t* qi) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 mx = _mm256_setzero_ps();
    int c = 0;
    for (; c + 8 <= r; c += 8) mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, _mm256_loadu_ps(qs + c)));
    float amax = hmax8(mx);
    for (; c < r; c++) amax = std::max(amax, std::fabs(qs[c]));
    const float d = amax / 127.0f, id = d > 0 ? 1.0f / d : 0.0f;
    const __m256 vid = _mm256_set1_ps(id);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);  // undo the lane-wise packs
    float pad[32];
    for (int k = 0; k < nchunk; k++) {
        const float* src = qs + 32 * k;
        if (32 * k + 32 > r) {  // the partial last chunk, zero-padded
            const int len = r - 32 * k;
            std::memcpy(pad, src, sizeof(float) * len);
            std::memset(pad + len, 0, sizeof(float) * (32 - len));
            src = pad;
        }
        const __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(src), vid));
        const __m256i i1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(src + 8), vid));
        const __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(src + 16), vid));
        const __m256i i3 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(src + 24), vid));
        const __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
        _mm256_storeu_si256((__m256i*)(qi + 32 * k), _mm256_permutevar8x32_epi32(b, order));
    }
    return d;
}

// Q4 key scores of slots [a, b) of one group with integer dot products:
// sc = qd_j (qi_j . code_s) + bias_j. One maddubs multiplies 32 codes by 32
// query bytes and sums pairs into int16 (at most 2 * 15 * 127 = 3810), and the
// int16 sums of up to 8 chunks (r <= 256) stay below 32767; 4 slots x G
// accumulators live in registers.
template <int G>
void scores_q4_int_g(const uint8_t* codes, int rb, int nchunk, int64_t a, int64_t b, int64_t s0, int64_t n,
                     const int8_t* qi, const float* qd, const float* bias, float* sc) {
    const __m256i ones = _mm256_set1_epi16(1);
    const int qstride = nchunk * 32;
    int64_t s = a;
    for (; s + 4 <= b; s += 4) {
        __m256i acc[G][4];
#pragma GCC unroll 8
        for (int j = 0; j < G; j++)
#pragma GCC unroll 8
            for (int u = 0; u < 4; u++) acc[j][u] = _mm256_setzero_si256();
        const uint8_t* c0 = codes + s * rb;
        for (int k = 0; k < nchunk; k++) {
            // One slot's codes at a time against every head's query read from
            // memory (maddubs folds the load): 4 G accumulators + 2 temporaries
            // stay within the 16 ymm registers for G <= 3.
            const int8_t* qk = qi + 32 * k;
#pragma GCC unroll 4
            for (int u = 0; u < 4; u++) {
                const __m256i kc = q4_load32(c0 + u * rb + 16 * k);
#pragma GCC unroll 8
                for (int j = 0; j < G; j++)
                    acc[j][u] = _mm256_add_epi16(
                        acc[j][u], _mm256_maddubs_epi16(kc, _mm256_loadu_si256((const __m256i*)(qk + j * qstride))));
            }
        }
#pragma GCC unroll 8
        for (int j = 0; j < G; j++) {
            const __m128 sum = hsum4(_mm256_cvtepi32_ps(_mm256_madd_epi16(acc[j][0], ones)),
                                     _mm256_cvtepi32_ps(_mm256_madd_epi16(acc[j][1], ones)),
                                     _mm256_cvtepi32_ps(_mm256_madd_epi16(acc[j][2], ones)),
                                     _mm256_cvtepi32_ps(_mm256_madd_epi16(acc[j][3], ones)));
            _mm_storeu_ps(sc + j * n + s - s0, _mm_fmadd_ps(sum, _mm_set1_ps(qd[j]), _mm_set1_ps(bias[j])));
        }
    }
    for (; s < b; s++) {
        __m256i acc[G];
#pragma GCC unroll 8
        for (int j = 0; j < G; j++) acc[j] = _mm256_setzero_si256();
        for (int k = 0; k < nchunk; k++) {
            const __m256i kc = q4_load32(codes + s * rb + 16 * k);
#pragma GCC unroll 8
            for (int j = 0; j < G; j++)
                acc[j] = _mm256_add_epi16(
                    acc[j], _mm256_maddubs_epi16(kc, _mm256_loadu_si256((const __m256i*)(qi + j * qstride + 32 * k))));
        }
#pragma GCC unroll 8
        for (int j = 0; j < G; j++)
            sc[j * n + s - s0] = simd::hsum(_mm256_cvtepi32_ps(_mm256_madd_epi16(acc[j], ones))) * qd[j] + bias[j];
    }
}

// Q4 value sums of slots [a, b) over the first 8 NV channels (NV = 2 or 4) of
// block blk: acc_j += sum_s (p_j s_b) code_s, msum_j,b += sum_s p_j m_b, added
// into dst (row j at dst + j * stride). Per chunk of up to 64 slots the weights
// p_j s_b are computed first (vectorised) into pw [G x 64], so the slot loop broadcasts them
// from memory. Codes are widened 8 bytes at a time with vpmovzxbd: the low
// nibbles of bytes 0..7 are the even channels 0..14 and the high nibbles the odd
// ones, so the accumulators hold (even, odd) halves of each 16 channels, put back
// in channel order once at the end; no byte shuffles per slot.
// The slot loop of values_q4_block over n slots from cp (codes of the block in
// the first slot; rows rb bytes apart) with weights pw [G x KV_Q4_WCHUNK]. Kept out of line
// with its accumulators in locals: inlined into the chunk loop, GCC stored all
// G x NV accumulators to the stack on every slot.
// One slot's 16-channel half: 8 code bytes c widened to 32-bit lanes, the low
// nibbles (even channels) into e, the high ones (odd) into o, each weighted by
// the slot's p_j s_b (w[j * KV_Q4_WCHUNK]). 12 accumulators + 2 code vectors + the
// weight fit the 16 ymm registers (G = 3, two halves).
template <int G>
__attribute__((always_inline)) inline void values_q4_half(const uint8_t* c, const float* w, __m256 (&e)[G],
                                                          __m256 (&o)[G]) {
    const __m256i x = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)c));
    const __m256i hi = _mm256_srli_epi32(x, 4);  // no mask constant: one register fewer
    const __m256 ve = _mm256_cvtepi32_ps(_mm256_sub_epi32(x, _mm256_slli_epi32(hi, 4)));
    const __m256 vo = _mm256_cvtepi32_ps(hi);
#pragma GCC unroll 4
    for (int j = 0; j < G; j++) {
        const __m256 ps = _mm256_broadcast_ss(w + j * KV_Q4_WCHUNK);
        e[j] = _mm256_fmadd_ps(ps, ve, e[j]);
        o[j] = _mm256_fmadd_ps(ps, vo, o[j]);
    }
}

template <int G, int NV>
__attribute__((noinline)) void values_q4_slots(const uint8_t* cp, int rb, int64_t n, const float* pw,
                                               __m256 (&acc)[G][NV]) {
    // Even / odd channels of the first and second 16. GCC 12 keeps arrays of
    // vectors in registers only when every loop over them is fully unrolled;
    // otherwise it stores all of them on every slot.
    __m256 e0[G], o0[G], e1[G], o1[G];
#pragma GCC unroll 4
    for (int j = 0; j < G; j++) {
        e0[j] = acc[j][0], o0[j] = acc[j][1];
        e1[j] = NV == 4 ? acc[j][NV == 4 ? 2 : 0] : _mm256_setzero_ps();
        o1[j] = NV == 4 ? acc[j][NV == 4 ? 3 : 0] : _mm256_setzero_ps();
    }
    for (int64_t t = 0; t < n; t++, cp += rb) {
        const float* w = pw + t;
        values_q4_half<G>(cp, w, e0, o0);
        if (NV == 4) values_q4_half<G>(cp + 8, w, e1, o1);
    }
#pragma GCC unroll 4
    for (int j = 0; j < G; j++) {
        acc[j][0] = e0[j], acc[j][1] = o0[j];
        if (NV == 4) acc[j][NV == 4 ? 2 : 0] = e1[j], acc[j][NV == 4 ? 3 : 0] = o1[j];
    }
}

template <int G, int NV>
void values_q4_block(const uint8_t* codes, int rb, const uint16_t* vs, const uint16_t* vm, int nb, int blk,
                     int64_t a, int64_t b, int64_t s0, int64_t n, const float* sc, float* dst, int64_t stride,
                     float* msum, float* pw) {
    static_assert(NV == 2 || NV == 4, "16 or 32 channels");
    const int c0 = blk * KV_Q4_VBLOCK;
    __m256 ac[G][NV];
    float ms[G];
    for (int j = 0; j < G; j++) {
        for (int u = 0; u < NV; u++) ac[j][u] = _mm256_setzero_ps();
        ms[j] = 0;
    }
    for (int64_t s = a; s < b; s += KV_Q4_WCHUNK) {
        const int64_t e = std::min<int64_t>(b, s + KV_Q4_WCHUNK);
        const int m = (int)(e - s);
        float* sf = pw + 4 * KV_Q4_WCHUNK;  // [m] scales, then [m] mins
        float* mf = sf + KV_Q4_WCHUNK;
        if (nb == 1) {
            simd::f16_to_f32_row(vs + s, sf, m);
            simd::f16_to_f32_row(vm + s, mf, m);
        } else {
            for (int t = 0; t < m; t++) sf[t] = h2f(vs[(s + t) * nb + blk]), mf[t] = h2f(vm[(s + t) * nb + blk]);
        }
        for (int j = 0; j < G; j++) {
            const float* p = sc + j * n + s - s0;
            simd::mul_f32(p, sf, pw + j * KV_Q4_WCHUNK, m);
            ms[j] += simd::dot_f32(p, mf, m);
        }
        values_q4_slots<G, NV>(codes + s * rb + c0 / 2, rb, e - s, pw, ac);
    }
    for (int j = 0; j < G; j++) {
        for (int h = 0; h < NV / 2; h++) {
            // (even, odd) -> channels 16h + 0..7 and 16h + 8..15
            const __m256 lo = _mm256_unpacklo_ps(ac[j][2 * h], ac[j][2 * h + 1]);
            const __m256 hi = _mm256_unpackhi_ps(ac[j][2 * h], ac[j][2 * h + 1]);
            float* d = dst + j * stride + 16 * h;
            _mm256_storeu_ps(d, _mm256_add_ps(_mm256_loadu_ps(d), _mm256_permute2f128_ps(lo, hi, 0x20)));
            _mm256_storeu_ps(d + 8, _mm256_add_ps(_mm256_loadu_ps(d + 8), _mm256_permute2f128_ps(lo, hi, 0x31)));
        }
        msum[j * nb + blk] += ms[j];
    }
}

// All value blocks of slots [a, b). Full blocks add in place to acc [G x r]; a
// partial last block (r % 32 != 0) sums 16 or 32 channels into `tmp` [G x 32]
// (the codes past r that it reads are padding or the next row, and land in
// channels that are dropped), then adds the channels below r.
template <int G>
void values_q4_fast_g(const uint8_t* codes, int rb, const uint16_t* vs, const uint16_t* vm, int nb, int64_t a,
                      int64_t b, int64_t s0, int64_t n, int r, const float* sc, float* acc, float* msum,
                      float* tmp, float* pw) {
    const int full = r / KV_Q4_VBLOCK;
    for (int blk = 0; blk < full; blk++)
        values_q4_block<G, 4>(codes, rb, vs, vm, nb, blk, a, b, s0, n, sc, acc + blk * KV_Q4_VBLOCK, r, msum, pw);
    const int c0 = full * KV_Q4_VBLOCK, len = r - c0;
    if (len == 0) return;
    std::memset(tmp, 0, sizeof(float) * G * 32);
    if (len <= 16)
        values_q4_block<G, 2>(codes, rb, vs, vm, nb, full, a, b, s0, n, sc, tmp, 32, msum, pw);
    else
        values_q4_block<G, 4>(codes, rb, vs, vm, nb, full, a, b, s0, n, sc, tmp, 32, msum, pw);
    for (int j = 0; j < G; j++)
        for (int c = 0; c < len; c++) acc[j * r + c0 + c] += tmp[j * 32 + c];
}

// ---- fast paths for 8-bit slots (AVX2) ----
// Codes are int8 per token with one f16 scale per KV_Q8_BLOCK (32) channels.
// Keys: scores_fast_g<int8_t, G, SCALED = true>, the f16 path's loop with each
// 8-code chunk multiplied by its slot's block scale.
// Values: per block, the weights p_j d_s are computed per chunk of slots first,
// then values_stripe (the f16 path's loop, with load8/load4<int8_t>) accumulates
// G x (channels / 8) vectors in registers. Ranks are multiples of 4; a 4-channel
// tail is loaded with a 4-byte load, so nothing past a row (or the buffer) is read.

// 8-bit values: per block and chunk of slots, the weights p_j d_s (scale of
// slot s's block) into pw [G x KV_Q4_WCHUNK], then the f16 path's stripe loop
// on the int8 codes with those weights.
template <int G>
void values_q8_fast_g(const int8_t* codes, const uint16_t* d, int nb, int64_t a, int64_t b, int64_t s0, int64_t n,
                      int r, const float* sc, float* acc, float* pw) {
    float* df = pw + 4 * KV_Q4_WCHUNK;  // [m] the chunk's scales
    for (int blk = 0; blk < nb; blk++) {
        const int c0 = blk * KV_Q8_BLOCK, len = std::min(KV_Q8_BLOCK, r - c0);
        for (int64_t s = a; s < b; s += KV_Q4_WCHUNK) {
            const int m = (int)std::min<int64_t>(KV_Q4_WCHUNK, b - s);
            for (int t = 0; t < m; t++) df[t] = h2f(d[(s + t) * nb + blk]);
            for (int j = 0; j < G; j++) simd::mul_f32(sc + j * n + s - s0, df, pw + j * KV_Q4_WCHUNK, m);
            values_stripe_len<int8_t, G>(len, codes, 0, s, s + m, s, KV_Q4_WCHUNK, r, c0, pw, acc);
        }
    }
}

void values_q8_fast(const int8_t* codes, const uint16_t* d, int nb, int64_t a, int64_t b, int64_t s0, int64_t n,
                    int r, int G, const float* sc, float* acc, float* pw) {
    for (int j0 = 0; j0 < G; j0 += 4) {
        const float* p = sc + j0 * n;
        float* o = acc + j0 * r;
        switch (std::min(4, G - j0)) {
            case 1: values_q8_fast_g<1>(codes, d, nb, a, b, s0, n, r, p, o, pw); break;
            case 2: values_q8_fast_g<2>(codes, d, nb, a, b, s0, n, r, p, o, pw); break;
            case 3: values_q8_fast_g<3>(codes, d, nb, a, b, s0, n, r, p, o, pw); break;
            default: values_q8_fast_g<4>(codes, d, nb, a, b, s0, n, r, p, o, pw); break;
        }
    }
}
#endif

// ---- scores ----

// The group holding quantized slot s.
inline int64_t group_of(const attn_kv_view& kv, int64_t s) {
    return std::upper_bound(kv.group_start, kv.group_start + kv.n_groups + 1, (int32_t)s) - kv.group_start - 1;
}

// Q4 keys of slots [a, b) (inside the quantized part) into sc (index s - s0),
// unscaled. Per group: the folded query q_c s_c and bias sum_c q_c m_c once,
// then one nibble row per slot shared by the G query heads.
void scores_q4(const attn_kv_view& kv, int64_t a, int64_t b, int64_t s0, int64_t n, const float* qt,
               const attn_q_view& q, scratch_layout& w) {
    const int G = q.n_group, r = kv.r_k, gs = kv.group, rb = kv_q4_row_bytes(r);
    const uint8_t* codes = (const uint8_t*)kv.kq;
    const attn_gear_view& gr = kv.gear_k;
    for (int64_t g = group_of(kv, a); g < kv.n_groups && kv.group_start[g] < b; g++) {
        const int64_t g0 = kv.group_start[g];
        const int64_t ga = std::max<int64_t>(a, g0), gb = std::min<int64_t>(b, kv.group_start[g + 1]);
        const uint16_t* scl = kv.ks + g * r;
        const uint16_t* mn = kv.km + g * r;
        simd::f16_to_f32_row(scl, w.krow, r);
        simd::f16_to_f32_row(mn, w.kmin, r);
        for (int j = 0; j < G; j++) {
            const float* qj = qt + j * q.q_head_stride;
            simd::mul_f32(qj, w.krow, w.qs + j * r, r);
            w.bias[j] = simd::dot_f32(qj, w.kmin, r);
        }
#ifdef ZK_SIMD_AVX2
        const int nchunk = (r + 31) / 32;
        if (nchunk <= 8) {  // int16 sums stay exact up to r = 256
            const int qstride = nchunk * 32;
            for (int j = 0; j < G; j++) w.qd[j] = q4_quantize_query(w.qs + j * r, r, nchunk, w.qi + j * qstride);
            for (int j0 = 0; j0 < G; j0 += 4) {  // query heads in register-sized groups
                const int8_t* qi = w.qi + j0 * qstride;
                float* sc = w.sc + j0 * n;
                switch (std::min(4, G - j0)) {
                    case 1: scores_q4_int_g<1>(codes, rb, nchunk, ga, gb, s0, n, qi, w.qd + j0, w.bias + j0, sc); break;
                    case 2: scores_q4_int_g<2>(codes, rb, nchunk, ga, gb, s0, n, qi, w.qd + j0, w.bias + j0, sc); break;
                    case 3: scores_q4_int_g<3>(codes, rb, nchunk, ga, gb, s0, n, qi, w.qd + j0, w.bias + j0, sc); break;
                    default: scores_q4_int_g<4>(codes, rb, nchunk, ga, gb, s0, n, qi, w.qd + j0, w.bias + j0, sc); break;
                }
            }
        } else
#endif
        for (int64_t s = ga; s < gb; s++) {
            q4_codes_to_f32(codes + s * rb, r, w.krow);
            for (int j = 0; j < G; j++) w.sc[j * n + s - s0] = simd::dot_f32(w.qs + j * r, w.krow, r) + w.bias[j];
        }
        if (gr.rank == 0) continue;
        const int k = gr.rank;
        const uint16_t* B = gr.b + g * r * k;
        const uint16_t* A = gr.a + g * gs * k;
        for (int j = 0; j < G; j++) {
            const float* qj = qt + j * q.q_head_stride;
            for (int i = 0; i < k; i++) {
                float d = 0;
                for (int c = 0; c < r; c++) d += qj[c] * h2f(B[c * k + i]);
                w.qb[j * k + i] = d;
            }
        }
        for (int64_t s = ga; s < gb; s++) {
            const uint16_t* At = A + (s - g0) * k;
            for (int j = 0; j < G; j++) {
                float d = 0;
                for (int i = 0; i < k; i++) d += h2f(At[i]) * w.qb[j * k + i];
                w.sc[j * n + s - s0] += d;
            }
        }
        const uint16_t* oi = gr.out_idx + g * gr.n_out;
        const uint16_t* ov = gr.out_val + g * gr.n_out;
        for (int o = 0; o < gr.n_out && oi[o] != KV_GEAR_NONE; o++) {
            const int64_t s = g0 + oi[o] / r;
            if (s < ga || s >= gb) continue;
            const int c = oi[o] % r;
            const float val = h2f(ov[o]);
            for (int j = 0; j < G; j++) w.sc[j * n + s - s0] += qt[j * q.q_head_stride + c] * val;
        }
    }
}

// Unscaled scores of slots [s0, e) into sc.
void scores_all(const attn_kv_view& kv, int64_t s0, int64_t e, int64_t n, const float* qt, const attn_q_view& q,
                scratch_layout& w) {
    const int G = q.n_group, r = kv.r_k;
    const int64_t qe = std::min(e, kv.n_quant);
    if (kv.quant == KV_QUANT_Q8) {
        const int nb = kv_n_blocks(r, KV_Q8_BLOCK);
#ifdef ZK_SIMD_AVX2
        if (s0 < qe && r % 4 == 0 && r <= 256) {
            scores_fast((const int8_t*)kv.kq, kv.ks, nb, 0, s0, qe, s0, n, r, qt, q.q_head_stride, G, w.sc);
        } else
#endif
        for (int64_t s = s0; s < qe; s++) {
            q8_row_to_f32((const int8_t*)kv.kq + s * r, kv.ks + s * nb, r, w.krow);
            for (int j = 0; j < G; j++) w.sc[j * n + s - s0] = simd::dot_f32(qt + j * q.q_head_stride, w.krow, r);
        }
    } else if (kv.quant == KV_QUANT_Q4 && s0 < qe) {
        scores_q4(kv, s0, qe, s0, n, qt, q, w);
    }
    const int64_t f0 = std::max(s0, kv.n_quant);
#ifdef ZK_SIMD_AVX2
    if (f0 < e && fp_fast_ok(G, r)) {
        if (kv.type == dtype::F16)
            scores_fast((const uint16_t*)kv.k, nullptr, 0, kv.n_quant, f0, e, s0, n, r, qt, q.q_head_stride, G, w.sc);
        else
            scores_fast((const float*)kv.k, nullptr, 0, kv.n_quant, f0, e, s0, n, r, qt, q.q_head_stride, G, w.sc);
        return;
    }
#endif
    for (int64_t s = f0; s < e; s++) {
        const float* kr = kv_row(kv.type, kv.k, s - kv.n_quant, r, w.krow);
        for (int j = 0; j < G; j++) w.sc[j * n + s - s0] = simd::dot_f32(qt + j * q.q_head_stride, kr, r);
    }
}

// ---- values ----

// GEAR value correction of slots [a, b) in group g: acc_j += (p_j^T A) B^T + sparse.
void values_gear_q4(const attn_kv_view& kv, int64_t g, int64_t a, int64_t b, int64_t s0, int64_t n, int G,
                    float* acc, scratch_layout& w) {
    const attn_gear_view& gr = kv.gear_v;
    const int k = gr.rank, r = kv.r_v, gs = kv.group;
    const int64_t g0 = kv.group_start[g];
    const uint16_t* A = gr.a + g * gs * k;
    const uint16_t* B = gr.b + g * r * k;
    for (int j = 0; j < G * k; j++) w.qb[j] = 0;
    for (int64_t s = a; s < b; s++) {
        const uint16_t* At = A + (s - g0) * k;
        for (int i = 0; i < k; i++) {
            const float av = h2f(At[i]);
            for (int j = 0; j < G; j++) w.qb[j * k + i] += w.sc[j * n + s - s0] * av;
        }
    }
    for (int c = 0; c < r; c++)
        for (int i = 0; i < k; i++) {
            const float bv = h2f(B[c * k + i]);
            for (int j = 0; j < G; j++) acc[j * r + c] += w.qb[j * k + i] * bv;
        }
    const uint16_t* oi = gr.out_idx + g * gr.n_out;
    const uint16_t* ov = gr.out_val + g * gr.n_out;
    for (int o = 0; o < gr.n_out && oi[o] != KV_GEAR_NONE; o++) {
        const int64_t s = g0 + oi[o] / r;
        if (s < a || s >= b) continue;
        const int c = oi[o] % r;
        const float val = h2f(ov[o]);
        for (int j = 0; j < G; j++) acc[j * r + c] += w.sc[j * n + s - s0] * val;
    }
}

// acc_j += sum over slots [s0, e) of p_j(s) v(s), p in sc.
void values_all(const attn_kv_view& kv, int64_t s0, int64_t e, int64_t n, int G, float* acc, scratch_layout& w) {
    const int r = kv.r_v;
    const int64_t qe = std::min(e, kv.n_quant);
    if (kv.quant == KV_QUANT_Q8) {
        const int nb = kv_n_blocks(r, KV_Q8_BLOCK);
#ifdef ZK_SIMD_AVX2
        if (s0 < qe && r % 4 == 0) {
            values_q8_fast((const int8_t*)kv.vq, kv.vs, nb, s0, qe, s0, n, r, G, w.sc, acc, w.pw);
        } else
#endif
        for (int64_t s = s0; s < qe; s++) {
            q8_row_to_f32((const int8_t*)kv.vq + s * r, kv.vs + s * nb, r, w.vrow);
            for (int j = 0; j < G; j++) simd::axpy_f32(w.sc[j * n + s - s0], w.vrow, acc + j * r, r);
        }
    } else if (kv.quant == KV_QUANT_Q4 && s0 < qe) {
        // p (s_b code + m_b) = (p s_b) code + p m_b: the codes are converted once
        // per slot and the min terms summed per block, added once at the end.
        const int nb = kv_n_blocks(r, KV_Q4_VBLOCK), rb = kv_q4_row_bytes(r);
        for (int i = 0; i < G * nb; i++) w.msum[i] = 0;
#ifdef ZK_SIMD_AVX2
        const bool fast = true;
        const uint8_t* codes = (const uint8_t*)kv.vq;
        for (int j0 = 0; j0 < G; j0 += 4) {  // query heads in register-sized groups
            const float* sc = w.sc + j0 * n;
            float* ac = acc + j0 * r;
            float* ms = w.msum + j0 * nb;
            switch (std::min(4, G - j0)) {
                case 1: values_q4_fast_g<1>(codes, rb, kv.vs, kv.vm, nb, s0, qe, s0, n, r, sc, ac, ms, w.tmp, w.pw); break;
                case 2: values_q4_fast_g<2>(codes, rb, kv.vs, kv.vm, nb, s0, qe, s0, n, r, sc, ac, ms, w.tmp, w.pw); break;
                case 3: values_q4_fast_g<3>(codes, rb, kv.vs, kv.vm, nb, s0, qe, s0, n, r, sc, ac, ms, w.tmp, w.pw); break;
                default: values_q4_fast_g<4>(codes, rb, kv.vs, kv.vm, nb, s0, qe, s0, n, r, sc, ac, ms, w.tmp, w.pw); break;
            }
        }
#else
        const bool fast = false;
#endif
        for (int64_t s = fast ? qe : s0; s < qe; s++) {
            q4_codes_to_f32((const uint8_t*)kv.vq + s * rb, r, w.vrow);
            const uint16_t* vs = kv.vs + s * nb;
            const uint16_t* vm = kv.vm + s * nb;
            for (int b = 0; b < nb; b++) {
                const int c0 = b * KV_Q4_VBLOCK, len = std::min(KV_Q4_VBLOCK, r - c0);
                const float sc = h2f(vs[b]), mn = h2f(vm[b]);
                for (int j = 0; j < G; j++) {
                    const float p = w.sc[j * n + s - s0];
                    simd::axpy_f32(p * sc, w.vrow + c0, acc + j * r + c0, len);
                    w.msum[j * nb + b] += p * mn;
                }
            }
        }
        for (int j = 0; j < G; j++)
            for (int c = 0; c < r; c++) acc[j * r + c] += w.msum[j * nb + c / KV_Q4_VBLOCK];
        if (kv.gear_v.rank > 0) {
            for (int64_t g = group_of(kv, s0); g < kv.n_groups && kv.group_start[g] < qe; g++)
                values_gear_q4(kv, g, std::max<int64_t>(s0, kv.group_start[g]),
                               std::min<int64_t>(qe, kv.group_start[g + 1]), s0, n, G, acc, w);
        }
    }
    const int64_t f0 = std::max(s0, kv.n_quant);
#ifdef ZK_SIMD_AVX2
    if (f0 < e && fp_fast_ok(G, r)) {
        if (kv.type == dtype::F16)
            values_fp_fast((const uint16_t*)kv.v, kv.n_quant, f0, e, s0, n, r, G, w.sc, acc);
        else
            values_fp_fast((const float*)kv.v, kv.n_quant, f0, e, s0, n, r, G, w.sc, acc);
        return;
    }
#endif
    for (int64_t s = f0; s < e; s++) {
        const float* vr = kv_row(kv.type, kv.v, s - kv.n_quant, r, w.vrow);
        for (int j = 0; j < G; j++) simd::axpy_f32(w.sc[j * n + s - s0], vr, acc + j * r, r);
    }
}

}  // namespace

int64_t kernel_attention_scratch(int n_group, int64_t n, int r_k, int r_v, int gear_rank) {
    return n_group * n + r_k + r_v + (int64_t)n_group * (r_k + 1 + gear_rank + kv_n_blocks(r_v, KV_Q4_VBLOCK)) +
           n_group + 4 * 32 + 6 * KV_Q4_WCHUNK + r_k + (int64_t)n_group * kv_n_blocks(r_k, 32) * 32 / 4 + 16;
}

void kernel_attention_range(const attn_kv_view& kv, int64_t s0, int64_t s1, const attn_q_view& q,
                            const attn_partial& out, float* scratch) {
    ZK_ASSERT(kv.type == dtype::F32 || kv.type == dtype::F16);
    ZK_ASSERT(kv.quant == KV_QUANT_NONE || kv.quant == KV_QUANT_Q8 || kv.quant == KV_QUANT_Q4);
    const int G = q.n_group;
    s0 = std::max(s0, kv.n_sink_slots);  // exact sinks: kernel_attention_sinks
    s1 = std::max(s1, s0);
    const int64_t n = s1 - s0;
    scratch_layout w = scratch_split(scratch, G, n, kv.r_k, kv.r_v, std::max(kv.gear_k.rank, kv.gear_v.rank));
    const float neg_inf = -std::numeric_limits<float>::infinity();

    for (int64_t t = 0; t < q.n_tok; t++) {
        const float* qt = q.q + t * q.q_stride;
        const int32_t qp = q.q_pos[t];
        // Slots are kept in position order, so the visible ones form a prefix of
        // the range; find its end once.
        int64_t e = s1;
        if (s0 < s1 && kv.pos[s1 - 1] > qp) e = std::upper_bound(kv.pos + s0, kv.pos + s1, qp) - kv.pos;
        const int64_t nv = e - s0;
        float* m = out.m + t * G;
        float* l = out.l + t * G;
        float* acc = out.acc + t * G * kv.r_v;
        std::memset(acc, 0, sizeof(float) * G * kv.r_v);
        if (nv > 0) scores_all(kv, s0, e, n, qt, q, w);
        for (int j = 0; j < G; j++) simd::scale_f32(w.sc + j * n, (int)nv, q.scale);
        if (out.logits) {
            for (int j = 0; j < G; j++) {
                float* lg = out.logits + (t * G + j) * out.logits_stride;
                std::memcpy(lg + s0, w.sc + j * n, sizeof(float) * nv);
                for (int64_t s = e; s < s1; s++) lg[s] = neg_inf;
            }
        }
        if (nv == 0) {
            for (int j = 0; j < G; j++) m[j] = neg_inf, l[j] = 0;
            continue;
        }
        for (int j = 0; j < G; j++) {
            const float mx = simd::max_f32(w.sc + j * n, (int)nv);
            m[j] = mx;
            l[j] = simd::exp_shift_sum(w.sc + j * n, (int)nv, mx);
        }
        values_all(kv, s0, e, n, G, acc, w);
    }
}

void kernel_attention_sinks(const attn_kv_view& kv, const attn_q_view& q, const attn_partial& out) {
    const int G = q.n_group, D = kv.sink_dim;
    ZK_ASSERT(out.acc_dim == D);
    const float neg_inf = -std::numeric_limits<float>::infinity();
    // a handful of rows: scores on the stack
    constexpr int64_t k_max_sinks = 64;
    ZK_ASSERT(kv.n_sink_slots <= k_max_sinks && (kv.n_sink_slots == 0 || (kv.sink_k && kv.sink_v && D > 0)));
    float sc[k_max_sinks];
    for (int64_t t = 0; t < q.n_tok; t++) {
        const int32_t qp = q.q_pos[t];
        int64_t nv = 0;  // visible sink slots: a prefix (positions ascend)
        while (nv < kv.n_sink_slots && kv.pos[nv] <= qp) nv++;
        for (int j = 0; j < G; j++) {
            const int64_t ij = t * G + j;
            const float* qj = q.q + t * q.q_stride + j * q.q_head_stride;
            float* acc = out.acc + ij * D;
            std::memset(acc, 0, sizeof(float) * D);
            float mx = neg_inf;
            for (int64_t s = 0; s < nv; s++) {
                sc[s] = q.scale * simd::dot_f32(qj, kv.sink_k + (size_t)kv.pos[s] * D, D);
                mx = std::max(mx, sc[s]);
            }
            if (out.logits) {
                float* lg = out.logits + ij * out.logits_stride;
                for (int64_t s = 0; s < kv.n_sink_slots; s++) lg[s] = s < nv ? sc[s] : neg_inf;
            }
            out.m[ij] = mx;
            float l = 0;
            for (int64_t s = 0; s < nv; s++) {
                const float e = std::exp(sc[s] - mx);
                l += e;
                simd::axpy_f32(e, kv.sink_v + (size_t)kv.pos[s] * D, acc, D);
            }
            out.l[ij] = l;
        }
    }
}

void kernel_attention_merge(const attn_partial* parts, int n_parts, int64_t n_tok, int n_group,
                            int r_v, float* out, int64_t out_stride, int64_t out_head_stride) {
    int width = r_v;
    for (int p = 0; p < n_parts; p++) width = std::max(width, parts[p].acc_dim > 0 ? parts[p].acc_dim : r_v);
    for (int64_t t = 0; t < n_tok; t++) {
        for (int j = 0; j < n_group; j++) {
            const int64_t ij = t * n_group + j;
            float mx = -std::numeric_limits<float>::infinity();
            for (int p = 0; p < n_parts; p++) mx = parts[p].m[ij] > mx ? parts[p].m[ij] : mx;
            float* o = out + t * out_stride + j * out_head_stride;
            std::memset(o, 0, sizeof(float) * width);
            if (mx == -std::numeric_limits<float>::infinity()) continue;  // nothing visible
            float l = 0;
            for (int p = 0; p < n_parts; p++) {
                if (parts[p].l[ij] == 0) continue;
                const float w = std::exp(parts[p].m[ij] - mx);
                const int d = parts[p].acc_dim > 0 ? parts[p].acc_dim : r_v;
                l += w * parts[p].l[ij];
                simd::axpy_f32(w, parts[p].acc + ij * d, o, d);
            }
            const float inv = 1.0f / l;
            for (int c = 0; c < width; c++) o[c] *= inv;
        }
    }
}

}  // namespace zk
