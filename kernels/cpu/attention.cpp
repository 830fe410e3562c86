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

// Slots per chunk whose 8-bit value weights are computed ahead of the slot loop.
constexpr int KV_Q8_WCHUNK = 64;

struct scratch_layout {
    float* sc;    // [G x n] scores, then probabilities
    float* krow;  // [r_k]
    float* vrow;  // [r_v]
    float* qs;    // [G x r_k] folded query (Q4 keys)
    float* bias;  // [G]
    float* qb;    // [G x rank] q . B[:, i] (GEAR keys), then p^T A (GEAR values)
    float* msum;  // [G x value blocks] sum of p m_b (Q4 values)
    int8_t* qi;   // [G x 64 row chunks(r_k)] int8 folded query, zero-padded (Q4 keys)
    float* qpad;  // [G x 64 row chunks(r_k)] the query times the softmax scale, zero past r_k (Q4 keys)
    float* qd;    // [G] its scales
    float* pw;    // [6 x KV_Q8_WCHUNK] 8-bit value weights p_j d_s of a chunk of slots (rows j < 4), its scales
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
    s.pw = s.qd + G;
    s.kmin = s.pw + 6 * KV_Q8_WCHUNK;
    const int64_t r64 = 64 * (int64_t)((r_k + 63) / 64);
    s.qpad = s.kmin + r_k;
    s.qi = (int8_t*)(s.qpad + G * r64);
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

#ifdef ZK_SIMD_AVX2
inline float hmax8(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps(m, m, 1)));
}

// ---- fast paths for 4-bit slots (AVX2): integer dot products ----
// A 4-bit row is read 32 bytes (64 channels, a "row chunk") at a time; byte i
// holds channel 2i in its low nibble and 2i + 1 in its high one, so
// x & 0x0F are the even channels and (x >> 4) & 0x0F the odd ones, in order,
// with no byte shuffle per slot. Code buffers are readable KV_Q4_PAD (32) bytes
// past their last row: a row shorter than its last chunk reads into the next
// row or the padding, and those channels meet zero query bytes (keys) or are
// dropped (values).

inline int q4_row_chunks(int r) { return (r + 63) / 64; }

inline int32_t hsum_epi32(__m256i v) {
    __m128i x = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    x = _mm_add_epi32(x, _mm_unpackhi_epi64(x, x));
    return _mm_cvtsi128_si32(_mm_add_epi32(x, _mm_shuffle_epi32(x, 1)));
}

// Folded queries of GB <= 4 heads for one key group, as int8 in the layout the
// score loop reads: per row chunk, 32 bytes of even channels then 32 of odd
// ones (qi [GB x nrc x 64], zeros past r; nrc <= 4). qs = q_c s_c is rounded
// with one scale per head, qd = max|qs| / 127 (llama.cpp likewise rounds Q to 8
// bits for a quantized cache); bias = sum_c q_c m_c. q [GB x nrc x 64] floats,
// zero past r; scl, mn: the group's r f16 scales and mins, read in place (8 at
// a time; a partial last 8 through a zero-filled copy). All heads go through
// one pass over the scales and their reductions overlap: this runs once per
// group of 32 slots, so its latency chains (max, reciprocal) are a visible part
// of a score.
template <int GB>
void q4_fold_queries(const float* q, const uint16_t* scl, const uint16_t* mn, int r, int nrc, int8_t* qi,
                     float* qd, float* bias) {
    const int qstride = 64 * nrc;
    alignas(32) float qs[GB][4 * 64];  // nrc <= 4
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 mx[GB], bs[GB];
#pragma GCC unroll 4
    for (int j = 0; j < GB; j++) mx[j] = bs[j] = _mm256_setzero_ps();
    auto fold8 = [&](int c, __m128i s16, __m128i m16) __attribute__((always_inline)) {
        const __m256 sv = _mm256_cvtph_ps(s16), mv = _mm256_cvtph_ps(m16);
#pragma GCC unroll 4
        for (int j = 0; j < GB; j++) {
            const __m256 qc = _mm256_loadu_ps(q + j * qstride + c);
            const __m256 x = _mm256_mul_ps(qc, sv);
            _mm256_store_ps(qs[j] + c, x);
            mx[j] = _mm256_max_ps(mx[j], _mm256_andnot_ps(sign, x));
            bs[j] = _mm256_fmadd_ps(qc, mv, bs[j]);
        }
    };
    int c = 0;
    for (; c + 8 <= r; c += 8)
        fold8(c, _mm_loadu_si128((const __m128i*)(scl + c)), _mm_loadu_si128((const __m128i*)(mn + c)));
    if (c < r) {
        alignas(16) uint16_t ts[8] = {}, tm[8] = {};
        std::memcpy(ts, scl + c, sizeof(uint16_t) * (r - c));
        std::memcpy(tm, mn + c, sizeof(uint16_t) * (r - c));
        fold8(c, _mm_load_si128((const __m128i*)ts), _mm_load_si128((const __m128i*)tm));
        c += 8;
    }
    for (; c < qstride; c += 8)
#pragma GCC unroll 4
        for (int j = 0; j < GB; j++) _mm256_store_ps(qs[j] + c, _mm256_setzero_ps());
    __m256 vid[GB];
#pragma GCC unroll 4
    for (int j = 0; j < GB; j++) {
        bias[j] = simd::hsum(bs[j]);
        const float d = hmax8(mx[j]) / 127.0f;
        qd[j] = d;
        vid[j] = _mm256_set1_ps(d > 0 ? 1.0f / d : 0.0f);
    }
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);  // undo the lane-wise packs
    // within each 16-byte lane: the 8 even bytes, then the 8 odd ones
    const __m256i eo = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15, 0, 2, 4, 6, 8, 10,
                                        12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
