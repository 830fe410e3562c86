// Decode attention over 4- and 2-bit KIVI codes (KV_LAYOUT_Q4, KV_LAYOUT_Q2):
// the walk over key groups (the folded query q_c s_c and bias sum_c q_c m_c once
// per group, then one code row per slot shared by the G query heads), the value
// sums with their min terms, GEAR's corrections of both, and the float
// reference path. The integer kernels of each width are in attention_q4.cpp and
// attention_q2.cpp.
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "ggml-like/error.h"
#include "kernels/cpu/attention_layout.h"

namespace zk {
namespace attn {

namespace {

// Key groups' scales and mins (and, on the float path, code rows) are asked for
// this many groups ahead (simd::prefetch_l2): one group's scores take about as
// long as a DRAM access.
constexpr int64_t k_kivi_prefetch_groups = 2;

int kivi_bits(kv_layout_id id) { return id == KV_LAYOUT_Q4 ? 4 : 2; }

const kivi_int_kernels* kivi_int(kv_layout_id id) { return id == KV_LAYOUT_Q4 ? q4_int_kernels() : q2_int_kernels(); }

// r codes of `bits` bits (engine/kv_quant.h's packing) to floats 0..2^bits - 1.
inline void kivi_codes_to_f32(int bits, const uint8_t* src, int r, float* dst) {
    int i = 0;
    if (bits == 2) {
        for (; i < r; i++) dst[i] = (float)((src[i / 4] >> (2 * (i & 3))) & 0x03);
        return;
    }
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

// GEAR value correction of slots [a, b) in group g: acc_j += (p_j^T A) B^T + sparse.
void values_gear(const attn_kv_view& kv, int64_t g, int64_t a, int64_t b, int64_t s0, int64_t n, int G, float* acc,
                 range_scratch& w) {
    const attn_gear_view& gr = kv.v.gear;
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

}  // namespace

// Key row of r channels, the last `tail` in 1-bit codes after `mid` 2-bit ones
// after the h4 = r - tail - mid codes of `bits` bits (kernels/attention.h), to floats.
inline void kivi_key_codes_to_f32(int bits, const uint8_t* src, int r, int tail, int mid, float* dst) {
    const int h4 = r - tail - mid, h = r - tail, tb = kv_tail_bytes(tail);
    kivi_codes_to_f32(bits, src, h4, dst);
    const uint8_t* m = src + kv_kivi_row_bytes(bits, h4);
    kivi_codes_to_f32(2, m, mid, dst + h4);
    const uint8_t* t = m + kv_kivi_row_bytes(2, mid);
    for (int i = 0; i < tail; i++) dst[h + i] = (float)((t[i % tb] >> (i / tb)) & 1);
}

// Keys of slots [a, b) (inside the quantized part): scaled scores q.scale (q . k)
// into sc (index s - s0). The integer path takes the scale into its copy of the
// query, so the scores need no pass of their own. With a 1-bit key tail, 2-bit
// rows whose 2-bit part is short (h <= 64, h % 8 == 0; the plans' h = 32) take
// one pass over both parts (kivi_tail_kernels: one fold, one sum a slot);
// others a second integer pass that adds the tail's part (its own folded
// query, with its own int8 scale: attention_q1.cpp). The 2-bit channels of
// 4-bit keys (`mid`) take a pass of the 2-bit kernels between the two, which
// adds their part likewise (its own query, fold and scale). 4-bit rows with
// such parts (h <= 128, mid <= 128) take the same folds and then one pass
// over the slots for all parts (attention_q4_parts.cpp): the same integer
// sums, 13-18% less attention time on the plans' rows of four widths; with
// AVX-512 one fold for the three parts and a pass of 16 slots at a time
// (attention_parts_wide.cpp: the same int8 query, the same integer sums).
//
// 0-bit channels [r, r + zero) (r here: the channels with codes) take no part
// in either pass: their q_c m_c joins each group's bias (zero_bias).
void kivi_scores(const attn_kv_view& kv, int64_t a, int64_t b, int64_t s0, int64_t n, const float* qt,
                 const attn_q_view& q, range_scratch& w, bool ref) {
    const int bits = kivi_bits(kv.k.layout);
    const int zero = kv.k.zero, gw = kv_key_grid_words(kv.r_k, zero);
    const int G = q.n_group, r = kv.r_k - zero, gs = kv.group, tail = kv.k.tail, mid = kv.k.mid;
    // the channels of `bits` bits, and with the 2-bit ones
    const int h = r - tail - mid, hm = r - tail;
    ZK_ASSERT(mid == 0 || bits == 4);
    const int rb = kv_key_row_bytes(bits, r, tail, 0, mid), rbh = kv_kivi_row_bytes(bits, h);
    const int rbm = rbh + kv_kivi_row_bytes(2, mid);  // the tail's first byte
    // the group's sum_c q_c m_c over its 0-bit channels (times `mul`) added to
    // bias: their min codes as floats (in kmin past the coded channels, which
    // only the float path uses), one vector dot product a head (a scalar loop
    // here was a serial chain of 32 fmas a head and group: +15% a layer)
    auto zero_bias = [&](const uint16_t* grid, const uint16_t* step, float mul) {
        if (zero == 0) return;
        const int8_t* zb = kv_key_zero_mins(grid, kv.r_k, zero);
        float* zf = w.kmin + r;
        for (int c = 0; c < zero; c++) zf[c] = (float)zb[c];
        const float dm = h2f(step[1]) * mul;
        for (int j = 0; j < G; j++) w.bias[j] += dm * simd::dot_f32(qt + j * q.q_head_stride + r, zf, zero);
    };
    const float scale = q.scale;
    const uint8_t* codes = (const uint8_t*)kv.k.codes;
    const attn_gear_view& gr = kv.k.gear;
    const kivi_int_kernels* ik = ref ? nullptr : kivi_int(kv.k.layout);
    const kivi_int_kernels* it = ref || tail == 0 ? nullptr : q1_tail_kernels();
    const kivi_int_kernels* im = ref || mid == 0 ? nullptr : q2_int_kernels();
    // a short 2-bit part and its tail in one pass (one fold, one sum a slot)
    const kivi_tail_kernels* ft = ref || tail == 0 || kv.k.layout != KV_LAYOUT_Q2 ? nullptr : q2_tail_kernels();
    const bool fused = ft && h <= ft->max_h && h % 8 == 0;
    const int nrc = ik ? (h + ik->chunk - 1) / ik->chunk : 0;
    const int nrm = im ? (mid + im->chunk - 1) / im->chunk : 0;
    const bool int_path = !fused && ik && nrc <= ik->max_chunks && (tail == 0 || it) &&
                          (mid == 0 || (im && im->scores_add && nrm <= im->max_chunks));
    // 4-bit rows of several parts in one pass
    const kivi_parts_kernels* kp = int_path && bits == 4 && (mid > 0 || tail > 0) ? q4_parts_kernels() : nullptr;
    const bool parts = kp && h <= kp->max_h4 && mid <= kp->max_mid;
    // ... and with AVX-512 the three folds in one and 16 slots a pass (attention_parts_wide.cpp)
    const bool wide_parts = parts && kivi_wide_parts_fit(G, h, mid, tail);
    if (wide_parts)  // its query: the r coded channels in order, scaled
        for (int j = 0; j < G; j++)
            for (int c = 0; c < r; c++) w.qs[j * kv.r_k + c] = qt[j * q.q_head_stride + c] * scale;
    if (fused) {  // the scaled query, zero past r
        for (int j = 0; j < G; j++) {
            float* qj = w.qtail + j * ft->qstride;
            for (int c = 0; c < r; c++) qj[c] = qt[j * q.q_head_stride + c] * scale;
            std::memset(qj + r, 0, sizeof(float) * (ft->qstride - r));
        }
    }
    if (int_path) {  // the scaled query zero-padded to whole row chunks (the tail's to its own chunk)
        const int64_t rq = (int64_t)ik->chunk * nrc;
        for (int j = 0; j < G; j++) {
            for (int c = 0; c < h; c++) w.qpad[j * rq + c] = qt[j * q.q_head_stride + c] * scale;
            std::memset(w.qpad + j * rq + h, 0, sizeof(float) * (rq - h));
            float* qj = w.qtail + j * KV_KEY_TAIL_MAX;
            for (int c = 0; c < tail; c++) qj[c] = qt[j * q.q_head_stride + hm + c] * scale;
            std::memset(qj + tail, 0, sizeof(float) * (KV_KEY_TAIL_MAX - tail));
            if (mid == 0) continue;
            const int64_t rm = (int64_t)im->chunk * nrm;
            float* qm = w.qmid + j * rm;
            for (int c = 0; c < mid; c++) qm[c] = qt[j * q.q_head_stride + h + c] * scale;
            std::memset(qm + mid, 0, sizeof(float) * (rm - mid));
        }
    }
    for (int64_t g = group_of(kv, a); g < kv.n_groups && kv.group_start[g] < b; g++) {
        const int64_t g0 = kv.group_start[g];
        const int64_t ga = std::max<int64_t>(a, g0), gb = std::min<int64_t>(b, kv.group_start[g + 1]);
        const uint16_t* grid = kv.k.scale + g * gw;
        const uint16_t* step = kv.k.min + g * KV_GRID_STEPS;
        if (g + k_kivi_prefetch_groups < kv.n_groups && kv.group_start[g + k_kivi_prefetch_groups] < b) {
            const int64_t p = g + k_kivi_prefetch_groups;
            if (!int_path && !fused)  // the integer score loops ask for their rows as they go
                simd::prefetch_l2(codes + kv.group_start[p] * rb,
                                  (size_t)(kv.group_start[p + 1] - kv.group_start[p]) * rb);
            simd::prefetch_l2(kv.k.scale + p * gw, sizeof(uint16_t) * gw);
        }
        if (fused) {
            ft->fold(G, w.qtail, grid, step, r, h, w.qi, w.qd, w.bias);
            zero_bias(grid, step, scale);
            ft->scores(G, h, codes, rb, ga, gb, b, s0, n, w.qi, w.qd, w.bias, w.sc);
        } else if (wide_parts) {
            for (int j = 0; j < G; j++) w.bias[j] = 0.0f;
            zero_bias(grid, step, scale);
            kivi_wide_parts_group(G, h, mid, tail, w.qs, kv.r_k, grid, step, codes, rb, ga, gb, b, s0, n, w.bias,
                                  w.sc);
        } else if (parts) {
            // each part's fold into its own query bytes, scale and bias; one pass over the slots
            int8_t* qi4 = w.qi;
            int8_t* qim = qi4 + (int64_t)G * ik->chunk * nrc;
            int8_t* qit = qim + (int64_t)G * (im ? im->chunk : 0) * nrm;
            float* bp = w.bias + G;  // [3 x G]
            for (int j = 0; j < 3 * G; j++) bp[j] = 0.0f;
            if (h > 0) ik->fold(G, w.qpad, grid, step, h, nrc, qi4, w.qd, bp);
            if (mid > 0) im->fold(G, w.qmid, grid + h, step, mid, nrm, qim, w.qd + G, bp + G);
            if (tail > 0) it->fold(G, w.qtail, grid + hm, step, tail, 1, qit, w.qd + 2 * G, bp + 2 * G);
            for (int j = 0; j < G; j++) w.bias[j] = bp[j] + bp[G + j] + bp[2 * G + j];
            zero_bias(grid, step, scale);
            kp->scores(G, h, mid, tail, codes, rb, ga, gb, b, s0, n, qi4, qim, qit, w.qd, w.bias, w.sc);
        } else if (int_path) {
            // the parts' passes in row order: the first writes the scores (with
            // the 0-bit channels' bias), the others add theirs; the first with
            // channels asks for the rows ahead
            bool first = true;
            if (h > 0) {
                ik->fold(G, w.qpad, grid, step, h, nrc, w.qi, w.qd, w.bias);
                zero_bias(grid, step, scale);
                ik->scores(G, h, nrc, codes, rb, ga, gb, b, s0, n, w.qi, w.qd, w.bias, w.sc);
                first = false;
            } else if (mid > 0 || tail > 0) {
                for (int j = 0; j < G; j++) std::fill(w.sc + j * n + ga - s0, w.sc + j * n + gb - s0, 0.0f);
            } else {
                for (int j = 0; j < G; j++) w.bias[j] = 0;
                zero_bias(grid, step, scale);
                for (int j = 0; j < G; j++) std::fill(w.sc + j * n + ga - s0, w.sc + j * n + gb - s0, w.bias[j]);
            }
            if (mid > 0) {
                im->fold(G, w.qmid, grid + h, step, mid, nrm, w.qi, w.qd, w.bias);
                if (first) zero_bias(grid, step, scale);
                im->scores_add(G, mid, nrm, codes + rbh, rb, ga, gb, first ? b : 0, s0, n, w.qi, w.qd, w.bias, w.sc);
                first = false;
            }
            if (tail > 0) {
                it->fold(G, w.qtail, grid + hm, step, tail, 1, w.qi, w.qd, w.bias);
                if (first) zero_bias(grid, step, scale);
                it->scores(G, tail, 1, codes + rbm, rb, ga, gb, first ? b : 0, s0, n, w.qi, w.qd, w.bias, w.sc);
            }
        } else {
            const float ds = fp16_to_fp32(step[0]), dm = fp16_to_fp32(step[1]);
            for (int c = 0; c < r; c++) w.krow[c] = kivi_grid_scale(grid[c], ds), w.kmin[c] = kivi_grid_min(grid[c], dm);
            for (int j = 0; j < G; j++) {
                const float* qj = qt + j * q.q_head_stride;
                simd::mul_f32(qj, w.krow, w.qs + j * r, r);
                w.bias[j] = simd::dot_f32(qj, w.kmin, r);
            }
            zero_bias(grid, step, 1.0f);
            for (int64_t s = ga; s < gb; s++) {
                kivi_key_codes_to_f32(bits, codes + s * rb, r, tail, mid, w.krow);
                for (int j = 0; j < G; j++)
                    w.sc[j * n + s - s0] = (simd::dot_f32(w.qs + j * r, w.krow, r) + w.bias[j]) * scale;
            }
        }
        if (gr.rank == 0 && gr.n_out == 0) continue;  // no GEAR (a rank-0 GEAR still has its outliers)
        const int k = gr.rank;
        const uint16_t* B = gr.b + g * r * k;
        const uint16_t* A = gr.a + g * gs * k;
        for (int j = 0; j < G; j++) {
            const float* qj = qt + j * q.q_head_stride;
            for (int i = 0; i < k; i++) {
                float d = 0;
                for (int c = 0; c < r; c++) d += qj[c] * h2f(B[c * k + i]);
                w.qb[j * k + i] = d * scale;
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
            const float val = h2f(ov[o]) * scale;
            for (int j = 0; j < G; j++) w.sc[j * n + s - s0] += qt[j * q.q_head_stride + c] * val;
        }
    }
}

// Values of the slots of spans sp[3 i] .. sp[3 i + 1] (p_j(s) at w.sc[j n + s -
// sp[3 i + 2]]): p (s_b code + m_b) = (p s_b) code + p m_b, so the codes are
// read once per slot and the min terms summed per block, added once at the end
// (s_b, m_b: block b's grid, decoded with the steps of the slot's group). The
// spans share one accumulator set-up: decode-time selection reads tens of
// scattered groups a head (kernel_attention_runs).
void kivi_values_spans(const attn_kv_view& kv, const int64_t* sp, int n_sp, int64_t n, int G, float* acc,
                       range_scratch& w, bool ref) {
    if (n_sp == 0) return;
    const int bits = kivi_bits(kv.v.layout);
    const int r = kv.r_v, nb = kv_n_blocks(r, KV_Q4_VBLOCK), rb = kv_kivi_row_bytes(bits, r);
    const uint8_t* codes = (const uint8_t*)kv.v.codes;
    for (int i = 0; i < G * nb; i++) w.msum[i] = 0;
    const kivi_int_kernels* ik = ref ? nullptr : kivi_int(kv.v.layout);
    if (ik) {
        ik->values(G, codes, rb, kv.v.scale, kv.v.min, kv.group_start, group_of(kv, sp[0]), nb, sp, n_sp, n, r, w.sc,
                   acc, w.msum);
    } else {
        for (int i = 0; i < n_sp; i++) {
            const int64_t a = sp[3 * i], b = sp[3 * i + 1], s0 = sp[3 * i + 2];
            for (int64_t s = a, g = group_of(kv, a); s < b; s++) {
                while (kv.group_start[g + 1] <= s) g++;
                kivi_codes_to_f32(bits, codes + s * rb, r, w.vrow);
                const uint16_t* vg = kv.v.scale + s * nb;
                const float ds = h2f(kv.v.min[g * KV_GRID_STEPS]), dm = h2f(kv.v.min[g * KV_GRID_STEPS + 1]);
                for (int bl = 0; bl < nb; bl++) {
                    const int c0 = bl * KV_Q4_VBLOCK, len = std::min(KV_Q4_VBLOCK, r - c0);
                    const float sc = kivi_grid_scale(vg[bl], ds), mn = kivi_grid_min(vg[bl], dm);
                    for (int j = 0; j < G; j++) {
                        const float p = w.sc[j * n + s - s0];
                        simd::axpy_f32(p * sc, w.vrow + c0, acc + j * r + c0, len);
                        w.msum[j * nb + bl] += p * mn;
                    }
                }
            }
        }
    }
    for (int j = 0; j < G; j++)
        for (int bl = 0; bl < nb; bl++) {  // block by block: a constant a block, vectorised
            const float mb = w.msum[j * nb + bl];
            float* ab = acc + j * r + bl * KV_Q4_VBLOCK;
            const int len = std::min(KV_Q4_VBLOCK, r - bl * KV_Q4_VBLOCK);
            for (int c = 0; c < len; c++) ab[c] += mb;
        }
    if (kv.v.gear.rank > 0 || kv.v.gear.n_out > 0) {
        for (int i = 0; i < n_sp; i++) {
            const int64_t a = sp[3 * i], b = sp[3 * i + 1], s0 = sp[3 * i + 2];
            for (int64_t g = group_of(kv, a); g < kv.n_groups && kv.group_start[g] < b; g++)
                values_gear(kv, g, std::max<int64_t>(a, kv.group_start[g]),
                            std::min<int64_t>(b, kv.group_start[g + 1]), s0, n, G, acc, w);
        }
    }
}

void kivi_values(const attn_kv_view& kv, int64_t a, int64_t b, int64_t s0, int64_t n, int G, float* acc,
                 range_scratch& w, bool ref) {
    const int64_t sp[3] = {a, b, s0};
    kivi_values_spans(kv, sp, a < b ? 1 : 0, n, G, acc, w, ref);
}

}  // namespace attn
}  // namespace zk
