// Shared parts of the 4- and 2-bit KIVI integer kernels (AVX2), instantiated by
// attention_q4.cpp and attention_q2.cpp with what differs between the widths:
// how a row of codes unpacks into bytes (and so the order the folded query must
// be laid out in), and the value kernel's pair loop.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/cpu/attention_layout.h"

namespace zk {
namespace attn {

#ifdef ZK_SIMD_AVX2
inline float hmax8(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps(m, m, 1)));
}

inline int32_t hsum_epi32(__m256i v) {
    __m128i x = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    x = _mm_add_epi32(x, _mm_unpackhi_epi64(x, x));
    return _mm_cvtsi128_si32(_mm_add_epi32(x, _mm_shuffle_epi32(x, 1)));
}

// {sum of a's int32 lanes, of b's, c's, d's}.
inline __m128i hsum4_epi32(__m256i a, __m256i b, __m256i c, __m256i d) {
    const __m256i s = _mm256_hadd_epi32(_mm256_hadd_epi32(a, b), _mm256_hadd_epi32(c, d));  // {a, b, c, d} per lane
    return _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
}

// The score loops' byte dot products, code bytes (u8) times query bytes (s8).
// With VNNI one dpbusd adds 4 products into each int32 lane; without it a
// maddubs sums pairs into int16 and an add accumulates them (the width's score
// loop bounds those sums below 32767), and kivi_score_widen turns the int16
// lanes into int32 ones. Both give the same integers.
#if defined(__AVX512VNNI__) && defined(__AVX512VL__) || defined(__AVXVNNI__)
inline __m256i kivi_score_add(__m256i acc, __m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(acc, u, s);
#else
    return _mm256_dpbusd_avx_epi32(acc, u, s);
#endif
}
inline __m256i kivi_score_widen(__m256i acc) { return acc; }
#else
inline __m256i kivi_score_add(__m256i acc, __m256i u, __m256i s) {
    return _mm256_add_epi16(acc, _mm256_maddubs_epi16(u, s));
}
inline __m256i kivi_score_widen(__m256i acc) { return _mm256_madd_epi16(acc, _mm256_set1_epi16(1)); }
#endif

// {sum of a's lanes, b's, c's, d's} of four score accumulators, as int32.
inline __m128i kivi_score_hsum4(__m256i a, __m256i b, __m256i c, __m256i d) {
    return hsum4_epi32(kivi_score_widen(a), kivi_score_widen(b), kivi_score_widen(c), kivi_score_widen(d));
}

// 32 floats of src times vid, rounded to int8, in channel order (the packs
// work per 128-bit lane; the permutation undoes that).
inline __m256i kivi_round_int8(const float* src, __m256 vid) {
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);  // undo the lane-wise packs
    const __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_load_ps(src), vid));
    const __m256i i1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_load_ps(src + 8), vid));
    const __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_load_ps(src + 16), vid));
    const __m256i i3 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_load_ps(src + 24), vid));
    return _mm256_permutevar8x32_epi32(_mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3)),
                                       order);
}

// The integer score loops ask for code rows this many slots ahead
// (simd::prefetch_l2), four rows per four slots as they go. Asking for a whole
// group's rows at once, two groups ahead, stalled on the core's fill buffers:
// perf put most of kivi_scores' own samples on that loop.
constexpr int64_t KIVI_SCORE_PREFETCH_SLOTS = 64;

// Rows [s + KIVI_SCORE_PREFETCH_SLOTS, + 4) into L2 while they lie below pf_end.
inline void kivi_prefetch_rows(const uint8_t* codes, int rb, int64_t s, int64_t pf_end) {
    const int64_t p = s + KIVI_SCORE_PREFETCH_SLOTS;
    if (p + 4 <= pf_end) simd::prefetch_l2(codes + p * rb, 4 * (size_t)rb);
}

// Heads [0, G) in passes of at most `most`, as even as can be (7 = 4 + 3,
// 6 = 3 + 3 for 4): f(j0, g) for each pass of g heads from j0. A pass reads and
// unpacks the codes once for its heads; each head's sums are its own, so the
// grouping changes no result.
template <class F>
void kivi_head_passes(int G, int most, F&& f) {
    const int passes = (G + most - 1) / most;
    for (int i = 0, j0 = 0; i < passes; i++) {
        const int g = (G - j0) / (passes - i);
        f(j0, g);
        j0 += g;
    }
}

// Query heads per pass of the score loops and the query fold: 4 slots' int32
// sums a head stay in registers with the codes. (6 heads a pass, where
// AVX-512VL gives 32 vector registers, measured no faster: GCC spilled
// accumulators and the fold's latency chains grew.)
constexpr int KIVI_SCORE_HEADS = 4;

// f(std::integral_constant<int, g>()) for 1 <= g <= N: a pass's head count as
// a template argument, so its accumulators are arrays in registers.
template <int N, class F>
void kivi_with_heads(int g, F&& f) {
    if constexpr (N > 1)
        if (g < N) return kivi_with_heads<N - 1>(g, f);
    f(std::integral_constant<int, N>());
}

// Folded queries of GB <= KIVI_FOLD_HEADS heads for one key group, as int8 in the layout the
// score loop of the width reads (pk.pack(qs, vid, nrc, r, dst): per row chunk of Pack::chunk
// channels, a pack that may carry the row's shape; qi [GB x nrc x chunk], zeros past r; nrc x chunk <= 256). qs = q_c s_c
// is rounded with one scale per head, qd = max|qs| / 127 (llama.cpp likewise
// rounds Q to 8 bits for a quantized cache); bias = sum_c q_c m_c. q [GB x nrc x
// chunk] floats, zero past r; grid: the group's r packed grid codes, step its
// f16 ds and dm (kernels/attention.h), read in place (8 at a time; a partial
// last 8 through a zero-filled copy). All heads go through one pass over the
// grid and their reductions overlap: this runs once per group of 32 slots, so
// its latency chains (max, reciprocal) are a visible part of a score.
template <int GB, class Pack>
void kivi_fold_queries(const float* q, const uint16_t* grid, const uint16_t* step, int r, int nrc, int8_t* qi,
                       float* qd, float* bias, const Pack& pk) {
    const int qstride = Pack::chunk * nrc;
    alignas(32) float qs[GB][256];  // qstride <= 256
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256 ds = _mm256_set1_ps(h2f(step[0])), dm = _mm256_set1_ps(h2f(step[1]));
    const __m128i lo8 = _mm_set1_epi16(0xff);
    __m256 mx[GB], bs[GB];
#pragma GCC unroll 4
    for (int j = 0; j < GB; j++) mx[j] = bs[j] = _mm256_setzero_ps();
    auto fold8 = [&](int c, __m128i g16) __attribute__((always_inline)) {
        // s_c = ds * (g & 0xff), m_c = dm * (int8)(g >> 8)
        const __m256 sv = _mm256_mul_ps(ds, _mm256_cvtepi32_ps(_mm256_cvtepu16_epi32(_mm_and_si128(g16, lo8))));
        const __m256 mv = _mm256_mul_ps(dm, _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm_srai_epi16(g16, 8))));
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
    for (; c + 8 <= r; c += 8) fold8(c, _mm_loadu_si128((const __m128i*)(grid + c)));
    if (c < r) {
        alignas(16) uint16_t tg[8] = {};
        std::memcpy(tg, grid + c, sizeof(uint16_t) * (r - c));
        fold8(c, _mm_load_si128((const __m128i*)tg));
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
#pragma GCC unroll 4
    for (int j = 0; j < GB; j++) pk.pack(qs[j], vid[j], nrc, r, qi + j * qstride);
}

