// Decode attention (kernels/attention.h): the range driver, the softmax, exact
// sinks and the merge of partials. Scores and value sums are each layout's
// (kernels/cpu/attention_layout.h): the key side's layout scores its quantized
// slots and the value side's layout sums them; slots past a side's quantized
// part are full-precision rows (attention_rows.cpp).
#include "kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "ggml-like/error.h"
#include "kernels/cpu/attention_layout.h"
#include "kernels/cpu/simd.h"

namespace zk {

namespace attn {

range_scratch scratch_split(float* p, int G, int64_t n, int r_k, int r_v, int rank) {
    range_scratch s;
    s.sc = p;
    s.krow = s.sc + G * n;
    s.vrow = s.krow + r_k;
    s.qs = s.vrow + r_v;
    s.bias = s.qs + (int64_t)G * r_k;
    s.qb = s.bias + 4 * G;
    s.msum = s.qb + (int64_t)G * rank;
    s.qd = s.msum + (int64_t)G * kv_n_blocks(r_v, KV_Q4_VBLOCK);
    s.pw = s.qd + 3 * G;
    s.kmin = s.pw + 6 * KV_Q8_WCHUNK;
    s.qpad = s.kmin + r_k;
    s.qmid = s.qpad + G * scratch_qpad(r_k);
    s.qtail = s.qmid + G * scratch_qpad(r_k);
    s.hist = s.qtail + G * KV_KEY_TAIL_QSTRIDE;
    s.vw = s.hist + (int64_t)vq_hist_heads(G) * KV_VQ_CELLS_PER_CH * r_v;
    s.vcode = (int32_t*)(s.vw + (int64_t)vq_hist_heads(G) * n);
    s.qi = (int8_t*)(s.vcode + r_v);
    return s;
}

}  // namespace attn

namespace {

using namespace attn;

// The quantized part of a side, by its layout (KV_LAYOUT_ROWS has none).
using scores_fn = void (*)(const attn_kv_view&, int64_t, int64_t, int64_t, int64_t, const float*, const attn_q_view&,
                           range_scratch&, bool);
using values_fn = void (*)(const attn_kv_view&, int64_t, int64_t, int64_t, int64_t, int, float*, range_scratch&, bool);
constexpr scores_fn k_scores[KV_LAYOUT_COUNT] = {nullptr, q8_scores, kivi_scores, kivi_scores, nullptr};
constexpr values_fn k_values[KV_LAYOUT_COUNT] = {nullptr, q8_values, kivi_values, kivi_values, vq_values};

// Scaled scores q.scale (q . k) of slots [a, e) into w.sc: slot s at
// w.sc[j n + s - base].
void scores_all(const attn_kv_view& kv, int64_t a, int64_t e, int64_t base, int64_t n, const float* qt,
                const attn_q_view& q, range_scratch& w, bool ref) {
    const attn_side_view& k = kv.k;
    const int64_t qe = std::min(e, k.n_quant);
    if (a < qe) k_scores[k.layout](kv, a, qe, base, n, qt, q, w, ref);
    const int64_t f0 = std::max(a, k.n_quant);
    if (f0 < e && kv.tier) {  // the tier's slots, in its own numbering
        scores_all(*kv.tier, f0 - k.n_quant, e - k.n_quant, base - k.n_quant, n, qt, q, w, ref);
        return;
    }
    if (f0 < e)
        rows_scores(kv.type, k.rows, k.n_quant, kv.r_k, f0, e, base, n, qt, q.q_head_stride, q.n_group, q.scale, w,
                    ref);
}

// acc_j += sum over slots [a, e) of p_j(s) v(s), p_j(s) at w.sc[j n + s - base].
void values_all(const attn_kv_view& kv, int64_t a, int64_t e, int64_t base, int64_t n, int G, float* acc,
                range_scratch& w, bool ref) {
    const attn_side_view& v = kv.v;
    const int64_t qe = std::min(e, v.n_quant);
    if (a < qe) k_values[v.layout](kv, a, qe, base, n, G, acc, w, ref);
    const int64_t f0 = std::max(a, v.n_quant);
    if (f0 < e && kv.tier) {
        values_all(*kv.tier, f0 - v.n_quant, e - v.n_quant, base - v.n_quant, n, G, acc, w, ref);
        return;
    }
    if (f0 < e) rows_values(kv.type, v.rows, v.n_quant, kv.r_v, f0, e, base, n, G, acc, w, ref);
}

void check_side(const attn_side_view& s) {
    ZK_ASSERT(s.layout >= KV_LAYOUT_ROWS && s.layout < KV_LAYOUT_COUNT);
    ZK_ASSERT(s.layout != KV_LAYOUT_ROWS || s.n_quant == 0);
}
void check_view(const attn_kv_view& kv, int G) {
    ZK_ASSERT(kv.type == dtype::F32 || kv.type == dtype::F16);
    if (kv.tier) {
        ZK_ASSERT(kv.k.n_quant == kv.v.n_quant && !kv.tier->tier && kv.tier->r_k == kv.r_k && kv.tier->r_v == kv.r_v &&
                  kv.tier->n_slots == kv.n_slots - kv.k.n_quant && kv.tier->n_sink_slots == 0);
        check_view(*kv.tier, G);
    }
    check_side(kv.k);
    check_side(kv.v);
    ZK_ASSERT(kv.k.layout != KV_LAYOUT_VQ);  // values only
    ZK_ASSERT(kv.v.layout != KV_LAYOUT_VQ || (kv.v.vq.book && kv.v.vq.c > 0 && kv.r_v % kv.v.vq.c == 0 &&
                                              kv.v.vq.K <= KV_VQ_CELLS_PER_CH * kv.v.vq.c && G <= KV_VQ_MAX_HEADS));
}

void attention_range(const attn_kv_view& kv, int64_t s0, int64_t s1, const attn_q_view& q, const attn_partial& out,
                     float* scratch, bool ref) {
    check_view(kv, q.n_group);
    const int G = q.n_group;
    s0 = std::max(s0, kv.n_sink_slots);  // exact sinks: kernel_attention_sinks
    s1 = std::max(s1, s0);
    const int64_t n = s1 - s0;
    range_scratch w = scratch_split(scratch, G, n, kv.r_k, kv.r_v, std::max(kv.k.gear.rank, kv.v.gear.rank));
    const float neg_inf = -std::numeric_limits<float>::infinity();

    for (int64_t t = 0; t < q.n_tok; t++) {
        const float* qt = q.q + t * q.q_stride;
        const int32_t qp = q.q_pos[t];
        // Slots are kept in position order, so the visible ones form a prefix of
        // the range; find its end once.
        int64_t e = s1;
        if (s0 < s1 && kv.pos[s1 - 1] > qp) e = std::upper_bound(kv.pos + s0, kv.pos + s1, qp) - kv.pos;
        const int64_t nv = e - s0;
        float* m = out.m + t * G;
        float* l = out.l + t * G;
        float* acc = out.acc + t * G * kv.r_v;
        std::memset(acc, 0, sizeof(float) * G * kv.r_v);
        if (nv > 0) scores_all(kv, s0, e, s0, n, qt, q, w, ref);
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
            const float mx = simd::max_f32(w.sc + j * n, (int)nv);
            m[j] = mx;
            l[j] = simd::exp_shift_sum(w.sc + j * n, (int)nv, mx);
        }
        values_all(kv, s0, e, s0, n, G, acc, w, ref);
    }
}


}  // namespace

