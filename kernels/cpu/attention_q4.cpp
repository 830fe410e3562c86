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
#include "kernels/cpu/avx512_warnings.h"  // first: GCC PR 105593

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <utility>

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

// (VBMI: the wide fold's byte permute; Cascade Lake has VNNI without it and keeps the 256-bit loops)
#if defined(__AVX512BW__) && defined(__AVX512VNNI__) && defined(__AVX512VBMI__)
#define ZK_Q4_WIDE_SCORES 1
// The wide score loop, for rows of two row chunks (65..128 channels, rows
// read as 64 bytes: KV_Q4_PAD): 16 slots at a time, their 16 rows of 16
// dwords transposed (4 rounds of 16 shuffles) so that vector c holds dword c
// of every row, lane d slot d. Dword c is row bytes 4c .. 4c + 3, channels 8c
// .. 8c + 7: its low nibbles are the even channels 8c + 2e, which the folded
// query keeps as 4 consecutive bytes (64 (c / 8) + 4 (c % 8), the odd ones 32
// bytes on), so one dpbusd against that dword broadcast from memory adds four
// channels of 16 slots into their own lanes: no horizontal sums, which took
// most of the narrow loop's time once the products were dpbusd. The integers
// are the narrow loop's, and so are the scores (scores_q4_wide below).
//
// Whether the wide fold and score loops take a group: rows of two row chunks,
// at most 8 query heads (their accumulators in registers).
inline bool q4_wide_keys(int G, int r, int nrc) { return nrc == 2 && r > 64 && G <= 8; }

// acc + u (u8) . the query dword at qh + OFF, broadcast (as kivi_dpbusd512_bcast,
// whose call through a reference made GCC 12 clone scores_q4_wide without its
// prefetches: 12% slower), qh's 256 bytes an input so the fold's stores stay before it.
template <int OFF>
__attribute__((always_inline)) inline __m512i q4_dpbusd_bcast(__m512i acc, __m512i u, const int8_t* qh) {
    asm("vpdpbusd %c3(%2)%{1to16%}, %1, %0"
        : "+v"(acc)
        : "v"(u), "r"(qh), "i"(OFF), "m"(*(const int8_t(*)[256])qh));
    return acc;
}

// The products of the 16 transposed columns x[c] with G heads' query dwords
// (query stride 128 bytes) into acc: C... = 0..15, so that every query offset
// is a constant. Column c also asks for line c of pf (when set, c < pf_lines).
template <int G, int... C>
__attribute__((always_inline)) inline void q4_wide_columns(const __m512i (&x)[16], const int8_t* qi, __m512i (&acc)[G],
                                                           const uint8_t* pf, int pf_lines,
                                                           std::integer_sequence<int, C...>) {
    const __m512i mask = _mm512_set1_epi8(0x0F);
    auto column = [&](auto cc) __attribute__((always_inline)) {
        constexpr int c = decltype(cc)::value, qo = 64 * (c >> 3) + 4 * (c & 7);
        if (pf && c < pf_lines) simd::prefetch_l2(pf + 64 * c, 64);
        const __m512i lo = _mm512_and_si512(x[c], mask), hi = _mm512_and_si512(_mm512_srli_epi16(x[c], 4), mask);
#pragma GCC unroll 8
        for (int j = 0; j < G; j++) {
            acc[j] = q4_dpbusd_bcast<qo>(acc[j], lo, qi + 128 * j);
            acc[j] = q4_dpbusd_bcast<qo + 32>(acc[j], hi, qi + 128 * j);
        }
    };
    (column(std::integral_constant<int, C>()), ...);
}

// Slots [a, a + 16 k) of one group for G heads (query stride 128 bytes).
template <int G>
void scores_q4_wide(const uint8_t* codes, int rb, int64_t a, int64_t b, int64_t pf_end, int64_t s0, int64_t n,
                    const int8_t* qi, const float* qd, const float* bias, float* sc) {
    for (int64_t s = a; s + 16 <= b; s += 16) {
        const uint8_t* c0 = codes + s * rb;
        // the 16 rows KIVI_SCORE_PREFETCH_SLOTS ahead, a line a column (as the
        // packed mat-vecs spread theirs: ggml-like/quant_tile_k.cpp)
        const int64_t p = s + KIVI_SCORE_PREFETCH_SLOTS;
        const uint8_t* pf = p + 16 <= pf_end ? codes + p * rb : nullptr;
        __m512i x[16];
#pragma GCC unroll 16
        for (int i = 0; i < 16; i++) x[i] = _mm512_loadu_si512(c0 + i * rb);
        kivi_transpose16_dwords(x);
        __m512i acc[G];
#pragma GCC unroll 8
        for (int j = 0; j < G; j++) acc[j] = _mm512_setzero_si512();
        q4_wide_columns<G>(x, qi, acc, pf, (16 * rb + 63) / 64, std::make_integer_sequence<int, 16>());
#pragma GCC unroll 8
        for (int j = 0; j < G; j++) {
            const __m512 f = _mm512_cvtepi32_ps(acc[j]);
            _mm512_storeu_ps(sc + j * n + s - s0, _mm512_fmadd_ps(f, _mm512_set1_ps(qd[j]), _mm512_set1_ps(bias[j])));
        }
    }
}
#endif

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

