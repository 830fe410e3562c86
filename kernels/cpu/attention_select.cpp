// Key-group bounds for decode-time group selection (kernels/attention.h,
// kernel_attention_group_bounds). A KIVI key group's grids bound every key the
// group can hold: channel c lies in [m_c, m_c + L_c s_c] (L_c = 2^bits - 1 on
// the lead channels, 3 on 4-bit keys' 2-bit ones, 1 on a 1-bit tail, 0 on a
// 0-bit channel, which is m_c), so
//   max_k q . k <= sum_c q_c m_c + sum_c max(q_c, 0) L_c s_c
//             = dm sum_c q_c mcode_c + ds sum_c (max(q_c, 0) L_c) scode_c,
// two dot products of the query against the group's grid bytes: in floats
// (kernel_attention_group_bounds, the reference), or in integers against the
// bytes as they lie (kernel_attention_group_estimates, what selection runs:
// 2.4x faster at 32K, bench_attention BM_select_groups). This is Quest's
// page bound (min and max per channel and page), read from grids the cache
// keeps anyway: no extra bytes, 1/group of a score pass.
// With spread b in [0, 1] the second sum weighs (q_c + b |q_c|) / 2 instead of
// max(q_c, 0): the range's centre plus b times its half-width towards the
// query; b = 1 is the bound, b = 0 the centre.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "ggml-like/error.h"
#include "kernels/attention.h"
#include "kernels/cpu/attention_kivi.h"
#include "kernels/cpu/attention_layout.h"