#pragma GCC unroll 4
    for (int j = 0; j < GB; j++)
        for (int k = 0; k < nrc; k++) {
            __m256i half[2];  // channels 64k + [0, 32) and [32, 64): evens of the lanes in qwords 0, 1; odds in 2, 3
            for (int h = 0; h < 2; h++) {
                const float* src = qs[j] + 64 * k + 32 * h;
                const __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_load_ps(src), vid[j]));
                const __m256i i1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_load_ps(src + 8), vid[j]));
                const __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_load_ps(src + 16), vid[j]));
                const __m256i i3 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_load_ps(src + 24), vid[j]));
                const __m256i b = _mm256_permutevar8x32_epi32(
                    _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3)), order);
                half[h] = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(b, eo), 0xD8);  // qwords 0, 2, 1, 3
            }
            int8_t* dst = qi + j * qstride + 64 * k;
            _mm256_storeu_si256((__m256i*)dst, _mm256_permute2x128_si256(half[0], half[1], 0x20));
            _mm256_storeu_si256((__m256i*)(dst + 32), _mm256_permute2x128_si256(half[0], half[1], 0x31));
        }
}

// Heads [0, G) in blocks of at most 4.
void q4_fold_queries_n(int G, const float* q, const uint16_t* scl, const uint16_t* mn, int r, int nrc, int8_t* qi,
                       float* qd, float* bias) {
    const int qstride = 64 * nrc;
    for (int j0 = 0; j0 < G; j0 += 4) {
        const float* qj = q + j0 * qstride;
        int8_t* qij = qi + j0 * qstride;
        switch (std::min(4, G - j0)) {
            case 1: q4_fold_queries<1>(qj, scl, mn, r, nrc, qij, qd + j0, bias + j0); break;
            case 2: q4_fold_queries<2>(qj, scl, mn, r, nrc, qij, qd + j0, bias + j0); break;
            case 3: q4_fold_queries<3>(qj, scl, mn, r, nrc, qij, qd + j0, bias + j0); break;
            default: q4_fold_queries<4>(qj, scl, mn, r, nrc, qij, qd + j0, bias + j0); break;
        }
    }
}

// {sum of a's int16 lanes, of b's, c's, d's} as int32 (pairs are widened to
// int32 before any sum, so only the lanes themselves must fit int16).
inline __m128i hsum4_epi16(__m256i a, __m256i b, __m256i c, __m256i d) {
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256i ab = _mm256_hadd_epi32(_mm256_madd_epi16(a, ones), _mm256_madd_epi16(b, ones));
    const __m256i cd = _mm256_hadd_epi32(_mm256_madd_epi16(c, ones), _mm256_madd_epi16(d, ones));
    const __m256i s = _mm256_hadd_epi32(ab, cd);  // {a, b, c, d} per lane
    return _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
}

