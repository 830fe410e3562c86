// SIMD dot products for the weight types (x86: AVX2 + FMA + F16C, with
// AVX-VNNI / AVX512-VNNI's dpbusd and AVX512-BW's byte masks for the Q5 high
// bits where the build targets them). Dispatch is at
// compile time on the compiler's predefined macros: the default build uses
// -march=native, so this file is compiled for the host. Without AVX2 every
// entry point falls back to the scalar references in quant.cpp.
//
// The 32-element block types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL) share one
// tiled kernel, parameterised by a small "block kernel" struct, that computes
// up to 4 rows x 4 tokens per pass so each unpacked weight block and each
// activation block is loaded once per tile instead of once per dot product.
// The K-quants (256-element blocks) have one dot product per pair.

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "ggml-like/error.h"
#include "ggml-like/quant_ref.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define ZK_QUANT_AVX2 1
#include <immintrin.h>
#endif

namespace zk {

#if ZK_QUANT_AVX2

namespace {

inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// 8 int32 lanes, each the sum of 4 adjacent products u8 * s8. The pairwise int16
// step of maddubs cannot saturate for our operands (|u| <= 128, |s| <= 127 or
// u <= 63), so both paths give the same integers.
inline __m256i dot_u8s8(__m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#elif defined(__AVXVNNI__)
    return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, s);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}

// 16 bytes of nibbles -> 32 bytes 0..15: low nibbles in bytes 0..15 (elements
// 0..15 of a Q4 block), high nibbles in bytes 16..31 (elements 16..31).
inline __m256i unpack_nibbles(const uint8_t* qs) {
    const __m128i v = _mm_loadu_si128((const __m128i*)qs);
    const __m256i x = _mm256_inserti128_si256(_mm256_castsi128_si256(v), _mm_srli_epi16(v, 4), 1);
    return _mm256_and_si256(x, _mm256_set1_epi8(0x0F));
}

inline __m256i load32(const int8_t* p) { return _mm256_loadu_si256((const __m256i*)p); }

// f16 scale broadcast to every lane, without a round trip through a general
// register (vpbroadcastw + vcvtph2ps).
inline __m256 f16_bcast8(uint16_t h) { return _mm256_cvtph_ps(_mm_set1_epi16((short)h)); }
inline __m128 f16_bcast4(uint16_t h) { return _mm_cvtph_ps(_mm_set1_epi16((short)h)); }

// 32 bytes 0 / 0x10: byte i is 0x10 where bit i of the little-endian u32 at qh
// is set (the 5th bit of element i of a Q5_0 / Q5_1 block).
inline __m256i unpack_bit4(const uint8_t* qh) {
    uint32_t h;
    std::memcpy(&h, qh, 4);
#if defined(__AVX512BW__) && defined(__AVX512VL__)
    return _mm256_maskz_mov_epi8((__mmask32)h, _mm256_set1_epi8(0x10));  // the bits are a byte mask
#else
    // Byte i takes byte i / 8 of h, then tests bit i % 8 of it.
    const __m256i spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32((int)h),
        _mm256_setr_epi64x(0x0000000000000000, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303));
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
    return _mm256_and_si256(set, _mm256_set1_epi8(0x10));
#endif
}

// ---------------------------------------------------------------- 32-element block kernels
// Each provides: wblock/ablock types, prep_w (once per row and block), prep_a
// (once per token and block) and acc (once per row x token pair), which adds
// the block's contribution to a vector accumulator and to a scalar one kept in
// every lane of an __m128 (only the types with a min use it; the others leave
// it zero). Three shapes cover the six weight types, each varied only by how
// a block's quants are unpacked into 32 bytes.

