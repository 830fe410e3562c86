// Internal interface of the decode attention kernel (kernels/attention.h):
// the scratch of one kernel_attention_range call, and each cache layout's
// score and value paths, which kernels/cpu/attention.cpp picks by the layout of
// the block's keys and of its values. One file per layout implements them:
//   attention_rows.cpp   f16/f32 rows (also every quantized layout's residual window)
//   attention_q8.cpp     8-bit per token
//   attention_vq.cpp     vector-coded values
//   attention_kivi.cpp   4- and 2-bit KIVI: the group loop, GEAR, the float path;
//                        its integer kernels in attention_q4.cpp and attention_q2.cpp,
//                        those of 1-bit key tails in attention_q1.cpp
// Every path has `ref`: true takes the float reference path (what a build
// without AVX2 always runs), false the fastest path this build has.
#pragma once
#include <algorithm>
#include <cstdint>

#include "kernels/attention.h"
#include "kernels/cpu/simd.h"

namespace zk {
namespace attn {

inline float h2f(uint16_t h) {
#ifdef ZK_SIMD_AVX2
    return _cvtsh_ss(h);
#else
    return fp16_to_fp32(h);
#endif
}

// Slots per chunk whose 8-bit value weights are computed ahead of the slot loop.
constexpr int KV_Q8_WCHUNK = 64;

// The scratch of one call over a range of n slots (scratch_split carves it).
struct range_scratch {
    float* sc;    // [G x n] scores, then probabilities
    float* krow;  // [r_k]
    float* vrow;  // [r_v]
    float* qs;    // [G x r_k] folded query (KIVI keys, float path)
    float* bias;  // [4 x G]: the scores' (the first G), then the parts' of 4-bit keys in one pass
    float* qb;    // [G x rank] q . B[:, i] (GEAR keys), then p^T A (GEAR values)
    float* msum;  // [G x value blocks] sum of p m_b (KIVI values)
    int8_t* qi;   // [G x (2 row chunks(r_k) + KV_KEY_TAIL_QSTRIDE)] int8 folded query in code order,
                  // zero-padded (KIVI keys; 4-bit keys in one pass: the three parts' one after another)
    float* qpad;  // [G x row chunks(r_k)] the query times the softmax scale, zero past r_k (KIVI keys)
    float* qmid;  // [G x row chunks(r_k)] the 2-bit channels' of 4-bit keys, likewise
    float* qtail; // [G x KV_KEY_TAIL_QSTRIDE] a 1-bit key tail's scaled query channels (or, in one
                  // pass with the 2-bit part, all r_k of them), zero past them
    float* qd;    // [3 x G] its scales (4-bit keys in one pass: the 4-bit, 2-bit and tail parts')
    float* pw;    // [6 x KV_Q8_WCHUNK] 8-bit value weights p_j d_s of a chunk of slots (rows j < 4), its scales
    float* kmin;  // [r_k] a key group's mins (float path), then its 0-bit channels' min codes
    float* hist;  // [KV_VQ_CELLS_PER_CH x r_v x vq_hist_heads(G)] value weights per (group, code, head)
                  // (vector codes)
    float* vw;    // [n x vq_hist_heads(G)] a range's value weights p_j(s) scale_s (vector codes)
    int32_t* vcode;  // [r_v] a slot's unpacked value codes
};

// Vector-coded values: a histogram cell holds the weights of G heads, padded to
// whole 8-float vectors; at most KV_VQ_MAX_HEADS query heads a KV head.
constexpr int KV_VQ_MAX_HEADS = 64;
inline int vq_hist_heads(int G) { return (G + 7) / 8 * 8; }
// Groups of a histogram block: cells of at most 16 KB (half of an L1), a
// multiple of 4 groups for 6-bit codes (their unpacking), at least one.
inline int vq_block_groups(int ng, int K, int Gp, int bits) {
    int bg = std::max(1, 16384 / (K * Gp * (int)sizeof(float)));
    if (bits == 6) bg = std::max(4, bg / 4 * 4);
    return std::min(ng, bg);
}

// Floats (and int8 bytes of qi) per head for the query of keys with 1-bit tails.
constexpr int KV_KEY_TAIL_QSTRIDE = 192;
// Channels of the padded KIVI query per head: whole row chunks of either
// integer kernel (64 channels for 4-bit, 128 for 2-bit).
inline int64_t scratch_qpad(int r_k) { return 128 * (int64_t)((r_k + 127) / 128); }
range_scratch scratch_split(float* p, int G, int64_t n, int r_k, int r_v, int rank);

// Scaled scores q.scale (q . k) of slots [a, b) (inside the key side's codes)
// into w.sc[j * n + s - s0].
void q8_scores(const attn_kv_view& kv, int64_t a, int64_t b, int64_t s0, int64_t n, const float* qt,
               const attn_q_view& q, range_scratch& w, bool ref);
void kivi_scores(const attn_kv_view& kv, int64_t a, int64_t b, int64_t s0, int64_t n, const float* qt,
                 const attn_q_view& q, range_scratch& w, bool ref);
// acc_j += sum over slots [a, b) (inside the value side's codes) of p_j(s) v(s), p in w.sc.
void q8_values(const attn_kv_view& kv, int64_t a, int64_t b, int64_t s0, int64_t n, int G, float* acc, range_scratch& w,
               bool ref);
void kivi_values(const attn_kv_view& kv, int64_t a, int64_t b, int64_t s0, int64_t n, int G, float* acc,
                 range_scratch& w, bool ref);
// kivi_values over spans sp[3 i], sp[3 i + 1] (ascending, inside the codes), p_j(s) at
// w.sc[j n + s - sp[3 i + 2]]: one accumulator set-up for all of them.
void kivi_values_spans(const attn_kv_view& kv, const int64_t* sp, int n_sp, int64_t n, int G, float* acc,
                       range_scratch& w, bool ref);
void vq_values(const attn_kv_view& kv, int64_t a, int64_t b, int64_t s0, int64_t n, int G, float* acc,
               range_scratch& w, bool ref);

// Full-precision rows of `type`, slot s at row s - off: scaled scores and value
// sums of slots [a, b), as above (qhs: the query's head stride).
void rows_scores(dtype type, const void* rows, int64_t off, int r, int64_t a, int64_t b, int64_t s0, int64_t n,
                 const float* qt, int64_t qhs, int G, float scale, range_scratch& w, bool ref);
void rows_values(dtype type, const void* rows, int64_t off, int r, int64_t a, int64_t b, int64_t s0, int64_t n,
                 int G, float* acc, range_scratch& w, bool ref);

// The integer kernels of one KIVI width (AVX2), behind the shared group loop.
struct kivi_int_kernels {
    int chunk;       // key channels per row chunk of the folded query (4-bit: 64, 2-bit: 128)
    int max_chunks;  // the int16 sums stay exact up to this many chunks; wider keys take the float path
    // Folded queries of G heads for one key group: qi [G x nrc x chunk] int8 in
    // code order (zeros past r), qd [G] their scales, bias [G] = sum_c q_c m_c.
    // q [G x nrc x chunk] floats (the scaled query, zero past r); grid, step: the
    // group's r packed grid codes and its two f16 steps (kernels/attention.h).
    void (*fold)(int G, const float* q, const uint16_t* grid, const uint16_t* step, int r, int nrc, int8_t* qi,
                 float* qd, float* bias);
    // sc[j * n + s - s0] = qd_j (qi_j . code_s) + bias_j for slots [a, b) of one group.
    // Code rows of slots below pf_end are asked for ahead (kivi_prefetch_rows).
    void (*scores)(int G, int r, int nrc, const uint8_t* codes, int rb, int64_t a, int64_t b, int64_t pf_end,
                   int64_t s0, int64_t n, const int8_t* qi, const float* qd, const float* bias, float* sc);
    // acc_j += sum_s p_j(s) s_b(s) code(s) over the slots of spans sp[3 i], sp[3 i + 1]
    // ([a, b), i < n_sp, ascending; p_j(s) at sc[j n + s - sp[3 i + 2]]);
    // msum [G x nb] += sum_s p_j(s) m_b(s). vs [slots x nb] the blocks' packed grid codes,
    // vm [groups x 2] the groups' f16 steps, gs [groups + 1] the groups' first slots,
    // g0 the group of the first span's first slot.
    void (*values)(int G, const uint8_t* codes, int rb, const uint16_t* vs, const uint16_t* vm, const int32_t* gs,
                   int64_t g0, int nb, const int64_t* sp, int n_sp, int64_t n, int r, const float* sc,
                   float* acc, float* msum);
    // `scores` adding to sc instead (2-bit: the 2-bit channels of 4-bit keys,
    // after the 4-bit part's pass); nullptr where a width has none.
    void (*scores_add)(int G, int r, int nrc, const uint8_t* codes, int rb, int64_t a, int64_t b, int64_t pf_end,
                       int64_t s0, int64_t n, const int8_t* qi, const float* qd, const float* bias,
                       float* sc) = nullptr;
};
// nullptr in a build without AVX2.
const kivi_int_kernels* q4_int_kernels();
const kivi_int_kernels* q2_int_kernels();
// The 4-bit kernels without their AVX-512 forms (the same as q4_int_kernels()
// in a build without them): the twins tests hold the wide loops to.
const kivi_int_kernels* q4_int_kernels_narrow();
// The scores of 1-bit key tails (attention_q1.cpp; no value kernel): chunk 128,
// the query laid out as that file says, and `scores` ADDS qd_j (qi_j . code_s)
// + bias_j to sc, after the width's kernels wrote the scores of the row's
// other channels; codes point at the rows' tail bytes. nullptr without AVX2.
const kivi_int_kernels* q1_tail_kernels();
// 2-bit keys with a 1-bit tail in one pass (attention_q2.cpp), for rows whose
// 2-bit part is h <= max_h channels, h a multiple of 8: one folded query over
// all r channels (qi [G x qstride] bytes from q [G x qstride] floats, zero past
// r), scores written as kivi_int_kernels::scores does. nullptr without AVX2.
struct kivi_tail_kernels {
    int max_h;
    int qstride;
    void (*fold)(int G, const float* q, const uint16_t* grid, const uint16_t* step, int r, int h, int8_t* qi,
                 float* qd, float* bias);
    void (*scores)(int G, int h, const uint8_t* codes, int rb, int64_t a, int64_t b, int64_t pf_end, int64_t s0,
                   int64_t n, const int8_t* qi, const float* qd, const float* bias, float* sc);
};
const kivi_tail_kernels* q2_tail_kernels();
// The same without the AVX-512 loop (the twin tests hold the wide one to).
const kivi_tail_kernels* q2_tail_kernels_narrow();
// 4-bit keys whose rows have 2-bit channels and/or a 1-bit tail, in one pass
// (attention_q4_parts.cpp), for h4 <= max_h4 4-bit and mid <= max_mid 2-bit
// channels: each part's folded query from its own width's fold (qi4 [G x 64
// nrc4] as q4's, qim [G x 128 nrm] as q2's, qit [G x 128] as the tail's), qd
// [3 x G] their scales (4-bit, 2-bit, tail), bias [G] the sum of the parts' and
// the 0-bit channels' biases; scores written as kivi_int_kernels::scores does.
// nullptr without AVX2.
struct kivi_parts_kernels {
    int max_h4, max_mid;
    void (*scores)(int G, int h4, int mid, int tail, const uint8_t* codes, int rb, int64_t a, int64_t b,
                   int64_t pf_end, int64_t s0, int64_t n, const int8_t* qi4, const int8_t* qim, const int8_t* qit,
                   const float* qd, const float* bias, float* sc);
};
const kivi_parts_kernels* q4_parts_kernels();
// The same rows with AVX-512 (attention_parts_wide.cpp), a group at a time:
// the three folds in one pass over the group's grid (the same int8 bytes,
// scales and, up to summation order, biases as the widths' folds), then slots
// [a, b) 16 a pass, every head at once. qf [G x qfs]: the scaled query over the
// r = h4 + mid + tail coded channels in order; bias [G]: added to (the 0-bit
// channels' share, set by the caller). A row shape's set-up (unit table, lane
// masks) is built on its first group and kept a thread for the next. kivi_wide_parts_fit
// says whether a row takes it (false in a build without AVX-512 BW, VNNI and VBMI).
bool kivi_wide_parts_fit(int G, int h4, int mid, int tail);
void kivi_wide_parts_group(int G, int h4, int mid, int tail, const float* qf, int qfs, const uint16_t* grid,
                           const uint16_t* step, const uint8_t* codes, int rb, int64_t a, int64_t b, int64_t pf_end,
                           int64_t s0, int64_t n, const float* bias, float* sc);

// ---- helpers of several layouts ----

// Row s of a full-precision [.. x r] block as f32 (a pointer into the block for
// F32, a conversion into tmp for F16).
inline const float* kv_row(dtype t, const void* base, int64_t s, int r, float* tmp) {
    if (t == dtype::F32) return (const float*)base + s * r;
    simd::f16_to_f32_row((const uint16_t*)base + s * r, tmp, r);
    return tmp;
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

// The group holding quantized slot s.
inline int64_t group_of(const attn_kv_view& kv, int64_t s) {
    return std::upper_bound(kv.group_start, kv.group_start + kv.n_groups + 1, (int32_t)s) - kv.group_start - 1;
}

}  // namespace attn
}  // namespace zk