// Q4 key scores of slots [a, b) of one group: sc = qd_j (qi_j . code_s) +
// bias_j. One maddubs multiplies 32 codes by 32 query bytes and sums pairs into
// int16 (at most 2 * 15 * 127 = 3810); a row chunk adds two (7620), and up to 4
// chunks (r <= 256) stay below 32767. 4 slots x G accumulators; NRC (row
// chunks) is a template parameter so that the chunk loop unrolls and, for the
// usual NRC = 1, the accumulators stay in registers.
// NRC = 0: r <= 32, a row is at most 16 bytes, so two slots share a vector
// (one per lane) against the query's 16 even and 16 odd bytes in both lanes.
template <int G, int NRC>
void scores_q4_int_g(const uint8_t* codes, int rb, int64_t a, int64_t b, int64_t s0, int64_t n, const int8_t* qi,
                     const float* qd, const float* bias, float* sc) {
    constexpr int nrc = NRC == 0 ? 1 : NRC;
    const __m256i mask = _mm256_set1_epi8(0x0F);
    const int qstride = nrc * 64;
    int64_t s = a;
    if constexpr (NRC == 0) {
        const __m256i ones = _mm256_set1_epi16(1);
        for (; s + 4 <= b; s += 4) {
            const uint8_t* c0 = codes + s * rb;
            const __m256i x01 = _mm256_loadu2_m128i((const __m128i*)(c0 + rb), (const __m128i*)c0);
            const __m256i x23 = _mm256_loadu2_m128i((const __m128i*)(c0 + 3 * rb), (const __m128i*)(c0 + 2 * rb));
            const __m256i l01 = _mm256_and_si256(x01, mask), h01 = _mm256_and_si256(_mm256_srli_epi16(x01, 4), mask);
            const __m256i l23 = _mm256_and_si256(x23, mask), h23 = _mm256_and_si256(_mm256_srli_epi16(x23, 4), mask);
#pragma GCC unroll 8
            for (int j = 0; j < G; j++) {
                const __m256i qe = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)(qi + j * qstride)));
                const __m256i qo = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)(qi + j * qstride + 32)));
                const __m256i m01 = _mm256_madd_epi16(
                    _mm256_add_epi16(_mm256_maddubs_epi16(l01, qe), _mm256_maddubs_epi16(h01, qo)), ones);
                const __m256i m23 = _mm256_madd_epi16(
                    _mm256_add_epi16(_mm256_maddubs_epi16(l23, qe), _mm256_maddubs_epi16(h23, qo)), ones);
                __m256i h = _mm256_hadd_epi32(m01, m23);  // lane 0: slots 0, 2 (two halves each); lane 1: 1, 3
                h = _mm256_hadd_epi32(h, h);              // lane 0: {s0, s2, s0, s2}; lane 1: {s1, s3, ...}
                const __m128 sum = _mm_cvtepi32_ps(_mm_unpacklo_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1)));
                _mm_storeu_ps(sc + j * n + s - s0, _mm_fmadd_ps(sum, _mm_set1_ps(qd[j]), _mm_set1_ps(bias[j])));
            }
        }
    }
    for (; NRC > 0 && s + 4 <= b; s += 4) {
        __m256i acc[G][4];
#pragma GCC unroll 8
        for (int j = 0; j < G; j++)
#pragma GCC unroll 8
            for (int u = 0; u < 4; u++) acc[j][u] = _mm256_setzero_si256();
        const uint8_t* c0 = codes + s * rb;
#pragma GCC unroll 4
        for (int k = 0; k < nrc; k++) {
            const int8_t* qk = qi + 64 * k;
#pragma GCC unroll 4
            for (int u = 0; u < 4; u++) {
                const __m256i x = _mm256_loadu_si256((const __m256i*)(c0 + u * rb + 32 * k));
                const __m256i lo = _mm256_and_si256(x, mask), hi = _mm256_and_si256(_mm256_srli_epi16(x, 4), mask);
#pragma GCC unroll 8
                for (int j = 0; j < G; j++) {
                    const int8_t* qj = qk + j * qstride;
                    acc[j][u] = _mm256_add_epi16(acc[j][u], _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i*)qj)));
                    acc[j][u] = _mm256_add_epi16(acc[j][u], _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i*)(qj + 32))));
                }
            }
        }
#pragma GCC unroll 8
        for (int j = 0; j < G; j++) {
            const __m128 sum = _mm_cvtepi32_ps(hsum4_epi16(acc[j][0], acc[j][1], acc[j][2], acc[j][3]));
            _mm_storeu_ps(sc + j * n + s - s0, _mm_fmadd_ps(sum, _mm_set1_ps(qd[j]), _mm_set1_ps(bias[j])));
        }
    }
    const __m256i ones = _mm256_set1_epi16(1);
    for (; s < b; s++) {
        __m256i acc[G];
#pragma GCC unroll 8
        for (int j = 0; j < G; j++) acc[j] = _mm256_setzero_si256();
#pragma GCC unroll 4
        for (int k = 0; k < nrc; k++) {
            const __m256i x = _mm256_loadu_si256((const __m256i*)(codes + s * rb + 32 * k));
            const __m256i lo = _mm256_and_si256(x, mask), hi = _mm256_and_si256(_mm256_srli_epi16(x, 4), mask);
#pragma GCC unroll 8
            for (int j = 0; j < G; j++) {
                const int8_t* qj = qi + j * qstride + 64 * k;
                acc[j] = _mm256_add_epi16(acc[j], _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i*)qj)));
                acc[j] = _mm256_add_epi16(acc[j], _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i*)(qj + 32))));
            }
        }
#pragma GCC unroll 8
        for (int j = 0; j < G; j++)
            sc[j * n + s - s0] = (float)hsum_epi32(_mm256_madd_epi16(acc[j], ones)) * qd[j] + bias[j];
    }
}

template <int G>
void scores_q4_int_n(int nrc, const uint8_t* codes, int rb, int64_t a, int64_t b, int64_t s0, int64_t n,
                     const int8_t* qi, const float* qd, const float* bias, float* sc) {
    switch (nrc) {
        case 0: return scores_q4_int_g<G, 0>(codes, rb, a, b, s0, n, qi, qd, bias, sc);
        case 1: return scores_q4_int_g<G, 1>(codes, rb, a, b, s0, n, qi, qd, bias, sc);
        case 2: return scores_q4_int_g<G, 2>(codes, rb, a, b, s0, n, qi, qd, bias, sc);
        case 3: return scores_q4_int_g<G, 3>(codes, rb, a, b, s0, n, qi, qd, bias, sc);
        default: return scores_q4_int_g<G, 4>(codes, rb, a, b, s0, n, qi, qd, bias, sc);
    }
}

