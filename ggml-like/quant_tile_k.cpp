// SIMD kernels for the packed layouts of quant_pack.h (Q4_K, Q6_K, Q8_0, Q5_0):
// one row group (k_pack_rows rows, one int32 lane each) times up to 8 tokens,
// and the K-quants' activation quantizer. x86 AVX2 + FMA + F16C with 8-row
// groups; with AVX-512 (F, BW, VL, VNNI) 16-row groups in 512-bit vectors;
// with AVX512-VNNI or AVX-VNNI the 4-byte dot products are one dpbusd each.
//
// The kernels are written once over a "dot policy" that says how 4-byte
// products are summed within a sub-block and then scaled per row:
//   dot_vnni: int32 sums (dpbusd), scaled by a vpmulld with the row scales;
//   dot_avx2: int16 sums of maddubs products (as many chunks as cannot
//             overflow), scaled and widened by one vpmaddwd with (sc, sc) pairs.
// Both give the exact integer sums of the scalar references; per token the
// arithmetic is the same whatever the tile's token count, so a token's outputs
// never depend on which tile it was in (decode vs batched decode).
// GCC 12's AVX-512 headers trip -Wmaybe-uninitialized on their own
// _mm512_undefined_* placeholders once inlined (GCC PR 105593); the pragma has
// to precede the headers, whose locations the warning points at.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include "ggml-like/quant_tile_k.h"

#include <array>
#include <cstring>
#include <type_traits>
#include <utility>

#include "ggml-like/quant_pack.h"
#include "ggml-like/quant_ref.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define ZK_TILE_K_AVX2 1
#include <immintrin.h>
#endif

