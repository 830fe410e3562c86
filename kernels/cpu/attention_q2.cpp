// Decode attention over 2-bit KIVI codes (KV_LAYOUT_Q2): the AVX2 integer
// kernels behind the shared KIVI group loop (attention_kivi.cpp).
// Byte i of a row holds channels 4i .. 4i + 3, channel 4i + p in bits 2p and
// 2p + 1 ("plane" p), so (x >> 2p) & 3 over 32 bytes gives 32 codes of one
// plane in order, with no byte shuffle per slot:
//   keys    a row chunk is 32 bytes, 128 channels; the folded query is laid out
//           per chunk as its 4 planes of 32 bytes (plane p, byte i = channel
//           128k + 4i + p), a permutation computed once per group;
//   values  64 channels (16 bytes, a row chunk) at a time, two slots'
//           bytes interleaved: each plane then gives 8 channels (4e + p) per
//           lane, the low lane channels 64k.., the high lane 64k + 32.., so the
//           weights are those of the 4-bit kernel (attention_kivi.h).
// Code buffers are readable KV_Q4_PAD (32) bytes past their last row: a row
// shorter than its last load reads into the next row or the padding, and those
// channels meet zero query bytes (keys) or are dropped (values).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/cpu/attention_kivi.h"
#include "kernels/cpu/attention_layout.h"