// G <= 4 query heads, nrc <= 4 row chunks (0: r <= 32, two slots per vector).
void scores_q4_int(int G, int nrc, const uint8_t* codes, int rb, int64_t a, int64_t b, int64_t s0, int64_t n,
                   const int8_t* qi, const float* qd, const float* bias, float* sc) {
    switch (G) {
        case 1: return scores_q4_int_n<1>(nrc, codes, rb, a, b, s0, n, qi, qd, bias, sc);
        case 2: return scores_q4_int_n<2>(nrc, codes, rb, a, b, s0, n, qi, qd, bias, sc);
        case 3: return scores_q4_int_n<3>(nrc, codes, rb, a, b, s0, n, qi, qd, bias, sc);
        default: return scores_q4_int_n<4>(nrc, codes, rb, a, b, s0, n, qi, qd, bias, sc);
    }
}

// Q4 value sums of slots [a, b) for G <= 3 heads with integer dot products.
// Per row chunk (64 channels, value blocks 2k and 2k + 1) and per chunk of
// KV_Q4_VCHUNK slots, the weights w = p_j s_b (probability times the slot's
// block scale) are rounded to 7 bits with one scale per (head, block, chunk),
// D = max w / 127 (as the key scores round the query), and the codes are
// centred, c - 8 in [-8, 7]:
//   sum_s w_s c_s = D sum_s u_s (c_s - 8) + 8 sum_s w_s,
// the last term exact, added to the min terms. The rounding error of a weight
// (at most 1/254 of the chunk's largest) thus meets |c - 8| <= 8 rather than
// c <= 15. Two slots at a time: their code bytes are interleaved (unpack) so one
// maddubs gives u_t (c_t - 8) + u_t+1 (c_t+1 - 8) for 16 channels; int16 sums
// of 16 pairs stay within 32767 (32 * 8 * 127 = 32512), so a chunk is 32 slots,
// after which the sums are widened and scaled by D into float accumulators.
// (8-bit weights would halve the chunk: the widening and the per-chunk setup
// then cost more than the pair loop itself.)
// In a 32-byte vector the low lane holds block 2k and the high lane block
// 2k + 1, so each weight vector carries the pair's two block weights, one per
// lane. The min terms sum_s p_j (m_b + 8 s_b) are added per block into msum
// [G x nb].
constexpr int KV_Q4_VCHUNK = 32;
constexpr float KV_Q4_WMAX = 127.0f;  // largest rounded weight

// One nibble half of a pair of slots (l0, l1: codes 0..15 of slot t and of
// slot t + 1, or of two lanes' pairs under HALF): interleaved, centred, and
// weighted by every head's vector w [G] into lo (bytes 0..7 of each lane) and
// hi (bytes 8..15). Always inline: the accumulators stay in registers.
template <int G>
__attribute__((always_inline)) inline void values_q4_nibbles(__m256i l0, __m256i l1, const __m256i (&w)[G],
                                                             __m256i (&lo)[G], __m256i (&hi)[G]) {
    const __m256i eight = _mm256_set1_epi8(8);
    const __m256i ca = _mm256_sub_epi8(_mm256_unpacklo_epi8(l0, l1), eight);
    const __m256i cb = _mm256_sub_epi8(_mm256_unpackhi_epi8(l0, l1), eight);
#pragma GCC unroll 4
    for (int j = 0; j < G; j++) {
        lo[j] = _mm256_add_epi16(lo[j], _mm256_maddubs_epi16(w[j], ca));
        hi[j] = _mm256_add_epi16(hi[j], _mm256_maddubs_epi16(w[j], cb));
    }
}

