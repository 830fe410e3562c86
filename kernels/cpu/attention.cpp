#include "kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "ggml-like/error.h"
#include "kernels/cpu/simd.h"

namespace zk {

namespace {

// ---- row decoders: one cached row to f32 in scratch (never a whole cache) ----

inline float h2f(uint16_t h) {
#ifdef ZK_SIMD_AVX2
    return _cvtsh_ss(h);
#else
    return fp16_to_fp32(h);
#endif
}

// Row s of a full-precision [n x r] block as f32 (a pointer into the block for
// F32, a conversion into tmp for F16).
inline const float* kv_row(dtype t, const void* base, int64_t s, int r, float* tmp) {
    if (t == dtype::F32) return (const float*)base + s * r;
    simd::f16_to_f32_row((const uint16_t*)base + s * r, tmp, r);
    return tmp;
}

// r 4-bit codes (low nibble first) to floats 0..15.
inline void q4_codes_to_f32(const uint8_t* src, int r, float* dst) {
    int i = 0;
#ifdef ZK_SIMD_AVX2
    const __m128i mask = _mm_set1_epi8(0x0F);
    for (; i + 16 <= r; i += 16) {
        const __m128i b = _mm_loadl_epi64((const __m128i*)(src + i / 2));
        const __m128i lo = _mm_and_si128(b, mask);
        const __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), mask);
        const __m128i x = _mm_unpacklo_epi8(lo, hi);  // 16 codes in channel order
        _mm256_storeu_ps(dst + i, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(x)));
        _mm256_storeu_ps(dst + i + 8, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(x, 8))));
    }
#endif
    for (; i < r; i++) dst[i] = (float)((src[i / 2] >> ((i & 1) * 4)) & 0x0F);
}

// int8 codes times one scale per block of KV_Q8_BLOCK channels.
inline void q8_row_to_f32(const int8_t* src, const uint16_t* d, int r, float* dst) {
    for (int b0 = 0, bi = 0; b0 < r; b0 += KV_Q8_BLOCK, bi++) {
        const int n = std::min(KV_Q8_BLOCK, r - b0);
        const float sc = h2f(d[bi]);
        int i = 0;
#ifdef ZK_SIMD_AVX2
        const __m256 vs = _mm256_set1_ps(sc);
        for (; i + 8 <= n; i += 8) {
            const __m128i c = _mm_loadl_epi64((const __m128i*)(src + b0 + i));
            _mm256_storeu_ps(dst + b0 + i, _mm256_mul_ps(vs, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(c))));
        }
#endif
        for (; i < n; i++) dst[b0 + i] = sc * (float)src[b0 + i];
    }
}

struct scratch_layout {
    float* sc;    // [G x n] scores, then probabilities
    float* krow;  // [r_k]
    float* vrow;  // [r_v]
    float* qs;    // [G x r_k] folded query (Q4 keys)
    float* bias;  // [G]
    float* qb;    // [G x rank] q . B[:, i] (GEAR keys), then p^T A (GEAR values)
    float* msum;  // [G x value blocks] sum of p m_b (Q4 values)
};

scratch_layout scratch_split(float* p, int G, int64_t n, int r_k, int r_v, int rank) {
    scratch_layout s;
    s.sc = p;
    s.krow = s.sc + G * n;
    s.vrow = s.krow + r_k;
    s.qs = s.vrow + r_v;
    s.bias = s.qs + (int64_t)G * r_k;
    s.qb = s.bias + G;
    s.msum = s.qb + (int64_t)G * rank;
    return s;
}

// ---- scores ----

// The group holding quantized slot s.
inline int64_t group_of(const attn_kv_view& kv, int64_t s) {
    return std::upper_bound(kv.group_start, kv.group_start + kv.n_groups + 1, (int32_t)s) - kv.group_start - 1;
}