namespace zk {

#if ZK_TILE_K_AVX2

namespace {

#define ZK_UNROLL _Pragma("GCC unroll 8")

inline int32_t load32(const void* p) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return v;
}

// ---------------------------------------------------------------- vectors
// One int32 lane per packed row: 256-bit vectors for 8-row groups, 512-bit for
// 16-row groups (k_pack_rows follows the build, see quant_pack.h).

struct v256 {
    using vi = __m256i;
    using vf = __m256;
    static vi load(const void* p) { return _mm256_loadu_si256((const __m256i*)p); }
    static vi bcast32(const void* p) { return _mm256_set1_epi32(load32(p)); }
    static vi set1_8(char c) { return _mm256_set1_epi8(c); }
    static vi zero() { return _mm256_setzero_si256(); }
    static vi and_(vi a, vi b) { return _mm256_and_si256(a, b); }
    static vi or_(vi a, vi b) { return _mm256_or_si256(a, b); }
    static vi andnot(vi a, vi b) { return _mm256_andnot_si256(a, b); }  // ~a & b
    template <int N> static vi srl16(vi a) { return _mm256_srli_epi16(a, N); }
    template <int N> static vi sll16(vi a) { return _mm256_slli_epi16(a, N); }
    template <int N> static vi sll32(vi a) { return _mm256_slli_epi32(a, N); }
    template <int N> static vi sra32(vi a) { return _mm256_srai_epi32(a, N); }
    static vi add32(vi a, vi b) { return _mm256_add_epi32(a, b); }
    static vi sub32(vi a, vi b) { return _mm256_sub_epi32(a, b); }
    static vi madd16(vi a, vi b) { return _mm256_madd_epi16(a, b); }
    static vi mullo32(vi a, vi b) { return _mm256_mullo_epi32(a, b); }
    // one row byte each -> int32 lanes; two row bytes each -> int16 pairs
    static vi u8_32(const uint8_t* p) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)p)); }
    static vi s8_32(const int8_t* p) { return _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)p)); }
    static vi u8_16(const uint8_t* p) { return _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i*)p)); }
    static vf f16(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p)); }
    static vf fzero() { return _mm256_setzero_ps(); }
    static vf fset1(float x) { return _mm256_set1_ps(x); }
    static vf cvt(vi a) { return _mm256_cvtepi32_ps(a); }
    static vf mul(vf a, vf b) { return _mm256_mul_ps(a, b); }
    static vf fmadd(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
    static vf fnmadd(vf a, vf b, vf c) { return _mm256_fnmadd_ps(a, b, c); }
    static void store(float* y, vf v) { _mm256_storeu_ps(y, v); }
};

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__)
#define ZK_TILE_K_512 1
struct v512 {
    using vi = __m512i;
    using vf = __m512;
    static vi load(const void* p) { return _mm512_loadu_si512(p); }
    static vi bcast32(const void* p) { return _mm512_set1_epi32(load32(p)); }
    static vi set1_8(char c) { return _mm512_set1_epi8(c); }
    static vi zero() { return _mm512_setzero_si512(); }
    static vi and_(vi a, vi b) { return _mm512_and_si512(a, b); }
    static vi or_(vi a, vi b) { return _mm512_or_si512(a, b); }
    static vi andnot(vi a, vi b) { return _mm512_andnot_si512(a, b); }  // ~a & b
    template <int N> static vi srl16(vi a) { return _mm512_srli_epi16(a, N); }
    template <int N> static vi sll16(vi a) { return _mm512_slli_epi16(a, N); }
    template <int N> static vi sll32(vi a) { return _mm512_slli_epi32(a, N); }
    template <int N> static vi sra32(vi a) { return _mm512_srai_epi32(a, N); }
    static vi add32(vi a, vi b) { return _mm512_add_epi32(a, b); }
    static vi sub32(vi a, vi b) { return _mm512_sub_epi32(a, b); }
    static vi madd16(vi a, vi b) { return _mm512_madd_epi16(a, b); }
    static vi mullo32(vi a, vi b) { return _mm512_mullo_epi32(a, b); }
    static vi u8_32(const uint8_t* p) { return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)p)); }
    static vi s8_32(const int8_t* p) { return _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)p)); }
    static vi u8_16(const uint8_t* p) { return _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i*)p)); }
    static vf f16(const uint16_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p)); }
    static vf fzero() { return _mm512_setzero_ps(); }
    static vf fset1(float x) { return _mm512_set1_ps(x); }
    static vf cvt(vi a) { return _mm512_cvtepi32_ps(a); }
    static vf mul(vf a, vf b) { return _mm512_mul_ps(a, b); }
    static vf fmadd(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
    static vf fnmadd(vf a, vf b, vf c) { return _mm512_fnmadd_ps(a, b, c); }
    static void store(float* y, vf v) { _mm512_storeu_ps(y, v); }
};
using V = v512;
#else
using V = v256;
#endif
static_assert(sizeof(V::vi) == 4 * k_pack_rows, "one int32 lane per packed row");

// ---------------------------------------------------------------- dot policies

