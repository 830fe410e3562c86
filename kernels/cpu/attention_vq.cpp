// Decode attention's value sums over vector-coded values (KV_LAYOUT_VQ; the
// format in kernels/attention.h). A slot's value is scale_s book[g][code_g]
// for each group g of c channels. Fast paths, by the book's shape:
//   4 channels x 64 centroids (what calibrate trains), G <= 8 heads, AVX2:
//     per pair of groups the heads' 8-channel sums stay in registers while the
//     slots go by, each adding its two centroids (one vector, two 16-byte
//     loads) times each head's weight p_j(s) scale_s. About 1.4x the time of
//     2-bit KIVI values (bench/RESULTS.md "vector-coded values").
//   8 channels x 256 centroids (8-bit codes, calibrate's second books), G <= 8:
//     the same per group, a slot adding its centroid (one vector) times each
//     head's weight.
//   any other: acc_j = sum_g sum_k H_j[g][k] book[g][k] with the histogram
//     H_j[g][k] = sum of p_j(s) scale_s over the slots whose group g has code k:
//     r / c vector adds a slot (each of the G heads' weights at once), a block
//     of groups at a time so that its cells stay in L1, and the book once per
//     range (r x K multiply-adds a head). Scattered adds into a histogram
//     measured 2.4x the 2-bit time on the 4 x 64 books, hence the path above.
// A range shorter than K slots (histogram) and the reference path decode each
// slot's row and add it.
#include "kernels/cpu/avx512_warnings.h"  // first: GCC PR 105593

#include <algorithm>
#include <cstring>

#include "ggml-like/error.h"
#include "kernels/cpu/attention_kivi.h"
#include "kernels/cpu/attention_layout.h"