// Q4 keys of slots [a, b) (inside the quantized part) into sc (index s - s0),
// unscaled. Per group: the folded query q_c s_c and bias sum_c q_c m_c once,
// then one nibble row per slot shared by the G query heads.
void scores_q4(const attn_kv_view& kv, int64_t a, int64_t b, int64_t s0, int64_t n, const float* qt,
               const attn_q_view& q, scratch_layout& w) {
    const int G = q.n_group, r = kv.r_k, gs = kv.group, rb = kv_q4_row_bytes(r);
    const uint8_t* codes = (const uint8_t*)kv.kq;
    const attn_gear_view& gr = kv.gear_k;
    for (int64_t g = group_of(kv, a); g < kv.n_groups && kv.group_start[g] < b; g++) {
        const int64_t g0 = kv.group_start[g];
        const int64_t ga = std::max<int64_t>(a, g0), gb = std::min<int64_t>(b, kv.group_start[g + 1]);
        const uint16_t* scl = kv.ks + g * r;
        const uint16_t* mn = kv.km + g * r;
        for (int c = 0; c < r; c++) w.krow[c] = h2f(scl[c]);
        for (int j = 0; j < G; j++) {
            const float* qj = qt + j * q.q_head_stride;
            float bias = 0;
            for (int c = 0; c < r; c++) {
                w.qs[j * r + c] = qj[c] * w.krow[c];
                bias += qj[c] * h2f(mn[c]);
            }
            w.bias[j] = bias;
        }
        for (int64_t s = ga; s < gb; s++) {
            q4_codes_to_f32(codes + s * rb, r, w.krow);
            for (int j = 0; j < G; j++) w.sc[j * n + s - s0] = simd::dot_f32(w.qs + j * r, w.krow, r) + w.bias[j];
        }
        if (gr.rank == 0) continue;
        const int k = gr.rank;
        const uint16_t* B = gr.b + g * r * k;
        const uint16_t* A = gr.a + g * gs * k;
        for (int j = 0; j < G; j++) {
            const float* qj = qt + j * q.q_head_stride;
            for (int i = 0; i < k; i++) {
                float d = 0;
                for (int c = 0; c < r; c++) d += qj[c] * h2f(B[c * k + i]);
                w.qb[j * k + i] = d;
            }
        }
        for (int64_t s = ga; s < gb; s++) {
            const uint16_t* At = A + (s - g0) * k;
            for (int j = 0; j < G; j++) {
                float d = 0;
                for (int i = 0; i < k; i++) d += h2f(At[i]) * w.qb[j * k + i];
                w.sc[j * n + s - s0] += d;
            }
        }
        const uint16_t* oi = gr.out_idx + g * gr.n_out;
        const uint16_t* ov = gr.out_val + g * gr.n_out;
        for (int o = 0; o < gr.n_out && oi[o] != KV_GEAR_NONE; o++) {
            const int64_t s = g0 + oi[o] / r;
            if (s < ga || s >= gb) continue;
            const int c = oi[o] % r;
            const float val = h2f(ov[o]);
            for (int j = 0; j < G; j++) w.sc[j * n + s - s0] += qt[j * q.q_head_stride + c] * val;
        }
    }
}

// Unscaled scores of slots [s0, e) into sc.
void scores_all(const attn_kv_view& kv, int64_t s0, int64_t e, int64_t n, const float* qt, const attn_q_view& q,
                scratch_layout& w) {
    const int G = q.n_group, r = kv.r_k;
    const int64_t qe = std::min(e, kv.n_quant);
    if (kv.quant == KV_QUANT_Q8) {
        const int nb = kv_n_blocks(r, KV_Q8_BLOCK);
        for (int64_t s = s0; s < qe; s++) {
            q8_row_to_f32((const int8_t*)kv.kq + s * r, kv.ks + s * nb, r, w.krow);
            for (int j = 0; j < G; j++) w.sc[j * n + s - s0] = simd::dot_f32(qt + j * q.q_head_stride, w.krow, r);
        }
    } else if (kv.quant == KV_QUANT_Q4 && s0 < qe) {
        scores_q4(kv, s0, qe, s0, n, qt, q, w);
    }
    for (int64_t s = std::max(s0, kv.n_quant); s < e; s++) {
        const float* kr = kv_row(kv.type, kv.k, s - kv.n_quant, r, w.krow);
        for (int j = 0; j < G; j++) w.sc[j * n + s - s0] = simd::dot_f32(qt + j * q.q_head_stride, kr, r);
    }
}

// ---- values ----

