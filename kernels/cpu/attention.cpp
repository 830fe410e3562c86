#include "kernels/attention.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "ggml-like/error.h"
#include "kernels/cpu/simd.h"

namespace zk {

namespace {

// Row s of a [n x r] block as f32 (a pointer into the block for F32, a
// conversion into tmp for F16).
inline const float* kv_row(dtype t, const void* base, int64_t s, int r, float* tmp) {
    if (t == dtype::F32) return (const float*)base + s * r;
    simd::f16_to_f32_row((const uint16_t*)base + s * r, tmp, r);
    return tmp;
}

}  // namespace

void kernel_attention_range(const attn_kv_view& kv, int64_t s0, int64_t s1, const attn_q_view& q,
                            const attn_partial& out, float* scratch) {
    ZK_ASSERT(kv.type == dtype::F32 || kv.type == dtype::F16);
    const int G = q.n_group;
    const int64_t n = s1 - s0;
    float* sc = scratch;              // [G x n] scores, then probabilities
    float* krow = scratch + G * n;    // [r_k]
    float* vrow = krow + kv.r_k;      // [r_v]
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
        if (nv == 0) {
            for (int j = 0; j < G; j++) m[j] = neg_inf, l[j] = 0;
            continue;
        }
        // scores: one K row load shared by the G query heads of the group
        for (int64_t s = 0; s < nv; s++) {
            const float* kr = kv_row(kv.type, kv.k, s0 + s, kv.r_k, krow);
            for (int j = 0; j < G; j++) sc[j * n + s] = simd::dot_f32(qt + j * q.q_head_stride, kr, kv.r_k) * q.scale;
        }
        for (int j = 0; j < G; j++) {
            float mx = neg_inf;
            for (int64_t s = 0; s < nv; s++) mx = sc[j * n + s] > mx ? sc[j * n + s] : mx;
            m[j] = mx;
            l[j] = simd::exp_shift_sum(sc + j * n, (int)nv, mx);
        }
        for (int64_t s = 0; s < nv; s++) {
            const float* vr = kv_row(kv.type, kv.v, s0 + s, kv.r_v, vrow);
            for (int j = 0; j < G; j++) simd::axpy_f32(sc[j * n + s], vr, acc + j * kv.r_v, kv.r_v);
        }
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
