// Key scores over 4-bit KIVI keys whose rows have more than one part (kernels/
// attention.h: h4 4-bit codes, then `mid` 2-bit ones, then a 1-bit tail of tb
// bytes) in one pass over the slots: each part keeps its own folded query and
// int8 scale (the parts' own folds: attention_q4.cpp, attention_q2.cpp,
// attention_q1.cpp), and the parts' integer sums meet in float before one
// reduction a slot and head, where the part-by-part passes of
// attention_kivi.cpp reduced, stored and reloaded every slot's score once a
// part. (One fold for all three parts, one pass over the grid with three
// maxima, measured no faster: 6% slower on 4-bit keys with 96 2-bit channels.)
// A part is read in one of two forms:
//   pairs  16 code bytes of a row at a time ("halves"), two slots a vector
//          (slot t in the low lane, t + 1 in the high one), against 16 query
//          bytes in both lanes;
//   quads  a part of at most 8 bytes: four slots a vector (t, t + 2 in the low
//          lane's qwords, t + 1, t + 3 in the high one's), against 8 query bytes
//          in every qword: half the products of the pair form.
// The query layouts the folds write, as the forms read them:
//   4-bit  per row chunk k (64 channels): 32 bytes of even channels, then 32 of
//          odd ones, so half m (channels 32m..) has its evens at 64(m/2) +
//          16(m%2) and its odds 32 bytes on;
//   2-bit  per row chunk k (128 channels): 4 planes of 32 bytes (plane p, byte i
//          = channel 128k + 4i + p), so plane p of half m (64 channels) is at
//          128(m/2) + 32p + 16(m%2);
//   1-bit  8 planes of 16 bytes (plane p, byte i = tail channel p tb + i).
// Code buffers are readable KV_Q4_PAD (32) bytes past their last row: loads
// past a part meet zero query bytes.
#include <cstdint>

#include "kernels/cpu/attention_kivi.h"
#include "kernels/cpu/attention_layout.h"

namespace zk {
namespace attn {

#ifdef ZK_SIMD_AVX2
namespace {

// Query heads per pass: two pair accumulators, two float sums and a quad sum a
// head stay in (or near) the 16 vector registers.
constexpr int k_parts_heads = 3;

// One part of a row: codes of `bits` bits at byte `off` of each row, `halves`
// 16-byte halves in the pair form or (quad) at most 8 bytes; its folded query
// at q + j qs for head j, its scales qd [G].
struct key_part {
    int off, halves;
    bool quad;
    const int8_t* q;
    int qs;
    const float* qd;
};

// Sub-vector i of a code vector x: the codes of one nibble (4-bit), plane
// (2-bit) or bit plane (1-bit), as bytes.
template <int BITS>
inline __m256i part_sub(__m256i x, int i) {
    const __m256i m = _mm256_set1_epi8((char)((1 << BITS) - 1));
    return _mm256_and_si256(_mm256_srl_epi16(x, _mm_cvtsi32_si128(BITS * i)), m);
}

// Offset of the query bytes of sub-vector i of half m in a head's folded query.
template <int BITS>
inline int part_qoff(int m, int i) {
    if (BITS == 4) return 64 * (m >> 1) + 16 * (m & 1) + 32 * i;
    if (BITS == 2) return 128 * (m >> 1) + 16 * (m & 1) + 32 * i;
    return 16 * i;
}

// The part's sums of 4 slots (rows r[0..3]) for G heads, scaled by qd, added
// to f01 (slots 0, 1: a lane each, 8 partial sums) and f23, or, in the quad
// form, to fq (lane l's qword u: slot 2u + l, as the hadd of f01 and f23 lays them).
// int16 sums stay exact without VNNI: a half adds at most 2 x 15 x 127 x 2
// (4-bit), 4 x 3 x 127 x 2 (2-bit) or 8 x 127 x 2 (1-bit), and a part has at most
// 4 halves (4-bit: h4 <= 128), 2 (2-bit: mid <= 128) or 1.
template <int G, int BITS>
__attribute__((always_inline)) inline void part_scores(const key_part& pt, const uint8_t* const (&r)[4],
                                                        __m256 (&f01)[G], __m256 (&f23)[G], __m256 (&fq)[G]) {
    constexpr int NSUB = 8 / BITS;
    if (pt.quad) {
        auto q8 = [&](int u) { return _mm_loadl_epi64((const __m128i*)(r[u] + pt.off)); };
        const __m256i x = _mm256_set_m128i(_mm_unpacklo_epi64(q8(1), q8(3)), _mm_unpacklo_epi64(q8(0), q8(2)));
        __m256i a[G];
#pragma GCC unroll 4
        for (int j = 0; j < G; j++) a[j] = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int i = 0; i < NSUB; i++) {
            const __m256i c = part_sub<BITS>(x, i);
#pragma GCC unroll 4
            for (int j = 0; j < G; j++)
                a[j] = kivi_score_add(a[j], c,
                                      _mm256_broadcastq_epi64(_mm_loadl_epi64(
                                          (const __m128i*)(pt.q + j * pt.qs + part_qoff<BITS>(0, i)))));
        }
#pragma GCC unroll 4
        for (int j = 0; j < G; j++)
            fq[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(kivi_score_widen(a[j])), _mm256_set1_ps(pt.qd[j]), fq[j]);
        return;
    }
    __m256i a01[G], a23[G];
#pragma GCC unroll 4
    for (int j = 0; j < G; j++) a01[j] = a23[j] = _mm256_setzero_si256();
    for (int m = 0; m < pt.halves; m++) {
        const int o = pt.off + 16 * m;
        const __m256i x01 = _mm256_loadu2_m128i((const __m128i*)(r[1] + o), (const __m128i*)(r[0] + o));
        const __m256i x23 = _mm256_loadu2_m128i((const __m128i*)(r[3] + o), (const __m128i*)(r[2] + o));
#pragma GCC unroll 8
        for (int i = 0; i < NSUB; i++) {
            const __m256i c01 = part_sub<BITS>(x01, i), c23 = part_sub<BITS>(x23, i);
            const int qo = part_qoff<BITS>(m, i);
#pragma GCC unroll 4
            for (int j = 0; j < G; j++) {
                const __m256i qv = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)(pt.q + j * pt.qs + qo)));
                a01[j] = kivi_score_add(a01[j], c01, qv);
                a23[j] = kivi_score_add(a23[j], c23, qv);
            }
        }
    }