// Unsigned quants q with x = d (q - Off) (Q4_0: 4 bits, Off 8; Q5_0: 5 bits,
// Off 16) against Q8_0: q . a - Off sum(a), the second term once per
// activation block (as a per-lane-group vector, so the sums stay integer).
template <class U, int Off>
struct bk_offset {
    using wblock = typename U::block;
    using ablock = block_q8_0;
    struct wp {
        __m256i q;  // 0..2 Off - 1
        __m256 d;
    };
    struct ap {
        __m256i q;
        __m256i off;  // Off * sum(q) per lane group
        __m256 d;
    };
    static wp prep_w(const wblock& b) { return {U::unpack(b), f16_bcast8(b.d)}; }
    static ap prep_a(const ablock& b) {
        const __m256i q = load32(b.qs);
        return {q, dot_u8s8(_mm256_set1_epi8(Off), q), f16_bcast8(b.d)};
    }
    static void acc(const wp& w, const ap& a, __m256& acc, __m128&) {
        const __m256i s = _mm256_sub_epi32(dot_u8s8(w.q, a.q), a.off);
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(w.d, a.d), acc);
    }
};

// Unsigned quants with a min, x = d q + m (Q4_1, Q5_1), against Q8_1 whose s =
// da sum(qa) turns the min's term into one product per block pair.
template <class U>
struct bk_min {
    using wblock = typename U::block;
    using ablock = block_q8_1;
    struct wp {
        __m256i q;
        __m256 d;
        __m128 m;
    };
    struct ap {
        __m256i q;
        __m256 d;
        __m128 s;
    };
    static wp prep_w(const wblock& b) { return {U::unpack(b), f16_bcast8(b.d), f16_bcast4(b.m)}; }
    static ap prep_a(const ablock& b) { return {load32(b.qs), f16_bcast8(b.d), f16_bcast4(b.s)}; }
    static void acc(const wp& w, const ap& a, __m256& acc, __m128& extra) {
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_u8s8(w.q, a.q)), _mm256_mul_ps(w.d, a.d), acc);
        extra = _mm_fmadd_ps(w.m, a.s, extra);  // the min times the activation block's sum
    }
};

// Signed int8 weights x = d q (Q8_0; IQ4_NL after its table lookup, |q| <= 127)
// against Q8_0: |w| . (a with w's sign), the unsigned x signed form dpbusd /
// maddubs take.
template <class U>
struct bk_signed {
    using wblock = typename U::block;
    using ablock = block_q8_0;
    struct wp {
        __m256i q;
        __m256i absq;  // |w| as unsigned; the sign moves onto the activation
        __m256 d;
    };
    struct ap {
        __m256i q;
        __m256 d;
    };
    static wp prep_w(const wblock& b) {
        const __m256i q = U::unpack(b);
        return {q, _mm256_sign_epi8(q, q), f16_bcast8(b.d)};
    }
    static ap prep_a(const ablock& b) { return {load32(b.qs), f16_bcast8(b.d)}; }
    static void acc(const wp& w, const ap& a, __m256& acc, __m128&) {
        const __m256i s = dot_u8s8(w.absq, _mm256_sign_epi8(a.q, w.q));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(w.d, a.d), acc);
    }
};

// Unpackers: a weight block's 32 quants as 32 bytes in element order.
template <class B>
struct up_q4 {  // Q4_0, Q4_1: 0..15
    using block = B;
    static __m256i unpack(const B& b) { return unpack_nibbles(b.qs); }
};
template <class B>
struct up_q5 {  // Q5_0, Q5_1: 0..31
    using block = B;
    static __m256i unpack(const B& b) { return _mm256_or_si256(unpack_nibbles(b.qs), unpack_bit4(b.qh)); }
};
struct up_q8_0 {
    using block = block_q8_0;
    static __m256i unpack(const block& b) { return load32(b.qs); }
};
struct up_iq4_nl {  // the nibbles index the 16 table values (one byte shuffle)
    using block = block_iq4_nl;
    static __m256i unpack(const block& b) {
        const __m128i t = _mm_loadu_si128((const __m128i*)k_iq4nl_values);
        return _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(t), unpack_nibbles(b.qs));
    }
};

using bk_q4_0 = bk_offset<up_q4<block_q4_0>, 8>;
using bk_q5_0 = bk_offset<up_q5<block_q5_0>, 16>;
using bk_q4_1 = bk_min<up_q4<block_q4_1>>;
using bk_q5_1 = bk_min<up_q5<block_q5_1>>;
using bk_q8_0 = bk_signed<up_q8_0>;
using bk_iq4_nl = bk_signed<up_iq4_nl>;

