// SIMD kernels for the packed K-quant layouts of quant_pack.h: one row group
// (8 rows, one int32 lane each) times up to 4 tokens, and the activation
// quantizer. x86 AVX2 + FMA + F16C; with AVX512-VNNI (+VL) or AVX-VNNI the
// 4-byte dot products are one dpbusd each.
//
// The kernels are written once over a "dot policy" that says how 4-byte
// products are summed within a sub-block and then scaled per row:
//   dot_vnni: int32 sums (dpbusd), scaled by a vpmulld with the row scales;
//   dot_avx2: int16 sums of maddubs products (as many chunks as cannot
//             overflow), scaled and widened by one vpmaddwd with (sc, sc) pairs.
// Both give the exact integer sums of the scalar references; per token the
// arithmetic is the same whatever the tile's token count, so a token's outputs
// never depend on which tile it was in (decode vs batched decode).
#include "ggml-like/quant_tile_k.h"

#include <cstring>

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

inline __m256i bcast32(const void* p) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

#if (defined(__AVX512VNNI__) && defined(__AVX512VL__)) || defined(__AVXVNNI__)
struct dot_policy {
    static constexpr bool int32_sums = true;
    using sum = __m256i;  // int32 per row
    static constexpr int max_chunks_4bit = 8;
    static constexpr int max_chunks_6bit = 4;
    static sum zero() { return _mm256_setzero_si256(); }
    static sum add(sum s, __m256i w, __m256i a) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
        return _mm256_dpbusd_epi32(s, w, a);
#else
        return _mm256_dpbusd_avx_epi32(s, w, a);
#endif
    }
    // row scales: one int32 per row
    static __m256i scale_u8(const uint8_t* p) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)p)); }
    static __m256i scale_s8(const int8_t* p) { return _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)p)); }
    static __m256i scaled(sum s, __m256i sc) { return _mm256_mullo_epi32(s, sc); }
};
#else
struct dot_policy {
    static constexpr bool int32_sums = false;
    using sum = __m256i;  // int16 pairs per row
    // maddubs pairs: 4-bit codes 2 * 15 * 128 = 3840 per int16, 8 chunks 30720;
    // 6-bit codes 2 * 63 * 128 = 16128, 2 chunks 32256.
    static constexpr int max_chunks_4bit = 8;
    static constexpr int max_chunks_6bit = 2;
    static sum zero() { return _mm256_setzero_si256(); }
    static sum add(sum s, __m256i w, __m256i a) { return _mm256_add_epi16(s, _mm256_maddubs_epi16(w, a)); }
    // row scales: (sc, sc) int16 pairs per row
    static __m256i scale_u8(const uint8_t* p) {
        const __m256i b = _mm256_set1_epi64x((long long)load64(p));
        const __m256i idx = _mm256_setr_epi8(0, -1, 0, -1, 1, -1, 1, -1, 2, -1, 2, -1, 3, -1, 3, -1,  //
                                             4, -1, 4, -1, 5, -1, 5, -1, 6, -1, 6, -1, 7, -1, 7, -1);
        return _mm256_shuffle_epi8(b, idx);
    }
    static __m256i scale_s8(const int8_t* p) {
        const __m256i x = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)p));
        return _mm256_blend_epi16(x, _mm256_slli_epi32(x, 16), 0xAA);
    }
    static __m256i scaled(sum s, __m256i sc) { return _mm256_madd_epi16(s, sc); }
    static uint64_t load64(const uint8_t* p) {
        uint64_t v;
        std::memcpy(&v, p, 8);
        return v;
    }
};
#endif
using P = dot_policy;

inline __m256 f16x8(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p)); }

// 8 outputs of a row group for one token: all 8 rows, or the first nr.
inline void store_rows(float* y, __m256 v, int nr) {
    if (nr == k_pack_rows) {
        _mm256_storeu_ps(y, v);
        return;
    }
    alignas(32) float tmp[k_pack_rows];
    _mm256_store_ps(tmp, v);
    for (int r = 0; r < nr; r++) y[r] = tmp[r];
}

// Decode streams each weight from DRAM once per step: touch the block
// k_pf_blocks ahead (the prefetch address runs ahead of the group pointer by
// the caller's distance; here only one block's lines per block step).
template <size_t Bytes>
inline void prefetch_block(uintptr_t p) {
    ZK_UNROLL for (size_t k = 0; k < Bytes; k += 64) _mm_prefetch((const char*)(p + k), _MM_HINT_T0);
}

// ---------------------------------------------------------------- Q4_K