namespace zk {
namespace attn {

#ifdef ZK_SIMD_AVX2
namespace {

// The folded query of one head in the score loop's order (dst [nrc x 128]).
struct q2_pack {
    static constexpr int chunk = 128;
    static void pack(const float* qs, __m256 vid, int nrc, int /*r*/, int8_t* dst) {
        // within each 16-byte lane: the bytes of plane 0 (0, 4, 8, 12), then planes 1, 2, 3
        const __m256i planes = _mm256_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15, 0, 4, 8, 12, 1,
                                                5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
        const __m256i lanes = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);  // qword p: plane p of both lanes
        for (int k = 0; k < nrc; k++) {
            __m256i V[4];  // channels 128k + 32h + [0, 32): qword p = plane p (8 bytes)
            for (int h = 0; h < 4; h++)
                V[h] = _mm256_permutevar8x32_epi32(
                    _mm256_shuffle_epi8(kivi_round_int8(qs + 128 * k + 32 * h, vid), planes), lanes);
            // a 4 x 4 transpose of qwords: plane p = {V0.p, V1.p, V2.p, V3.p}
            const __m256i t0 = _mm256_unpacklo_epi64(V[0], V[1]), t1 = _mm256_unpackhi_epi64(V[0], V[1]);
            const __m256i t2 = _mm256_unpacklo_epi64(V[2], V[3]), t3 = _mm256_unpackhi_epi64(V[2], V[3]);
            int8_t* d = dst + 128 * k;
            _mm256_storeu_si256((__m256i*)d, _mm256_permute2x128_si256(t0, t2, 0x20));
            _mm256_storeu_si256((__m256i*)(d + 32), _mm256_permute2x128_si256(t1, t3, 0x20));
            _mm256_storeu_si256((__m256i*)(d + 64), _mm256_permute2x128_si256(t0, t2, 0x31));
            _mm256_storeu_si256((__m256i*)(d + 96), _mm256_permute2x128_si256(t1, t3, 0x31));
        }
    }
};

// Plane p of 32 code bytes: codes 0..3 of channels 4i + p.
template <int P>
inline __m256i q2_plane(__m256i x, __m256i m3) {
    return _mm256_and_si256(P == 0 ? x : _mm256_srli_epi16(x, 2 * P), m3);
}

// Key scores of slots [a, b) of one group: sc = qd_j (qi_j . code_s) + bias_j.
// One maddubs multiplies 32 codes of a plane by 32 query bytes and sums pairs
// into int16 (at most 2 * 3 * 127 = 762); a row chunk adds four (3048), and 2
// chunks (r <= 256) stay far below 32767. 4 slots x G accumulators.
// NRC = 0: r <= 64, a row is at most 16 bytes, so two slots share a vector (one
// per lane) against the first 16 bytes of each query plane in both lanes.
// ADD: the scores are added to sc (the 2-bit channels of 4-bit keys, after the
// 4-bit part's pass).
template <int G, int NRC, bool ADD>
void scores_q2_int_g(const uint8_t* codes, int rb, int64_t a, int64_t b, int64_t pf_end, int64_t s0, int64_t n,
                     const int8_t* qi, const float* qd, const float* bias, float* sc) {
    constexpr int nrc = NRC == 0 ? 1 : NRC;
    const __m256i m3 = _mm256_set1_epi8(0x03);
    const int qstride = nrc * 128;
    int64_t s = a;
    if constexpr (NRC == 0) {
        for (; s + 4 <= b; s += 4) {
            const uint8_t* c0 = codes + s * rb;
            kivi_prefetch_rows(codes, rb, s, pf_end);
            const __m256i x01 = _mm256_loadu2_m128i((const __m128i*)(c0 + rb), (const __m128i*)c0);
            const __m256i x23 = _mm256_loadu2_m128i((const __m128i*)(c0 + 3 * rb), (const __m128i*)(c0 + 2 * rb));
            const __m256i p01[4] = {q2_plane<0>(x01, m3), q2_plane<1>(x01, m3), q2_plane<2>(x01, m3),
                                    q2_plane<3>(x01, m3)};
            const __m256i p23[4] = {q2_plane<0>(x23, m3), q2_plane<1>(x23, m3), q2_plane<2>(x23, m3),
                                    q2_plane<3>(x23, m3)};
#pragma GCC unroll 8
            for (int j = 0; j < G; j++) {
                __m256i s01 = _mm256_setzero_si256(), s23 = s01;
#pragma GCC unroll 4
                for (int p = 0; p < 4; p++) {
                    const __m256i qp =
                        _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)(qi + j * qstride + 32 * p)));
                    s01 = kivi_score_add(s01, p01[p], qp);
                    s23 = kivi_score_add(s23, p23[p], qp);
                }
                __m256i h = _mm256_hadd_epi32(kivi_score_widen(s01), kivi_score_widen(s23));
                h = _mm256_hadd_epi32(h, h);  // lane 0: {s0, s2, s0, s2}; lane 1: {s1, s3, ...}
                const __m128 sum = _mm_cvtepi32_ps(
                    _mm_unpacklo_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1)));
                float* o = sc + j * n + s - s0;
                const __m128 base = ADD ? _mm_add_ps(_mm_loadu_ps(o), _mm_set1_ps(bias[j])) : _mm_set1_ps(bias[j]);
                _mm_storeu_ps(o, _mm_fmadd_ps(sum, _mm_set1_ps(qd[j]), base));
            }
        }
    }
    for (; NRC > 0 && s + 4 <= b; s += 4) {
        __m256i acc[G][4];
#pragma GCC unroll 8
        for (int j = 0; j < G; j++)
#pragma GCC unroll 4
            for (int u = 0; u < 4; u++) acc[j][u] = _mm256_setzero_si256();
        const uint8_t* c0 = codes + s * rb;
        kivi_prefetch_rows(codes, rb, s, pf_end);
#pragma GCC unroll 2
        for (int k = 0; k < nrc; k++) {
            const int8_t* qk = qi + 128 * k;
#pragma GCC unroll 4
            for (int u = 0; u < 4; u++) {
                const __m256i x = _mm256_loadu_si256((const __m256i*)(c0 + u * rb + 32 * k));
                const __m256i pl[4] = {q2_plane<0>(x, m3), q2_plane<1>(x, m3), q2_plane<2>(x, m3),
                                       q2_plane<3>(x, m3)};
#pragma GCC unroll 8
                for (int j = 0; j < G; j++) {
                    const int8_t* qj = qk + j * qstride;
#pragma GCC unroll 4
                    for (int p = 0; p < 4; p++)
                        acc[j][u] = kivi_score_add(acc[j][u], pl[p], _mm256_loadu_si256((const __m256i*)(qj + 32 * p)));
                }
            }
        }
#pragma GCC unroll 8
        for (int j = 0; j < G; j++) {
            const __m128 sum = _mm_cvtepi32_ps(kivi_score_hsum4(acc[j][0], acc[j][1], acc[j][2], acc[j][3]));
            float* o = sc + j * n + s - s0;
            const __m128 base = ADD ? _mm_add_ps(_mm_loadu_ps(o), _mm_set1_ps(bias[j])) : _mm_set1_ps(bias[j]);
            _mm_storeu_ps(o, _mm_fmadd_ps(sum, _mm_set1_ps(qd[j]), base));
        }
    }
    for (; s < b; s++) {
        __m256i acc[G];
#pragma GCC unroll 8
        for (int j = 0; j < G; j++) acc[j] = _mm256_setzero_si256();
#pragma GCC unroll 2
        for (int k = 0; k < nrc; k++) {
            const __m256i x = _mm256_loadu_si256((const __m256i*)(codes + s * rb + 32 * k));
            const __m256i pl[4] = {q2_plane<0>(x, m3), q2_plane<1>(x, m3), q2_plane<2>(x, m3), q2_plane<3>(x, m3)};
#pragma GCC unroll 8
            for (int j = 0; j < G; j++) {
                const int8_t* qj = qi + j * qstride + 128 * k;
#pragma GCC unroll 4
                for (int p = 0; p < 4; p++)
                    acc[j] = kivi_score_add(acc[j], pl[p], _mm256_loadu_si256((const __m256i*)(qj + 32 * p)));
            }
        }
#pragma GCC unroll 8
        for (int j = 0; j < G; j++)
            sc[j * n + s - s0] = (float)hsum_epi32(kivi_score_widen(acc[j])) * qd[j] + bias[j] +
                                 (ADD ? sc[j * n + s - s0] : 0.0f);
    }
}