// The r/t loops must be fully unrolled so acc, extra and wp live in registers;
// the build's -O2 does not do that by itself, hence the pragmas.
#define ZK_UNROLL _Pragma("GCC unroll 4")

// Decode (one token) streams every weight from DRAM once per step. A tile reads
// its R rows side by side, R short streams of a few hundred bytes each, which
// the hardware prefetchers pick up too late; so each block step also prefetches
// its share of the tile k_prefetch_tiles ahead (the rows of a weight are
// contiguous, so that is the next-but-one R x ws bytes). Measured on the
// default model's decode matmuls (bench_matmul Model/decode, 2 threads, from
// DRAM): 8.4 -> 5.9 ms; 1 tile ahead is slower, 3 level with 2. The lines go to
// L2, not L1 (_MM_HINT_T1): a T0 prefetch holds one of the core's few L1 fill
// buffers until its line arrives, so (the likely reason) it throttles the demand
// loads; into L2 it does not. Qwen2.5-Coder-0.5B's Q5_0 matrices from
// DRAM, 2 threads: 17.0 -> 20.2 GB/s (read probe 25 GB/s), its Q8_0 output 20.0 -> 21.7.
constexpr int64_t k_prefetch_tiles = 2;

template <class K, int R, int T>
void tile_kernel(int64_t nb, const uint8_t* w, size_t ws, const uint8_t* a, size_t as, float* y,
                 size_t ys) {
    __m256 acc[R][T];
    __m128 extra[R][T];
    ZK_UNROLL for (int r = 0; r < R; r++) {
        ZK_UNROLL for (int t = 0; t < T; t++) {
            acc[r][t] = _mm256_setzero_ps();
            extra[r][t] = _mm_setzero_ps();
        }
    }
    // An address, not a pointer into w: the last tiles prefetch past the weight's end.
    const uintptr_t pf = (uintptr_t)w + k_prefetch_tiles * R * ws;
    constexpr size_t pf_step = R * sizeof(typename K::wblock);  // bytes of the tile per block step
    for (int64_t ib = 0; ib < nb; ib++) {
        if (T == 1) {  // with more tokens the tile is compute bound and the weights come from L2
            ZK_UNROLL for (size_t k = 0; k < pf_step; k += 64) _mm_prefetch((const char*)(pf + ib * pf_step + k), _MM_HINT_T1);
        }
        typename K::wp wp[R];
        ZK_UNROLL for (int r = 0; r < R; r++) wp[r] = K::prep_w(((const typename K::wblock*)(w + r * ws))[ib]);
        ZK_UNROLL for (int t = 0; t < T; t++) {
            const typename K::ap ap = K::prep_a(((const typename K::ablock*)(a + t * as))[ib]);
            ZK_UNROLL for (int r = 0; r < R; r++) K::acc(wp[r], ap, acc[r][t], extra[r][t]);
        }
    }
    ZK_UNROLL for (int r = 0; r < R; r++) {
        ZK_UNROLL for (int t = 0; t < T; t++) y[t * ys + r] = hsum(acc[r][t]) + _mm_cvtss_f32(extra[r][t]);
    }
}

using tile_fn = void (*)(int64_t, const uint8_t*, size_t, const uint8_t*, size_t, float*, size_t);

template <class K>
void tile_dispatch(int64_t nb, const void* w, size_t ws, int nr, const void* a, size_t as, int nt,
                   float* y, size_t ys) {
    static const tile_fn fns[4][4] = {
        {tile_kernel<K, 1, 1>, tile_kernel<K, 1, 2>, tile_kernel<K, 1, 3>, tile_kernel<K, 1, 4>},
        {tile_kernel<K, 2, 1>, tile_kernel<K, 2, 2>, tile_kernel<K, 2, 3>, tile_kernel<K, 2, 4>},
        {tile_kernel<K, 3, 1>, tile_kernel<K, 3, 2>, tile_kernel<K, 3, 3>, tile_kernel<K, 3, 4>},
        {tile_kernel<K, 4, 1>, tile_kernel<K, 4, 2>, tile_kernel<K, 4, 3>, tile_kernel<K, 4, 4>},
    };
    fns[nr - 1][nt - 1](nb, (const uint8_t*)w, ws, (const uint8_t*)a, as, y, ys);
}