int64_t kernel_attention_scratch(int n_group, int64_t n, int r_k, int r_v, int gear_rank) {
    const int64_t rq = scratch_qpad(r_k);
    return n_group * n + r_k + r_v + (int64_t)n_group * (r_k + 4 + gear_rank + kv_n_blocks(r_v, KV_Q4_VBLOCK)) +
           3 * n_group + 6 * KV_Q8_WCHUNK + r_k + 2 * n_group * rq + n_group * KV_KEY_TAIL_QSTRIDE +
           n_group * (2 * rq + KV_KEY_TAIL_QSTRIDE) / 4 + (int64_t)vq_hist_heads(n_group) * (KV_VQ_CELLS_PER_CH * r_v + n) +
           r_v + 16;
}

void kernel_attention_range(const attn_kv_view& kv, int64_t s0, int64_t s1, const attn_q_view& q,
                            const attn_partial& out, float* scratch) {
    attention_range(kv, s0, s1, q, out, scratch, false);
}

void kernel_attention_range_ref(const attn_kv_view& kv, int64_t s0, int64_t s1, const attn_q_view& q,
                                const attn_partial& out, float* scratch) {
    attention_range(kv, s0, s1, q, out, scratch, true);
}

void kernel_attention_runs(const attn_kv_view& kv, const int64_t* runs, int64_t n_runs, const attn_q_view& q,
                           const attn_partial& out, float* scratch) {
    check_view(kv, q.n_group);
    ZK_ASSERT(q.n_tok == 1 && !out.logits);
    const int G = q.n_group;
    const int32_t qp = q.q_pos[0];
    // run i's visible slots [a, b): past the sinks, up to the query's position
    auto visible = [&](int64_t i, int64_t& a, int64_t& b) {
        a = std::max(runs[2 * i], kv.n_sink_slots);
        b = std::max(runs[2 * i + 1], a);
        if (a < b && kv.pos[b - 1] > qp) b = std::upper_bound(kv.pos + a, kv.pos + b, qp) - kv.pos;
    };
    int64_t n = 0, a = 0, b = 0;
    for (int64_t i = 0; i < n_runs; i++) {
        ZK_ASSERT(runs[2 * i] <= runs[2 * i + 1] && runs[2 * i + 1] <= kv.n_slots &&
                  (i == 0 || runs[2 * i - 1] <= runs[2 * i]));
        visible(i, a, b);
        n += b - a;
    }
    range_scratch w = scratch_split(scratch, G, n, kv.r_k, kv.r_v, std::max(kv.k.gear.rank, kv.v.gear.rank));
    std::memset(out.acc, 0, sizeof(float) * G * kv.r_v);
    if (n == 0) {
        for (int j = 0; j < G; j++) out.m[j] = -std::numeric_limits<float>::infinity(), out.l[j] = 0;
        return;
    }
    // run i's slot s scores at w.sc[j n + at + s - a]: base a - at
    for (int64_t i = 0, at = 0; i < n_runs; i++) {
        visible(i, a, b);
        if (a < b) scores_all(kv, a, b, a - at, n, q.q, q, w, false);
        at += b - a;
    }
    for (int j = 0; j < G; j++) {
        out.m[j] = simd::max_f32(w.sc + j * n, (int)n);
        out.l[j] = simd::exp_shift_sum(w.sc + j * n, (int)n, out.m[j]);
    }
    // KIVI values: the runs' quantized slots as spans, k_span_batch to a call of
    // the value kernel (its accumulators set up once a call, not once a run);
    // then each run's other slots (another layout's codes, the f16 window)
    const bool kivi = kv.v.layout == KV_LAYOUT_Q4 || kv.v.layout == KV_LAYOUT_Q2;
    constexpr int k_span_batch = 64;
    int64_t sp[3 * k_span_batch];
    int n_sp = 0;
    for (int64_t i = 0, at = 0; i < n_runs && kivi; i++) {
        visible(i, a, b);
        const int64_t qe = std::min(b, kv.v.n_quant);
        if (a < qe) {
            sp[3 * n_sp] = a, sp[3 * n_sp + 1] = qe, sp[3 * n_sp + 2] = a - at;
            if (++n_sp == k_span_batch) kivi_values_spans(kv, sp, n_sp, n, G, out.acc, w, false), n_sp = 0;
        }
        at += b - a;
    }
    kivi_values_spans(kv, sp, n_sp, n, G, out.acc, w, false);
    for (int64_t i = 0, at = 0; i < n_runs; i++) {
        visible(i, a, b);
        const int64_t a2 = kivi ? std::max(a, kv.v.n_quant) : a;
        if (a2 < b) values_all(kv, a2, b, a - at, n, G, out.acc, w, false);
        at += b - a;
    }
}