// The pair loop of one chunk: np pairs of slots from t (the last pair of an odd
// chunk repeats its slot, with weight 0) into ac (zeroed here). Out of line
// with its accumulators in locals: inlined into the chunk loop, GCC kept them
// on the stack. HALF (r <= 32, rows of at most 16 bytes): an iteration takes
// 4 slots, the pair (t, t + 1) in the low lane and (t + 2, t + 3) in the high one.
// pd [G][16]: per head, the weight dwords of the chunk's pairs in order,
// broadcast and spread to a weight vector per pair here: a load and a shuffle,
// where a vector built in advance cost a load, a shuffle, a store and the
// loop's load.
template <int G, bool HALF>
__attribute__((noinline)) void values_q4_pairs(const uint8_t* cp, int rb, int64_t np, int64_t last,
                                               const uint32_t* pd, __m256i (&ac)[G][4]) {
    const __m256i mask = _mm256_set1_epi8(0x0F);
    // A pair's weights arrive as the dword {u_t(b0), u_t(b1), u_t+1(b0), u_t+1(b1)}
    // (slot-major, as the scales lie in memory); broadcast and shuffled: the low
    // lane gets the b0 pair, the high lane the b1 pair.
    const __m256i wctl = _mm256_setr_epi8(0, 2, 0, 2, 0, 2, 0, 2, 0, 2, 0, 2, 0, 2, 0, 2, 1, 3, 1, 3, 1, 3, 1, 3, 1, 3,
                                          1, 3, 1, 3, 1, 3);
    __m256i a0[G], a1[G], a2[G], a3[G];
#pragma GCC unroll 4
    for (int j = 0; j < G; j++) a0[j] = a1[j] = a2[j] = a3[j] = _mm256_setzero_si256();
    const int64_t step = (HALF ? 4 : 2) * (int64_t)rb;
    const uint8_t* p = cp;
    for (int64_t i = 0; i < np; i++, p += step) {
        __m256i w[G];
#pragma GCC unroll 4
        for (int j = 0; j < G; j++) w[j] = _mm256_shuffle_epi8(_mm256_set1_epi32((int)pd[16 * j + i]), wctl);
        // row offsets of the iteration's other slots; in the last iteration,
        // slots past `last` repeat it
        int64_t o1 = rb, o2 = 2 * (int64_t)rb, o3 = 3 * (int64_t)rb;
        if (i + 1 == np) {
            const int64_t t = (HALF ? 4 : 2) * i;
            o1 = (std::min(t + 1, last) - t) * rb, o2 = (std::min(t + 2, last) - t) * rb;
            o3 = (std::min(t + 3, last) - t) * rb;
        }
        __m256i x0, x1;
        if (HALF) {
            x0 = _mm256_loadu2_m128i((const __m128i*)(p + o2), (const __m128i*)p);
            x1 = _mm256_loadu2_m128i((const __m128i*)(p + o3), (const __m128i*)(p + o1));
        } else {
            x0 = _mm256_loadu_si256((const __m256i*)p);
            x1 = _mm256_loadu_si256((const __m256i*)(p + o1));
        }
        values_q4_nibbles<G>(_mm256_and_si256(x0, mask), _mm256_and_si256(x1, mask), w, a0, a1);
        values_q4_nibbles<G>(_mm256_and_si256(_mm256_srli_epi16(x0, 4), mask),
                             _mm256_and_si256(_mm256_srli_epi16(x1, 4), mask), w, a2, a3);
    }
#pragma GCC unroll 4
    for (int j = 0; j < G; j++) ac[j][0] = a0[j], ac[j][1] = a1[j], ac[j][2] = a2[j], ac[j][3] = a3[j];
}

// HALF (r <= 32, one value block): the two lanes carry different slots
// instead of two blocks. Slot entries of the weight dwords are then (t, t + 2)
// in place of (block 0, block 1), a chunk is 64 slots (16 pairs per lane), and
// both lanes add to the same channels.
template <int G, bool HALF>
void values_q4_int_g(const uint8_t* codes, int rb, const uint16_t* vs, const uint16_t* vm, int nb, int64_t a,
                     int64_t b, int64_t s0, int64_t n, int r, const float* sc, float* acc, float* msum) {
    static_assert(G >= 1 && G <= 3, "12 int16 accumulators at most");
    constexpr int C = HALF ? 2 * KV_Q4_VCHUNK : KV_Q4_VCHUNK;
    const __m256i dup_lo = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3), dup_hi = _mm256_setr_epi32(4, 4, 5, 5, 6, 6, 7, 7);
    const __m256i quad = _mm256_setr_epi32(0, 2, 1, 3, 4, 6, 5, 7);  // HALF: slots (t, t + 2), (t + 1, t + 3)
    const __m256i pair_order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    const __m256i quad16 = _mm256_setr_epi8(0, 1, 4, 5, 2, 3, 6, 7, 8, 9, 12, 13, 10, 11, 14, 15, 0, 1, 4, 5, 2, 3, 6,
                                            7, 8, 9, 12, 13, 10, 11, 14, 15);
    const int nrc = HALF ? 1 : q4_row_chunks(r);
    for (int k = 0; k < nrc; k++) {
        alignas(32) float fa[G][4][2][8];  // [head][code vector][lane][8]: channel order restored at the end
        std::memset(fa, 0, sizeof(fa));
        __m256 msv[G];  // min terms, lanes alternate blocks 2k, 2k + 1
        for (int j = 0; j < G; j++) msv[j] = _mm256_setzero_ps();
        const bool two = 2 * k + 1 < nb;
        for (int64_t s = a; s < b; s += C) {
            const int m = (int)std::min<int64_t>(C, b - s);
            // per slot, the f16 pairs {s_b0, s_b1} and {m_b0, m_b1}: read in place
            // when the two blocks are a whole row of scales, else gathered (zeros
            // past the chunk's end or a missing second block)
            alignas(32) uint32_t st[KV_Q4_VCHUNK], mt[KV_Q4_VCHUNK];
            const uint32_t *sd = st, *md = mt;
            if (HALF && m == C) {  // {s_t, s_t+2}, {s_t+1, s_t+3} per 4 slots
                for (int h = 0; h < C / 16; h++) {  // 16 slots (8 dwords) per vector
                    _mm256_store_si256((__m256i*)(st + 8 * h), _mm256_shuffle_epi8(_mm256_loadu_si256((const __m256i*)(vs + s + 16 * h)), quad16));
                    _mm256_store_si256((__m256i*)(mt + 8 * h), _mm256_shuffle_epi8(_mm256_loadu_si256((const __m256i*)(vm + s + 16 * h)), quad16));
                }
            } else if (HALF) {
                for (int e = 0; e < KV_Q4_VCHUNK; e++) {
                    const int t = 4 * (e >> 1) + (e & 1);
                    st[e] = (t < m ? vs[s + t] : 0u) | (t + 2 < m ? (uint32_t)vs[s + t + 2] << 16 : 0u);
                    mt[e] = (t < m ? vm[s + t] : 0u) | (t + 2 < m ? (uint32_t)vm[s + t + 2] << 16 : 0u);
                }
            } else if (nb == 2 && m == C) {
                sd = (const uint32_t*)(vs + s * 2);
                md = (const uint32_t*)(vm + s * 2);
            } else {
                for (int t = 0; t < C; t++) {
                    const int64_t o = (s + t) * nb + 2 * k;
                    st[t] = t >= m ? 0u : vs[o] | (two ? (uint32_t)vs[o + 1] << 16 : 0u);
                    mt[t] = t >= m ? 0u : vm[o] | (two ? (uint32_t)vm[o + 1] << 16 : 0u);
                }
            }
            // the probabilities, zero past a short chunk's end
            const float* pj[G];
            alignas(32) float pf[G][C];
            for (int j = 0; j < G; j++) {
                pj[j] = sc + j * n + s - s0;
                if (m < C) {
                    for (int t = 0; t < C; t++) pf[j][t] = t < m ? pj[j][t] : 0.0f;
                    pj[j] = pf[j];
                }
            }
            // weights and their maxima for every head first (two parts of 16 scale
            // dwords), then the roundings: the heads' reciprocals overlap instead of
            // each stalling its own chain
            alignas(32) float wf[G][8][8];  // [head][part * 4 + vector]: 4 slots x 2 blocks (HALF: 8 slots)
            __m256 mx[G];
#pragma GCC unroll 4
            for (int j = 0; j < G; j++) mx[j] = _mm256_setzero_ps();
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                __m256 S[4], M[4];
#pragma GCC unroll 4
                for (int q = 0; q < 4; q++) {
                    S[q] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(sd + 16 * h + 4 * q)));
                    M[q] = _mm256_fmadd_ps(_mm256_set1_ps(8.0f), S[q],
                                           _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(md + 16 * h + 4 * q))));
                }
