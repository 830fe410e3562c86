// Decode attention over 4-bit KIVI codes (KV_LAYOUT_Q4): the AVX2 integer
// kernels behind the shared KIVI group loop (attention_kivi.cpp).
// A 4-bit row is read 32 bytes (64 channels, a "row chunk") at a time; byte i
// holds channel 2i in its low nibble and 2i + 1 in its high one, so
// x & 0x0F are the even channels and (x >> 4) & 0x0F the odd ones, in order,
// with no byte shuffle per slot: the folded query is laid out as the 32 even
// then the 32 odd channels of each chunk. Code buffers are readable KV_Q4_PAD
// (32) bytes past their last row: a row shorter than its last chunk reads into
// the next row or the padding, and those channels meet zero query bytes (keys)
// or are dropped (values).
#include <algorithm>
#include <cstdint>

#include "kernels/cpu/attention_kivi.h"
#include "kernels/cpu/attention_layout.h"

namespace zk {
namespace attn {

#ifdef ZK_SIMD_AVX2
namespace {

// The folded query of one head in the score loop's order: per row chunk k,
// 32 bytes of even channels then 32 of odd ones (dst [nrc x 64]).
struct q4_pack {
    static constexpr int chunk = 64;
    static void pack(const float* qs, __m256 vid, int nrc, int /*r*/, int8_t* dst) {
        // within each 16-byte lane: the 8 even bytes, then the 8 odd ones
        const __m256i eo = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15, 0, 2, 4, 6, 8, 10,
                                            12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
        for (int k = 0; k < nrc; k++) {
            __m256i half[2];  // channels 64k + [0, 32) and [32, 64): evens of the lanes in qwords 0, 1; odds in 2, 3
            for (int h = 0; h < 2; h++) {
                const __m256i b = kivi_round_int8(qs + 64 * k + 32 * h, vid);
                half[h] = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(b, eo), 0xD8);  // qwords 0, 2, 1, 3
            }
            int8_t* d = dst + 64 * k;
            _mm256_storeu_si256((__m256i*)d, _mm256_permute2x128_si256(half[0], half[1], 0x20));
            _mm256_storeu_si256((__m256i*)(d + 32), _mm256_permute2x128_si256(half[0], half[1], 0x31));
        }
    }
};

// Key scores of slots [a, b) of one group: sc = qd_j (qi_j . code_s) +
// bias_j. One maddubs multiplies 32 codes by 32 query bytes and sums pairs into
// int16 (at most 2 * 15 * 127 = 3810); a row chunk adds two (7620), and up to 4
// chunks (r <= 256) stay below 32767 (with VNNI the sums are int32:
// kivi_score_add). 4 slots x G accumulators; NRC (row
// chunks) is a template parameter so that the chunk loop unrolls and, for the
// usual NRC = 1, the accumulators stay in registers.
// NRC = 0: r <= 32, a row is at most 16 bytes, so two slots share a vector
// (one per lane) against the query's 16 even and 16 odd bytes in both lanes.
template <int G, int NRC>
void scores_q4_int_g(const uint8_t* codes, int rb, int64_t a, int64_t b, int64_t pf_end, int64_t s0, int64_t n,
                     const int8_t* qi, const float* qd, const float* bias, float* sc) {
    constexpr int nrc = NRC == 0 ? 1 : NRC;
    const __m256i mask = _mm256_set1_epi8(0x0F);
    const int qstride = nrc * 64;
    int64_t s = a;
    if constexpr (NRC == 0) {
        for (; s + 4 <= b; s += 4) {
            const uint8_t* c0 = codes + s * rb;
            kivi_prefetch_rows(codes, rb, s, pf_end);
            const __m256i x01 = _mm256_loadu2_m128i((const __m128i*)(c0 + rb), (const __m128i*)c0);
            const __m256i x23 = _mm256_loadu2_m128i((const __m128i*)(c0 + 3 * rb), (const __m128i*)(c0 + 2 * rb));
            const __m256i l01 = _mm256_and_si256(x01, mask), h01 = _mm256_and_si256(_mm256_srli_epi16(x01, 4), mask);
            const __m256i l23 = _mm256_and_si256(x23, mask), h23 = _mm256_and_si256(_mm256_srli_epi16(x23, 4), mask);
#pragma GCC unroll 8
            for (int j = 0; j < G; j++) {
                const __m256i qe = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)(qi + j * qstride)));
                const __m256i qo = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)(qi + j * qstride + 32)));
                const __m256i z = _mm256_setzero_si256();
                const __m256i m01 = kivi_score_widen(kivi_score_add(kivi_score_add(z, l01, qe), h01, qo));
                const __m256i m23 = kivi_score_widen(kivi_score_add(kivi_score_add(z, l23, qe), h23, qo));
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
        kivi_prefetch_rows(codes, rb, s, pf_end);
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
                    acc[j][u] = kivi_score_add(acc[j][u], lo, _mm256_loadu_si256((const __m256i*)qj));
                    acc[j][u] = kivi_score_add(acc[j][u], hi, _mm256_loadu_si256((const __m256i*)(qj + 32)));
                }
            }
        }