template <int G, bool ADD>
void scores_q2_int_n(int nrc, const uint8_t* codes, int rb, int64_t a, int64_t b, int64_t pf_end, int64_t s0,
                     int64_t n, const int8_t* qi, const float* qd, const float* bias, float* sc) {
    switch (nrc) {
        case 0: return scores_q2_int_g<G, 0, ADD>(codes, rb, a, b, pf_end, s0, n, qi, qd, bias, sc);
        case 1: return scores_q2_int_g<G, 1, ADD>(codes, rb, a, b, pf_end, s0, n, qi, qd, bias, sc);
        default: return scores_q2_int_g<G, 2, ADD>(codes, rb, a, b, pf_end, s0, n, qi, qd, bias, sc);
    }
}

template <bool ADD>
void q2_scores_t(int G, int r, int nrc, const uint8_t* codes, int rb, int64_t a, int64_t b, int64_t pf_end,
                 int64_t s0, int64_t n, const int8_t* qi, const float* qd, const float* bias, float* sc) {
    const int qstride = 128 * nrc;
    kivi_head_passes(G, KIVI_SCORE_HEADS, [&](int j0, int g) {  // query heads in register-sized groups
        const int nr = r <= 64 ? 0 : nrc;
        kivi_with_heads<KIVI_SCORE_HEADS>(g, [&](auto gb) {
            scores_q2_int_n<decltype(gb)::value, ADD>(nr, codes, rb, a, b, pf_end, s0, n, qi + j0 * qstride,
                                                      qd + j0, bias + j0, sc + j0 * n);
        });
    });
}

void q2_scores(int G, int r, int nrc, const uint8_t* codes, int rb, int64_t a, int64_t b, int64_t pf_end,
               int64_t s0, int64_t n, const int8_t* qi, const float* qd, const float* bias, float* sc) {
    q2_scores_t<false>(G, r, nrc, codes, rb, a, b, pf_end, s0, n, qi, qd, bias, sc);
}