namespace zk {
namespace attn {

namespace {

// cell[i] = (g0 + i - g0) K + code of group g0 + i, for the groups [g0, g1) of
// a row of `bits`-bit codes: the block's cell of each. 6-bit codes (64
// centroids) come four from every three bytes, read as one 32-bit word (rows
// are readable KV_VQ_PAD bytes on; g0 a multiple of 4); 8-bit ones are bytes.
inline void unpack_cells(const uint8_t* row, int g0, int g1, int bits, int K, int32_t* cell) {
    int g = g0;
    if (bits == 6 && g0 % 4 == 0) {
        for (; g + 4 <= g1; g += 4) {
            uint32_t wd;
            std::memcpy(&wd, row + g / 4 * 3, 4);
            const int i = g - g0;
            cell[i] = i * K + (int)(wd & 63);
            cell[i + 1] = (i + 1) * K + (int)((wd >> 6) & 63);
            cell[i + 2] = (i + 2) * K + (int)((wd >> 12) & 63);
            cell[i + 3] = (i + 3) * K + (int)((wd >> 18) & 63);
        }
    } else if (bits == 8) {
        for (; g < g1; g++) cell[g - g0] = (g - g0) * K + row[g];
    }
    for (; g < g1; g++) cell[g - g0] = (g - g0) * K + kv_vq_code(row, g, bits);
}

#ifdef ZK_SIMD_AVX2
// 4 channels a code, 64 centroids, G <= 8 heads: per pair of groups the G
// heads' sums of 8 channels stay in registers over the slots, a slot adding
// its two centroids (one vector) times each head's weight; no histogram, so
// nothing waits on memory. pw [slots x Gp] the weights, acc [G x r].
template <int G>
void values_c4k64(const uint8_t* codes, int rb, int64_t a, int64_t b, int ng, const float* book, const float* pw,
                  int Gp, int r, float* acc) {
    for (int g = 0; g < ng; g += 2) {
        const bool pair = g + 1 < ng;
        const float* b0 = book + (size_t)g * 64 * 4;
        const float* b1 = pair ? b0 + 64 * 4 : b0;  // a lone last group adds its centroid twice, the upper half dropped
        __m256 s[G];
        for (int j = 0; j < G; j++) s[j] = _mm256_setzero_ps();
        const uint8_t* row = codes + a * rb + g * 6 / 8;
        const int sh = g * 6 % 8;  // 0 or 4: the pair's 12 bits lie in one 16-bit word
        const float* ps = pw;
        for (int64_t t = a; t < b; t++, row += rb, ps += Gp) {
            uint16_t wd;
            std::memcpy(&wd, row, 2);
            const unsigned x = (unsigned)wd >> sh;
            const __m256 cent = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps(b0 + (x & 63) * 4)),
                                                     _mm_loadu_ps(b1 + ((x >> 6) & 63) * 4), 1);
            for (int j = 0; j < G; j++) s[j] = _mm256_fmadd_ps(_mm256_broadcast_ss(ps + j), cent, s[j]);
        }
        for (int j = 0; j < G; j++) {
            float* o = acc + j * r + g * 4;
            if (pair) {
                _mm256_storeu_ps(o, _mm256_add_ps(_mm256_loadu_ps(o), s[j]));
            } else {
                _mm_storeu_ps(o, _mm_add_ps(_mm_loadu_ps(o), _mm256_castps256_ps128(s[j])));
            }
        }
    }
}

// 8 channels a code, 256 centroids (8-bit codes): per group the G heads' sums
// of its 8 channels stay in registers over the slots.
template <int G>
void values_c8k256(const uint8_t* codes, int rb, int64_t a, int64_t b, int ng, const float* book, const float* pw,
                   int Gp, int r, float* acc) {
    for (int g = 0; g < ng; g++) {
        const float* b0 = book + (size_t)g * 256 * 8;
        __m256 s[G];
        for (int j = 0; j < G; j++) s[j] = _mm256_setzero_ps();
        const uint8_t* row = codes + a * rb + g;
        const float* ps = pw;
        for (int64_t t = a; t < b; t++, row += rb, ps += Gp) {
            const __m256 cent = _mm256_loadu_ps(b0 + (size_t)*row * 8);
            for (int j = 0; j < G; j++) s[j] = _mm256_fmadd_ps(_mm256_broadcast_ss(ps + j), cent, s[j]);
        }
        for (int j = 0; j < G; j++) {
            float* o = acc + j * r + g * 8;
            _mm256_storeu_ps(o, _mm256_add_ps(_mm256_loadu_ps(o), s[j]));
        }
    }
}

// The same sums in integers (8 x 256 books with an int8 copy, G <= 8): per
// chunk of VQ_I8_CHUNK slots each head's weights w = p_j(s) scale_s are
// rounded to u8 against one step D_j = max w / 127 (the KIVI value sums' rule:
// an error of at most 1/254 of the chunk's largest weight), and per group
// four slots' int8 centroids are interleaved channel by channel (bytes t, t+1,
// t+2, t+3 of channel e in int32 lane e) so that one dpbusd (or, without VNNI,
// maddubs + madd: the same integers) adds four slots' weighted centroids into
// each of the group's 8 channel lanes. 6 heads: about 21 instructions for four
// slots of a group against the float path's 52 (bench/RESULTS.md "integer
// value sums for vector codes"). acc_j += D_j scale_g sum.
constexpr int VQ_I8_CHUNK = 32;

inline __m256i vq_dot4_add(__m256i acc, __m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    // in asm: GCC 12 emits the intrinsic in its VEX form, which reaches only
    // ymm0-15, and copied accumulators kept in ymm16-31 down and back for it
    asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u), "v"(s));
    return acc;
#elif defined(__AVXVNNI__)
    return _mm256_dpbusd_avx_epi32(acc, u, s);
#else
    // u8 x s8 pairs stay within int16 (2 x 127 x 127 < 32767)
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
#endif
}

