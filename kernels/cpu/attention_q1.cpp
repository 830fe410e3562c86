// Key scores over 1-bit key tails (kernels/attention.h: the last `tail`
// channels of a KIVI key row, after its 4- or 2-bit codes): the AVX2 integer
// kernels the shared KIVI group loop (attention_kivi.cpp) runs after the
// width's own, adding to its scores.
// The tail's tb = kv_tail_bytes(tail) <= 16 bytes hold tail channel i in bit
// i / tb of byte i % tb, so bit plane p of the bytes is channels [p tb, p tb +
// tb) in order: (x >> p) & 1 over a 16-byte lane gives a plane's codes with no
// shuffle, and the folded query is laid out as 8 planes of 16 bytes (plane p,
// byte i = tail channel p tb + i for i < tb, zero past tb), so that the row
// bytes a 16-byte load takes past the tail meet zeros. Two slots share a
// vector, one per lane, as the 2-bit kernel does for short rows.
#include <cstdint>

#include "kernels/cpu/attention_kivi.h"
#include "kernels/cpu/attention_layout.h"

namespace zk {
namespace attn {

#ifdef ZK_SIMD_AVX2
namespace {

constexpr int k_q1_planes = 8;

// The folded query of one head in the score loop's order (dst [8 x 16]);
// qs: the tail's r <= 128 folded channels, zero past r.
struct q1_pack {
    static constexpr int chunk = 128;
    static void pack(const float* qs, __m256 vid, int nrc, int r, int8_t* dst) {
        (void)nrc;  // one chunk: r <= KV_KEY_TAIL_MAX
        alignas(32) int8_t b[128];  // zero past r, as qs is
        for (int h = 0; h < 4; h++) _mm256_store_si256((__m256i*)(b + 32 * h), kivi_round_int8(qs + 32 * h, vid));
        // plane p: b[p tb, p tb + tb) then zeros, by a masked 16-byte copy (p tb + 16 <= 128 as
        // tb <= 16): a variable-length memcpy and a memset a plane cost more than the rest
        const int tb = kv_tail_bytes(r);
        const __m128i keep = _mm_cmpgt_epi8(_mm_set1_epi8((char)tb), _mm_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10,
                                                                                    11, 12, 13, 14, 15));
        for (int p = 0; p < k_q1_planes; p++)
            _mm_storeu_si128((__m128i*)(dst + 16 * p),
                             _mm_and_si128(_mm_loadu_si128((const __m128i*)(b + p * tb)), keep));
    }
};

template <int P>
inline __m256i q1_plane(__m256i x, __m256i m1) {
    return _mm256_and_si256(P == 0 ? x : _mm256_srli_epi16(x, P), m1);
}

// sc[j * n + s - s0] += qd_j (qi_j . tail code_s) + bias_j for slots [a, b):
// 4 slots (two vectors of two rows) x G heads per step. One maddubs pair sums
// at most 2 * 127, eight planes 2032: int16 sums stay exact.
template <int G>
void scores_q1_int_g(const uint8_t* codes, int rb, int64_t a, int64_t b, int64_t pf_end, int64_t s0, int64_t n,
                     const int8_t* qi, const float* qd, const float* bias, float* sc) {
    const __m256i m1 = _mm256_set1_epi8(0x01);
    __m256i qp[G][k_q1_planes];  // each plane's 16 query bytes in both lanes
#pragma GCC unroll 4
    for (int j = 0; j < G; j++)
#pragma GCC unroll 8
        for (int p = 0; p < k_q1_planes; p++)
            qp[j][p] = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)(qi + j * 128 + 16 * p)));
    auto planes = [&](__m256i x, __m256i (&pl)[k_q1_planes]) __attribute__((always_inline)) {
        pl[0] = q1_plane<0>(x, m1), pl[1] = q1_plane<1>(x, m1), pl[2] = q1_plane<2>(x, m1);
        pl[3] = q1_plane<3>(x, m1), pl[4] = q1_plane<4>(x, m1), pl[5] = q1_plane<5>(x, m1);
        pl[6] = q1_plane<6>(x, m1), pl[7] = q1_plane<7>(x, m1);
    };
    int64_t s = a;
    for (; s + 4 <= b; s += 4) {
        const uint8_t* c0 = codes + s * rb;
        kivi_prefetch_rows(codes, rb, s, pf_end);
        __m256i p01[k_q1_planes], p23[k_q1_planes];
        planes(_mm256_loadu2_m128i((const __m128i*)(c0 + rb), (const __m128i*)c0), p01);
        planes(_mm256_loadu2_m128i((const __m128i*)(c0 + 3 * rb), (const __m128i*)(c0 + 2 * rb)), p23);
#pragma GCC unroll 4
        for (int j = 0; j < G; j++) {
            __m256i s01 = _mm256_setzero_si256(), s23 = s01;
#pragma GCC unroll 8
            for (int p = 0; p < k_q1_planes; p++) {
                s01 = kivi_score_add(s01, p01[p], qp[j][p]);
                s23 = kivi_score_add(s23, p23[p], qp[j][p]);
            }
            __m256i h = _mm256_hadd_epi32(kivi_score_widen(s01), kivi_score_widen(s23));
            h = _mm256_hadd_epi32(h, h);  // lane 0: {s0, s2, s0, s2}; lane 1: {s1, s3, ...}
            const __m128 sum =
                _mm_cvtepi32_ps(_mm_unpacklo_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1)));
            float* d = sc + j * n + s - s0;
            _mm_storeu_ps(d, _mm_add_ps(_mm_loadu_ps(d), _mm_fmadd_ps(sum, _mm_set1_ps(qd[j]), _mm_set1_ps(bias[j]))));
        }
    }
    for (; s < b; s++) {  // the last slots one at a time (the high lane repeats the row)
        const uint8_t* c0 = codes + s * rb;
        __m256i pl[k_q1_planes];
        planes(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)c0)), pl);