void q2_scores_add(int G, int r, int nrc, const uint8_t* codes, int rb, int64_t a, int64_t b, int64_t pf_end,
                   int64_t s0, int64_t n, const int8_t* qi, const float* qd, const float* bias, float* sc) {
    q2_scores_t<true>(G, r, nrc, codes, rb, a, b, pf_end, s0, n, qi, qd, bias, sc);
}

// The width's parts of the shared value kernel (attention_kivi.h).
struct q2_codes {
    static constexpr float center = 2.0f;
    static constexpr int chunk_bytes = 16;
    static constexpr bool wide = false;
    // A pair loop iteration's code vectors (kivi_values_pairs): the 16 bytes
    // (64 channels) of slot t and of slot t + 1 interleaved, the low lane
    // bytes 0..7 (channels 64k..), the high lane bytes 8..15 (64k + 32..), and
    // its 4 planes centred, c - 2 in [-2, 1] (a lane's int16 sum over a chunk
    // of 16 pairs stays within 16 * 2 * 127 * 2 = 8128). HALF (r <= 32, rows of
    // at most 8 bytes): the pair (t, t + 1) in the low lane and (t + 2, t + 3)
    // in the high one. SPLIT: the low lane's 8 bytes are at p and the high
    // lane's at p + 16, in the next row chunk (blocks k and k + 1, a weight
    // each), instead of the two halves of one row chunk.
    template <bool HALF, bool SPLIT>
    __attribute__((always_inline)) static void planes(const uint8_t* p, int64_t o1, int64_t o2, int64_t o3,
                                                      __m256i (&c)[4]) {
        const __m256i m3 = _mm256_set1_epi8(0x03), two = _mm256_set1_epi8(2);
        __m256i x;
        if (HALF) {
            const __m128i lo = _mm_unpacklo_epi8(_mm_loadl_epi64((const __m128i*)p), _mm_loadl_epi64((const __m128i*)(p + o1)));
            const __m128i hi =
                _mm_unpacklo_epi8(_mm_loadl_epi64((const __m128i*)(p + o2)), _mm_loadl_epi64((const __m128i*)(p + o3)));
            x = _mm256_set_m128i(hi, lo);
        } else {
            __m128i x0, x1;
            if (SPLIT) {
                x0 = _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i*)p), _mm_loadl_epi64((const __m128i*)(p + 16)));
                x1 = _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i*)(p + o1)),
                                        _mm_loadl_epi64((const __m128i*)(p + o1 + 16)));
            } else {
                x0 = _mm_loadu_si128((const __m128i*)p), x1 = _mm_loadu_si128((const __m128i*)(p + o1));
            }
            x = _mm256_set_m128i(_mm_unpackhi_epi8(x0, x1), _mm_unpacklo_epi8(x0, x1));
        }
        c[0] = _mm256_sub_epi8(q2_plane<0>(x, m3), two), c[1] = _mm256_sub_epi8(q2_plane<1>(x, m3), two);
        c[2] = _mm256_sub_epi8(q2_plane<2>(x, m3), two), c[3] = _mm256_sub_epi8(q2_plane<3>(x, m3), two);
    }
    // vector v = plane v; element e of lane h: byte e of the block of lane h,
    // channel 4e + v in it (HALF: both lanes hold block 0 of other slots).
    static int channel(bool half, int k, int h, int v, int e) { return 64 * k + (half ? 0 : 32 * h) + 4 * e + v; }
};

void q2_fold(int G, const float* q, const uint16_t* grid, const uint16_t* step, int r, int nrc, int8_t* qi, float* qd,
             float* bias) {
    kivi_fold_queries_n<q2_pack>(G, q, grid, step, r, nrc, qi, qd, bias);
}

void q2_values(int G, const uint8_t* codes, int rb, const uint16_t* vs, const uint16_t* vm, const int32_t* gs,
               int64_t g0, int nb, const int64_t* sp, int n_sp, int64_t n, int r, const float* sc, float* acc,
               float* msum) {
    kivi_values_int<q2_codes>(G, codes, rb, vs, vm, gs, g0, nb, sp, n_sp, n, r, sc, acc, msum);
}