// Heads [0, G) in passes of at most KIVI_FOLD_HEADS, as even as can be
// (kivi_head_passes): where AVX-512VL gives 32 vector registers a head's max and
// bias accumulators fit for 8 heads, so the 1.5B's 6 heads take one pass (its
// grid read and converted once, the heads' reductions overlapping) instead of two.
#ifdef __AVX512VL__
constexpr int KIVI_FOLD_HEADS = 8;
#else
constexpr int KIVI_FOLD_HEADS = KIVI_SCORE_HEADS;
#endif
template <class Pack>
void kivi_fold_queries_n(int G, const float* q, const uint16_t* grid, const uint16_t* step, int r, int nrc,
                         int8_t* qi, float* qd, float* bias, const Pack& pk = Pack()) {
    const int qstride = Pack::chunk * nrc;
    kivi_head_passes(G, KIVI_FOLD_HEADS, [&](int j0, int g) {
        kivi_with_heads<KIVI_FOLD_HEADS>(g, [&](auto gb) {
            kivi_fold_queries<decltype(gb)::value, Pack>(q + j0 * qstride, grid, step, r, nrc, qi + j0 * qstride,
                                                         qd + j0, bias + j0, pk);
        });
    });
}

// KIVI value sums of slots [a, b) for G <= 3 heads with integer dot products.
// Per row chunk (64 channels, value blocks 2k and 2k + 1) and per chunk of
// KIVI_VCHUNK slots, the weights w = p_j s_b (probability times the slot's
// block scale) are rounded to 7 bits with one scale per (head, block, chunk),
// D = max w / 127 (as the key scores round the query), and the codes are
// centred on z = Codes::center (4-bit: c - 8 in [-8, 7]; 2-bit: c - 2 in [-2, 1]):
//   sum_s w_s c_s = D sum_s u_s (c_s - z) + z sum_s w_s,
// the last term exact, added to the min terms. The rounding error of a weight
// (at most 1/254 of the chunk's largest) thus meets |c - z| <= z rather than
// c <= 2z - 1. Two slots at a time: their code bytes are interleaved (unpack)
// so one maddubs gives u_t (c_t - z) + u_t+1 (c_t+1 - z) for 16 channels; int16
// sums of 16 pairs stay within 32767 (4-bit: 32 * 8 * 127 = 32512), so a chunk
// is 32 slots, after which the sums are widened and scaled by D into float
// accumulators. (8-bit weights would halve the chunk: the widening and the
// per-chunk setup then cost more than the pair loop itself.)
// A 32-byte vector holds row chunk k, channels 64k .. 64k + 63: the low lane
// 32 of them, the high lane the next 32, each lane with the weight of its
// channels' block (blocks of 64 or more: both lanes the same block). The min
// terms sum_s p_j (m_b + z s_b) are added per block into msum [G x nb].
constexpr int KIVI_VCHUNK = 32;
// Query heads per pass of the value kernel: 4 int16 accumulators a head stay in
// registers with the pass's weight vectors and codes, 4 heads where AVX-512VL
// gives 32 vector registers, 3 where there are 16.
#ifdef __AVX512VL__
constexpr int KIVI_VALUE_HEADS = 4;
#else
constexpr int KIVI_VALUE_HEADS = 3;
#endif
constexpr float KIVI_WMAX = 127.0f;  // largest rounded weight
// Chunks of slots whose codes and scales are asked for ahead (simd::prefetch_l2).
constexpr int KIVI_PREFETCH_CHUNKS = 2;

// The pair loop of one chunk of slots, shared by the widths: np pairs of slots
// from cp (the last pair of an odd chunk repeats its slot, with weight 0; under
// HALF an iteration takes 4 slots, the pair (t, t + 1) in the low lane and
// (t + 2, t + 3) in the high one) into ac, zeroed here: per head 4 int16
// accumulators, accumulator v adding maddubs(w, c_v) for the iteration's four
// centred code vectors c_v = Codes::planes<HALF, SPLIT>(p, o1, o2, o3), the
// rows of the iteration's slots at p, p + o1, p + o2, p + o3. Out of line with
// its accumulators in locals: inlined into the chunk loop, GCC kept them on
// the stack.
// pd [G][16]: per head, the weight dwords of the chunk's pairs in order,
// {u_t(lo), u_t(hi), u_t+1(lo), u_t+1(hi)} (lo, hi: the low and the high lane's
// channels), broadcast and shuffled here so that the low lane gets the lo pair
// and the high lane the hi pair: a load and a shuffle, where a vector built in
// advance cost a load, a shuffle, a store and the loop's load.
template <class Codes, int G, bool HALF, bool SPLIT>
__attribute__((noinline)) void kivi_values_pairs(const uint8_t* cp, int rb, int64_t np, int64_t last, int64_t pf,
                                                 const uint32_t* pd, __m256i (&ac)[G][4]) {
    const __m256i wctl = _mm256_setr_epi8(0, 2, 0, 2, 0, 2, 0, 2, 0, 2, 0, 2, 0, 2, 0, 2, 1, 3, 1, 3, 1, 3, 1, 3, 1, 3,
                                          1, 3, 1, 3, 1, 3);
    __m256i a0[G], a1[G], a2[G], a3[G];
#pragma GCC unroll 4
    for (int j = 0; j < G; j++) a0[j] = a1[j] = a2[j] = a3[j] = _mm256_setzero_si256();
    const int64_t step = (HALF ? 4 : 2) * (int64_t)rb;
    const uint8_t* p = cp;
    for (int64_t i = 0; i < np; i++, p += step) {
        if (pf) simd::prefetch_l2(p + pf, (size_t)step);
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
        __m256i c[4];
        Codes::template planes<HALF, SPLIT>(p, o1, o2, o3, c);
#pragma GCC unroll 4
        for (int j = 0; j < G; j++) {
            a0[j] = _mm256_add_epi16(a0[j], _mm256_maddubs_epi16(w[j], c[0]));
            a1[j] = _mm256_add_epi16(a1[j], _mm256_maddubs_epi16(w[j], c[1]));
            a2[j] = _mm256_add_epi16(a2[j], _mm256_maddubs_epi16(w[j], c[2]));
            a3[j] = _mm256_add_epi16(a3[j], _mm256_maddubs_epi16(w[j], c[3]));
        }
    }
#pragma GCC unroll 4
    for (int j = 0; j < G; j++) ac[j][0] = a0[j], ac[j][1] = a1[j], ac[j][2] = a2[j], ac[j][3] = a3[j];
}