// Four slots' int8 centroids of one group interleaved channel by channel
// (codes c0..c3 into the group's book bk): int32 lane e holds channel e of
// slots t, t + 1, t + 2, t + 3, as one dpbusd against four weights needs them.
inline __m256i vq_i8_cent4(const int8_t* bk, unsigned c0, unsigned c1, unsigned c2, unsigned c3) {
    const __m128i x0 = _mm_loadl_epi64((const __m128i*)(bk + c0 * 8));
    const __m128i x1 = _mm_loadl_epi64((const __m128i*)(bk + c1 * 8));
    const __m128i x2 = _mm_loadl_epi64((const __m128i*)(bk + c2 * 8));
    const __m128i x3 = _mm_loadl_epi64((const __m128i*)(bk + c3 * 8));
    const __m128i p01 = _mm_unpacklo_epi8(x0, x1), p23 = _mm_unpacklo_epi8(x2, x3);
    return _mm256_set_m128i(_mm_unpackhi_epi16(p01, p23), _mm_unpacklo_epi16(p01, p23));
}

// acc_j[g 8 .. g 8 + 8) += D_j scale_g s_j for the G heads' int32 sums of group g.
template <int G>
inline void vq_i8_store(const __m256i (&s)[G], int g, const float* dj, const float* bscale, int r, float* acc) {
    for (int j = 0; j < G; j++) {
        float* o = acc + j * r + g * 8;
        const __m256 f = _mm256_set1_ps(dj[j] * bscale[g]);
        _mm256_storeu_ps(o, _mm256_fmadd_ps(f, _mm256_cvtepi32_ps(s[j]), _mm256_loadu_ps(o)));
    }
}

#if defined(ZK_KIVI_WIDE_VALUES) && defined(__AVX512DQ__) && defined(__AVX512VL__)
#define ZK_VQ_WIDE 1
// Four groups of a chunk in two 512-bit vectors a head (lanes 0-7 group g's
// channels, 8-15 group g + 1's; the same for g + 2, g + 3): per quad of slots
// the 16 centroids (8 bytes each) are gathered by qword loads into two 256-bit
// halves and one vpermt2b interleaves them as vq_i8_cent4 does, four slots'
// bytes of a channel in its dword lane; each head's weights are broadcast once
// for all four groups. The int32 sums are the narrow loops' (the same products,
// added in another order), so the floats are too. Against two groups in 256-bit
// vectors: 14 shuffles instead of 20 and 12 dpbusd instead of 24 for the same
// four groups and slots, and a third fewer loads (on a Zen 4 EPYC 4-bit keys
// with these codes everywhere 8% faster at 8K; bench/RESULTS.md 2026-12-06,
// eighth session).
inline __m256i vq_i8_qwords4(const int8_t* bk, unsigned c0, unsigned c1, unsigned c2, unsigned c3) {
    const __m128i a = _mm_castpd_si128(_mm_loadh_pd(_mm_castsi128_pd(_mm_loadl_epi64((const __m128i*)(bk + c0 * 8))),
                                                    (const double*)(bk + c1 * 8)));
    const __m128i b = _mm_castpd_si128(_mm_loadh_pd(_mm_castsi128_pd(_mm_loadl_epi64((const __m128i*)(bk + c2 * 8))),
                                                    (const double*)(bk + c3 * 8)));
    return _mm256_inserti128_si256(_mm256_castsi128_si256(a), b, 1);
}