template <class K>
float dot_block32(const void* w, const void* a, int64_t nb) {
    float y;
    tile_kernel<K, 1, 1>(nb, (const uint8_t*)w, 0, (const uint8_t*)a, 0, &y, 0);
    return y;
}

// ---------------------------------------------------------------- K-quants

// int16 lanes 0..7 = scale g, lanes 8..15 = scale g + 1, from 8 int16 scales
// held in both 128-bit halves of s (g even, 0..6): the per-group scale vector
// of a 32-byte product whose two halves belong to consecutive 16-element groups.
inline __m256i scale_pair(__m256i s, int g) {
    const short lo = (short)(((2 * g + 1) << 8) | (2 * g));
    const short hi = (short)(((2 * g + 3) << 8) | (2 * g + 2));
    return _mm256_shuffle_epi8(s, _mm256_set_m128i(_mm_set1_epi16(hi), _mm_set1_epi16(lo)));
}

// Q2_K and Q3_K share the 2-bit packing (element 128h + 32s + l in bits 2s of
// qs[32h + l]) and 16 groups of 16 with integer scales sc (16 x int16). Sums
// sum_g sc_g (q' . qa)_g over a block, where q' = the 2 low bits plus, for
// Q3_K, 4 * the high bit (bit 4h + s of hmask[l]): 0..3 or 0..7, unsigned.
template <bool HighBit>
__m256i sum_q23_K(const uint8_t* qs, const uint8_t* hmask, const int8_t* q8, __m256i sc) {
    const __m256i m3 = _mm256_set1_epi8(3);
    const __m256i sc_lo = _mm256_permute2x128_si256(sc, sc, 0x00);  // scales 0..7 in both halves
    const __m256i sc_hi = _mm256_permute2x128_si256(sc, sc, 0x11);  // scales 8..15
    __m256i hm = HighBit ? _mm256_loadu_si256((const __m256i*)hmask) : _mm256_setzero_si256();
    __m256i isum = _mm256_setzero_si256();
    for (int h = 0; h < 2; h++) {
        const __m256i q = _mm256_loadu_si256((const __m256i*)(qs + 32 * h));
        const __m256i sch = h ? sc_hi : sc_lo;
        for (int s = 0; s < 4; s++) {
            __m256i v = _mm256_and_si256(_mm256_srli_epi16(q, 2 * s), m3);
            if (HighBit) {  // bit 0 of hm (shifted down one step per sub-block) -> bit 2
                v = _mm256_or_si256(v, _mm256_slli_epi16(_mm256_and_si256(hm, _mm256_set1_epi8(1)), 2));
                hm = _mm256_srli_epi16(hm, 1);
            }
            const __m256i p = _mm256_maddubs_epi16(v, load32(q8 + 128 * h + 32 * s));
            isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, scale_pair(sch, 2 * s)));
        }
    }
    return isum;
}

// Q2_K: d da sum_g sc_g (q . qa)_g - dmin da sum_g m_g bsums_g, 4-bit sc and m.
float dot_q2_K(const block_q2_K* w, const block_q8_K* a, int64_t nb) {
    __m256 acc = _mm256_setzero_ps(), acc_m = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        const __m128i sm = _mm_loadu_si128((const __m128i*)w[i].scales);
        const __m256i sc = _mm256_cvtepu8_epi16(_mm_and_si128(sm, _mm_set1_epi8(0x0F)));
        const __m256i m = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sm, 4), _mm_set1_epi8(0x0F)));
        const __m256i msum = _mm256_madd_epi16(m, _mm256_loadu_si256((const __m256i*)a[i].bsums));
        const __m256i isum = sum_q23_K<false>(w[i].qs, nullptr, a[i].qs, sc);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(fp16_load(w[i].d) * a[i].d), _mm256_cvtepi32_ps(isum), acc);
        acc_m = _mm256_fmadd_ps(_mm256_set1_ps(fp16_load(w[i].dmin) * a[i].d), _mm256_cvtepi32_ps(msum), acc_m);
    }
    return hsum(_mm256_sub_ps(acc, acc_m));
}