#if defined(__AVX512BW__) && defined(__AVX512VNNI__) && defined(__AVX512VBMI__)
#define ZK_KIVI_WIDE_VALUES 1
// Query heads per pass of the wide value loop (below): 2 int32 accumulators a
// head, 12 of the 32 zmm registers at 6 heads, so the 1.5B's 6 query heads a
// KV head share one pass.
constexpr int KIVI_WIDE_HEADS = 6;

// acc + the dword dot products of u (u8) and c (s8): vpdpbusd, in asm because
// GCC 12 copied every accumulator of the intrinsic's loop to a fresh register
// and back (24 moves a quad at 6 heads).
__attribute__((always_inline)) inline __m512i kivi_dpbusd512(__m512i acc, __m512i u, __m512i c) {
    asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u), "v"(c));
    return acc;
}

// x[i] = row i's 16 dwords -> x[c] = dword c of the 16 rows, in row order.
__attribute__((always_inline)) inline void kivi_transpose16_dwords(__m512i (&x)[16]) {
    __m512i t[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(x[2 * i], x[2 * i + 1]);  // lane: A0 B0 A1 B1
        t[2 * i + 1] = _mm512_unpackhi_epi32(x[2 * i], x[2 * i + 1]);  // A2 B2 A3 B3
    }
    for (int i = 0; i < 4; i++) {  // x[4i + m], lane l: rows 4i .. 4i + 3 of dword 4l + m
        x[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        x[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        x[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        x[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    // rows 8h .. 8h + 7: t[8h + m] lanes hold dwords m, 8 + m of rows 8h .. +3, then of 8h + 4 .. +7;
    // t[8h + 4 + m] dwords 4 + m, 12 + m
    for (int h = 0; h < 2; h++)
        for (int m = 0; m < 4; m++) {
            t[8 * h + m] = _mm512_shuffle_i32x4(x[8 * h + m], x[8 * h + 4 + m], _MM_SHUFFLE(2, 0, 2, 0));
            t[8 * h + 4 + m] = _mm512_shuffle_i32x4(x[8 * h + m], x[8 * h + 4 + m], _MM_SHUFFLE(3, 1, 3, 1));
        }
    for (int m = 0; m < 8; m++) {  // t[m]: dwords c = m % 4 + 4 (m / 4) and c + 8 of rows 0..7; t[8 + m] of rows 8..15
        const int c = (m & 3) + 4 * (m >> 2);
        x[c] = _mm512_shuffle_i32x4(t[m], t[8 + m], _MM_SHUFFLE(2, 0, 2, 0));
        x[c + 8] = _mm512_shuffle_i32x4(t[m], t[8 + m], _MM_SHUFFLE(3, 1, 3, 1));
    }
}

// acc + u (u8) . the dword at q + OFF (s8) broadcast to every lane, in asm: the
// intrinsic's loops got a register copy of every accumulator (GCC 12), and a
// memory operand per (head, dword) became addresses spilled to the stack; here
// one base register and a constant offset a head. mem: the bytes q points into,
// an input so that the stores that wrote them stay before.
template <int OFF, class Mem>
__attribute__((always_inline)) inline __m512i kivi_dpbusd512_bcast(__m512i acc, __m512i u, const int8_t* q,
                                                                   const Mem& mem) {
    asm("vpdpbusd %c3(%2)%{1to16%}, %1, %0" : "+v"(acc) : "v"(u), "r"(q), "i"(OFF), "m"(mem));
    return acc;
}

// One vector v of the interleaved bytes (kivi_values_quads) over nq quads of
// slots: 2 G int32 accumulators (a plane each) stay in registers with the
// codes, where all four vectors at once (8 G) spilled.
template <int G, int V>
__attribute__((always_inline)) inline void kivi_values_quads_v(const uint8_t* cp, int rb, int64_t nq, int64_t last,
                                                               int64_t pf, const __m512i (&wq)[G][8],
                                                               const __m512 (&dv)[G], float (&fw)[G][4][2][16]) {
    const __m512i top = _mm512_set1_epi8((char)0xF0), flip = _mm512_set1_epi8((char)0x88);
    const int64_t step = 4 * (int64_t)rb;
    __m512i a0[G], a1[G];  // planes: low nibbles, high ones
#pragma GCC unroll 8
    for (int j = 0; j < G; j++) a0[j] = a1[j] = _mm512_setzero_si512();
    const uint8_t* p = cp;
    for (int64_t i = 0; i < nq; i++, p += step) {
        if (V == 0 && pf) simd::prefetch_l2(p + pf, (size_t)step);
        int64_t o1 = rb, o2 = 2 * (int64_t)rb, o3 = 3 * (int64_t)rb;
        if (i + 1 == nq) {
            const int64_t t = 4 * i;
            o1 = (std::min(t + 1, last) - t) * rb, o2 = (std::min(t + 2, last) - t) * rb;
            o3 = (std::min(t + 3, last) - t) * rb;
        }
        const __m512i x0 = _mm512_loadu_si512(p), x1 = _mm512_loadu_si512(p + o1);
        const __m512i x2 = _mm512_loadu_si512(p + o2), x3 = _mm512_loadu_si512(p + o3);
        const __m512i u01 = V >= 2 ? _mm512_unpackhi_epi8(x0, x1) : _mm512_unpacklo_epi8(x0, x1);
        const __m512i u23 = V >= 2 ? _mm512_unpackhi_epi8(x2, x3) : _mm512_unpacklo_epi8(x2, x3);
        const __m512i q = V & 1 ? _mm512_unpackhi_epi16(u01, u23) : _mm512_unpacklo_epi16(u01, u23);
        // each nibble c as the signed byte 16 (c - 8): ((c ^ 8) << 4), one ternary
        // op a plane ((x ^ flip) & top: imm 0x28) where masking, shifting and
        // centring took five; the sums come out 16 times the centred ones (a chunk's
        // under 2^20: 8 quads of 4 products |16 (c - 8)| u <= 128 x 127)
        const __m512i lo = _mm512_ternarylogic_epi32(_mm512_slli_epi16(q, 4), flip, top, 0x28);
        const __m512i hi = _mm512_ternarylogic_epi32(q, flip, top, 0x28);
#pragma GCC unroll 8
        for (int j = 0; j < G; j++) {
            a0[j] = kivi_dpbusd512(a0[j], wq[j][i], lo);
            a1[j] = kivi_dpbusd512(a1[j], wq[j][i], hi);
        }
    }
#pragma GCC unroll 8
    for (int j = 0; j < G; j++) {
        // (maskz: the plain form's undefined source operand trips GCC 12's
        // -Wuninitialized, PR 105593, which a pragma cannot reach in a unity batch)
        float* f0 = fw[j][V][0];
        float* f1 = fw[j][V][1];
        // (the shift is exact: the sums are multiples of 16)
        const __m512 x0 = _mm512_maskz_cvtepi32_ps(simd::all16, _mm512_maskz_srai_epi32(simd::all16, a0[j], 4));
        const __m512 x1 = _mm512_maskz_cvtepi32_ps(simd::all16, _mm512_maskz_srai_epi32(simd::all16, a1[j], 4));
        _mm512_store_ps(f0, _mm512_fmadd_ps(x0, dv[j], _mm512_load_ps(f0)));
        _mm512_store_ps(f1, _mm512_fmadd_ps(x1, dv[j], _mm512_load_ps(f1)));
    }
}

// The wide loop's weights for one chunk of 32 slots, in 512-bit vectors (the
// 256-bit set-up below made them 8 entries a vector and then moved every
// head's bytes into this layout with a load, a widening and a byte permute a
// quad): vc [32 x 2] the slots' grid codes {g_0, g_1} as stored (read up to m); the
// slot's steps from its group (g: slot s's, gs: the groups' first slots, vm
// their steps); pj[j] the head's 32 probabilities, zeros past m. Per block b
// the weights are w = p s_b over 16 slots a vector, their maximum x_b, the
// 7-bit roundings u = round(w 127 / x_b) packed to bytes and spread into wq
// (kivi_values_quads) by one dword permute a quad; dv = {x_0 / 127 x 8,
// x_1 / 127 x 8}. Every float is computed by the 256-bit set-up's operations
// and the integers are its integers, so the value sums are bit-identical; the
// min terms p (m_b + 8 s_b) go into msv [G] (lanes: block 0's slots t = 0..3
// mod 4, then block 1's) quad by quad in slot order, as the 256-bit set-up
// sums them (there lanes alternate the blocks), so their sums are too.
template <int G>
__attribute__((always_inline)) inline void kivi_values_wide_weights(const uint16_t* vc, const uint16_t* vm,
                                                                    const int32_t* gs, int64_t g, int64_t s, int m,
                                                                    const float* const (&pj)[G], __m512i (&wq)[G][8],
                                                                    __m512 (&dv)[G], __m256 (&msv)[G]) {
    using simd::all16;
    // the steps of slots 0..15 and 16..31: the chunk's first group's, later
    // groups' from their first slot on
    __m512 dl[2], ml[2];
    dl[0] = dl[1] = _mm512_set1_ps(h2f(vm[g * KV_GRID_STEPS]));
    ml[0] = ml[1] = _mm512_set1_ps(h2f(vm[g * KV_GRID_STEPS + 1]));
    for (int64_t g2 = g + 1; gs[g2] < s + m; g2++) {
        const int f = (int)(gs[g2] - s);  // 1 .. m - 1
        const __m512 d2 = _mm512_set1_ps(h2f(vm[g2 * KV_GRID_STEPS])), m2 = _mm512_set1_ps(h2f(vm[g2 * KV_GRID_STEPS + 1]));
        const __mmask16 k0 = f >= 16 ? (__mmask16)0 : (__mmask16)(0xFFFFu << f);
        const __mmask16 k1 = (__mmask16)(0xFFFFu << std::max(f - 16, 0));
        dl[0] = _mm512_mask_mov_ps(dl[0], k0, d2), ml[0] = _mm512_mask_mov_ps(ml[0], k0, m2);
        dl[1] = _mm512_mask_mov_ps(dl[1], k1, d2), ml[1] = _mm512_mask_mov_ps(ml[1], k1, m2);
    }
    // S[h][b], M[h][b]: slots 16 h .. 16 h + 15 of block b; s_b = ds code_s, m_b = dm code_m
    __m512 S[2][2], M[2][2];
    const __m512i lo8 = _mm512_set1_epi32(0xff);
    const __m512 center = _mm512_set1_ps(8.0f);
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        // (read in place, masked past m: a copy's narrower stores stalled these loads)
        const int left = std::min(std::max(m - 16 * h, 0), 16);
        const __m512i v = _mm512_maskz_loadu_epi32((__mmask16)((1u << left) - 1), vc + 32 * h);
        const __m512i c0 = _mm512_and_si512(v, lo8);
        const __m512i c1 = _mm512_and_si512(_mm512_maskz_srli_epi32(all16, v, 16), lo8);
        const __m512i n0 = _mm512_maskz_srai_epi32(all16, _mm512_maskz_slli_epi32(all16, v, 16), 24);
        const __m512i n1 = _mm512_maskz_srai_epi32(all16, v, 24);
        S[h][0] = _mm512_mul_ps(dl[h], _mm512_maskz_cvtepi32_ps(all16, c0));
        S[h][1] = _mm512_mul_ps(dl[h], _mm512_maskz_cvtepi32_ps(all16, c1));
        M[h][0] = _mm512_fmadd_ps(center, S[h][0], _mm512_mul_ps(ml[h], _mm512_maskz_cvtepi32_ps(all16, n0)));
        M[h][1] = _mm512_fmadd_ps(center, S[h][1], _mm512_mul_ps(ml[h], _mm512_maskz_cvtepi32_ps(all16, n1)));
    }
    // the min terms' vectors quad by quad: mq[q] = {block 0's m of slots 4q .. 4q + 3, block 1's}
    alignas(64) float mq[8][8];
    {
        const __m512i even = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
        const __m512i odd = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            _mm512_store_ps(mq[4 * h], _mm512_permutex2var_ps(M[h][0], even, M[h][1]));
            _mm512_store_ps(mq[4 * h + 2], _mm512_permutex2var_ps(M[h][0], odd, M[h][1]));
        }
    }
    // every head's two maxima first, into lanes 2 j and 2 j + 1 of one vector,
    // so that one division serves all heads (a division a head waited on its
    // own reduction: perf put an eighth of this function's samples on its result)
    static_assert(2 * G <= 16, "two maxima a head in one vector");
    __m512 X = _mm512_setzero_ps();
    const __m512i pick_max = _mm512_setr_epi32(0, 8, 0, 8, 0, 8, 0, 8, 0, 8, 0, 8, 0, 8, 0, 8);
#pragma GCC unroll 8
    for (int j = 0; j < G; j++) {
        const __m512 p0 = _mm512_loadu_ps(pj[j]), p1 = _mm512_loadu_ps(pj[j] + 16);
        // weights are >= 0, so their maxima need no zero to start from
        const __m512 x0 = _mm512_maskz_max_ps(all16, _mm512_mul_ps(p0, S[0][0]), _mm512_mul_ps(p1, S[1][0]));
        const __m512 x1 = _mm512_maskz_max_ps(all16, _mm512_mul_ps(p0, S[0][1]), _mm512_mul_ps(p1, S[1][1]));
        // {max of block 0 x 8, max of block 1 x 8}
        __m512 x = _mm512_maskz_max_ps(all16, _mm512_shuffle_f32x4(x0, x1, _MM_SHUFFLE(1, 0, 1, 0)),
                                       _mm512_shuffle_f32x4(x0, x1, _MM_SHUFFLE(3, 2, 3, 2)));
        x = _mm512_maskz_max_ps(all16, x, _mm512_shuffle_f32x4(x, x, _MM_SHUFFLE(2, 3, 0, 1)));
        x = _mm512_maskz_max_ps(all16, x, _mm512_permute_ps(x, 0x4E));
        x = _mm512_maskz_max_ps(all16, x, _mm512_permute_ps(x, 0xB1));
        X = _mm512_mask_permutexvar_ps(X, (__mmask16)(3u << (2 * j)), pick_max, x);
    }
    const __m512 ID = _mm512_maskz_div_ps(_mm512_cmp_ps_mask(X, _mm512_setzero_ps(), _CMP_GT_OQ),
                                          _mm512_set1_ps(KIVI_WMAX), X);
    const __m512 DV = _mm512_mul_ps(X, _mm512_set1_ps(1.0f / KIVI_WMAX));
    // (the min terms while the division runs)
#pragma GCC unroll 8
    for (int j = 0; j < G; j++)
#pragma GCC unroll 8
        for (int q = 0; q < 8; q++)
            msv[j] = _mm256_fmadd_ps(_mm256_broadcast_ps((const __m128*)(pj[j] + 4 * q)), _mm256_load_ps(mq[q]),
                                     msv[j]);
#pragma GCC unroll 8
    for (int j = 0; j < G; j++) {
        const __m512i b0 = _mm512_set1_epi32(2 * j), b1 = _mm512_set1_epi32(2 * j + 1);
        const __m512 id0 = _mm512_permutexvar_ps(b0, ID), id1 = _mm512_permutexvar_ps(b1, ID);
        dv[j] = _mm512_permutexvar_ps(_mm512_inserti64x4(b0, _mm512_castsi512_si256(b1), 1), DV);
        // the weights again (the same products), rounded to 7 bits
        const __m512 p0 = _mm512_loadu_ps(pj[j]), p1 = _mm512_loadu_ps(pj[j] + 16);
        const __m512i u00 = _mm512_maskz_cvtps_epi32(all16, _mm512_mul_ps(_mm512_mul_ps(p0, S[0][0]), id0));
        const __m512i u01 = _mm512_maskz_cvtps_epi32(all16, _mm512_mul_ps(_mm512_mul_ps(p1, S[1][0]), id0));
        const __m512i u10 = _mm512_maskz_cvtps_epi32(all16, _mm512_mul_ps(_mm512_mul_ps(p0, S[0][1]), id1));
        const __m512i u11 = _mm512_maskz_cvtps_epi32(all16, _mm512_mul_ps(_mm512_mul_ps(p1, S[1][1]), id1));
        // dwords of lane l: block 0's quads l and 4 + l, then block 1's
        const __m512i B = _mm512_packus_epi16(_mm512_packs_epi32(u00, u01), _mm512_packs_epi32(u10, u11));
#pragma GCC unroll 8
        for (int q = 0; q < 8; q++) {
            const int d0 = 4 * (q & 3) + (q >> 2);
            wq[j][q] = _mm512_permutexvar_epi32(
                _mm512_inserti64x4(_mm512_set1_epi32(d0), _mm256_set1_epi32(d0 + 2), 1), B);
        }
    }
}

// The wide form of the pair loop, for 4-bit rows of 65..128 channels (two row
// chunks, blocks 0 and 1; rows padded to 64 bytes by KV_Q4_PAD): four slots at
// a time, a whole row a zmm load. The four rows' bytes are interleaved (two
// unpacks of bytes, two of words) so that dword e of lane l of vector v holds
// row byte 16 l + 4 v + e of the four slots in order; its low nibbles centred
// (c - 8) are channel 32 l + 8 v + 2 e, the high ones channel + 1. One dpbusd
// then adds u_t (c_t - 8) + .. + u_t+3 (c_t+3 - 8) into the int32 lanes, where
// the pair loop's maddubs added two slots into int16 ones: half the multiply
// instructions, at twice their width. (The codes enter as 16 (c - 8), so the
// sums are 16 times these, shifted back exactly before they turn to floats.)
// The integers are the pair loop's, so the results are too (the float steps are
// the same, channel by channel).
//
// nq quads of slots from cp (slots past `last` repeat it: their weight is 0);
// wq [G][8]: per head and quad the weight vector, dwords 0..7 {u_t .. u_t+3}
// of block 0, 8..15 of block 1 (lanes 0-1 are channels 0..63). Vector by
// vector (the rows stay in L1 for the next), the int32 sums are scaled by
// dv[j] ({D_0 x 8, D_1 x 8}) into fw[j][v][plane] (16 floats).
template <int G>
__attribute__((noinline)) void kivi_values_quads(const uint8_t* cp, int rb, int64_t nq, int64_t last, int64_t pf,
                                                 const __m512i (&wq)[G][8], const __m512 (&dv)[G],
                                                 float (&fw)[G][4][2][16]) {
    kivi_values_quads_v<G, 0>(cp, rb, nq, last, pf, wq, dv, fw);
    kivi_values_quads_v<G, 1>(cp, rb, nq, last, pf, wq, dv, fw);
    kivi_values_quads_v<G, 2>(cp, rb, nq, last, pf, wq, dv, fw);
    kivi_values_quads_v<G, 3>(cp, rb, nq, last, pf, wq, dv, fw);
}
#endif

// The chunk loop of the value sums for row chunk k (SPLIT: chunks k and k + 1)
// over the slots of spans sp[3 i] .. sp[3 i + 1] (weights at sc[j n + s - sp[3 i + 2]]),
// over Codes (the width):
//   Codes::center        the centring (8 for 4-bit codes 0..15, 2 for 2-bit 0..3)
//   Codes::chunk_bytes   bytes of a row chunk of 64 channels (32 a lane)
//   Codes::planes<HALF, SPLIT>(p, o1, o2, o3, c)   always inline: the 4 centred
//                        code vectors of a pair loop iteration (kivi_values_pairs,
//                        which asks for each iteration's rows pf bytes ahead into
//                        L2, pf = 0: none), 8 channels per lane each
//   Codes::channel(half, k, h, v, e)   the channel of element e of lane h of vector v
// HALF (r <= 32): the two lanes carry different slots instead of the two
// halves of a row chunk. Slot entries of the weight dwords are then (t, t + 2)
// in place of (low lane, high lane), a chunk is 64 slots (16 pairs per lane), and
// both lanes add to the same channels.
// SPLIT: the low lane holds half i of row chunk k (block k), the high lane
// half i of chunk k + 1 (block k + 1), in two pair loops (i = 0, 1) that share
// the weights: a weight dword's two lanes are then two blocks' weights of a
// slot, where one chunk's lanes held one block's weight twice. Every integer
// sum and every float operation on a channel is the one of two separate
// chunks, so the results are bit-identical.
// WIDE (4-bit codes, rows of two row chunks, k = 0; SPLIT): both halves in one
// wide quad loop (kivi_values_quads) in place of the two pair loops, its
// weights made 16 slots a vector (kivi_values_wide_weights).
template <int G, bool HALF, bool SPLIT, class Codes, bool WIDE = false>
void kivi_values_unit(const uint8_t* codes, int rb, const uint16_t* vs, const uint16_t* vm, const int32_t* gs,
                      int64_t g0, int nb, const int64_t* sp, int n_sp, int64_t n, int r, const float* sc,
                      float* acc, float* msum, int k) {
#ifdef ZK_KIVI_WIDE_VALUES
    static_assert(G >= 1 && G <= (WIDE ? KIVI_WIDE_HEADS : KIVI_VALUE_HEADS), "accumulators all in registers");
    static_assert(!WIDE || SPLIT, "the wide loop covers the two row chunks of a split unit");
#else
    static_assert(!WIDE, "the wide loop needs AVX-512 BW, VNNI and VBMI");
    static_assert(G >= 1 && G <= KIVI_VALUE_HEADS, "4 int16 accumulators a head, all in registers");
#endif
    static_assert(!SPLIT || (!HALF && KV_Q4_VBLOCK == 64), "split lanes: row chunks k and k + 1 are blocks k and k + 1");
    constexpr int NH = SPLIT ? 2 : 1;  // halves of the row chunks, a pair loop each
    constexpr int C = HALF ? 2 * KIVI_VCHUNK : KIVI_VCHUNK;
    // a value block spans whole row chunks: both lanes of chunk k take its grid
    static_assert(KV_Q4_VBLOCK % 64 == 0, "a value block is one or more row chunks of 64 channels");
    const __m256i dup_lo = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3), dup_hi = _mm256_setr_epi32(4, 4, 5, 5, 6, 6, 7, 7);
    const __m256i quad = _mm256_setr_epi32(0, 2, 1, 3, 4, 6, 5, 7);  // HALF: slots (t, t + 2), (t + 1, t + 3)
    const __m256i pair_order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    const __m256i quad16 = _mm256_setr_epi8(0, 1, 4, 5, 2, 3, 6, 7, 8, 9, 12, 13, 10, 11, 14, 15, 0, 1, 4, 5, 2, 3, 6,
                                            7, 8, 9, 12, 13, 10, 11, 14, 15);
    // the chunk slot of each of 8 consecutive 16-bit entries of st (below), from the first
    const __m256i entry_slot =
        HALF ? _mm256_setr_epi32(0, 2, 1, 3, 4, 6, 5, 7) : _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3);
    int64_t g = g0;  // the group of slot s
    alignas(32) float fa[WIDE ? 1 : G][NH][4][2][8];  // [head][half][code vector][lane][8]: channel order restored at the end
#ifdef ZK_KIVI_WIDE_VALUES
    alignas(64) float fw[WIDE ? G : 1][4][2][16];  // WIDE: [head][code vector][plane][16] (kivi_values_quads)
    if (WIDE) std::memset(fw, 0, sizeof(fw));
#endif
    std::memset(fa, 0, sizeof(fa));
    __m256 msv[G];  // min terms, lanes alternate the low and high lane's (the same block but for HALF)
    for (int j = 0; j < G; j++) msv[j] = _mm256_setzero_ps();
    for (int isp = 0; isp < n_sp; isp++) {  // the spans: slots [a, b), slot s's weight at sc[j n + s - s0]
        const int64_t a = sp[3 * isp], b = sp[3 * isp + 1], s0 = sp[3 * isp + 2];
        for (int64_t s = a; s < b; s += C) {
            const int m = (int)std::min<int64_t>(C, b - s);
            // KIVI_PREFETCH_CHUNKS chunks ahead, on the first row chunk (later ones
            // find the rows in L2): the scales here, the code rows a pair at a
            // time in the pair loop (ahead: their distance in bytes, 0 = none)
            int64_t ahead = 0;
            if (k == 0 && s + KIVI_PREFETCH_CHUNKS * C < b) {
                const int64_t p = s + KIVI_PREFETCH_CHUNKS * C, np = std::min<int64_t>(C, b - p);
                simd::prefetch_l2(vs + p * nb, sizeof(uint16_t) * (size_t)(np * nb));
                if (np == C) ahead = KIVI_PREFETCH_CHUNKS * C * (int64_t)rb;
            }
            // the probabilities, zero past a short chunk's end (both set-ups)
            const float* pj[G];
            alignas(64) float pf[G][C];
            for (int j = 0; j < G; j++) {
                pj[j] = sc + j * n + s - s0;
                if (m < C) {
                    for (int t = 0; t < C; t++) pf[j][t] = t < m ? pj[j][t] : 0.0f;
                    pj[j] = pf[j];
                }
            }
#ifdef ZK_KIVI_WIDE_VALUES
            if constexpr (WIDE) {
                static_assert(Codes::center == 8.0f, "the wide weights centre 4-bit codes");
                while (gs[g + 1] <= s) g++;
                __m512i wq[G][8];
                __m512 dv[G];
                kivi_values_wide_weights<G>(vs + s * 2, vm, gs, g, s, m, pj, wq, dv, msv);
                kivi_values_quads<G>(codes + s * rb, rb, (m + 3) / 4, m - 1, ahead, wq, dv, fw);
                continue;
            }
#endif
            // per slot, the grid code pair of the two lanes: {g_b, g_b} for the
            // block b of row chunk k (HALF: {g_t, g_t+2} of two slots' block 0);
            // zeros past the chunk's end
            alignas(32) uint32_t st[KIVI_VCHUNK];
            if (SPLIT && nb == 2 && m == C) {  // k = 0: {g_0, g_1}, a slot's grids as stored
                std::memcpy(st, vs + s * 2, sizeof(st));
            } else if (SPLIT) {  // {g_k, g_k+1}
                for (int t = 0; t < C; t++)
                    st[t] = t >= m ? 0u : vs[(s + t) * nb + k] | (uint32_t)vs[(s + t) * nb + k + 1] << 16;
            } else if (HALF && m == C) {  // {g_t, g_t+2}, {g_t+1, g_t+3} per 4 slots
                for (int h = 0; h < C / 16; h++)  // 16 slots (8 dwords) per vector
                    _mm256_store_si256((__m256i*)(st + 8 * h), _mm256_shuffle_epi8(_mm256_loadu_si256((const __m256i*)(vs + s + 16 * h)), quad16));
            } else if (HALF) {
                for (int e = 0; e < KIVI_VCHUNK; e++) {
                    const int t = 4 * (e >> 1) + (e & 1);
                    st[e] = (t < m ? vs[s + t] : 0u) | (t + 2 < m ? (uint32_t)vs[s + t + 2] << 16 : 0u);
                }
            } else if (nb == 1 && m == C) {  // r <= 64: a slot's one grid, twice
                for (int h = 0; h < C / 8; h++) {
                    const __m256i g = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)(vs + s + 8 * h)));
                    _mm256_store_si256((__m256i*)(st + 8 * h), _mm256_or_si256(g, _mm256_slli_epi32(g, 16)));
                }
            } else if (nb == 2 && m == C) {  // r in (64, 128]: 4 slots' two grids a lane, grid bl of each twice
                const int bl = 64 * k / KV_Q4_VBLOCK;
                const char b0 = (char)(2 * bl), b1 = (char)(2 * bl + 1);
                const __m256i pick = _mm256_setr_epi8(b0, b1, b0, b1, b0 + 4, b1 + 4, b0 + 4, b1 + 4, b0 + 8, b1 + 8,
                                                      b0 + 8, b1 + 8, b0 + 12, b1 + 12, b0 + 12, b1 + 12, b0, b1, b0,
                                                      b1, b0 + 4, b1 + 4, b0 + 4, b1 + 4, b0 + 8, b1 + 8, b0 + 8,
                                                      b1 + 8, b0 + 12, b1 + 12, b0 + 12, b1 + 12);
                for (int h = 0; h < C / 8; h++)
                    _mm256_store_si256((__m256i*)(st + 8 * h),
                                       _mm256_shuffle_epi8(_mm256_loadu_si256((const __m256i*)(vs + (s + 8 * h) * 2)), pick));
            } else {
                const int bl = 64 * k / KV_Q4_VBLOCK;
                for (int t = 0; t < C; t++) st[t] = t >= m ? 0u : 0x10001u * vs[(s + t) * nb + bl];
            }
            // the steps (ds, dm) of each 16-bit entry's slot in f32: entry i of st
            // holds slot i / 2 (HALF: slot 4 (i / 4) + (i / 2) % 2 + 2 (i % 2)), and
            // a slot takes its group's steps (a chunk may cross groups: later
            // groups' steps are blended in from their first slot on)
            alignas(32) float dl[2 * KIVI_VCHUNK], ml[2 * KIVI_VCHUNK];
            while (gs[g + 1] <= s) g++;
            {
                const __m256 d0 = _mm256_set1_ps(h2f(vm[g * KV_GRID_STEPS]));
                const __m256 m0 = _mm256_set1_ps(h2f(vm[g * KV_GRID_STEPS + 1]));
                for (int v = 0; v < 2 * KIVI_VCHUNK / 8; v++) _mm256_store_ps(dl + 8 * v, d0), _mm256_store_ps(ml + 8 * v, m0);
                for (int64_t g2 = g + 1; gs[g2] < s + m; g2++) {
                    const __m256i first = _mm256_set1_epi32((int)(gs[g2] - s) - 1);
                    const __m256 d2 = _mm256_set1_ps(h2f(vm[g2 * KV_GRID_STEPS]));
                    const __m256 m2 = _mm256_set1_ps(h2f(vm[g2 * KV_GRID_STEPS + 1]));
                    for (int v = 0; v < 2 * KIVI_VCHUNK / 8; v++) {
                        const __m256i slot = _mm256_add_epi32(entry_slot, _mm256_set1_epi32(v * (HALF ? 8 : 4)));
                        const __m256 in = _mm256_castsi256_ps(_mm256_cmpgt_epi32(slot, first));
                        _mm256_store_ps(dl + 8 * v, _mm256_blendv_ps(_mm256_load_ps(dl + 8 * v), d2, in));
                        _mm256_store_ps(ml + 8 * v, _mm256_blendv_ps(_mm256_load_ps(ml + 8 * v), m2, in));
                    }
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
                for (int q = 0; q < 4; q++) {  // entries 32 h + 8 q ..: s_b = ds code_s, m_b = dm code_m
                    const __m256i gc = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)(st + 16 * h + 4 * q)));
                    const __m256 sc = _mm256_cvtepi32_ps(_mm256_and_si256(gc, _mm256_set1_epi32(0xff)));
                    const __m256 mc = _mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_slli_epi32(gc, 16), 24));
                    S[q] = _mm256_mul_ps(_mm256_load_ps(dl + 32 * h + 8 * q), sc);
                    M[q] = _mm256_fmadd_ps(_mm256_set1_ps(Codes::center), S[q],
                                           _mm256_mul_ps(_mm256_load_ps(ml + 32 * h + 8 * q), mc));
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
                dsc[j][0] = _mm256_cvtss_f32(x) * (1.0f / KIVI_WMAX);
                dsc[j][1] = _mm_cvtss_f32(_mm_shuffle_ps(_mm256_castps256_ps128(x), _mm256_castps256_ps128(x), 1)) *
                            (1.0f / KIVI_WMAX);
                id[j] = _mm256_and_ps(_mm256_div_ps(_mm256_set1_ps(KIVI_WMAX), x),
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
            for (int i = 0; i < NH; i++) {  // SPLIT: one set of weights for both halves
                __m256i ac[G][4];
                kivi_values_pairs<Codes, G, HALF, SPLIT>(
                    codes + s * rb + Codes::chunk_bytes * k + Codes::chunk_bytes / 2 * i, rb,
                    HALF ? (m + 3) / 4 : (m + 1) / 2, m - 1, i == 0 ? ahead : 0, &pd[0][0], ac);
    #pragma GCC unroll 4
                for (int j = 0; j < G; j++) {
                    const __m256 d0 = _mm256_set1_ps(dsc[j][0]), d1 = _mm256_set1_ps(dsc[j][1]);
    #pragma GCC unroll 4
                    for (int v = 0; v < 4; v++) {
                        const __m256 lo = _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm256_castsi256_si128(ac[j][v])));
                        const __m256 hi = _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm256_extracti128_si256(ac[j][v], 1)));
                        float* f = fa[j][i][v][0];
                        _mm256_store_ps(f, _mm256_fmadd_ps(lo, d0, _mm256_load_ps(f)));
                        _mm256_store_ps(f + 8, _mm256_fmadd_ps(hi, d1, _mm256_load_ps(f + 8)));
                    }
                }
            }
        }
    }
    // back to channel order (Codes::channel), past r dropped
    // (SPLIT: lane h of half i is the lane-i part of row chunk k + h)
    for (int j = 0; j < G; j++) {
#ifdef ZK_KIVI_WIDE_VALUES
        if (WIDE) {  // element 4 l + e of vector v, plane pl: channel 32 l + 8 v + 2 e + pl
            for (int v = 0; v < 4; v++)
                for (int pl = 0; pl < 2; pl++)
                    for (int d = 0; d < 16; d++) {
                        const int c = 32 * (d >> 2) + 8 * v + 2 * (d & 3) + pl;
                        if (c < r) acc[j * r + c] += fw[j][v][pl][d];
                    }
        }
#endif
        for (int i = 0; i < NH && !WIDE; i++)
            for (int v = 0; v < 4; v++)
                for (int h = 0; h < 2; h++)
                    for (int e = 0; e < 8; e++) {
                        const int c = SPLIT ? Codes::channel(false, k + h, i, v, e) : Codes::channel(HALF, k, h, v, e);
                        if (c < r) acc[j * r + c] += fa[j][i][v][h][e];
                    }
        alignas(32) float ms[8];
        _mm256_store_ps(ms, msv[j]);
        if (HALF) {  // the two lanes: other slots of block 0
            msum[j * nb] += ms[0] + ms[2] + ms[4] + ms[6];
            msum[j * nb] += ms[1] + ms[3] + ms[5] + ms[7];
        } else if (WIDE) {  // kivi_values_wide_weights: block 0's slots mod 4, then block 1's
            msum[j * nb] += ms[0] + ms[1] + ms[2] + ms[3];
            msum[j * nb + 1] += ms[4] + ms[5] + ms[6] + ms[7];
        } else if (SPLIT) {  // the low lane's block k, the high lane's k + 1
            msum[j * nb + k] += ms[0] + ms[2] + ms[4] + ms[6];
            msum[j * nb + k + 1] += ms[1] + ms[3] + ms[5] + ms[7];
        } else if (64 * k % KV_Q4_VBLOCK == 0) {
            // both lanes carried the block's min terms: one lane's, once per block
            msum[j * nb + 64 * k / KV_Q4_VBLOCK] += ms[0] + ms[2] + ms[4] + ms[6];
        }
    }
}