#if defined(ZK_TILE_K_512) || defined(__AVX512VNNI__) && defined(__AVX512VL__) || defined(__AVXVNNI__)
struct dot_policy {
    static constexpr bool int32_sums = true;
    using sum = V::vi;  // int32 per row
    [[maybe_unused]] static constexpr int max_chunks_6bit = 4;
    static sum zero() { return V::zero(); }
    static sum add(sum s, V::vi w, V::vi a) {
#if defined(ZK_TILE_K_512)
        return _mm512_dpbusd_epi32(s, w, a);
#elif defined(__AVX512VNNI__) && defined(__AVX512VL__)
        return _mm256_dpbusd_epi32(s, w, a);
#else
        return _mm256_dpbusd_avx_epi32(s, w, a);
#endif
    }
    // row scales: one int32 per row
    static V::vi scale_u8(const uint8_t* p) { return V::u8_32(p); }
    static V::vi scale_s8(const int8_t* p) { return V::s8_32(p); }
    static V::vi scaled(sum s, V::vi sc) { return V::mullo32(s, sc); }
};
#else
struct dot_policy {
    static constexpr bool int32_sums = false;
    using sum = __m256i;  // int16 pairs per row
    // maddubs pairs: 4-bit codes 2 * 15 * 128 = 3840 per int16, 8 chunks 30720;
    // 6-bit codes 2 * 63 * 128 = 16128, 2 chunks 32256.
    [[maybe_unused]] static constexpr int max_chunks_6bit = 2;
    static sum zero() { return _mm256_setzero_si256(); }
    static sum add(sum s, __m256i w, __m256i a) { return _mm256_add_epi16(s, _mm256_maddubs_epi16(w, a)); }
    // row scales: (sc, sc) int16 pairs per row
    static __m256i scale_u8(const uint8_t* p) {
        uint64_t v;
        std::memcpy(&v, p, 8);
        const __m256i idx = _mm256_setr_epi8(0, -1, 0, -1, 1, -1, 1, -1, 2, -1, 2, -1, 3, -1, 3, -1,  //
                                             4, -1, 4, -1, 5, -1, 5, -1, 6, -1, 6, -1, 7, -1, 7, -1);
        return _mm256_shuffle_epi8(_mm256_set1_epi64x((long long)v), idx);
    }
    static __m256i scale_s8(const int8_t* p) {
        const __m256i x = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)p));
        return _mm256_blend_epi16(x, _mm256_slli_epi32(x, 16), 0xAA);
    }
    static __m256i scaled(sum s, __m256i sc) { return _mm256_madd_epi16(s, sc); }
    // (sc[a][r], sc[b][r]) int16 pairs per row
    static __m256i scale_pairs_s8(const int8_t* a, const int8_t* b) {
        return _mm256_cvtepi8_epi16(
            _mm_unpacklo_epi8(_mm_loadl_epi64((const __m128i*)a), _mm_loadl_epi64((const __m128i*)b)));
    }
};
#endif
using P = dot_policy;
using vi = V::vi;
using vf = V::vf;

// k_pack_rows outputs of a row group for one token: all, or the first nr.
inline void store_rows(float* y, vf v, int nr) {
    if (nr == k_pack_rows) {
        V::store(y, v);
        return;
    }
    float tmp[k_pack_rows];
    V::store(tmp, v);
    for (int r = 0; r < nr; r++) y[r] = tmp[r];
}

// Decode streams each weight from DRAM once per step; the caller may ask for
// each block's lines, a fixed distance ahead (pf), to be touched as the block
// is computed. Into L2 (T1), not L1: see k_prefetch_tiles in quant_simd.cpp.
// The kernels spread a block's prefetches over its sub-block loop, a line or a
// few at a time, rather than issuing all of them at the top: a burst of 37-53
// prefetches stalls (most likely on the core's line fill buffers), and the
// block's arithmetic then runs with few requests in flight, so that memory
// time and compute time add. Spread, requests keep going out during the
// arithmetic. bench/read_compute.c, 2 threads, 4 FMAs a line, 3 KB ahead:
// 196-199 ns a 2304-byte block with the prefetches in one burst, 137 spread,
// 134-135 with no arithmetic; the 1.5B's decode step 39 -> 34 ms (with the
// distance at 3 KB; bench/RESULTS.md, 2026-12-06, fifth session).
// Line l of the block at p; lines [L0, L1).
inline void prefetch_line(uintptr_t p, int l) { _mm_prefetch((const char*)(p + 64 * l), _MM_HINT_T1); }
template <int L0, int L1>
inline void prefetch_lines(uintptr_t p) {
    ZK_UNROLL for (int l = L0; l < L1; l++) prefetch_line(p, l);
}

// ---------------------------------------------------------------- Q4_K