template <int T>
void tile_q4_K(int64_t nb, const block_q4_Kx8* w, const uint8_t* a, size_t as, float* y, size_t ys, int nr,
               uintptr_t pf) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256 acc[T];
    ZK_UNROLL for (int t = 0; t < T; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t ib = 0; ib < nb; ib++) {
        const block_q4_Kx8& p = w[ib];
        if (T == 1 && pf) prefetch_block<sizeof(block_q4_Kx8)>(pf + ib * sizeof(block_q4_Kx8));
        const block_q8_Kp* x[T];
        ZK_UNROLL for (int t = 0; t < T; t++) x[t] = (const block_q8_Kp*)(a + t * as) + ib;
        __m256i isum[T], msum[T];
        ZK_UNROLL for (int t = 0; t < T; t++) isum[t] = msum[t] = _mm256_setzero_si256();
        ZK_UNROLL for (int k = 0; k < 4; k++) {
            // sub-blocks 2k (low nibbles) and 2k + 1 (high), 8 chunks of 4 each
            P::sum lo[T], hi[T];
            ZK_UNROLL for (int t = 0; t < T; t++) lo[t] = hi[t] = P::zero();
            ZK_UNROLL for (int i = 0; i < 8; i++) {
                const __m256i q = _mm256_loadu_si256((const __m256i*)p.qs[k][i]);
                const __m256i wl = _mm256_and_si256(q, m4);
                const __m256i wh = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
                ZK_UNROLL for (int t = 0; t < T; t++) {
                    lo[t] = P::add(lo[t], wl, bcast32(x[t]->qs + 64 * k + 4 * i));
                    hi[t] = P::add(hi[t], wh, bcast32(x[t]->qs + 64 * k + 32 + 4 * i));
                }
            }
            const __m256i sl = P::scale_u8(p.sc[2 * k]), sh = P::scale_u8(p.sc[2 * k + 1]);
            ZK_UNROLL for (int t = 0; t < T; t++)
                isum[t] = _mm256_add_epi32(isum[t], _mm256_add_epi32(P::scaled(lo[t], sl), P::scaled(hi[t], sh)));
        }
        // mins: lane r = m[r][2q] s32[2q] + m[r][2q+1] s32[2q+1]
        ZK_UNROLL for (int q = 0; q < 4; q++) {
            const __m256i m16 = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i*)p.m[q]));
            ZK_UNROLL for (int t = 0; t < T; t++)
                msum[t] = _mm256_add_epi32(msum[t], _mm256_madd_epi16(m16, bcast32(x[t]->s32 + 2 * q)));
        }
        const __m256 dw = f16x8(p.d), dm = f16x8(p.dmin);
        ZK_UNROLL for (int t = 0; t < T; t++) {
            const __m256 da = _mm256_set1_ps(x[t]->d);
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), _mm256_mul_ps(dw, da), acc[t]);
            acc[t] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(msum[t]), _mm256_mul_ps(dm, da), acc[t]);
        }
    }
    ZK_UNROLL for (int t = 0; t < T; t++) store_rows(y + t * ys, acc[t], nr);
}

// ---------------------------------------------------------------- Q6_K