#pragma GCC unroll 4
                for (int j = 0; j < G; j++) {
                    const float* p = pj[j] + (HALF ? 32 : 16) * h;
                    __m256 P[4];
                    if (HALF) {
#pragma GCC unroll 4
                        for (int q = 0; q < 4; q++) P[q] = _mm256_permutevar8x32_ps(_mm256_loadu_ps(p + 8 * q), quad);
                    } else {
                        const __m256 p0 = _mm256_loadu_ps(p), p1 = _mm256_loadu_ps(p + 8);
                        P[0] = _mm256_permutevar8x32_ps(p0, dup_lo), P[1] = _mm256_permutevar8x32_ps(p0, dup_hi);
                        P[2] = _mm256_permutevar8x32_ps(p1, dup_lo), P[3] = _mm256_permutevar8x32_ps(p1, dup_hi);
                    }
#pragma GCC unroll 4
                    for (int q = 0; q < 4; q++) {
                        const __m256 w = _mm256_mul_ps(P[q], S[q]);
                        _mm256_store_ps(wf[j][4 * h + q], w);
                        msv[j] = _mm256_fmadd_ps(P[q], M[q], msv[j]);
                        mx[j] = _mm256_max_ps(mx[j], w);
                    }
                }
            }
            alignas(32) uint32_t pd[G][16];  // [head][pair] weight dwords
            float dsc[G][2];
            __m256 id[G];
#pragma GCC unroll 4
            for (int j = 0; j < G; j++) {
                // per block: even lanes b0, odd lanes b1
                __m256 x = _mm256_max_ps(mx[j], _mm256_permute2f128_ps(mx[j], mx[j], 1));
                x = _mm256_max_ps(x, _mm256_shuffle_ps(x, x, 0x4E));
                dsc[j][0] = _mm256_cvtss_f32(x) * (1.0f / KV_Q4_WMAX);
                dsc[j][1] = _mm_cvtss_f32(_mm_shuffle_ps(_mm256_castps256_ps128(x), _mm256_castps256_ps128(x), 1)) *
                            (1.0f / KV_Q4_WMAX);
                id[j] = _mm256_and_ps(_mm256_div_ps(_mm256_set1_ps(KV_Q4_WMAX), x),
                                      _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_GT_OQ));
            }
#pragma GCC unroll 4
            for (int j = 0; j < G; j++)