// WIDE: the wide loops where they are built and apply (false: the 256-bit
// twins, which tests hold them to).
template <bool WIDE>
void q4_scores(int G, int r, int nrc, const uint8_t* codes, int rb, int64_t a, int64_t b, int64_t pf_end,
               int64_t s0, int64_t n, const int8_t* qi, const float* qd, const float* bias, float* sc) {
    const int qstride = 64 * nrc;
#ifdef ZK_Q4_WIDE_SCORES
    if (WIDE && q4_wide_keys(G, r, nrc)) {  // whole 16s of slots in the wide loop, every head at once
        const int64_t w = a + (b - a) / 16 * 16;
        if (w > a)
            kivi_with_heads<8>(G, [&](auto gb) {
                scores_q4_wide<decltype(gb)::value>(codes, rb, a, w, pf_end, s0, n, qi, qd, bias, sc);
            });
        if (w == b) return;
        a = w;
    }
#endif
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
    static constexpr bool wide = true;  // kivi_values_quads reads these rows where it is built
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

#ifdef ZK_Q4_WIDE_SCORES
// kivi_fold_queries for rows of two row chunks (65..128 channels, query
// stride 128), 16 channels a step and every head in one pass over the grid:
// the same q_c s_c, maxima, int8 roundings and layout (q4_pack), the bias
// sum_c q_c m_c summed in another order. The roundings are packed to bytes
// lane by lane (two packs) and put in the layout by one byte permute.
template <int GB>
void q4_fold_wide(const float* q, const uint16_t* grid, const uint16_t* step, int r, int8_t* qi, float* qd,
                  float* bias) {
    // byte i of a chunk's layout (evens, then odds) is channel ch = 2i or 2(i - 32) + 1, which the packs
    // of four int32 vectors (channels 16m + 4l + e) leave at byte 16l + 4m + e
    alignas(64) static const int8_t pick_bytes[64] = {
        0, 2, 16, 18, 32, 34, 48, 50, 4, 6, 20, 22, 36, 38, 52, 54,
        8, 10, 24, 26, 40, 42, 56, 58, 12, 14, 28, 30, 44, 46, 60, 62,
        1, 3, 17, 19, 33, 35, 49, 51, 5, 7, 21, 23, 37, 39, 53, 55,
        9, 11, 25, 27, 41, 43, 57, 59, 13, 15, 29, 31, 45, 47, 61, 63};
    alignas(64) float qs[GB][128];
    const __m512 ds = _mm512_set1_ps(h2f(step[0])), dm = _mm512_set1_ps(h2f(step[1]));
    const __m256i lo8 = _mm256_set1_epi16(0xff);
    __m512 mx[GB], bs[GB];
#pragma GCC unroll 8
    for (int j = 0; j < GB; j++) mx[j] = bs[j] = _mm512_setzero_ps();
    for (int c = 0; c < 128; c += 16) {
        // grid codes of channels c .. c + 15, zeros past r (the query is zero there too)
        const __mmask16 in = c + 16 <= r ? (__mmask16)0xFFFF : c >= r ? (__mmask16)0 : (__mmask16)((1u << (r - c)) - 1);
        const __m256i g16 = _mm256_maskz_loadu_epi16(in, grid + c);
        const __m512 sv = _mm512_mul_ps(ds, _mm512_cvtepi32_ps(_mm512_cvtepu16_epi32(_mm256_and_si256(g16, lo8))));
        const __m512 mv = _mm512_mul_ps(dm, _mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(_mm256_srai_epi16(g16, 8))));
#pragma GCC unroll 8
        for (int j = 0; j < GB; j++) {
            const __m512 qc = _mm512_loadu_ps(q + 128 * j + c);
            const __m512 x = _mm512_mul_ps(qc, sv);
            _mm512_store_ps(qs[j] + c, x);
            mx[j] = _mm512_max_ps(mx[j], _mm512_abs_ps(x));
            bs[j] = _mm512_fmadd_ps(qc, mv, bs[j]);
        }
    }
    const __m512i pick = _mm512_load_si512(pick_bytes);
    // every head's maximum into lane j of one vector, so that two divisions
    // serve all heads (a head's scalar divisions waited on its own reduction)
    static_assert(GB <= 16, "a head a lane");
    __m512 X = _mm512_setzero_ps();
#pragma GCC unroll 8
    for (int j = 0; j < GB; j++) {
        __m512 x = _mm512_maskz_max_ps(simd::all16, mx[j], _mm512_shuffle_f32x4(mx[j], mx[j], _MM_SHUFFLE(1, 0, 3, 2)));
        x = _mm512_maskz_max_ps(simd::all16, x, _mm512_shuffle_f32x4(x, x, _MM_SHUFFLE(2, 3, 0, 1)));
        x = _mm512_maskz_max_ps(simd::all16, x, _mm512_permute_ps(x, 0x4E));
        x = _mm512_maskz_max_ps(simd::all16, x, _mm512_permute_ps(x, 0xB1));
        X = _mm512_mask_mov_ps(X, (__mmask16)(1u << j), x);
    }
    const __m512 D = _mm512_div_ps(X, _mm512_set1_ps(127.0f));  // d = max / 127, as the narrow fold
    const __m512 VID = _mm512_maskz_div_ps(_mm512_cmp_ps_mask(D, _mm512_setzero_ps(), _CMP_GT_OQ),
                                           _mm512_set1_ps(1.0f), D);
    _mm512_mask_storeu_ps(qd, (__mmask16)((1u << GB) - 1), D);
#pragma GCC unroll 8
    for (int j = 0; j < GB; j++) {
        bias[j] = _mm512_reduce_add_ps(bs[j]);
        const __m512 vid = _mm512_permutexvar_ps(_mm512_set1_epi32(j), VID);
        for (int k = 0; k < 2; k++) {
            const float* x = qs[j] + 64 * k;
            const __m512i i0 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_load_ps(x), vid));
            const __m512i i1 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_load_ps(x + 16), vid));
            const __m512i i2 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_load_ps(x + 32), vid));
            const __m512i i3 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_load_ps(x + 48), vid));
            const __m512i b = _mm512_packs_epi16(_mm512_packs_epi32(i0, i1), _mm512_packs_epi32(i2, i3));
            _mm512_storeu_si512(qi + 128 * j + 64 * k, _mm512_permutexvar_epi8(pick, b));
        }
    }
}
#endif