#pragma GCC unroll 4
        for (int j = 0; j < G; j++) {
            __m256i acc = _mm256_setzero_si256();
#pragma GCC unroll 8
            for (int p = 0; p < k_q1_planes; p++) acc = kivi_score_add(acc, pl[p], qp[j][p]);
            sc[j * n + s - s0] += (float)(hsum_epi32(kivi_score_widen(acc)) / 2) * qd[j] + bias[j];
        }
    }
}

void q1_scores(int G, int r, int nrc, const uint8_t* codes, int rb, int64_t a, int64_t b, int64_t pf_end,
               int64_t s0, int64_t n, const int8_t* qi, const float* qd, const float* bias, float* sc) {
    (void)r, (void)nrc;
    kivi_head_passes(G, KIVI_SCORE_HEADS, [&](int j0, int g) {
        kivi_with_heads<KIVI_SCORE_HEADS>(g, [&](auto gb) {
            scores_q1_int_g<decltype(gb)::value>(codes, rb, a, b, pf_end, s0, n, qi + j0 * 128, qd + j0, bias + j0,
                                                 sc + j0 * n);
        });
    });
}

void q1_fold(int G, const float* q, const uint16_t* grid, const uint16_t* step, int r, int nrc, int8_t* qi,
             float* qd, float* bias) {
    kivi_fold_queries_n<q1_pack>(G, q, grid, step, r, nrc, qi, qd, bias);
}

// max_chunks 1: a tail is at most KV_KEY_TAIL_MAX = 128 channels. No value kernel.
const kivi_int_kernels k_q1 = {128, 1, q1_fold, q1_scores, nullptr};

}  // namespace

const kivi_int_kernels* q1_tail_kernels() { return &k_q1; }
#else
const kivi_int_kernels* q1_tail_kernels() { return nullptr; }
#endif

}  // namespace attn
}  // namespace zk