template <int G>
__attribute__((always_inline)) inline void values_c8k256_i8_quad(const int8_t* book8, const float* bscale,
                                                                 const uint8_t* const* rows, int nq,
                                                                 const uint32_t (*wq)[8], int g, const float* dj,
                                                                 int r, float* acc) {
    // byte 4e + k of the result: channel e % 8 of slot k, from the first source
    // (group g: slot k's qword at 8k) for e < 8, the second (group g + 1) past
    alignas(64) static constexpr uint8_t k_idx[64] = {
        0,  8,  16, 24, 1,  9,  17, 25, 2,  10, 18, 26, 3,  11, 19, 27, 4,  12, 20, 28, 5,  13,
        21, 29, 6,  14, 22, 30, 7,  15, 23, 31, 64, 72, 80, 88, 65, 73, 81, 89, 66, 74, 82, 90,
        67, 75, 83, 91, 68, 76, 84, 92, 69, 77, 85, 93, 70, 78, 86, 94, 71, 79, 87, 95};
    const __m512i idx = _mm512_load_si512(k_idx);
    const int8_t* b0 = book8 + (size_t)g * 256 * 8;
    const int8_t *b1 = b0 + 256 * 8, *b2 = b1 + 256 * 8, *b3 = b2 + 256 * 8;
    __m512i s01[G], s23[G];
#pragma GCC unroll 8
    for (int j = 0; j < G; j++) s01[j] = s23[j] = _mm512_setzero_si512();
    for (int q = 0; q < nq; q++) {
        const uint8_t* const* rq = rows + 4 * q;
        uint32_t c[4];
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) std::memcpy(&c[i], rq[i] + g, 4);
        auto code = [&](int i, int k) { return (c[i] >> (8 * k)) & 255; };
        const __m512i e01 = _mm512_permutex2var_epi8(
            _mm512_castsi256_si512(vq_i8_qwords4(b0, code(0, 0), code(1, 0), code(2, 0), code(3, 0))), idx,
            _mm512_castsi256_si512(vq_i8_qwords4(b1, code(0, 1), code(1, 1), code(2, 1), code(3, 1))));
        const __m512i e23 = _mm512_permutex2var_epi8(
            _mm512_castsi256_si512(vq_i8_qwords4(b2, code(0, 2), code(1, 2), code(2, 2), code(3, 2))), idx,
            _mm512_castsi256_si512(vq_i8_qwords4(b3, code(0, 3), code(1, 3), code(2, 3), code(3, 3))));
#pragma GCC unroll 8
        for (int j = 0; j < G; j++) {
            const __m512i w = _mm512_set1_epi32((int)wq[q][j]);
            // by value: asm on the array elements themselves kept every
            // accumulator in memory (a load and a store around each product)
            s01[j] = kivi_dpbusd512(s01[j], w, e01);
            s23[j] = kivi_dpbusd512(s23[j], w, e23);
        }
    }
    const __m512 f01 = _mm512_insertf32x8(_mm512_set1_ps(bscale[g]), _mm256_set1_ps(bscale[g + 1]), 1);
    const __m512 f23 = _mm512_insertf32x8(_mm512_set1_ps(bscale[g + 2]), _mm256_set1_ps(bscale[g + 3]), 1);
#pragma GCC unroll 8
    for (int j = 0; j < G; j++) {
        float* o = acc + j * r + g * 8;
        const __m512 d = _mm512_set1_ps(dj[j]);
        _mm512_storeu_ps(o, _mm512_fmadd_ps(_mm512_mul_ps(d, f01), _mm512_cvtepi32_ps(s01[j]), _mm512_loadu_ps(o)));
        _mm512_storeu_ps(o + 16,
                         _mm512_fmadd_ps(_mm512_mul_ps(d, f23), _mm512_cvtepi32_ps(s23[j]), _mm512_loadu_ps(o + 16)));
    }
}
#endif