// Q3_K's 16 scales (quant_ref.h, q3_K_scales) as 16 x int16, -32..31.
inline __m256i q3_K_scales16(const uint8_t* s) {
    uint64_t lo8;
    uint32_t hi4;
    std::memcpy(&lo8, s, 8);
    std::memcpy(&hi4, s + 8, 4);
    const __m128i x = _mm_set_epi64x((long long)hi4, (long long)lo8);
    const __m128i m4 = _mm_set1_epi8(0x0F), m2 = _mm_set1_epi8(3);
    // Low 4 bits: bytes 0..7 low nibbles (scales 0..7), high nibbles (8..15).
    const __m128i lo = _mm_unpacklo_epi64(_mm_and_si128(x, m4), _mm_and_si128(_mm_srli_epi16(x, 4), m4));
    // High 2 bits: byte 8 + g % 4 of s at bits 2 (g / 4): the 4 bytes in every
    // dword, dword k shifted by 2k.
    const __m128i h = _mm_shuffle_epi8(x, _mm_set1_epi32(0x0b0a0908));
    __m128i hi = _mm_and_si128(h, m2);
    hi = _mm_blend_epi32(hi, _mm_and_si128(_mm_srli_epi16(h, 2), m2), 0x2);
    hi = _mm_blend_epi32(hi, _mm_and_si128(_mm_srli_epi16(h, 4), m2), 0x4);
    hi = _mm_blend_epi32(hi, _mm_and_si128(_mm_srli_epi16(h, 6), m2), 0x8);
    const __m128i sc = _mm_sub_epi8(_mm_or_si128(lo, _mm_slli_epi16(hi, 4)), _mm_set1_epi8(32));
    return _mm256_cvtepi8_epi16(sc);
}

// Q3_K: q = q' - 4 with q' in 0..7, so sum_g sc_g (q . qa)_g = sum_g sc_g (q' . qa)_g
// - 4 sum_g sc_g bsums_g; signed 6-bit scales.
float dot_q3_K(const block_q3_K* w, const block_q8_K* a, int64_t nb) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        const __m256i sc = q3_K_scales16(w[i].scales);
        const __m256i offset = _mm256_madd_epi16(sc, _mm256_loadu_si256((const __m256i*)a[i].bsums));
        const __m256i isum = _mm256_sub_epi32(sum_q23_K<true>(w[i].qs, w[i].hmask, a[i].qs, sc),
                                              _mm256_slli_epi32(offset, 2));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(fp16_load(w[i].d) * a[i].d), _mm256_cvtepi32_ps(isum), acc);
    }
    return hsum(acc);
}

// Q4_K and Q5_K (Q5_K adds bit 4 of each quant from qh): d da sum_j sc_j (q . qa)_j
// - dmin da sum_j m_j (bsums of sub-block j), 8 sub-blocks of 32.
template <class B>
float dot_q45_K(const B* w, const block_q8_K* a, int64_t nb) {
    constexpr bool five = std::is_same<B, block_q5_K>::value;
    __m256 acc = _mm256_setzero_ps();
    float mins = 0.0f;
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i b4 = _mm256_set1_epi8(0x10);
    for (int64_t i = 0; i < nb; i++) {
        int sc[8], m[8], msum = 0;
        for (int j = 0; j < 8; j++) {
            q4_K_scale_min(w[i].scales, j, sc[j], m[j]);
            msum += m[j] * (a[i].bsums[2 * j] + a[i].bsums[2 * j + 1]);
        }
        __m256i qh = _mm256_setzero_si256();
        if constexpr (five) qh = _mm256_loadu_si256((const __m256i*)w[i].qh);
        __m256i isum = _mm256_setzero_si256();
        for (int k = 0; k < 4; k++) {
            const __m256i q = _mm256_loadu_si256((const __m256i*)(w[i].qs + 32 * k));
            __m256i lo = _mm256_and_si256(q, m4);                        // sub-block 2k
            __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);  // sub-block 2k+1
            if constexpr (five) {
                // Bits 2k and 2k+1 of qh[l] (bits 0 and 1 after k steps of 2) -> bit 4.
                lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi16(qh, 4), b4));
                hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_slli_epi16(qh, 3), b4));
                qh = _mm256_srli_epi16(qh, 2);
            }
            const __m256i p0 = _mm256_maddubs_epi16(lo, load32(a[i].qs + 64 * k));
            const __m256i p1 = _mm256_maddubs_epi16(hi, load32(a[i].qs + 64 * k + 32));
            isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p0, _mm256_set1_epi16((short)sc[2 * k])));
            isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p1, _mm256_set1_epi16((short)sc[2 * k + 1])));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(fp16_load(w[i].d) * a[i].d), _mm256_cvtepi32_ps(isum), acc);
        mins += fp16_load(w[i].dmin) * a[i].d * (float)msum;
    }
    return hsum(acc) - mins;
}