// int16 sums stay exact up to 2 chunks (r = 256): see scores_q2_int_g.
const kivi_int_kernels k_q2 = {128, 2, q2_fold, q2_scores, q2_values, q2_scores_add};

// ---- 2-bit keys with a 1-bit tail, in one pass ----
// Rows of h <= 64 2-bit channels (rbh <= 16 bytes) then a tail of at most 128
// 1-bit channels (tb <= 16 bytes; attention_q1.cpp has its planes). One folded
// query (one int8 scale a head over all r channels) laid out as the 4 planes
// of the head part (16 bytes each: channel 4i + p, zero at and past h) then the
// 8 planes of the tail (16 bytes each: tail channel p tb + i, zero past tb), so
// both parts add into one int32 sum a slot: one fold, one reduction per head.

// query floats / bytes a head: the head part's 64 bytes, the tail's 128; the
// fold reads channels up to h + 128 <= 192 (zero past r)
constexpr int k_q2t_qstride = 192;

struct q2t_pack {
    static constexpr int chunk = k_q2t_qstride;
    int h, tail;
    void pack(const float* qs, __m256 vid, int, int, int8_t* dst) const {
        // the tail's channels in order first (its planes are read back below, after
        // the head part has given the stores time to leave the store buffer)
        alignas(32) int8_t b[128];
        for (int k = 0; k < 4; k++) _mm256_store_si256((__m256i*)(b + 32 * k), kivi_round_int8(qs + h + 32 * k, vid));
        // the head part, channels 0..63 zero at and past h: per 32 channels, qword p
        // = plane p (channels 4i + p); planes of 16 bytes from the two halves
        const __m256i planes = _mm256_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15, 0, 4, 8, 12, 1,
                                                5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
        const __m256i lanes = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        const __m256i iota = _mm256_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20,
                                              21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31);
        __m256i V[2];
        for (int k = 0; k < 2; k++) {
            const __m256i keep = _mm256_cmpgt_epi8(_mm256_set1_epi8((char)std::min(std::max(h - 32 * k, 0), 32)), iota);
            const __m256i v = _mm256_and_si256(kivi_round_int8(qs + 32 * k, vid), keep);
            V[k] = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(v, planes), lanes);
        }
        const __m256i t0 = _mm256_unpacklo_epi64(V[0], V[1]), t1 = _mm256_unpackhi_epi64(V[0], V[1]);
        _mm256_storeu_si256((__m256i*)dst, _mm256_permute2x128_si256(t0, t1, 0x20));         // planes 0, 1
        _mm256_storeu_si256((__m256i*)(dst + 32), _mm256_permute2x128_si256(t0, t1, 0x31));  // planes 2, 3
        // the tail's planes: p tb + [0, tb) (p tb + 16 <= 128 as tb <= 16)
        const int tb = kv_tail_bytes(tail);
        const __m128i keep = _mm_cmpgt_epi8(_mm_set1_epi8((char)tb), _mm256_castsi256_si128(iota));
        for (int p = 0; p < 8; p++)
            _mm_storeu_si128((__m128i*)(dst + 64 + 16 * p),
                             _mm_and_si128(_mm_loadu_si128((const __m128i*)(b + p * tb)), keep));
    }
};