template <int G>
void values_c8k256_i8(const uint8_t* codes, int rb, int64_t a, int64_t b, int ng, const int8_t* book8,
                      const float* bscale, const float* pw, int Gp, int r, float* acc) {
    ZK_ASSERT(Gp == 8);  // a slot's weights are one vector, a lane a head
    alignas(32) uint32_t wq[VQ_I8_CHUNK / 4][8];  // per quad of slots, each head's four u8 weights
    alignas(32) float dj[8];
    const __m256 zero = _mm256_setzero_ps();
    for (int64_t t0 = a; t0 < b; t0 += VQ_I8_CHUNK) {
        const int n = (int)std::min<int64_t>(VQ_I8_CHUNK, b - t0), nq = (n + 3) / 4;
        const float* pc = pw + (t0 - a) * 8;
        // (four maxima in turn: one chain of n dependent maxes cost 4 cycles a slot)
        __m256 mm[4] = {zero, zero, zero, zero};
        int i = 0;
        for (; i + 4 <= n; i += 4)
            for (int k = 0; k < 4; k++) mm[k] = _mm256_max_ps(mm[k], _mm256_loadu_ps(pc + (i + k) * 8));
        for (; i < n; i++) mm[0] = _mm256_max_ps(mm[0], _mm256_loadu_ps(pc + i * 8));
        const __m256 m = _mm256_max_ps(_mm256_max_ps(mm[0], mm[1]), _mm256_max_ps(mm[2], mm[3]));
        _mm256_store_ps(dj, _mm256_div_ps(m, _mm256_set1_ps(127.0f)));
        // 127 / m, 0 where a head's weights are all 0 (rounded as cvtps rounds: to nearest even)
        const __m256 inv = _mm256_and_ps(_mm256_cmp_ps(m, zero, _CMP_GT_OQ),
                                         _mm256_div_ps(_mm256_set1_ps(127.0f), _mm256_max_ps(m, _mm256_set1_ps(1e-30f))));
        for (int q = 0; q < nq; q++) {
            __m256i wd = _mm256_setzero_si256();
            for (int i = 0; i < 4; i++) {
                const __m256 w = 4 * q + i < n ? _mm256_loadu_ps(pc + (4 * q + i) * 8) : zero;
                wd = _mm256_or_si256(wd, _mm256_slli_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(w, inv)), 8 * i));
            }
            _mm256_store_si256((__m256i*)wq[q], wd);
        }
        // the rows of a last quad past b: the chunk's last slot again (weight 0)
        const uint8_t* rows[VQ_I8_CHUNK];
        for (int i = 0; i < 4 * nq; i++) rows[i] = codes + (t0 + std::min(i, n - 1)) * rb;
        int g = 0;
#ifdef ZK_VQ_WIDE
        for (; g + 4 <= ng; g += 4) values_c8k256_i8_quad<G>(book8, bscale, rows, nq, wq, g, dj, r, acc);
#endif
#ifdef __AVX512VL__
        // two groups at a time where 32 vector registers hold both groups'
        // accumulators: a slot's two codes in one load, and each head's weight
        // broadcast once for both: fewer loads a slot (with the asm product above,
        // 4-bit keys and 8 x 256 values everywhere: 11.7-12.5 -> 10.1-10.5 ms at 8K)
        for (; g + 2 <= ng; g += 2) {
            const int8_t* b0 = book8 + (size_t)g * 256 * 8;
            const int8_t* b1 = b0 + 256 * 8;
            __m256i s0[G], s1[G];
            for (int j = 0; j < G; j++) s0[j] = s1[j] = _mm256_setzero_si256();
            for (int q = 0; q < nq; q++) {
                const uint8_t* const* rq = rows + 4 * q;
                unsigned c[4];
                for (int i = 0; i < 4; i++) {
                    uint16_t wd;
                    std::memcpy(&wd, rq[i] + g, 2);
                    c[i] = wd;
                }
                const __m256i e0 = vq_i8_cent4(b0, c[0] & 255, c[1] & 255, c[2] & 255, c[3] & 255);
                const __m256i e1 = vq_i8_cent4(b1, c[0] >> 8, c[1] >> 8, c[2] >> 8, c[3] >> 8);
                for (int j = 0; j < G; j++) {
                    const __m256i w = _mm256_set1_epi32((int)wq[q][j]);
                    s0[j] = vq_dot4_add(s0[j], w, e0);
                    s1[j] = vq_dot4_add(s1[j], w, e1);
                }
            }
            vq_i8_store<G>(s0, g, dj, bscale, r, acc);
            vq_i8_store<G>(s1, g + 1, dj, bscale, r, acc);
        }