template <int T>
void tile_q4_K(int64_t nb, const block_q4_Kp* w, const uint8_t* a, size_t as, float* y, size_t ys, int nr,
               uintptr_t pf) {
    const vi m4 = V::set1_8(0x0F);
    vf acc[T];
    ZK_UNROLL for (int t = 0; t < T; t++) acc[t] = V::fzero();
    for (int64_t ib = 0; ib < nb; ib++) {
        const block_q4_Kp& p = w[ib];
        // 37 lines (19 with 8-row groups): one per (k, i) below, those past 32 after the k loop
        constexpr int q4_lines = (int)((sizeof(block_q4_Kp) + 63) / 64);
        const uintptr_t pb = T == 1 && pf ? pf + ib * sizeof(block_q4_Kp) : 0;
        const block_q8_Kp* x[T];
        ZK_UNROLL for (int t = 0; t < T; t++) x[t] = (const block_q8_Kp*)(a + t * as) + ib;
        vi isum[T], msum[T];
        ZK_UNROLL for (int t = 0; t < T; t++) isum[t] = msum[t] = V::zero();
        // Not unrolled: with the four k iterations in one body GCC 12 moves the
        // scaling of all of them to the end and spills the sums (95 stack
        // accesses per block, and 20% slower).
#pragma GCC unroll 1
        for (int k = 0; k < 4; k++) {
            // sub-blocks 2k (low nibbles) and 2k + 1 (high), 8 chunks of 4 each
            P::sum lo[T], hi[T];
            ZK_UNROLL for (int t = 0; t < T; t++) lo[t] = hi[t] = P::zero();
            ZK_UNROLL for (int i = 0; i < 8; i++) {
                if (pb && 8 * k + i < q4_lines) prefetch_line(pb, 8 * k + i);
                const vi q = V::load(p.qs[k][i]);
                const vi wl = V::and_(q, m4);
                // int32 sums: the high nibbles in place (16 x the code, one
                // uop fewer than the shift and mask; up to 240 x 127 x 4 a
                // dpbusd), the scaled sum divided by 16 below; int16 sums
                // would overflow, so the AVX2 policy shifts
                const vi wh = P::int32_sums ? V::andnot(m4, q) : V::and_(V::srl16<4>(q), m4);
                ZK_UNROLL for (int t = 0; t < T; t++) {
                    lo[t] = P::add(lo[t], wl, V::bcast32(x[t]->qs + 64 * k + 4 * i));
                    hi[t] = P::add(hi[t], wh, V::bcast32(x[t]->qs + 64 * k + 32 + 4 * i));
                }
            }
            const vi sl = P::scale_u8(p.sc[2 * k]), sh = P::scale_u8(p.sc[2 * k + 1]);
            ZK_UNROLL for (int t = 0; t < T; t++) {
                // sums of 16 x the codes, scaled: multiples of 16 (and below
                // 63 x 32 x 240 x 128 < 2^31), so the shift divides exactly
                const vi h = P::int32_sums ? V::sra32<4>(P::scaled(hi[t], sh)) : P::scaled(hi[t], sh);
                isum[t] = V::add32(isum[t], V::add32(P::scaled(lo[t], sl), h));
            }
        }
        if (pb) prefetch_lines<32, q4_lines>(pb);
        // mins: lane r = m[r][2q] s32[2q] + m[r][2q+1] s32[2q+1]
        ZK_UNROLL for (int q = 0; q < 4; q++) {
            const vi m16 = V::u8_16(p.m[q][0]);
            ZK_UNROLL for (int t = 0; t < T; t++) msum[t] = V::add32(msum[t], V::madd16(m16, V::bcast32(x[t]->s32 + 2 * q)));
        }
        const vf dw = V::f16(p.d), dm = V::f16(p.dmin);
        ZK_UNROLL for (int t = 0; t < T; t++) {
            const vf da = V::fset1(x[t]->d);
            acc[t] = V::fmadd(V::cvt(isum[t]), V::mul(dw, da), acc[t]);
            acc[t] = V::fnmadd(V::cvt(msum[t]), V::mul(dm, da), acc[t]);
        }
    }
    ZK_UNROLL for (int t = 0; t < T; t++) store_rows(y + t * ys, acc[t], nr);
}

// ---------------------------------------------------------------- Q6_K