#pragma GCC unroll 8
        for (int j = 0; j < G; j++) {
            const __m128 sum = _mm_cvtepi32_ps(kivi_score_hsum4(acc[j][0], acc[j][1], acc[j][2], acc[j][3]));
            _mm_storeu_ps(sc + j * n + s - s0, _mm_fmadd_ps(sum, _mm_set1_ps(qd[j]), _mm_set1_ps(bias[j])));
        }
    }
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
                acc[j] = kivi_score_add(acc[j], lo, _mm256_loadu_si256((const __m256i*)qj));
                acc[j] = kivi_score_add(acc[j], hi, _mm256_loadu_si256((const __m256i*)(qj + 32)));
            }
        }
#pragma GCC unroll 8
        for (int j = 0; j < G; j++)
            sc[j * n + s - s0] = (float)hsum_epi32(kivi_score_widen(acc[j])) * qd[j] + bias[j];
    }
}

template <int G>
void scores_q4_int_n(int nrc, const uint8_t* codes, int rb, int64_t a, int64_t b, int64_t pf_end, int64_t s0,
                     int64_t n, const int8_t* qi, const float* qd, const float* bias, float* sc) {
    switch (nrc) {
        case 0: return scores_q4_int_g<G, 0>(codes, rb, a, b, pf_end, s0, n, qi, qd, bias, sc);
        case 1: return scores_q4_int_g<G, 1>(codes, rb, a, b, pf_end, s0, n, qi, qd, bias, sc);
        case 2: return scores_q4_int_g<G, 2>(codes, rb, a, b, pf_end, s0, n, qi, qd, bias, sc);
        case 3: return scores_q4_int_g<G, 3>(codes, rb, a, b, pf_end, s0, n, qi, qd, bias, sc);
        default: return scores_q4_int_g<G, 4>(codes, rb, a, b, pf_end, s0, n, qi, qd, bias, sc);
    }
}

void q4_scores(int G, int r, int nrc, const uint8_t* codes, int rb, int64_t a, int64_t b, int64_t pf_end,
               int64_t s0, int64_t n, const int8_t* qi, const float* qd, const float* bias, float* sc) {
    const int qstride = 64 * nrc;
    kivi_head_passes(G, KIVI_SCORE_HEADS, [&](int j0, int g) {  // query heads in register-sized groups
        const int nr = r <= 32 ? 0 : nrc;
        kivi_with_heads<KIVI_SCORE_HEADS>(g, [&](auto gb) {
            scores_q4_int_n<decltype(gb)::value>(nr, codes, rb, a, b, pf_end, s0, n, qi + j0 * qstride, qd + j0,
                                                 bias + j0, sc + j0 * n);
        });
    });
}