namespace zk {

namespace {

// The integer estimates' query weights rounded to this many levels a side:
// with VNNI dpbusd sums four u8 x s8 products into int32 lanes; without it
// maddubs sums two into int16, which two 255 x 63 products cannot overflow
// (the 0-bit channels' min bytes sit side by side).
#if defined(__AVX512VNNI__) && defined(__AVX512VL__) || defined(__AVXVNNI__)
constexpr bool k_est_vnni = true;
#else
constexpr bool k_est_vnni = false;
#endif
constexpr int k_est_levels = k_est_vnni ? 127 : 63;

#ifdef ZK_SIMD_AVX2
// acc + the 32 products u x s summed in fours into int32 lanes: the score
// loops' kivi_score_add, which with VNNI accumulates in int32 lanes already;
// without it its int16 pairs are widened at once, as a group's sums can pass int16.
inline __m256i est_dot_add(__m256i acc, __m256i u, __m256i s) {
    if constexpr (k_est_vnni) return attn::kivi_score_add(acc, u, s);
    return _mm256_add_epi32(acc, attn::kivi_score_widen(attn::kivi_score_add(_mm256_setzero_si256(), u, s)));
}

// The estimates of groups [g0, g1) for G query heads, group g's grid row at
// rows + g gw (li bytes of interleaved (scale u8, min s8) codes, then nz
// 0-bit channels' min bytes) and its steps (ds, dm as f16) at steps + g
// KV_GRID_STEPS. The coded part turns its mins into u8 (^ 0x80) and each 16
// bytes into [8 scales | 8 mins], so one dot product a head against C_j (the
// weights in that order: [G x lpi]) leaves the scale sums in int32 lanes 0-1
// of each half and the min sums in lanes 2-3; the 0-bit part dots Z_j [G x
// lpz] and joins the min lanes. est_j = ds coef[2j] (sa - off[2j]) + dm
// coef[2j + 1] (sb - off[2j + 1]) (coef, off [2 G rounded up to even]), ds
// and dm times qscale, goes to out[j os + g - g0]. One call runs every group,
// its accumulators in registers: a call a group spent a third of its time on
// the call and on spilling them around the tail's copy. A region's last
// partial 32 bytes are copied out first, inline: the row may end the buffer.
template <int G>
void group_estimates_avx2(const uint8_t* rows, int64_t gw, const uint16_t* steps, int64_t g0, int64_t g1, int li,
                          int nz, const int8_t* C, int lpi, const int8_t* Z, int lpz, const float* coef,
                          const int32_t* off, float qscale, float* out, int64_t os) {
    constexpr int GP = (G + 1) & ~1;
    const __m256i odd = _mm256_set1_epi16((short)0x8000);
    const __m256i split = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15,  //
                                           0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    const int li_full = li & ~31, nz_full = nz & ~31;
    alignas(32) uint8_t last[32];
    auto tail = [&last](const uint8_t* src, int n) {  // n < 32 bytes, zero-padded
        for (int i = 0; i < 32; i++) last[i] = i < n ? src[i] : 0;
        return _mm256_load_si256((const __m256i*)last);
    };
    for (int64_t g = g0; g < g1; g++) {
        const uint8_t* row = rows + g * gw;
        __m256i acc[GP];
        for (int j = 0; j < GP; j++) acc[j] = _mm256_setzero_si256();
        auto coded = [&](__m256i raw, int p) {
            const __m256i u = _mm256_shuffle_epi8(_mm256_xor_si256(raw, odd), split);
            for (int j = 0; j < G; j++)
                acc[j] = est_dot_add(acc[j], u, _mm256_load_si256((const __m256i*)(C + j * lpi + p)));
        };
        int p = 0;
        for (; p < li_full; p += 32) coded(_mm256_loadu_si256((const __m256i*)(row + p)), p);
        if (p < li) coded(tail(row + p, li - p), p);
        if (nz > 0) {
            __m256i accz[G];
            for (int j = 0; j < G; j++) accz[j] = _mm256_setzero_si256();
            const uint8_t* zrow = row + li;
            auto zeros = [&](__m256i raw, int q) {
                const __m256i u = _mm256_xor_si256(raw, _mm256_set1_epi8((char)0x80));
                for (int j = 0; j < G; j++)
                    accz[j] = est_dot_add(accz[j], u, _mm256_load_si256((const __m256i*)(Z + j * lpz + q)));
            };
            int q = 0;
            for (; q < nz_full; q += 32) zeros(_mm256_loadu_si256((const __m256i*)(zrow + q)), q);
            if (q < nz) zeros(tail(zrow + q, nz - q), q);
            // each half's four lanes summed into its min lanes (2-3)
            for (int j = 0; j < G; j++) {
                const __m256i x = _mm256_add_epi32(accz[j], _mm256_shuffle_epi32(accz[j], 0x4E));
                acc[j] = _mm256_add_epi32(acc[j], _mm256_blend_epi32(_mm256_setzero_si256(), x, 0xCC));
            }
        }
        const uint16_t* st = steps + g * KV_GRID_STEPS;
        const float ds = attn::h2f(st[0]) * qscale, dm = attn::h2f(st[1]) * qscale;
        const __m128 dsdm = _mm_setr_ps(ds, dm, ds, dm);
        float* o = out + (g - g0);
        for (int j = 0; j < GP; j += 2) {
            const __m256i h = _mm256_hadd_epi32(acc[j], acc[j + 1]);  // per half: [sa_j, sb_j, sa_j+1, sb_j+1]
            const __m128i s = _mm_sub_epi32(_mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1)),
                                            _mm_loadu_si128((const __m128i*)(off + 2 * j)));
            const __m128 f = _mm_mul_ps(_mm_mul_ps(_mm_cvtepi32_ps(s), _mm_loadu_ps(coef + 2 * j)), dsdm);
            const __m128 e = _mm_hadd_ps(f, f);
            o[j * os] = _mm_cvtss_f32(e);
            if (j + 1 < G) o[(j + 1) * os] = _mm_cvtss_f32(_mm_shuffle_ps(e, e, 1));
        }
    }
}

using estimates_fn = void (*)(const uint8_t*, int64_t, const uint16_t*, int64_t, int64_t, int, int, const int8_t*,
                              int, const int8_t*, int, const float*, const int32_t*, float, float*, int64_t);