template <bool WIDE>
void q4_fold(int G, const float* q, const uint16_t* grid, const uint16_t* step, int r, int nrc, int8_t* qi, float* qd,
             float* bias) {
#ifdef ZK_Q4_WIDE_SCORES
    if (WIDE && q4_wide_keys(G, r, nrc)) {
        kivi_with_heads<8>(G, [&](auto gb) { q4_fold_wide<decltype(gb)::value>(q, grid, step, r, qi, qd, bias); });
        return;
    }
#endif
    kivi_fold_queries_n<q4_pack>(G, q, grid, step, r, nrc, qi, qd, bias);
}

template <bool WIDE>
void q4_values(int G, const uint8_t* codes, int rb, const uint16_t* vs, const uint16_t* vm, const int32_t* gs,
               int64_t g0, int nb, const int64_t* sp, int n_sp, int64_t n, int r, const float* sc, float* acc,
               float* msum) {
    kivi_values_int<q4_codes, WIDE>(G, codes, rb, vs, vm, gs, g0, nb, sp, n_sp, n, r, sc, acc, msum);
}

// int16 sums stay exact up to 4 chunks (r = 256): see scores_q4_int_g.
const kivi_int_kernels k_q4 = {64, 4, q4_fold<true>, q4_scores<true>, q4_values<true>};
const kivi_int_kernels k_q4_narrow = {64, 4, q4_fold<false>, q4_scores<false>, q4_values<false>};

}  // namespace

const kivi_int_kernels* q4_int_kernels() { return &k_q4; }
const kivi_int_kernels* q4_int_kernels_narrow() { return &k_q4_narrow; }
#else
const kivi_int_kernels* q4_int_kernels() { return nullptr; }
const kivi_int_kernels* q4_int_kernels_narrow() { return nullptr; }
#endif

}  // namespace attn
}  // namespace zk