float dot_q6_K(const block_q6_K* w, const block_q8_K* a, int64_t nb) {
    __m256 acc = _mm256_setzero_ps();
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    for (int64_t i = 0; i < nb; i++) {
        // q - 32: the offset is folded in with the group sums of the activations.
        int offset = 0;
        for (int g = 0; g < 16; g++) offset += w[i].scales[g] * a[i].bsums[g];
        __m256i isum = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            const uint8_t* ql = w[i].ql + 64 * h;
            const int8_t* q8 = a[i].qs + 128 * h;
            const int8_t* sc = w[i].scales + 8 * h;
            const __m256i qh = _mm256_loadu_si256((const __m256i*)(w[i].qh + 32 * h));
            const __m256i l0 = _mm256_loadu_si256((const __m256i*)ql);
            const __m256i l1 = _mm256_loadu_si256((const __m256i*)(ql + 32));
            // Mask before shifting so no bits cross between bytes of a 16-bit lane.
            const __m256i q[4] = {
                _mm256_or_si256(_mm256_and_si256(l0, m4),
                                _mm256_slli_epi16(_mm256_and_si256(qh, _mm256_set1_epi8(0x03)), 4)),
                _mm256_or_si256(_mm256_and_si256(l1, m4),
                                _mm256_slli_epi16(_mm256_and_si256(qh, _mm256_set1_epi8(0x0C)), 2)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                                _mm256_and_si256(qh, _mm256_set1_epi8(0x30))),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                _mm256_srli_epi16(_mm256_and_si256(qh, _mm256_set1_epi8((char)0xC0)), 2)),
            };
            for (int k = 0; k < 4; k++) {
                // int16 lanes 0..7 come from elements 0..15 (group 2k), 8..15 from group 2k+1.
                const __m256i p = _mm256_maddubs_epi16(q[k], load32(q8 + 32 * k));
                const __m256i s = _mm256_set_m128i(_mm_set1_epi16(sc[2 * k + 1]), _mm_set1_epi16(sc[2 * k]));
                isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, s));
            }
        }
        isum = _mm256_sub_epi32(isum, _mm256_setr_epi32(32 * offset, 0, 0, 0, 0, 0, 0, 0));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(fp16_load(w[i].d) * a[i].d), _mm256_cvtepi32_ps(isum), acc);
    }
    return hsum(acc);
}

// ---------------------------------------------------------------- float weights

inline __m256 load8_f32(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8_f16(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p)); }
inline __m256 load8_bf16(const uint16_t* p) {
    const __m256i x = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(x, 16));
}