// Whether the wide quad loop takes these rows: 4-bit codes of 65..128 channels.
template <class Codes>
constexpr bool kivi_values_wide(int r) {
#ifdef ZK_KIVI_WIDE_VALUES
    return Codes::wide && KV_Q4_VBLOCK == 64 && r > 64 && r <= 128;
#else
    (void)r;
    return false;
#endif
}

// Row chunks one at a time, or two at a time (SPLIT) where blocks are 64
// channels and the row has a next chunk: the weights of a chunk of slots are
// then made once for 128 channels, where one chunk's lanes shared one block and
// so each weight was made twice.
template <int G, bool HALF, class Codes>
void kivi_values_int_g(const uint8_t* codes, int rb, const uint16_t* vs, const uint16_t* vm, const int32_t* gs,
                       int64_t g0, int nb, const int64_t* sp, int n_sp, int64_t n, int r, const float* sc,
                       float* acc, float* msum) {
    constexpr bool can_split = !HALF && KV_Q4_VBLOCK == 64;
    const int nrc = HALF ? 1 : (r + 63) / 64;
    for (int k = 0; k < nrc;) {
        if (can_split && k + 1 < nrc) {
            kivi_values_unit<G, HALF, can_split, Codes>(codes, rb, vs, vm, gs, g0, nb, sp, n_sp, n, r, sc, acc, msum, k);
            k += 2;
        } else {
            kivi_values_unit<G, HALF, false, Codes>(codes, rb, vs, vm, gs, g0, nb, sp, n_sp, n, r, sc, acc, msum, k);
            k += 1;
        }
    }
}