#endif
        for (; g < ng; g++) {
            const int8_t* bg = book8 + (size_t)g * 256 * 8;
            __m256i s[G];
            for (int j = 0; j < G; j++) s[j] = _mm256_setzero_si256();
            for (int q = 0; q < nq; q++) {
                const uint8_t* const* rq = rows + 4 * q;
                const __m256i cent = vq_i8_cent4(bg, rq[0][g], rq[1][g], rq[2][g], rq[3][g]);
                for (int j = 0; j < G; j++)
                    s[j] = vq_dot4_add(s[j], _mm256_set1_epi32((int)wq[q][j]), cent);
            }
            vq_i8_store<G>(s, g, dj, bscale, r, acc);
        }
    }
}

using values_i8_fn = void (*)(const uint8_t*, int, int64_t, int64_t, int, const int8_t*, const float*, const float*,
                              int, int, float*);
constexpr values_i8_fn k_values_c8k256_i8[9] = {nullptr,
                                                values_c8k256_i8<1>,
                                                values_c8k256_i8<2>,
                                                values_c8k256_i8<3>,
                                                values_c8k256_i8<4>,
                                                values_c8k256_i8<5>,
                                                values_c8k256_i8<6>,
                                                values_c8k256_i8<7>,
                                                values_c8k256_i8<8>};

using values_regs_fn = void (*)(const uint8_t*, int, int64_t, int64_t, int, const float*, const float*, int, int,
                                float*);
constexpr values_regs_fn k_values_c4k64[9] = {nullptr,         values_c4k64<1>, values_c4k64<2>,
                                              values_c4k64<3>, values_c4k64<4>, values_c4k64<5>,
                                              values_c4k64<6>, values_c4k64<7>, values_c4k64<8>};
constexpr values_regs_fn k_values_c8k256[9] = {nullptr,          values_c8k256<1>, values_c8k256<2>,
                                               values_c8k256<3>, values_c8k256<4>, values_c8k256<5>,
                                               values_c8k256<6>, values_c8k256<7>, values_c8k256<8>};
#endif

}  // namespace

void vq_values(const attn_kv_view& kv, int64_t a, int64_t b, int64_t s0, int64_t n, int G, float* acc,
               range_scratch& w, bool ref) {
    const attn_side_view& v = kv.v;
    const int r = kv.r_v, c = v.vq.c, K = v.vq.K, bits = v.vq.bits, ng = r / c;
    const int rb = kv_vq_row_bytes(ng, bits);
    const uint8_t* codes = (const uint8_t*)v.codes;
    const float* book = v.vq.book;  // [ng x K x c]
    bool regs = false;              // a register path (4 x 64 or 8 x 256 books)
#ifdef ZK_SIMD_AVX2
    const bool c4 = c == 4 && K == 64 && bits == 6, c8 = c == 8 && K == 256 && bits == 8;
    regs = (c4 || c8) && G <= 8;
#endif
    if (ref || (!regs && b - a < K)) {
        for (int64_t s = a; s < b; s++) {
            const uint8_t* row = codes + s * rb;
            const float sc = h2f(v.scale[s]);
            for (int g = 0; g < ng; g++) {
                const float* d = book + ((size_t)g * K + kv_vq_code(row, g, bits)) * c;
                for (int i = 0; i < c; i++) w.vrow[g * c + i] = sc * d[i];
            }
            for (int j = 0; j < G; j++) simd::axpy_f32(w.sc[j * n + s - s0], w.vrow, acc + j * r, r);
        }
        return;
    }
    // The weights of every slot of the range, [slots x Gp]: p_j(s) scale_s for
    // the G heads side by side (zeros past G).
    const int Gp = vq_hist_heads(G);
    float* pw = w.vw;
    int64_t s = a;
#ifdef ZK_SIMD_AVX2
    if (Gp == 8) {
        // 8 slots at a time: the heads' rows times the slots' scales, then one
        // transpose into the slots' vectors (the same products; a scalar loop
        // a slot here was 6-13% of a plan's attention, bench/RESULTS.md)
        for (; s + 8 <= b; s += 8) {
            const __m256 sc = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(v.scale + s)));
            __m256 x[8];
            for (int j = 0; j < 8; j++)
                x[j] = j < G ? _mm256_mul_ps(_mm256_loadu_ps(w.sc + j * n + s - s0), sc) : _mm256_setzero_ps();
            simd::transpose8_f32(x);
            for (int i = 0; i < 8; i++) _mm256_storeu_ps(pw + (s - a + i) * 8, x[i]);
        }
    }