template <typename T, __m256 (*load)(const T*), float (*scalar)(T)>
float dot_float(const T* w, const float* a, int64_t n) {
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    int64_t i = 0;
    for (; i + 32 <= n; i += 32)
        for (int k = 0; k < 4; k++)
            acc[k] = _mm256_fmadd_ps(load(w + i + 8 * k), _mm256_loadu_ps(a + i + 8 * k), acc[k]);
    for (; i + 8 <= n; i += 8) acc[0] = _mm256_fmadd_ps(load(w + i), _mm256_loadu_ps(a + i), acc[0]);
    float sum = hsum(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
    for (; i < n; i++) sum += scalar(w[i]) * a[i];
    return sum;
}

inline float id_f32(float x) { return x; }

// ---------------------------------------------------------------- Q8_0 / Q8_1 quantization
// Same arithmetic as the scalar reference (amax, d = amax / 127, id = 1 / d,
// q = roundf(x * id), rounding half away from zero), so the bytes match.

inline __m256 round_half_away(__m256 v) {
    const __m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __m256 sign = _mm256_and_ps(v, _mm256_set1_ps(-0.0f));
    const __m256 frac = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), _mm256_sub_ps(v, t));  // exact
    const __m256 up = _mm256_cmp_ps(frac, _mm256_set1_ps(0.5f), _CMP_GE_OQ);
    return _mm256_add_ps(t, _mm256_and_ps(up, _mm256_or_ps(sign, _mm256_set1_ps(1.0f))));
}

// One block of 32: writes the int8s, returns d and sum(q).
inline int quantize_block_q8_avx2(const float* x, int8_t* qs, float& d) {
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 v[4];
    __m256 m = _mm256_setzero_ps();
    for (int k = 0; k < 4; k++) {
        v[k] = _mm256_loadu_ps(x + 8 * k);
        m = _mm256_max_ps(_mm256_and_ps(v[k], abs_mask), m);  // NaN-ignoring, as the scalar
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float amax = _mm_cvtss_f32(m4);
    d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const __m256 idv = _mm256_set1_ps(id);
    __m256i q[4];
    for (int k = 0; k < 4; k++) q[k] = _mm256_cvttps_epi32(round_half_away(_mm256_mul_ps(v[k], idv)));
    // int32 -> int8 with the element order restored (packs work per 128-bit lane).
    const __m256i p01 = _mm256_packs_epi32(q[0], q[1]);
    const __m256i p23 = _mm256_packs_epi32(q[2], q[3]);
    __m256i p = _mm256_packs_epi16(p01, p23);
    p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i*)qs, p);
    const __m256i s = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
    return _mm_cvtsi128_si32(s4);
}

}  // namespace

bool quant_quantize_simd(dtype t, const float* src, void* dst, int64_t n) {
    if (t == dtype::Q8_0) {
        block_q8_0* y = (block_q8_0*)dst;
        for (int64_t i = 0; i < n / 32; i++) {
            float d;
            quantize_block_q8_avx2(src + 32 * i, y[i].qs, d);
            y[i].d = fp32_to_fp16(d);
        }
        return true;
    }
    if (t == dtype::Q8_1) {
        block_q8_1* y = (block_q8_1*)dst;
        for (int64_t i = 0; i < n / 32; i++) {
            float d;
            const int sum = quantize_block_q8_avx2(src + 32 * i, y[i].qs, d);
            y[i].d = fp32_to_fp16(d);
            y[i].s = fp32_to_fp16(d * (float)sum);
        }
        return true;
    }
    return false;
}

bool quant_has_simd(dtype weight) {
    switch (weight) {
        case dtype::Q4_0:
        case dtype::Q4_1:
        case dtype::Q5_0:
        case dtype::Q5_1:
        case dtype::Q8_0:
        case dtype::IQ4_NL:
        case dtype::Q2_K:
        case dtype::Q3_K:
        case dtype::Q4_K:
        case dtype::Q5_K:
        case dtype::Q6_K:
        case dtype::F16:
        case dtype::BF16:
        case dtype::F32: return true;
        default: return false;
    }
}