// sc[j * n + s - s0] = qd_j (qi_j . codes of slot s) + bias_j for slots [a, b)
// of one group: per two slots (one a lane), the head part's 4 planes and the
// tail's 8 against the query's 12 planes, in one accumulator (a lane's int16
// sums stay below 4 * 2 * 3 * 127 + 8 * 2 * 127 without VNNI). H4 (h <= 32:
// the head part is at most 8 bytes): four slots' head parts share a vector,
// {s, s + 2} in the low lane and {s + 1, s + 3} in the high one, against the
// plane's 8 query bytes in every qword: 4 products a plane for 4 slots, not 8.
// Its int32 sums then have the layout of the tail's after the first hadd
// ({s, s, s + 2, s + 2 | s + 1, ...}) and are added there.
template <int G, bool H4>
void scores_q2t_int_g(const uint8_t* codes, int rb, int rbh, int64_t a, int64_t b, int64_t pf_end, int64_t s0,
                      int64_t n, const int8_t* qi, const float* qd, const float* bias, float* sc) {
    const __m256i m3 = _mm256_set1_epi8(0x03), m1 = _mm256_set1_epi8(0x01);
    auto qplane = [&](int j, int p) __attribute__((always_inline)) {
        return _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)(qi + j * k_q2t_qstride + 16 * p)));
    };
    auto q8 = [](const void* c) __attribute__((always_inline)) { return _mm_loadl_epi64((const __m128i*)c); };
    // the head part of two slots (row s in the low lane, s + d in the high one)
    auto head2 = [&](const uint8_t* c, int64_t d, __m256i (&acc)[G]) __attribute__((always_inline)) {
        const __m256i xa = _mm256_loadu2_m128i((const __m128i*)(c + d), (const __m128i*)c);
        const __m256i pa[4] = {q2_plane<0>(xa, m3), q2_plane<1>(xa, m3), q2_plane<2>(xa, m3), q2_plane<3>(xa, m3)};
#pragma GCC unroll 4
        for (int j = 0; j < G; j++)
#pragma GCC unroll 4
            for (int p = 0; p < 4; p++) acc[j] = kivi_score_add(acc[j], pa[p], qplane(j, p));
    };
    // the tail of two slots, likewise
    auto tail2 = [&](const uint8_t* c, int64_t d, __m256i (&acc)[G]) __attribute__((always_inline)) {
        const __m256i xb = _mm256_loadu2_m128i((const __m128i*)(c + d + rbh), (const __m128i*)(c + rbh));
        const __m256i pb[8] = {xb,
                               _mm256_srli_epi16(xb, 1),
                               _mm256_srli_epi16(xb, 2),
                               _mm256_srli_epi16(xb, 3),
                               _mm256_srli_epi16(xb, 4),
                               _mm256_srli_epi16(xb, 5),
                               _mm256_srli_epi16(xb, 6),
                               _mm256_srli_epi16(xb, 7)};
#pragma GCC unroll 4
        for (int j = 0; j < G; j++)
#pragma GCC unroll 8
            for (int p = 0; p < 8; p++) acc[j] = kivi_score_add(acc[j], _mm256_and_si256(pb[p], m1), qplane(j, 4 + p));
    };
    int64_t s = a;
    for (; s + 4 <= b; s += 4) {
        const uint8_t* c0 = codes + s * rb;
        kivi_prefetch_rows(codes, rb, s, pf_end);
        __m256i a01[G], a23[G], ah[G];
#pragma GCC unroll 4
        for (int j = 0; j < G; j++) a01[j] = a23[j] = ah[j] = _mm256_setzero_si256();
        if constexpr (H4) {
            const __m256i x = _mm256_set_m128i(_mm_unpacklo_epi64(q8(c0 + rb), q8(c0 + 3 * rb)),
                                               _mm_unpacklo_epi64(q8(c0), q8(c0 + 2 * rb)));
            const __m256i ph[4] = {q2_plane<0>(x, m3), q2_plane<1>(x, m3), q2_plane<2>(x, m3), q2_plane<3>(x, m3)};
#pragma GCC unroll 4
            for (int j = 0; j < G; j++)
#pragma GCC unroll 4
                for (int p = 0; p < 4; p++)
                    ah[j] = kivi_score_add(ah[j], ph[p],
                                           _mm256_broadcastq_epi64(q8(qi + j * k_q2t_qstride + 16 * p)));
        } else {
            head2(c0, rb, a01);
            head2(c0 + 2 * rb, rb, a23);
        }
        tail2(c0, rb, a01);
        tail2(c0 + 2 * rb, rb, a23);
#pragma GCC unroll 4
        for (int j = 0; j < G; j++) {
            __m256i h = _mm256_hadd_epi32(kivi_score_widen(a01[j]), kivi_score_widen(a23[j]));
            if constexpr (H4) h = _mm256_add_epi32(h, kivi_score_widen(ah[j]));
            h = _mm256_hadd_epi32(h, h);  // lane 0: {s0, s2, s0, s2}; lane 1: {s1, s3, ...}
            const __m128 sum =
                _mm_cvtepi32_ps(_mm_unpacklo_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1)));
            _mm_storeu_ps(sc + j * n + s - s0, _mm_fmadd_ps(sum, _mm_set1_ps(qd[j]), _mm_set1_ps(bias[j])));
        }
    }
    for (; s < b; s++) {  // one slot in both lanes: twice its sum
        __m256i acc[G];
#pragma GCC unroll 4
        for (int j = 0; j < G; j++) acc[j] = _mm256_setzero_si256();
        head2(codes + s * rb, 0, acc);
        tail2(codes + s * rb, 0, acc);
#pragma GCC unroll 4
        for (int j = 0; j < G; j++)
            sc[j * n + s - s0] = (float)(hsum_epi32(kivi_score_widen(acc[j])) / 2) * qd[j] + bias[j];
    }
}