// GEAR value correction of slots [a, b) in group g: acc_j += (p_j^T A) B^T + sparse.
void values_gear_q4(const attn_kv_view& kv, int64_t g, int64_t a, int64_t b, int64_t s0, int64_t n, int G,
                    float* acc, scratch_layout& w) {
    const attn_gear_view& gr = kv.gear_v;
    const int k = gr.rank, r = kv.r_v, gs = kv.group;
    const int64_t g0 = kv.group_start[g];
    const uint16_t* A = gr.a + g * gs * k;
    const uint16_t* B = gr.b + g * r * k;
    for (int j = 0; j < G * k; j++) w.qb[j] = 0;
    for (int64_t s = a; s < b; s++) {
        const uint16_t* At = A + (s - g0) * k;
        for (int i = 0; i < k; i++) {
            const float av = h2f(At[i]);
            for (int j = 0; j < G; j++) w.qb[j * k + i] += w.sc[j * n + s - s0] * av;
        }
    }
    for (int c = 0; c < r; c++)
        for (int i = 0; i < k; i++) {
            const float bv = h2f(B[c * k + i]);
            for (int j = 0; j < G; j++) acc[j * r + c] += w.qb[j * k + i] * bv;
        }
    const uint16_t* oi = gr.out_idx + g * gr.n_out;
    const uint16_t* ov = gr.out_val + g * gr.n_out;
    for (int o = 0; o < gr.n_out && oi[o] != KV_GEAR_NONE; o++) {
        const int64_t s = g0 + oi[o] / r;
        if (s < a || s >= b) continue;
        const int c = oi[o] % r;
        const float val = h2f(ov[o]);
        for (int j = 0; j < G; j++) acc[j * r + c] += w.sc[j * n + s - s0] * val;
    }
}

// acc_j += sum over slots [s0, e) of p_j(s) v(s), p in sc.
void values_all(const attn_kv_view& kv, int64_t s0, int64_t e, int64_t n, int G, float* acc, scratch_layout& w) {
    const int r = kv.r_v;
    const int64_t qe = std::min(e, kv.n_quant);
    if (kv.quant == KV_QUANT_Q8) {
        const int nb = kv_n_blocks(r, KV_Q8_BLOCK);
        for (int64_t s = s0; s < qe; s++) {
            q8_row_to_f32((const int8_t*)kv.vq + s * r, kv.vs + s * nb, r, w.vrow);
            for (int j = 0; j < G; j++) simd::axpy_f32(w.sc[j * n + s - s0], w.vrow, acc + j * r, r);
        }
    } else if (kv.quant == KV_QUANT_Q4 && s0 < qe) {
        // p (s_b code + m_b) = (p s_b) code + p m_b: the codes are converted once
        // per slot and the min terms summed per block, added once at the end.
        const int nb = kv_n_blocks(r, KV_Q4_VBLOCK), rb = kv_q4_row_bytes(r);
        for (int i = 0; i < G * nb; i++) w.msum[i] = 0;
        for (int64_t s = s0; s < qe; s++) {
            q4_codes_to_f32((const uint8_t*)kv.vq + s * rb, r, w.vrow);
            const uint16_t* vs = kv.vs + s * nb;
            const uint16_t* vm = kv.vm + s * nb;
            for (int b = 0; b < nb; b++) {
                const int c0 = b * KV_Q4_VBLOCK, len = std::min(KV_Q4_VBLOCK, r - c0);
                const float sc = h2f(vs[b]), mn = h2f(vm[b]);
                for (int j = 0; j < G; j++) {
                    const float p = w.sc[j * n + s - s0];
                    simd::axpy_f32(p * sc, w.vrow + c0, acc + j * r + c0, len);
                    w.msum[j * nb + b] += p * mn;
                }
            }
        }
        for (int j = 0; j < G; j++)
            for (int c = 0; c < r; c++) acc[j * r + c] += w.msum[j * nb + c / KV_Q4_VBLOCK];
        if (kv.gear_v.rank > 0) {
            for (int64_t g = group_of(kv, s0); g < kv.n_groups && kv.group_start[g] < qe; g++)
                values_gear_q4(kv, g, std::max<int64_t>(s0, kv.group_start[g]),
                               std::min<int64_t>(qe, kv.group_start[g + 1]), s0, n, G, acc, w);
        }
    }
    for (int64_t s = std::max(s0, kv.n_quant); s < e; s++) {
        const float* vr = kv_row(kv.type, kv.v, s - kv.n_quant, r, w.vrow);
        for (int j = 0; j < G; j++) simd::axpy_f32(w.sc[j * n + s - s0], vr, acc + j * r, r);
    }
}

}  // namespace