float quant_dot_simd(dtype weight, const void* w, const void* a, int64_t n) {
    switch (weight) {
        case dtype::Q4_0: return dot_block32<bk_q4_0>(w, a, n / 32);
        case dtype::Q4_1: return dot_block32<bk_q4_1>(w, a, n / 32);
        case dtype::Q5_0: return dot_block32<bk_q5_0>(w, a, n / 32);
        case dtype::Q5_1: return dot_block32<bk_q5_1>(w, a, n / 32);
        case dtype::Q8_0: return dot_block32<bk_q8_0>(w, a, n / 32);
        case dtype::IQ4_NL: return dot_block32<bk_iq4_nl>(w, a, n / 32);
        case dtype::Q2_K: return dot_q2_K((const block_q2_K*)w, (const block_q8_K*)a, n / 256);
        case dtype::Q3_K: return dot_q3_K((const block_q3_K*)w, (const block_q8_K*)a, n / 256);
        case dtype::Q4_K: return dot_q45_K((const block_q4_K*)w, (const block_q8_K*)a, n / 256);
        case dtype::Q5_K: return dot_q45_K((const block_q5_K*)w, (const block_q8_K*)a, n / 256);
        case dtype::Q6_K: return dot_q6_K((const block_q6_K*)w, (const block_q8_K*)a, n / 256);
        case dtype::F32:
            return dot_float<float, load8_f32, id_f32>((const float*)w, (const float*)a, n);
        case dtype::F16:
            return dot_float<uint16_t, load8_f16, fp16_load>((const uint16_t*)w, (const float*)a, n);
        case dtype::BF16:
            return dot_float<uint16_t, load8_bf16, bf16_to_fp32>((const uint16_t*)w, (const float*)a, n);
        default: return quant_dot_ref(weight, w, a, n);  // throws for non-weight types
    }
}

void quant_dot_tile(dtype weight, int64_t n, const void* w, size_t w_stride, int nr, const void* a,
                    size_t a_stride, int nt, float* y, size_t y_stride) {
    ZK_ASSERT(nr >= 1 && nr <= k_tile_rows && nt >= 1 && nt <= k_tile_toks);
    switch (weight) {
        case dtype::Q4_0: return tile_dispatch<bk_q4_0>(n / 32, w, w_stride, nr, a, a_stride, nt, y, y_stride);
        case dtype::Q4_1: return tile_dispatch<bk_q4_1>(n / 32, w, w_stride, nr, a, a_stride, nt, y, y_stride);
        case dtype::Q5_0: return tile_dispatch<bk_q5_0>(n / 32, w, w_stride, nr, a, a_stride, nt, y, y_stride);
        case dtype::Q5_1: return tile_dispatch<bk_q5_1>(n / 32, w, w_stride, nr, a, a_stride, nt, y, y_stride);
        case dtype::Q8_0: return tile_dispatch<bk_q8_0>(n / 32, w, w_stride, nr, a, a_stride, nt, y, y_stride);
        case dtype::IQ4_NL: return tile_dispatch<bk_iq4_nl>(n / 32, w, w_stride, nr, a, a_stride, nt, y, y_stride);
        default: break;
    }
    // K-quants and float weights: one dot product per pair (their blocks are
    // large enough that the per-call overhead does not matter).
    for (int t = 0; t < nt; t++)
        for (int r = 0; r < nr; r++)
            y[t * y_stride + r] = quant_dot_simd(weight, (const uint8_t*)w + r * w_stride,
                                                 (const uint8_t*)a + t * a_stride, n);
}

#else  // no AVX2: the scalar references serve as the "SIMD" paths

bool quant_has_simd(dtype) { return false; }

bool quant_quantize_simd(dtype, const float*, void*, int64_t) { return false; }

float quant_dot_simd(dtype weight, const void* w, const void* a, int64_t n) {
    return quant_dot_ref(weight, w, a, n);
}

void quant_dot_tile(dtype weight, int64_t n, const void* w, size_t w_stride, int nr, const void* a,
                    size_t a_stride, int nt, float* y, size_t y_stride) {
    ZK_ASSERT(nr >= 1 && nr <= k_tile_rows && nt >= 1 && nt <= k_tile_toks);
    for (int t = 0; t < nt; t++)
        for (int r = 0; r < nr; r++)
            y[t * y_stride + r] = quant_dot_ref(weight, (const uint8_t*)w + r * w_stride,
                                                (const uint8_t*)a + t * a_stride, n);
}

#endif

}  // namespace zk

#undef ZK_UNROLL  // this file's own; unity builds join it with others