// Q is the policy (a template parameter so the branch for the other policy's
// offset handling need not compile).
template <int T, class Q = P>
void tile_q6_K(int64_t nb, const block_q6_Kp* w, const uint8_t* a, size_t as, float* y, size_t ys, int nr,
               uintptr_t pf) {
    const vi m4 = V::set1_8(0x0F);
    const vi m2 = V::set1_8(0x03), m2s2 = V::set1_8(0x0C), m2s4 = V::set1_8(0x30);
    vf acc[T];
    ZK_UNROLL for (int t = 0; t < T; t++) acc[t] = V::fzero();
    for (int64_t ib = 0; ib < nb; ib++) {
        const block_q6_Kp& p = w[ib];
        // 53 lines (27 with 8-row groups): three per group n below, those past 48 after the n loop
        constexpr int q6_lines = (int)((sizeof(block_q6_Kp) + 63) / 64);
        const uintptr_t pb = T == 1 && pf ? pf + ib * sizeof(block_q6_Kp) : 0;
        const block_q8_Kp* x[T];
        ZK_UNROLL for (int t = 0; t < T; t++) x[t] = (const block_q8_Kp*)(a + t * as) + ib;
        vi isum[T];
        ZK_UNROLL for (int t = 0; t < T; t++) isum[t] = V::zero();
        for (int n = 0; n < 16; n++) {
            if (pb)
                ZK_UNROLL for (int l = 3 * n; l < 3 * n + 3; l++)
                    if (l < q6_lines) prefetch_line(pb, l);
            // the 4 chunks of group n: 6-bit codes 0..63
            const vi h = V::load(p.qh[n]);
            const vi l0 = V::load(p.ql[2 * n]);
            const vi l1 = V::load(p.ql[2 * n + 1]);
            const vi c[4] = {
                V::or_(V::and_(l0, m4), V::sll16<4>(V::and_(h, m2))),
                V::or_(V::and_(V::srl16<4>(l0), m4), V::sll16<2>(V::and_(h, m2s2))),
                V::or_(V::and_(l1, m4), V::and_(h, m2s4)),
                V::or_(V::and_(V::srl16<4>(l1), m4), V::and_(V::srl16<2>(h), m2s4)),
            };
            const vi sc = Q::scale_s8(p.sc[n]);
            ZK_UNROLL for (int t = 0; t < T; t++) {
                const int8_t* xq = x[t]->qs + 16 * n;
                if constexpr (Q::int32_sums) {
                    // start from -32 * (sum of the group's activations): the codes' offset
                    typename Q::sum s = V::bcast32(&x[t]->n16[n]);
                    ZK_UNROLL for (int j = 0; j < 4; j++) s = Q::add(s, c[j], V::bcast32(xq + 4 * j));
                    isum[t] = V::add32(isum[t], Q::scaled(s, sc));
                } else {
                    ZK_UNROLL for (int j = 0; j < 4; j += Q::max_chunks_6bit) {
                        typename Q::sum s = Q::zero();
                        ZK_UNROLL for (int u = 0; u < Q::max_chunks_6bit; u++)
                            s = Q::add(s, c[j + u], V::bcast32(xq + 4 * (j + u)));
                        isum[t] = V::add32(isum[t], Q::scaled(s, sc));
                    }
                }
            }
        }
        if (pb) prefetch_lines<48, q6_lines>(pb);
        if constexpr (!Q::int32_sums) {
            // the offset: isum -= 32 * sum_n sc[n][r] s16[n], two groups per vpmaddwd
            ZK_UNROLL for (int q = 0; q < 8; q++) {
                const vi pairs = Q::scale_pairs_s8(p.sc[2 * q], p.sc[2 * q + 1]);
                ZK_UNROLL for (int t = 0; t < T; t++)
                    isum[t] = V::sub32(isum[t], V::sll32<5>(V::madd16(pairs, V::bcast32(x[t]->s16 + 2 * q))));
            }
        }
        const vf dw = V::f16(p.d);
        ZK_UNROLL for (int t = 0; t < T; t++)
            acc[t] = V::fmadd(V::cvt(isum[t]), V::mul(dw, V::fset1(x[t]->d)), acc[t]);
    }
    ZK_UNROLL for (int t = 0; t < T; t++) store_rows(y + t * ys, acc[t], nr);
}