#pragma GCC unroll 4
    for (int j = 0; j < G; j++) {
        const __m256 d = _mm256_set1_ps(pt.qd[j]);
        f01[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(kivi_score_widen(a01[j])), d, f01[j]);
        f23[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(kivi_score_widen(a23[j])), d, f23[j]);
    }
}

// sc[j n + s - s0] = sum over the parts of qd_j (qi_j . part codes of slot s) +
// bias_j for slots [a, b) of one group: 4 slots at a time; the last ones one at
// a time, their row in all four places (the first sum kept).
template <int G>
void scores_parts_g(const key_part (&pt)[3], const uint8_t* codes, int rb, int64_t a, int64_t b, int64_t pf_end,
                    int64_t s0, int64_t n, const float* bias, float* sc) {
    auto four = [&](const uint8_t* const (&r)[4], __m128 (&out)[G]) __attribute__((always_inline)) {
        __m256 f01[G], f23[G], fq[G];
#pragma GCC unroll 4
        for (int j = 0; j < G; j++) f01[j] = f23[j] = fq[j] = _mm256_setzero_ps();
        if (pt[0].halves) part_scores<G, 4>(pt[0], r, f01, f23, fq);
        if (pt[1].halves) part_scores<G, 2>(pt[1], r, f01, f23, fq);
        if (pt[2].halves) part_scores<G, 1>(pt[2], r, f01, f23, fq);
#pragma GCC unroll 4
        for (int j = 0; j < G; j++) {
            // lane 0: {s0, s0, s2, s2} partials, lane 1: {s1, s1, s3, s3}; the quads' sums lie so too
            __m256 h = _mm256_add_ps(_mm256_hadd_ps(f01[j], f23[j]), fq[j]);
            h = _mm256_hadd_ps(h, h);  // lane 0: {s0, s2, s0, s2}; lane 1: {s1, s3, ...}
            out[j] = _mm_add_ps(_mm_unpacklo_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)),
                                _mm_set1_ps(bias[j]));
        }
    };
    int64_t s = a;
    for (; s + 4 <= b; s += 4) {
        const uint8_t* c0 = codes + s * rb;
        kivi_prefetch_rows(codes, rb, s, pf_end);
        const uint8_t* const r[4] = {c0, c0 + rb, c0 + 2 * rb, c0 + 3 * rb};
        __m128 o[G];
        four(r, o);
#pragma GCC unroll 4
        for (int j = 0; j < G; j++) _mm_storeu_ps(sc + j * n + s - s0, o[j]);
    }
    for (; s < b; s++) {
        const uint8_t* c0 = codes + s * rb;
        const uint8_t* const r[4] = {c0, c0, c0, c0};
        __m128 o[G];
        four(r, o);
#pragma GCC unroll 4
        for (int j = 0; j < G; j++) sc[j * n + s - s0] = _mm_cvtss_f32(o[j]);
    }
}

void q4_parts_scores(int G, int h4, int mid, int tail, const uint8_t* codes, int rb, int64_t a, int64_t b,
                     int64_t pf_end, int64_t s0, int64_t n, const int8_t* qi4, const int8_t* qim, const int8_t* qit,
                     const float* qd, const float* bias, float* sc) {
    const int b4 = kv_kivi_row_bytes(4, h4), bm = kv_kivi_row_bytes(2, mid), tb = kv_tail_bytes(tail);
    const int nrc4 = (h4 + 63) / 64, nrm = (mid + 127) / 128;
    // halves 0: the part is absent; a quad part has halves 1
    auto part = [](int off, int bytes, const int8_t* q, int qs, const float* d) {
        return key_part{off, (bytes + 15) / 16, bytes <= 8, q, qs, d};
    };
    kivi_head_passes(G, k_parts_heads, [&](int j0, int g) {
        const key_part pt[3] = {part(0, b4, qi4 + j0 * 64 * nrc4, 64 * nrc4, qd + j0),
                                part(b4, bm, qim + j0 * 128 * nrm, 128 * nrm, qd + G + j0),
                                part(b4 + bm, tb, qit + j0 * 128, 128, qd + 2 * G + j0)};
        kivi_with_heads<k_parts_heads>(g, [&](auto gb) {
            scores_parts_g<decltype(gb)::value>(pt, codes, rb, a, b, pf_end, s0, n, bias + j0, sc + j0 * n);
        });
    });
}

const kivi_parts_kernels k_q4_parts = {128, 128, q4_parts_scores};

}  // namespace

const kivi_parts_kernels* q4_parts_kernels() { return &k_q4_parts; }
#else
const kivi_parts_kernels* q4_parts_kernels() { return nullptr; }
#endif

}  // namespace attn
}  // namespace zk
