// Key-group bounds for decode-time group selection (kernels/attention.h,
// kernel_attention_group_bounds). A KIVI key group's grids bound every key the
// group can hold: channel c lies in [m_c, m_c + L_c s_c] (L_c = 2^bits - 1 on
// the lead channels, 1 on a 1-bit tail, 0 on a 0-bit channel, which is m_c), so
//   max_k q . k <= sum_c q_c m_c + sum_c max(q_c, 0) L_c s_c
//             = dm sum_c q_c mcode_c + ds sum_c (max(q_c, 0) L_c) scode_c,
// two dot products of the query against the group's grid bytes, as floats.
// This is Quest's page bound (min and max per channel and page), read from
// grids the cache keeps anyway: no extra bytes, 1/group of a score pass.
// With spread b in [0, 1] the second sum weighs (q_c + b |q_c|) / 2 instead of
// max(q_c, 0): the range's centre plus b times its half-width towards the
// query; b = 1 is the bound, b = 0 the centre.
#include <algorithm>
#include <cmath>

#include "ggml-like/error.h"
#include "kernels/attention.h"
#include "kernels/cpu/attention_layout.h"

namespace zk {

namespace {

#ifdef ZK_SIMD_AVX2
// One group's estimates for G query heads in one pass over the first r8
// channels of its grid (r8 a multiple of 8): the codes decoded 8 channels at a
// time and scaled by the group's steps, each head's two sums in one
// accumulator. Twelve separate dot products with their reductions cost twice
// this at G = 6 (bench_attention BM_select_groups).
template <int G>
void group_estimates_avx2(const float* q, int64_t qs, const float* w, int64_t rs, const uint16_t* grid, int r8,
                          float ds, float dm, float* out) {
    __m256 acc[G];
    for (int j = 0; j < G; j++) acc[j] = _mm256_setzero_ps();
    const __m128i lo8 = _mm_set1_epi16(0xff);
    const __m256 vds = _mm256_set1_ps(ds), vdm = _mm256_set1_ps(dm);
    for (int c = 0; c < r8; c += 8) {
        const __m128i g16 = _mm_loadu_si128((const __m128i*)(grid + c));
        const __m256 sv = _mm256_mul_ps(vds, _mm256_cvtepi32_ps(_mm256_cvtepu16_epi32(_mm_and_si128(g16, lo8))));
        const __m256 mv = _mm256_mul_ps(vdm, _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm_srai_epi16(g16, 8))));
        for (int j = 0; j < G; j++)
            acc[j] = _mm256_fmadd_ps(_mm256_loadu_ps(w + j * rs + c), sv,
                                     _mm256_fmadd_ps(_mm256_loadu_ps(q + j * qs + c), mv, acc[j]));
    }
    for (int j = 0; j < G; j++) out[j] = simd::hsum(acc[j]);
}

using estimates_fn = void (*)(const float*, int64_t, const float*, int64_t, const uint16_t*, int, float, float, float*);
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

}  // namespace

int64_t kernel_attention_select_scratch(int n_group, int r_k) { return (int64_t)(n_group + 2) * (r_k + 8); }

void kernel_attention_group_bounds(const attn_kv_view& kv, const attn_q_view& q, int64_t g0, int64_t g1,
                                   float spread, float* bound, float* scratch) {
    ZK_ASSERT(spread >= 0.0f && spread <= 1.0f);
    ZK_ASSERT(kv.k.layout == KV_LAYOUT_Q4 || kv.k.layout == KV_LAYOUT_Q2);
    const int bits = kv.k.layout == KV_LAYOUT_Q4 ? 4 : 2;
    const int zero = kv.k.zero, gw = kv_key_grid_words(kv.r_k, zero);
    const int G = q.n_group, r = kv.r_k - zero, h = r - kv.k.tail;
    const int64_t rs = kv.r_k + 8;  // scratch row stride
    // w_j = (q_j + spread |q_j|) / 2 L (spread 1: max(q_j, 0) L): per head, once for every group
    float* w = scratch;              // [G x rs]
    float* mf = scratch + G * rs;    // [rs] the group's min codes (the 0-bit channels' after the coded ones)
    float* sf = mf + rs;             // [rs] its scale codes (coded channels only)
    for (int j = 0; j < G; j++) {
        const float* qj = q.q + j * q.q_head_stride;
        for (int c = 0; c < r; c++)
            w[j * rs + c] = 0.5f * (qj[c] + spread * std::fabs(qj[c])) * (c < h ? (float)((1 << bits) - 1) : 1.0f);
    }
#ifdef ZK_SIMD_AVX2
    if (G < 9) {
        // the first r8 coded channels fused; the rest (past a multiple of 8, the
        // 0-bit channels' means) one at a time
        const int r8 = r & ~7;
        for (int64_t g = g0; g < g1; g++) {
            const uint16_t* grid = kv.k.scale + g * gw;
            const uint16_t* step = kv.k.min + g * KV_GRID_STEPS;
            const float ds = attn::h2f(step[0]) * q.scale, dm = attn::h2f(step[1]) * q.scale;
            float* out = bound + (g - g0) * G;
            k_estimates[G](q.q, q.q_head_stride, w, rs, grid, r8, ds, dm, out);
            const int8_t* zb = kv_key_zero_mins(grid, kv.r_k, zero);
            for (int j = 0; j < G; j++) {
                const float* qj = q.q + j * q.q_head_stride;
                float m = 0, sc = 0;
                for (int c = r8; c < r; c++)
                    m += qj[c] * (float)(int8_t)(grid[c] >> 8), sc += w[j * rs + c] * (float)(grid[c] & 0xff);
                for (int i = 0; i < zero; i++) m += qj[r + i] * (float)zb[i];
                out[j] += dm * m + ds * sc;
            }
        }
        return;
    }
#endif
    for (int64_t g = g0; g < g1; g++) {
        const uint16_t* grid = kv.k.scale + g * gw;
        const uint16_t* step = kv.k.min + g * KV_GRID_STEPS;
        int c = 0;
#ifdef ZK_SIMD_AVX2
        const __m128i lo8 = _mm_set1_epi16(0xff);
        for (; c + 8 <= r; c += 8) {
            const __m128i g16 = _mm_loadu_si128((const __m128i*)(grid + c));
            _mm256_storeu_ps(sf + c, _mm256_cvtepi32_ps(_mm256_cvtepu16_epi32(_mm_and_si128(g16, lo8))));
            _mm256_storeu_ps(mf + c, _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm_srai_epi16(g16, 8))));
        }
#endif
        for (; c < r; c++) sf[c] = (float)(grid[c] & 0xff), mf[c] = (float)(int8_t)(grid[c] >> 8);
        const int8_t* zb = kv_key_zero_mins(grid, kv.r_k, zero);
        for (int i = 0; i < zero; i++) mf[r + i] = (float)zb[i];
        const float ds = attn::h2f(step[0]) * q.scale, dm = attn::h2f(step[1]) * q.scale;
        for (int j = 0; j < G; j++)
            bound[(g - g0) * G + j] = dm * simd::dot_f32(q.q + j * q.q_head_stride, mf, kv.r_k) +
                                      ds * simd::dot_f32(w + j * rs, sf, r);
    }
}

}  // namespace zk