constexpr estimates_fn k_estimates[9] = {nullptr,
                                         group_estimates_avx2<1>,
                                         group_estimates_avx2<2>,
                                         group_estimates_avx2<3>,
                                         group_estimates_avx2<4>,
                                         group_estimates_avx2<5>,
                                         group_estimates_avx2<6>,
                                         group_estimates_avx2<7>,
                                         group_estimates_avx2<8>};
#endif

// x rounded to the nearest integer (ties to even, as lrint), inline.
inline int8_t round_i8(float x) {
#ifdef ZK_SIMD_AVX2
    return (int8_t)_mm_cvtss_si32(_mm_set_ss(x));
#else
    return (int8_t)std::lrint(x);
#endif
}

// The per-channel weights of the bounds' second sum, w_jc = (q_jc + spread
// |q_jc|) / 2 x L_c (spread 1: max(q_jc, 0) L_c), for the coded channels c <
// r: w [G x rs]. Checks what both the bounds and the estimates take.
void spread_weights(const attn_kv_view& kv, const attn_q_view& q, float spread, float* w, int64_t rs) {
    ZK_ASSERT(spread >= 0.0f && spread <= 1.0f);
    ZK_ASSERT(kv.k.layout == KV_LAYOUT_Q4 || kv.k.layout == KV_LAYOUT_Q2);
    const int bits = kv.k.layout == KV_LAYOUT_Q4 ? 4 : 2;
    const int r = kv.r_k - kv.k.zero, hm = r - kv.k.tail, h = hm - kv.k.mid;
    for (int j = 0; j < q.n_group; j++) {
        const float* qj = q.q + j * q.q_head_stride;
        for (int c = 0; c < r; c++)
            w[j * rs + c] = 0.5f * (qj[c] + spread * std::fabs(qj[c])) *
                            (c < h ? (float)((1 << bits) - 1) : c < hm ? 3.0f : 1.0f);
    }
}

}  // namespace

int64_t kernel_attention_select_scratch(int n_group, int r_k) {
    // the bounds' weights and decoded grid, then the estimates' query bytes (with their padding)
    return (int64_t)(n_group + 2) * (r_k + 8) + ((int64_t)n_group * (2 * r_k + 64) + 64) / 4;
}

void kernel_attention_group_bounds(const attn_kv_view& kv, const attn_q_view& q, int64_t g0, int64_t g1,
                                   float spread, float* bound, float* scratch) {
    const int zero = kv.k.zero, gw = kv_key_grid_words(kv.r_k, zero), G = q.n_group, r = kv.r_k - zero;
    const int64_t rs = kv.r_k + 8;  // scratch row stride
    float* w = scratch;             // [G x rs]
    float* mf = scratch + G * rs;   // [rs] the group's min codes (the 0-bit channels' after the coded ones)
    float* sf = mf + rs;            // [rs] its scale codes (coded channels only)
    spread_weights(kv, q, spread, w, rs);
    for (int64_t g = g0; g < g1; g++) {
        const uint16_t* grid = kv.k.scale + g * gw;
        const uint16_t* step = kv.k.min + g * KV_GRID_STEPS;
        for (int c = 0; c < r; c++) sf[c] = (float)(grid[c] & 0xff), mf[c] = (float)(int8_t)(grid[c] >> 8);
        const int8_t* zb = kv_key_zero_mins(grid, kv.r_k, zero);
        for (int i = 0; i < zero; i++) mf[r + i] = (float)zb[i];
        const float ds = attn::h2f(step[0]) * q.scale, dm = attn::h2f(step[1]) * q.scale;
        for (int j = 0; j < G; j++)
            bound[j * (g1 - g0) + (g - g0)] =
                dm * simd::dot_f32(q.q + j * q.q_head_stride, mf, kv.r_k) + ds * simd::dot_f32(w + j * rs, sf, r);
    }
}