template <int G, class Codes>
void kivi_values_int_h(const uint8_t* codes, int rb, const uint16_t* vs, const uint16_t* vm, const int32_t* gs,
                       int64_t g0, int nb, const int64_t* sp, int n_sp, int64_t n, int r, const float* sc,
                       float* acc, float* msum) {
    if (r <= 32)
        kivi_values_int_g<G, true, Codes>(codes, rb, vs, vm, gs, g0, nb, sp, n_sp, n, r, sc, acc, msum);
    else
        kivi_values_int_g<G, false, Codes>(codes, rb, vs, vm, gs, g0, nb, sp, n_sp, n, r, sc, acc, msum);
}

#ifdef ZK_KIVI_WIDE_VALUES
// ---- key rows of several parts, 16 slots a pass (attention_parts_wide.cpp) ----
// One part of a KIVI key row: codes of `bits` (4, 2 or 1) bits in row bytes
// [off, off + len); sub-vector i (a nibble, a 2-bit plane, a bit plane) of
// part byte b meets query byte q[j qs + cs (b / 32) + ps i + b % 32] of head j
// (the part's own fold, in the layout the narrow loops read), and the part's
// integer sums are scaled by its qd[j].
struct kivi_wide_part {
    int bits, off, len;
    const int8_t* q;
    int qs, cs, ps;
    const float* qd;
};
// Rows of at most this many bytes take the wide loop (16 dwords a row).
constexpr int KIVI_WIDE_PARTS_MAX_ROW = 64;
// sc[j n + s - s0] = bias_j + sum over the parts of qd_j (q_j . codes of slot s)
// for slots [a, b), 16 a pass (G <= 8 heads, rb <= KIVI_WIDE_PARTS_MAX_ROW, at
// most 3 parts, each reading at most 128 query bytes a head); returns b, or a
// (nothing done) where the rows do not fit. (The 4-bit rows' fused fold and
// these scores: kivi_wide_parts_group, attention_layout.h.)
int64_t kivi_wide_parts_scores(int G, const kivi_wide_part* parts, int np, const uint8_t* codes, int rb, int64_t a,
                               int64_t b, int64_t pf_end, int64_t s0, int64_t n, const float* bias, float* sc);