int64_t kernel_attention_scratch(int n_group, int64_t n, int r_k, int r_v, int gear_rank) {
    return n_group * n + r_k + r_v + (int64_t)n_group * (r_k + 1 + gear_rank + kv_n_blocks(r_v, KV_Q4_VBLOCK)) + 16;
}

void kernel_attention_range(const attn_kv_view& kv, int64_t s0, int64_t s1, const attn_q_view& q,
                            const attn_partial& out, float* scratch) {
    ZK_ASSERT(kv.type == dtype::F32 || kv.type == dtype::F16);
    ZK_ASSERT(kv.quant == KV_QUANT_NONE || kv.quant == KV_QUANT_Q8 || kv.quant == KV_QUANT_Q4);
    const int G = q.n_group;
    const int64_t n = s1 - s0;
    scratch_layout w = scratch_split(scratch, G, n, kv.r_k, kv.r_v, std::max(kv.gear_k.rank, kv.gear_v.rank));
    const float neg_inf = -std::numeric_limits<float>::infinity();

    for (int64_t t = 0; t < q.n_tok; t++) {
        const float* qt = q.q + t * q.q_stride;
        const int32_t qp = q.q_pos[t];
        // Slots are kept in position order, so the visible ones form a prefix of
        // the range; find its end once.
        int64_t e = s0;
        while (e < s1 && kv.pos[e] <= qp) e++;
        const int64_t nv = e - s0;
        float* m = out.m + t * G;
        float* l = out.l + t * G;
        float* acc = out.acc + t * G * kv.r_v;
        std::memset(acc, 0, sizeof(float) * G * kv.r_v);
        if (nv > 0) scores_all(kv, s0, e, n, qt, q, w);
        for (int j = 0; j < G; j++)
            for (int64_t s = 0; s < nv; s++) w.sc[j * n + s] *= q.scale;
        if (out.logits) {
            for (int j = 0; j < G; j++) {
                float* lg = out.logits + (t * G + j) * out.logits_stride;
                std::memcpy(lg + s0, w.sc + j * n, sizeof(float) * nv);
                for (int64_t s = e; s < s1; s++) lg[s] = neg_inf;
            }
        }
        if (nv == 0) {
            for (int j = 0; j < G; j++) m[j] = neg_inf, l[j] = 0;
            continue;
        }
        for (int j = 0; j < G; j++) {
            float mx = neg_inf;
            for (int64_t s = 0; s < nv; s++) mx = w.sc[j * n + s] > mx ? w.sc[j * n + s] : mx;
            m[j] = mx;
            l[j] = simd::exp_shift_sum(w.sc + j * n, (int)nv, mx);
        }
        values_all(kv, s0, e, n, G, acc, w);
    }
}

void kernel_attention_merge(const attn_partial* parts, int n_parts, int64_t n_tok, int n_group,
                            int r_v, float* out, int64_t out_stride, int64_t out_head_stride) {
    for (int64_t t = 0; t < n_tok; t++) {
        for (int j = 0; j < n_group; j++) {
            const int64_t ij = t * n_group + j;
            float mx = -std::numeric_limits<float>::infinity();
            for (int p = 0; p < n_parts; p++) mx = parts[p].m[ij] > mx ? parts[p].m[ij] : mx;
            float* o = out + t * out_stride + j * out_head_stride;
            std::memset(o, 0, sizeof(float) * r_v);
            if (mx == -std::numeric_limits<float>::infinity()) continue;  // nothing visible
            float l = 0;
            for (int p = 0; p < n_parts; p++) {
                if (parts[p].l[ij] == 0) continue;
                const float w = std::exp(parts[p].m[ij] - mx);
                l += w * parts[p].l[ij];
                simd::axpy_f32(w, parts[p].acc + ij * r_v, o, r_v);
            }
            const float inv = 1.0f / l;
            for (int c = 0; c < r_v; c++) o[c] *= inv;
        }
    }
}

}  // namespace zk