void kernel_attention_group_estimates(const attn_kv_view& kv, const attn_q_view& q, int64_t g0, int64_t g1,
                                      float spread, float* est, float* scratch) {
    const int zero = kv.k.zero, gw = kv_key_grid_words(kv.r_k, zero), G = q.n_group, r = kv.r_k - zero;
    ZK_ASSERT(G <= 64);
    const int li = 2 * r, lpi = (li + 31) / 32 * 32, lpz = (zero + 31) / 32 * 32;
    const int64_t rs = kv.r_k + 8;
    float* w = scratch;  // [G x rs]
    spread_weights(kv, q, spread, w, rs);
    // The query bytes: C_j over the coded channels in the order the kernel
    // reads them (per 16 grid bytes, i.e. 8 channels: their 8 weights w, then
    // their 8 query values), Z_j the query over the 0-bit channels; each head
    // rounded with one step for w and one for q. The mins read as u8 (+128),
    // which off takes back.
    int8_t* C = (int8_t*)(((uintptr_t)(scratch + G * rs) + 31) & ~(uintptr_t)31);  // [G x lpi]
    int8_t* Z = C + (int64_t)G * lpi;                                                 // [G x lpz]
    std::memset(C, 0, (size_t)G * (lpi + lpz));
    float coef[130] = {};
    int32_t off[130] = {};
    for (int j = 0; j < G; j++) {
        const float* qj = q.q + j * q.q_head_stride;
        const float* wj = w + j * rs;
        float wa = 0, qa = 0;
        for (int c = 0; c < r; c++) wa = std::max(wa, std::fabs(wj[c]));
        for (int c = 0; c < kv.r_k; c++) qa = std::max(qa, std::fabs(qj[c]));
        coef[2 * j] = wa / k_est_levels, coef[2 * j + 1] = qa / k_est_levels;
        const float ia = wa > 0 ? k_est_levels / wa : 0.0f, ib = qa > 0 ? k_est_levels / qa : 0.0f;
        int32_t sum_b = 0;
        for (int c = 0; c < kv.r_k; c++) {
            const int8_t b = round_i8(qj[c] * ib);
            sum_b += b;
            if (c < r) {
                int8_t* cj = C + (int64_t)j * lpi + (c / 8) * 16 + c % 8;
                cj[0] = round_i8(wj[c] * ia);
                cj[8] = b;
            } else {
                Z[(int64_t)j * lpz + (c - r)] = b;
            }
        }
        off[2 * j + 1] = 128 * sum_b;
    }
#ifdef ZK_SIMD_AVX2
    if (G < 9) {
        k_estimates[G]((const uint8_t*)kv.k.scale, 2 * (int64_t)gw, kv.k.min, g0, g1, li, zero, C, lpi, Z, lpz, coef,
                       off, q.scale, est, g1 - g0);
        return;
    }
#endif
    for (int64_t g = g0; g < g1; g++) {
        const uint8_t* row = (const uint8_t*)(kv.k.scale + g * gw);
        const uint16_t* step = kv.k.min + g * KV_GRID_STEPS;
        const float ds = attn::h2f(step[0]) * q.scale, dm = attn::h2f(step[1]) * q.scale;
        float* out = est + (g - g0);  // head j at out[j (g1 - g0)]
        for (int j = 0; j < G; j++) {
            const int8_t* cj = C + (int64_t)j * lpi;
            const int8_t* zj = Z + (int64_t)j * lpz;
            int32_t sa = 0, sb = 0;
            for (int c = 0; c < r; c++) {
                const int p = (c / 8) * 16 + c % 8;
                sa += row[2 * c] * cj[p];
                sb += (row[2 * c + 1] ^ 0x80) * cj[p + 8];
            }
            for (int i = 0; i < zero; i++) sb += (row[li + i] ^ 0x80) * zj[i];
            out[j * (g1 - g0)] = ds * coef[2 * j] * (float)sa + dm * coef[2 * j + 1] * (float)(sb - off[2 * j + 1]);
        }
    }
}

}  // namespace zk