void kernel_attention_scores(const attn_kv_view& kv, int64_t s0, int64_t s1, const attn_q_view& q, float* scratch) {
    check_view(kv, q.n_group);
    ZK_ASSERT(kv.n_sink_slots <= s0 && s0 <= s1 && s1 <= kv.n_slots && (s0 == s1 || kv.pos[s1 - 1] <= q.q_pos[0]));
    const int64_t n = s1 - s0;
    range_scratch w =
        scratch_split(scratch, q.n_group, n, kv.r_k, kv.r_v, std::max(kv.k.gear.rank, kv.v.gear.rank));
    if (n > 0) scores_all(kv, s0, s1, s0, n, q.q, q, w, false);
}

void kernel_attention_sinks(const attn_kv_view& kv, const attn_q_view& q, const attn_partial& out) {
    const int G = q.n_group, D = kv.sink_dim;
    ZK_ASSERT(out.acc_dim == D);
    const float neg_inf = -std::numeric_limits<float>::infinity();
    // a handful of rows: scores on the stack
    constexpr int64_t k_max_sinks = 64;
    ZK_ASSERT(kv.n_sink_slots <= k_max_sinks && (kv.n_sink_slots == 0 || (kv.sink_k && kv.sink_v && D > 0)));
    float sc[k_max_sinks];
    for (int64_t t = 0; t < q.n_tok; t++) {
        const int32_t qp = q.q_pos[t];
        int64_t nv = 0;  // visible sink slots: a prefix (positions ascend)
        while (nv < kv.n_sink_slots && kv.pos[nv] <= qp) nv++;
        for (int j = 0; j < G; j++) {
            const int64_t ij = t * G + j;
            const float* qj = q.q + t * q.q_stride + j * q.q_head_stride;
            float* acc = out.acc + ij * D;
            std::memset(acc, 0, sizeof(float) * D);
            float mx = neg_inf;
            for (int64_t s = 0; s < nv; s++) {
                sc[s] = q.scale * simd::dot_f32(qj, kv.sink_k + (size_t)kv.pos[s] * D, D);
                mx = std::max(mx, sc[s]);
            }
            if (out.logits) {
                float* lg = out.logits + ij * out.logits_stride;
                for (int64_t s = 0; s < kv.n_sink_slots; s++) lg[s] = s < nv ? sc[s] : neg_inf;
            }
            out.m[ij] = mx;
            float l = 0;
            for (int64_t s = 0; s < nv; s++) {
                const float e = std::exp(sc[s] - mx);
                l += e;
                simd::axpy_f32(e, kv.sink_v + (size_t)kv.pos[s] * D, acc, D);
            }
            out.l[ij] = l;
        }
    }
}