template <int T>
void tile_q6_K(int64_t nb, const block_q6_Kx8* w, const uint8_t* a, size_t as, float* y, size_t ys, int nr,
               uintptr_t pf) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i m2 = _mm256_set1_epi8(0x03), m2s2 = _mm256_set1_epi8(0x0C), m2s4 = _mm256_set1_epi8(0x30);
    __m256 acc[T];
    ZK_UNROLL for (int t = 0; t < T; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t ib = 0; ib < nb; ib++) {
        const block_q6_Kx8& p = w[ib];
        if (T == 1 && pf) prefetch_block<sizeof(block_q6_Kx8)>(pf + ib * sizeof(block_q6_Kx8));
        const block_q8_Kp* x[T];
        ZK_UNROLL for (int t = 0; t < T; t++) x[t] = (const block_q8_Kp*)(a + t * as) + ib;
        __m256i isum[T];
        ZK_UNROLL for (int t = 0; t < T; t++) isum[t] = _mm256_setzero_si256();
        for (int n = 0; n < 16; n++) {
            // the 4 chunks of group n: 6-bit codes 0..63
            const __m256i h = _mm256_loadu_si256((const __m256i*)p.qh[n]);
            const __m256i l0 = _mm256_loadu_si256((const __m256i*)p.ql[2 * n]);
            const __m256i l1 = _mm256_loadu_si256((const __m256i*)p.ql[2 * n + 1]);
            const __m256i c[4] = {
                _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_slli_epi16(_mm256_and_si256(h, m2), 4)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                                _mm256_slli_epi16(_mm256_and_si256(h, m2s2), 2)),
                _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(h, m2s4)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                _mm256_and_si256(_mm256_srli_epi16(h, 2), m2s4)),
            };
            const __m256i sc = P::scale_s8(p.sc[n]);
            ZK_UNROLL for (int t = 0; t < T; t++) {
                const int8_t* xq = x[t]->qs + 16 * n;
                if constexpr (P::int32_sums) {
                    // start from -32 * (sum of the group's activations): the codes' offset
                    P::sum s = _mm256_set1_epi32(x[t]->n16[n]);
                    ZK_UNROLL for (int j = 0; j < 4; j++) s = P::add(s, c[j], bcast32(xq + 4 * j));
                    isum[t] = _mm256_add_epi32(isum[t], P::scaled(s, sc));
                } else {
                    ZK_UNROLL for (int j = 0; j < 4; j += P::max_chunks_6bit) {
                        P::sum s = P::zero();
                        ZK_UNROLL for (int u = 0; u < P::max_chunks_6bit; u++)
                            s = P::add(s, c[j + u], bcast32(xq + 4 * (j + u)));
                        isum[t] = _mm256_add_epi32(isum[t], P::scaled(s, sc));
                    }
                }
            }
        }
        if constexpr (!P::int32_sums) {
            // the offset: isum -= 32 * sum_n sc[n][r] s16[n], two groups per vpmaddwd
            ZK_UNROLL for (int q = 0; q < 8; q++) {
                const __m128i lo = _mm_loadl_epi64((const __m128i*)p.sc[2 * q]);
                const __m128i hi = _mm_loadl_epi64((const __m128i*)p.sc[2 * q + 1]);
                const __m256i pairs = _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(lo, hi));
                ZK_UNROLL for (int t = 0; t < T; t++)
                    isum[t] = _mm256_sub_epi32(isum[t],
                                               _mm256_slli_epi32(_mm256_madd_epi16(pairs, bcast32(x[t]->s16 + 2 * q)), 5));
            }
        }
        const __m256 dw = f16x8(p.d);
        ZK_UNROLL for (int t = 0; t < T; t++)
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), _mm256_mul_ps(dw, _mm256_set1_ps(x[t]->d)), acc[t]);
    }
    ZK_UNROLL for (int t = 0; t < T; t++) store_rows(y + t * ys, acc[t], nr);
}

using tile_fn = void (*)(int64_t, const void*, const uint8_t*, size_t, float*, size_t, int, uintptr_t);

template <class B, void (*F)(int64_t, const B*, const uint8_t*, size_t, float*, size_t, int, uintptr_t)>
void tile_erased(int64_t nb, const void* w, const uint8_t* a, size_t as, float* y, size_t ys, int nr, uintptr_t pf) {
    F(nb, (const B*)w, a, as, y, ys, nr, pf);
}

const tile_fn k_q4_K_fns[k_pack_toks] = {
    tile_erased<block_q4_Kx8, tile_q4_K<1>>, tile_erased<block_q4_Kx8, tile_q4_K<2>>,
    tile_erased<block_q4_Kx8, tile_q4_K<3>>, tile_erased<block_q4_Kx8, tile_q4_K<4>>};
const tile_fn k_q6_K_fns[k_pack_toks] = {
    tile_erased<block_q6_Kx8, tile_q6_K<1>>, tile_erased<block_q6_Kx8, tile_q6_K<2>>,
    tile_erased<block_q6_Kx8, tile_q6_K<3>>, tile_erased<block_q6_Kx8, tile_q6_K<4>>};

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

bool quant_tile_k_has_simd() { return true; }

bool quant_tile_k_run(dtype t, int64_t nb, const void* group, int nr, const void* a, size_t a_stride, int nt,
                      float* y, size_t y_stride, const void* prefetch) {
    const tile_fn* fns = t == dtype::Q4_K ? k_q4_K_fns : t == dtype::Q6_K ? k_q6_K_fns : nullptr;
    if (!fns) return false;
    fns[nt - 1](nb, group, (const uint8_t*)a, a_stride, y, y_stride, nr, (uintptr_t)prefetch);
    return true;
}

bool quant_tile_k_quantize(const float* x, void* dst, int64_t n) {
    block_q8_Kp* b = (block_q8_Kp*)dst;
    for (int64_t i = 0; i < n / 256; i++) quantize_block(x + 256 * i, b[i]);
    return true;
}

#else  // no AVX2: the callers use the scalar references

bool quant_tile_k_has_simd() { return false; }
bool quant_tile_k_run(dtype, int64_t, const void*, int, const void*, size_t, int, float*, size_t, const void*) {
    return false;
}
bool quant_tile_k_quantize(const float*, void*, int64_t) { return false; }

#endif

}  // namespace zk