#endif
    for (; s < b; s++) {
        float* ps = pw + (s - a) * Gp;
        const float sc = h2f(v.scale[s]);
        for (int j = 0; j < G; j++) ps[j] = w.sc[j * n + s - s0] * sc;
        for (int j = G; j < Gp; j++) ps[j] = 0.0f;
    }
#ifdef ZK_SIMD_AVX2
    if (regs) {
        if (c8 && v.vq.book8)
            k_values_c8k256_i8[G](codes, rb, a, b, ng, v.vq.book8, v.vq.book8_scale, pw, Gp, r, acc);
        else
            (c4 ? k_values_c4k64 : k_values_c8k256)[G](codes, rb, a, b, ng, book, pw, Gp, r, acc);
        return;
    }
#endif
    // H [cells x Gp] in blocks of groups whose cells fit in L1 (a whole head's
    // 64 KB at 32 groups x 64 codes x 8 would not): per block, every slot adds
    // its weight vector to its cell of each group of the block.
    const int bg = vq_block_groups(ng, K, Gp, bits);
    int32_t* cell = w.vcode;  // [bg] a slot's cells in the block
    for (int g0 = 0; g0 < ng; g0 += bg) {
        const int g1 = std::min(ng, g0 + bg), nb = g1 - g0;
        float* hist = w.hist;  // [nb x K x Gp], cell (g - g0) K + code
        std::memset(hist, 0, sizeof(float) * (size_t)nb * K * Gp);
        for (int64_t s = a; s < b; s++) {
            unpack_cells(codes + s * rb, g0, g1, bits, K, cell);
            const float* ps = pw + (s - a) * Gp;
#ifdef ZK_SIMD_AVX2
            if (Gp == 8) {
                const __m256 p8 = _mm256_loadu_ps(ps);
                for (int i = 0; i < nb; i++) {
                    float* h = hist + (size_t)cell[i] * 8;
                    _mm256_storeu_ps(h, _mm256_add_ps(_mm256_loadu_ps(h), p8));
                }
                continue;
            }
#endif
            for (int i = 0; i < nb; i++) {
                float* h = hist + (size_t)cell[i] * Gp;
                for (int j = 0; j < Gp; j++) h[j] += ps[j];
            }
        }
        // acc_j[g c .. g c + c) += H[g][k][j] book[g][k]
        for (int i = 0; i < nb; i++) {
            const int g = g0 + i;
            for (int k = 0; k < K; k++) {
                const float* h = hist + ((size_t)i * K + k) * Gp;
                const float* bk = book + ((size_t)g * K + k) * c;
                for (int j = 0; j < G; j++) {
                    if (h[j] == 0.0f) continue;
                    float* og = acc + j * r + g * c;
                    for (int e = 0; e < c; e++) og[e] += h[j] * bk[e];
                }
            }
        }
    }
    }

}  // namespace attn

bool kernel_attention_vq_int8_faster() {
#if defined(ZK_SIMD_AVX2) && ((defined(__AVX512VNNI__) && defined(__AVX512VL__)) || defined(__AVXVNNI__))
    return true;
#else
    return false;
#endif
}

}  // namespace zk