void q2t_fold(int G, const float* q, const uint16_t* grid, const uint16_t* step, int r, int h, int8_t* qi, float* qd,
              float* bias) {
    kivi_fold_queries_n<q2t_pack>(G, q, grid, step, r, 1, qi, qd, bias, q2t_pack{h, r - h});
}

// WIDE: with AVX-512 the wide loop (attention_parts_wide.cpp) reads this
// fold's bytes, its two parts at one scale, 16 slots a pass; false: never (the
// twin test holds the wide loop to this one).
template <bool WIDE>
void q2t_scores(int G, int h, const uint8_t* codes, int rb, int64_t a, int64_t b, int64_t pf_end, int64_t s0,
                int64_t n, const int8_t* qi, const float* qd, const float* bias, float* sc) {
    const int rbh = kv_kivi_row_bytes(2, h);
#ifdef ZK_KIVI_WIDE_VALUES
    if (WIDE) {  // the head part's 4 planes of 16 bytes, then the tail's 8
        const kivi_wide_part wp[2] = {{2, 0, rbh, qi, k_q2t_qstride, 0, 16, qd},
                                      {1, rbh, rb - rbh, qi + 64, k_q2t_qstride, 0, 16, qd}};
        a = kivi_wide_parts_scores(G, wp, 2, codes, rb, a, b, pf_end, s0, n, bias, sc);
        if (a == b) return;
    }
#endif
    kivi_head_passes(G, KIVI_SCORE_HEADS, [&](int j0, int g) {
        kivi_with_heads<KIVI_SCORE_HEADS>(g, [&](auto gb) {
            auto run = [&](auto h4) {
                scores_q2t_int_g<decltype(gb)::value, decltype(h4)::value>(
                    codes, rb, rbh, a, b, pf_end, s0, n, qi + j0 * k_q2t_qstride, qd + j0, bias + j0, sc + j0 * n);
            };
            if (rbh <= 8)
                run(std::true_type{});
            else
                run(std::false_type{});
        });
    });
}

const kivi_tail_kernels k_q2t = {64, k_q2t_qstride, q2t_fold, q2t_scores<true>};
const kivi_tail_kernels k_q2t_narrow = {64, k_q2t_qstride, q2t_fold, q2t_scores<false>};

}  // namespace

const kivi_int_kernels* q2_int_kernels() { return &k_q2; }
const kivi_tail_kernels* q2_tail_kernels() { return &k_q2t; }
const kivi_tail_kernels* q2_tail_kernels_narrow() { return &k_q2t_narrow; }
#else
const kivi_int_kernels* q2_int_kernels() { return nullptr; }
const kivi_tail_kernels* q2_tail_kernels() { return nullptr; }
const kivi_tail_kernels* q2_tail_kernels_narrow() { return nullptr; }
#endif

}  // namespace attn
}  // namespace zk