// ---------------------------------------------------------------- Q8_0, Q5_0

// f(std::integral_constant<int, i>()) for each i of I: a loop whose index is a
// compile-time constant (shift counts).
template <class F, size_t... I>
inline void unrolled(F&& f, std::index_sequence<I...>) {
    (f(std::integral_constant<int, (int)I>()), ...);
}

// Each 32-element block starts its int32 sums at -Off x the activations' sum
// (block_q8_0pa), so a dpbusd of the unsigned codes gives the signed dot, the
// integer sum of dot_ref_q8_0 / dot_ref_q5_0, scaled per block as they do.
// Q is the policy (a template parameter so that only the int32-sum policy,
// which these kernels need, instantiates the body: the unsigned codes reach
// 255 and their maddubs pairs would overflow int16).
template <int T, bool Q5, class Q = P>
void tile_q32(int64_t nb, const void* wv, const uint8_t* a, size_t as, float* y, size_t ys, int nr, uintptr_t pf) {
    if constexpr (!Q::int32_sums) {
        return;  // not reached: quant_tile_k_has_simd says no for these types
    } else {
        using blk = std::conditional_t<Q5, block_q5_0p, block_q8_0p>;
        const blk* w = (const blk*)wv;
        const vi m4 = V::set1_8(0x0F);
        vf acc[T];
        ZK_UNROLL for (int t = 0; t < T; t++) acc[t] = V::fzero();
        for (int64_t ib = 0; ib < nb; ib++) {
            const blk& p = w[ib];
            // the block's lines in two halves, one per half-block h (as prefetch_lines says)
            constexpr int lines = (int)((sizeof(blk) + 63) / 64);
            const uintptr_t pb = T == 1 && pf ? pf + ib * sizeof(blk) : 0;
            ZK_UNROLL for (int h = 0; h < 2; h++) {
                if (pb) {
                    if (h == 0) prefetch_lines<0, lines / 2>(pb);
                    else prefetch_lines<lines / 2, lines>(pb);
                }
                const block_q8_0pa* x[T];
                ZK_UNROLL for (int t = 0; t < T; t++) x[t] = (const block_q8_0pa*)(a + t * as) + 2 * ib + h;
                typename Q::sum s[T];
                ZK_UNROLL for (int t = 0; t < T; t++) s[t] = V::bcast32(Q5 ? &x[t]->n16 : &x[t]->n128);
                vi qh = V::zero();
                if constexpr (Q5) qh = V::load(p.qh[h]);
                unrolled(
                    [&](auto ic) {
                        constexpr int i = decltype(ic)::value;
                        vi c;
                        if constexpr (Q5) {
                            // 4 low bits from the nibble of block h, bit 4 from bit i of qh
                            const vi q = V::load(p.qs[i]);
                            const vi lo = h == 0 ? V::and_(q, m4) : V::and_(V::srl16<4>(q), m4);
                            const vi hb = V::and_(qh, V::set1_8((char)(1 << i)));
                            vi b4;
                            if constexpr (i <= 4)
                                b4 = V::sll16<4 - i>(hb);
                            else
                                b4 = V::srl16<i - 4>(hb);
                            c = V::or_(lo, b4);
                        } else {
                            c = V::load(p.qs[8 * h + i]);
                        }
                        ZK_UNROLL for (int t = 0; t < T; t++) s[t] = Q::add(s[t], c, V::bcast32(x[t]->qs + 4 * i));
                    },
                    std::make_index_sequence<8>());
                const vf dw = V::f16(p.d[h]);
                ZK_UNROLL for (int t = 0; t < T; t++) acc[t] = V::fmadd(V::cvt(s[t]), V::mul(dw, V::fset1(x[t]->d)), acc[t]);
            }
        }
        ZK_UNROLL for (int t = 0; t < T; t++) store_rows(y + t * ys, acc[t], nr);
    }
}