#pragma GCC unroll 2
                for (int h = 0; h < 2; h++) {
                    const __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_load_ps(wf[j][4 * h]), id[j]));
                    const __m256i i1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_load_ps(wf[j][4 * h + 1]), id[j]));
                    const __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_load_ps(wf[j][4 * h + 2]), id[j]));
                    const __m256i i3 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_load_ps(wf[j][4 * h + 3]), id[j]));
                    // the packs leave the pair dwords as 0, 2, 4, 6 | 1, 3, 5, 7
                    const __m256i v = _mm256_packus_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
                    _mm256_store_si256((__m256i*)(pd[j] + 8 * h), _mm256_permutevar8x32_epi32(v, pair_order));
                }
            __m256i ac[G][4];
            values_q4_pairs<G, HALF>(codes + s * rb + 32 * k, rb, HALF ? (m + 3) / 4 : (m + 1) / 2, m - 1, &pd[0][0], ac);
#pragma GCC unroll 4
            for (int j = 0; j < G; j++) {
                const __m256 d0 = _mm256_set1_ps(dsc[j][0]), d1 = _mm256_set1_ps(dsc[j][1]);
#pragma GCC unroll 4
                for (int v = 0; v < 4; v++) {
                    const __m256 lo = _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm256_castsi256_si128(ac[j][v])));
                    const __m256 hi = _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm256_extracti128_si256(ac[j][v], 1)));
                    _mm256_store_ps(fa[j][v][0], _mm256_fmadd_ps(lo, d0, _mm256_load_ps(fa[j][v][0])));
                    _mm256_store_ps(fa[j][v][1], _mm256_fmadd_ps(hi, d1, _mm256_load_ps(fa[j][v][1])));
                }
            }
        }
        // vector v of lane h, element e: unpacklo (v even) holds code bytes 0..7 of
        // the lane, unpackhi (v odd) bytes 8..15; low nibbles (v < 2) are the even
        // channels. Byte i of lane h is channels 64k + 32h + 2i, + 1.
        for (int j = 0; j < G; j++) {
            for (int v = 0; v < 4; v++)
                for (int h = 0; h < 2; h++)
                    for (int e = 0; e < 8; e++) {
                        const int c = 64 * k + (HALF ? 0 : 32 * h) + 2 * (8 * (v & 1) + e) + (v >> 1);
                        if (c < r) acc[j * r + c] += fa[j][v][h][e];
                    }
            alignas(32) float ms[8];
            _mm256_store_ps(ms, msv[j]);
            msum[j * nb + 2 * k] += ms[0] + ms[2] + ms[4] + ms[6];
            if (two) msum[j * nb + 2 * k + 1] += ms[1] + ms[3] + ms[5] + ms[7];
            if (HALF) msum[j * nb] += ms[1] + ms[3] + ms[5] + ms[7];
        }
    }
}