#endif

// WIDE = false: never the wide loop (the twin tests hold it to).
template <class Codes, bool WIDE = true>
void kivi_values_int(int G, const uint8_t* codes, int rb, const uint16_t* vs, const uint16_t* vm, const int32_t* gs,
                     int64_t g0, int nb, const int64_t* sp, int n_sp, int64_t n, int r, const float* sc,
                     float* acc, float* msum) {
#ifdef ZK_KIVI_WIDE_VALUES
    if (WIDE && kivi_values_wide<Codes>(r)) {
        if constexpr (Codes::wide) {
            kivi_head_passes(G, KIVI_WIDE_HEADS, [&](int j0, int g) {
                kivi_with_heads<KIVI_WIDE_HEADS>(g, [&](auto gb) {
                    kivi_values_unit<decltype(gb)::value, false, true, Codes, true>(
                        codes, rb, vs, vm, gs, g0, nb, sp, n_sp, n, r, sc + j0 * n, acc + j0 * r, msum + j0 * nb, 0);
                });
            });
        }
        return;
    }
#endif
    kivi_head_passes(G, KIVI_VALUE_HEADS, [&](int j0, int g) {
        kivi_with_heads<KIVI_VALUE_HEADS>(g, [&](auto gb) {
            kivi_values_int_h<decltype(gb)::value, Codes>(codes, rb, vs, vm, gs, g0, nb, sp, n_sp, n, r, sc + j0 * n,
                                                          acc + j0 * r, msum + j0 * nb);
        });
    });
}
#endif  // ZK_SIMD_AVX2

}  // namespace attn
}  // namespace zk