using tile_fn = void (*)(int64_t, const void*, const uint8_t*, size_t, float*, size_t, int, uintptr_t);

// Tokens per register tile (more run as several tiles): Q4_K's sums for 8
// tokens no longer fit in registers; Q6_K's (one int32 sum per token) do with
// AVX-512's 32 registers, and sharing its costlier 6-bit unpacking among 8
// tokens is 25% faster than among 4 (bench_matmul Qwen15/Q6_K/down, 64 tokens).
constexpr int k_q4_K_toks = 4;
#if defined(ZK_TILE_K_512)
constexpr int k_q6_K_toks = 8;
#else
constexpr int k_q6_K_toks = 4;
#endif

// T tokens as register tiles of at most k_q4_K_toks / k_q6_K_toks.
template <int T>
void q4_K_run(int64_t nb, const void* w, const uint8_t* a, size_t as, float* y, size_t ys, int nr, uintptr_t pf) {
    constexpr int T0 = T < k_q4_K_toks ? T : k_q4_K_toks;
    tile_q4_K<T0>(nb, (const block_q4_Kp*)w, a, as, y, ys, nr, pf);
    if constexpr (T > T0) q4_K_run<T - T0>(nb, w, a + T0 * as, as, y + T0 * ys, ys, nr, pf);
}
template <int T>
void q6_K_run(int64_t nb, const void* w, const uint8_t* a, size_t as, float* y, size_t ys, int nr, uintptr_t pf) {
    constexpr int T0 = T < k_q6_K_toks ? T : k_q6_K_toks;
    tile_q6_K<T0>(nb, (const block_q6_Kp*)w, a, as, y, ys, nr, pf);
    if constexpr (T > T0) q6_K_run<T - T0>(nb, w, a + T0 * as, as, y + T0 * ys, ys, nr, pf);
}

template <int T, bool Q5>
void q32_run(int64_t nb, const void* w, const uint8_t* a, size_t as, float* y, size_t ys, int nr, uintptr_t pf) {
    constexpr int T0 = T < k_q6_K_toks ? T : k_q6_K_toks;
    tile_q32<T0, Q5>(nb, w, a, as, y, ys, nr, pf);
    if constexpr (T > T0) q32_run<T - T0, Q5>(nb, w, a + T0 * as, as, y + T0 * ys, ys, nr, pf);
}

template <size_t... I>
constexpr std::array<tile_fn, sizeof...(I)> q4_K_fns(std::index_sequence<I...>) {
    return {q4_K_run<(int)I + 1>...};
}
template <size_t... I>
constexpr std::array<tile_fn, sizeof...(I)> q6_K_fns(std::index_sequence<I...>) {
    return {q6_K_run<(int)I + 1>...};
}
template <bool Q5, size_t... I>
constexpr std::array<tile_fn, sizeof...(I)> q32_fns(std::index_sequence<I...>) {
    return {q32_run<(int)I + 1, Q5>...};
}
// kernels for 1..k_pack_toks tokens
const std::array<tile_fn, k_pack_toks> k_q4_K_fns = q4_K_fns(std::make_index_sequence<k_pack_toks>());
const std::array<tile_fn, k_pack_toks> k_q6_K_fns = q6_K_fns(std::make_index_sequence<k_pack_toks>());
const std::array<tile_fn, k_pack_toks> k_q8_0_fns = q32_fns<false>(std::make_index_sequence<k_pack_toks>());
const std::array<tile_fn, k_pack_toks> k_q5_0_fns = q32_fns<true>(std::make_index_sequence<k_pack_toks>());

// ---------------------------------------------------------------- activations