template <int G>
void values_q4_int_h(const uint8_t* codes, int rb, const uint16_t* vs, const uint16_t* vm, int nb, int64_t a,
                     int64_t b, int64_t s0, int64_t n, int r, const float* sc, float* acc, float* msum) {
    if (r <= 32)
        values_q4_int_g<G, true>(codes, rb, vs, vm, nb, a, b, s0, n, r, sc, acc, msum);
    else
        values_q4_int_g<G, false>(codes, rb, vs, vm, nb, a, b, s0, n, r, sc, acc, msum);
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
// slot s's block) into pw [G x KV_Q8_WCHUNK], then the f16 path's stripe loop
// on the int8 codes with those weights.
template <int G>
void values_q8_fast_g(const int8_t* codes, const uint16_t* d, int nb, int64_t a, int64_t b, int64_t s0, int64_t n,
                      int r, const float* sc, float* acc, float* pw) {
    float* df = pw + 4 * KV_Q8_WCHUNK;  // [m] the chunk's scales
    for (int blk = 0; blk < nb; blk++) {
        const int c0 = blk * KV_Q8_BLOCK, len = std::min(KV_Q8_BLOCK, r - c0);
        for (int64_t s = a; s < b; s += KV_Q8_WCHUNK) {
            const int m = (int)std::min<int64_t>(KV_Q8_WCHUNK, b - s);
            for (int t = 0; t < m; t++) df[t] = h2f(d[(s + t) * nb + blk]);
            for (int j = 0; j < G; j++) simd::mul_f32(sc + j * n + s - s0, df, pw + j * KV_Q8_WCHUNK, m);
            values_stripe_len<int8_t, G>(len, codes, 0, s, s + m, s, KV_Q8_WCHUNK, r, c0, pw, acc);
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

// Q4 keys of slots [a, b) (inside the quantized part): scaled scores
// q.scale (q . k) into sc (index s - s0). Per group: the folded query q_c s_c
// and bias sum_c q_c m_c once, then one nibble row per slot shared by the G
// query heads. The integer path takes the scale into its copy of the query,
// so the scores need no pass of their own.
void scores_q4(const attn_kv_view& kv, int64_t a, int64_t b, int64_t s0, int64_t n, const float* qt,
               const attn_q_view& q, scratch_layout& w) {
    const int G = q.n_group, r = kv.r_k, gs = kv.group, rb = kv_q4_row_bytes(r);
    const float scale = q.scale;
    const uint8_t* codes = (const uint8_t*)kv.kq;
    const attn_gear_view& gr = kv.gear_k;
#ifdef ZK_SIMD_AVX2
    const int nrc = q4_row_chunks(r);
    const bool int_path = nrc <= 4;  // int16 sums stay exact up to r = 256
    if (int_path) {  // the scaled query zero-padded to whole row chunks
        const int64_t r64 = 64 * nrc;
        for (int j = 0; j < G; j++) {
            for (int c = 0; c < r; c++) w.qpad[j * r64 + c] = qt[j * q.q_head_stride + c] * scale;
            std::memset(w.qpad + j * r64 + r, 0, sizeof(float) * (r64 - r));
        }
    }
#endif
    for (int64_t g = group_of(kv, a); g < kv.n_groups && kv.group_start[g] < b; g++) {
        const int64_t g0 = kv.group_start[g];
        const int64_t ga = std::max<int64_t>(a, g0), gb = std::min<int64_t>(b, kv.group_start[g + 1]);
        const uint16_t* scl = kv.ks + g * r;
        const uint16_t* mn = kv.km + g * r;
#ifdef ZK_SIMD_AVX2
        if (int_path) {  // int16 sums stay exact up to r = 256
            const int qstride = 64 * nrc;
            q4_fold_queries_n(G, w.qpad, scl, mn, r, nrc, w.qi, w.qd, w.bias);
            for (int j0 = 0; j0 < G; j0 += 4)  // query heads in register-sized groups
                scores_q4_int(std::min(4, G - j0), r <= 32 ? 0 : nrc, codes, rb, ga, gb, s0, n, w.qi + j0 * qstride, w.qd + j0,
                              w.bias + j0, w.sc + j0 * n);
        } else
#endif
        {
            simd::f16_to_f32_row(scl, w.krow, r);
            simd::f16_to_f32_row(mn, w.kmin, r);
            for (int j = 0; j < G; j++) {
                const float* qj = qt + j * q.q_head_stride;
                simd::mul_f32(qj, w.krow, w.qs + j * r, r);
                w.bias[j] = simd::dot_f32(qj, w.kmin, r);
            }
            for (int64_t s = ga; s < gb; s++) {
                q4_codes_to_f32(codes + s * rb, r, w.krow);
                for (int j = 0; j < G; j++)
                    w.sc[j * n + s - s0] = (simd::dot_f32(w.qs + j * r, w.krow, r) + w.bias[j]) * scale;
            }
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
                w.qb[j * k + i] = d * scale;
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
            const float val = h2f(ov[o]) * scale;
            for (int j = 0; j < G; j++) w.sc[j * n + s - s0] += qt[j * q.q_head_stride + c] * val;
        }
    }
}

// Scaled scores q.scale (q . k) of slots [s0, e) into sc.
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
        if (s0 < qe)
            for (int j = 0; j < G; j++) simd::scale_f32(w.sc + j * n, (int)(qe - s0), q.scale);
    } else if (kv.quant == KV_QUANT_Q4 && s0 < qe) {
        scores_q4(kv, s0, qe, s0, n, qt, q, w);  // scaled already
    }
    const int64_t f0 = std::max(s0, kv.n_quant);
    if (f0 >= e) return;
#ifdef ZK_SIMD_AVX2
    if (fp_fast_ok(G, r)) {
        if (kv.type == dtype::F16)
            scores_fast((const uint16_t*)kv.k, nullptr, 0, kv.n_quant, f0, e, s0, n, r, qt, q.q_head_stride, G, w.sc);
        else
            scores_fast((const float*)kv.k, nullptr, 0, kv.n_quant, f0, e, s0, n, r, qt, q.q_head_stride, G, w.sc);
    } else
#endif
    for (int64_t s = f0; s < e; s++) {
        const float* kr = kv_row(kv.type, kv.k, s - kv.n_quant, r, w.krow);
        for (int j = 0; j < G; j++) w.sc[j * n + s - s0] = simd::dot_f32(qt + j * q.q_head_stride, kr, r);
    }
    for (int j = 0; j < G; j++) simd::scale_f32(w.sc + j * n + f0 - s0, (int)(e - f0), q.scale);
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
        for (int j0 = 0; j0 < G; j0 += 3) {  // query heads in register-sized groups
            const float* sc = w.sc + j0 * n;
            float* ac = acc + j0 * r;
            float* ms = w.msum + j0 * nb;
            switch (std::min(3, G - j0)) {
                case 1: values_q4_int_h<1>(codes, rb, kv.vs, kv.vm, nb, s0, qe, s0, n, r, sc, ac, ms); break;
                case 2: values_q4_int_h<2>(codes, rb, kv.vs, kv.vm, nb, s0, qe, s0, n, r, sc, ac, ms); break;
                default: values_q4_int_h<3>(codes, rb, kv.vs, kv.vm, nb, s0, qe, s0, n, r, sc, ac, ms); break;
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
    const int64_t r64 = 64 * (int64_t)((r_k + 63) / 64);
    return n_group * n + r_k + r_v + (int64_t)n_group * (r_k + 1 + gear_rank + kv_n_blocks(r_v, KV_Q4_VBLOCK)) +
           n_group + 6 * KV_Q8_WCHUNK + r_k + n_group * r64 + n_group * r64 / 4 + 16;
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