// The width's parts of the shared value kernel (attention_kivi.h).
struct q4_codes {
    static constexpr float center = 8.0f;
    static constexpr int chunk_bytes = 32;
    // A pair loop iteration's code vectors (kivi_values_pairs): the two slots'
    // bytes interleaved (unpack), low nibbles then high ones, centred, c - 8.
    // HALF (r <= 32, rows of at most 16 bytes): the pair (t, t + 1) in the low
    // lane and (t + 2, t + 3) in the high one. SPLIT: the two lanes hold 16
    // bytes of two row chunks, at p and p + 32 (blocks k and k + 1, a weight
    // each), instead of the two halves of one.
    template <bool HALF, bool SPLIT>
    __attribute__((always_inline)) static void planes(const uint8_t* p, int64_t o1, int64_t o2, int64_t o3,
                                                      __m256i (&c)[4]) {
        const __m256i mask = _mm256_set1_epi8(0x0F), eight = _mm256_set1_epi8(8);
        __m256i x0, x1;
        if (HALF) {
            x0 = _mm256_loadu2_m128i((const __m128i*)(p + o2), (const __m128i*)p);
            x1 = _mm256_loadu2_m128i((const __m128i*)(p + o3), (const __m128i*)(p + o1));
        } else if (SPLIT) {
            x0 = _mm256_loadu2_m128i((const __m128i*)(p + 32), (const __m128i*)p);
            x1 = _mm256_loadu2_m128i((const __m128i*)(p + o1 + 32), (const __m128i*)(p + o1));
        } else {
            x0 = _mm256_loadu_si256((const __m256i*)p);
            x1 = _mm256_loadu_si256((const __m256i*)(p + o1));
        }
        const __m256i l0 = _mm256_and_si256(x0, mask), l1 = _mm256_and_si256(x1, mask);
        const __m256i h0 = _mm256_and_si256(_mm256_srli_epi16(x0, 4), mask);
        const __m256i h1 = _mm256_and_si256(_mm256_srli_epi16(x1, 4), mask);
        c[0] = _mm256_sub_epi8(_mm256_unpacklo_epi8(l0, l1), eight);
        c[1] = _mm256_sub_epi8(_mm256_unpackhi_epi8(l0, l1), eight);
        c[2] = _mm256_sub_epi8(_mm256_unpacklo_epi8(h0, h1), eight);
        c[3] = _mm256_sub_epi8(_mm256_unpackhi_epi8(h0, h1), eight);
    }
    // vector v of lane h, element e: unpacklo (v even) holds code bytes 0..7 of
    // the lane, unpackhi (v odd) bytes 8..15; low nibbles (v < 2) are the even
    // channels. Byte i of lane h is channels 64k + 32h + 2i, + 1 (HALF: both
    // lanes hold the same channels of other slots).
    static int channel(bool half, int k, int h, int v, int e) {
        return 64 * k + (half ? 0 : 32 * h) + 2 * (8 * (v & 1) + e) + (v >> 1);
    }
};

void q4_fold(int G, const float* q, const uint16_t* grid, const uint16_t* step, int r, int nrc, int8_t* qi, float* qd,
             float* bias) {
    kivi_fold_queries_n<q4_pack>(G, q, grid, step, r, nrc, qi, qd, bias);
}

void q4_values(int G, const uint8_t* codes, int rb, const uint16_t* vs, const uint16_t* vm, const int32_t* gs,
               int64_t g0, int nb, const int64_t* sp, int n_sp, int64_t n, int r, const float* sc, float* acc,
               float* msum) {
    kivi_values_int<q4_codes>(G, codes, rb, vs, vm, gs, g0, nb, sp, n_sp, n, r, sc, acc, msum);
}

// int16 sums stay exact up to 4 chunks (r = 256): see scores_q4_int_g.
const kivi_int_kernels k_q4 = {64, 4, q4_fold, q4_scores, q4_values};

}  // namespace

const kivi_int_kernels* q4_int_kernels() { return &k_q4; }
#else
const kivi_int_kernels* q4_int_kernels() { return nullptr; }
#endif

}  // namespace attn
}  // namespace zk