// One block of 256 as quantize_q8_K in quant.cpp, bit for bit: the signed value
// of largest magnitude (the first one on ties) maps to -128, q = round-to-even
// of x * iscale, clamped to 127; then the group sums.
void quantize_block(const float* x, block_q8_Kp& b) {
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 m = _mm256_setzero_ps();
    for (int k = 0; k < 32; k++) m = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x + 8 * k), abs_mask), m);
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float amax = _mm_cvtss_f32(m4);
    std::memset(&b, 0, sizeof b);
    if (amax == 0.0f) return;  // also all-NaN blocks, as the scalar (it never sees ax > 0)
    float max = 0.0f;
    const __m256 av = _mm256_set1_ps(amax);
    for (int k = 0; k < 32; k++) {
        const int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_and_ps(_mm256_loadu_ps(x + 8 * k), abs_mask), av, _CMP_EQ_OQ));
        if (hit) {
            max = x[8 * k + __builtin_ctz((unsigned)hit)];
            break;
        }
    }
    const float iscale = -128.0f / max;
    const __m256 is = _mm256_set1_ps(iscale);
    const __m256i lim = _mm256_set1_epi32(127);
    for (int k = 0; k < 8; k++) {
        __m256i q[4];
        for (int u = 0; u < 4; u++) {
            const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + 32 * k + 8 * u), is);
            q[u] = _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)), lim);
        }
        __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
        p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i*)(b.qs + 32 * k), p);
        // sums of 8 bytes (biased by 128 to be unsigned) per 64-bit lane
        const __m256i s8 = _mm256_sad_epu8(_mm256_xor_si256(p, _mm256_set1_epi8((char)0x80)), _mm256_setzero_si256());
        alignas(32) int64_t s[4];
        _mm256_store_si256((__m256i*)s, s8);
        const int g0 = (int)(s[0] + s[1]) - 16 * 128, g1 = (int)(s[2] + s[3]) - 16 * 128;
        b.s16[2 * k] = (int16_t)g0;
        b.s16[2 * k + 1] = (int16_t)g1;
        b.n16[2 * k] = -32 * g0;
        b.n16[2 * k + 1] = -32 * g1;
        b.s32[k] = (int16_t)(g0 + g1);
    }
    b.d = 1.0f / iscale;
}

}  // namespace

// The K-quants with every policy; Q8_0 and Q5_0 with int32 sums (VNNI) only.
bool quant_tile_k_has_simd(dtype t) {
    return t == dtype::Q4_K || t == dtype::Q6_K || ((t == dtype::Q8_0 || t == dtype::Q5_0) && P::int32_sums);
}

bool quant_tile_k_run(dtype t, int64_t nb, const void* group, int nr, const void* a, size_t a_stride, int nt,
                      float* y, size_t y_stride, const void* prefetch) {
    if (!quant_tile_k_has_simd(t)) return false;
    const tile_fn* fns = t == dtype::Q4_K   ? k_q4_K_fns.data()
                         : t == dtype::Q6_K ? k_q6_K_fns.data()
                         : t == dtype::Q8_0 ? k_q8_0_fns.data()
                                            : k_q5_0_fns.data();
    fns[nt - 1](nb, group, (const uint8_t*)a, a_stride, y, y_stride, nr, (uintptr_t)prefetch);
    return true;
}

bool quant_tile_k_quantize(const float* x, void* dst, int64_t n) {
    block_q8_Kp* b = (block_q8_Kp*)dst;
    for (int64_t i = 0; i < n / 256; i++) quantize_block(x + 256 * i, b[i]);
    return true;
}

#else  // no AVX2: the callers use the scalar references

bool quant_tile_k_has_simd(dtype) { return false; }
bool quant_tile_k_run(dtype, int64_t, const void*, int, const void*, size_t, int, float*, size_t, const void*) {
    return false;
}
bool quant_tile_k_quantize(const float*, void*, int64_t) { return false; }

#endif

}  // namespace zk

#undef ZK_UNROLL  // this file's own; unity builds join it with others