void kernel_attention_merge(const attn_partial* parts, int n_parts, int64_t n_tok, int n_group,
                            int r_v, float* out, int64_t out_stride, int64_t out_head_stride) {
    int width = r_v;
    for (int p = 0; p < n_parts; p++) width = std::max(width, parts[p].acc_dim > 0 ? parts[p].acc_dim : r_v);
    for (int64_t t = 0; t < n_tok; t++) {
        for (int j = 0; j < n_group; j++) {
            const int64_t ij = t * n_group + j;
            float mx = -std::numeric_limits<float>::infinity();
            for (int p = 0; p < n_parts; p++) mx = parts[p].m[ij] > mx ? parts[p].m[ij] : mx;
            float* o = out + t * out_stride + j * out_head_stride;
            std::memset(o, 0, sizeof(float) * width);
            if (mx == -std::numeric_limits<float>::infinity()) continue;  // nothing visible
            float l = 0;
            for (int p = 0; p < n_parts; p++) {
                if (parts[p].l[ij] == 0) continue;
                const float w = std::exp(parts[p].m[ij] - mx);
                const int d = parts[p].acc_dim > 0 ? parts[p].acc_dim : r_v;
                l += w * parts[p].l[ij];
                simd::axpy_f32(w, parts[p].acc + ij * d, o, d);
            }
            const float inv = 1.0f / l;
            for (int c = 0; c < width; c++) o[c] *= inv;
        }
    }
}

}  // namespace zk
