// Decode attention over 8-bit codes (KV_LAYOUT_Q8): int8 per token with one f16
// scale per KV_Q8_BLOCK (32) channels.
// Keys: scores_fast_g<int8_t, G, SCALED = true> (attention_stripes.h), the f16
// path's loop with each 8-code chunk multiplied by its slot's block scale.
// Values: per block, the weights p_j d_s are computed per chunk of slots first,
// then values_stripe (the f16 path's loop, with load8/load4<int8_t>) accumulates
// G x (channels / 8) vectors in registers. Ranks are multiples of 4; a 4-channel
// tail is loaded with a 4-byte load, so nothing past a row (or the buffer) is read.
// Reference: each row dequantized (q8_row_to_f32), then float dot products and axpys.
#include <algorithm>
#include <cstdint>

#include "kernels/cpu/attention_layout.h"
#include "kernels/cpu/attention_stripes.h"

namespace zk {
namespace attn {

namespace {

#ifdef ZK_SIMD_AVX2
// 8-bit values: per block and chunk of slots, the weights p_j d_s (scale of
// slot s's block) into pw [G x KV_Q8_WCHUNK], then the f16 path's stripe loop
// on the int8 codes with those weights.
template <int G>
void values_q8_fast_g(const int8_t* codes, const uint16_t* d, int nb, int64_t a, int64_t b, int64_t s0, int64_t n,
                      int r, const float* sc, float* acc, float* pw) {
    float* df = pw + 4 * KV_Q8_WCHUNK;  // [m] the chunk's scales
    for (int blk = 0; blk < nb; blk++) {
        const int c0 = blk * KV_Q8_BLOCK, len = std::min(KV_Q8_BLOCK, r - c0);
        for (int64_t s = a; s < b; s += KV_Q8_WCHUNK) {
            const int m = (int)std::min<int64_t>(KV_Q8_WCHUNK, b - s);
            for (int t = 0; t < m; t++) df[t] = h2f(d[(s + t) * nb + blk]);
            for (int j = 0; j < G; j++) simd::mul_f32(sc + j * n + s - s0, df, pw + j * KV_Q8_WCHUNK, m);
            values_stripe_len<int8_t, G>(len, codes, 0, s, s + m, s, KV_Q8_WCHUNK, r, c0, pw, acc);
        }
    }
}

void values_q8_fast(const int8_t* codes, const uint16_t* d, int nb, int64_t a, int64_t b, int64_t s0, int64_t n,
                    int r, int G, const float* sc, float* acc, float* pw) {
    for (int j0 = 0; j0 < G; j0 += 4) {
        const float* p = sc + j0 * n;
        float* o = acc + j0 * r;
        switch (std::min(4, G - j0)) {
            case 1: values_q8_fast_g<1>(codes, d, nb, a, b, s0, n, r, p, o, pw); break;
            case 2: values_q8_fast_g<2>(codes, d, nb, a, b, s0, n, r, p, o, pw); break;
            case 3: values_q8_fast_g<3>(codes, d, nb, a, b, s0, n, r, p, o, pw); break;
            default: values_q8_fast_g<4>(codes, d, nb, a, b, s0, n, r, p, o, pw); break;
        }
    }
}
#endif

}  // namespace

void q8_scores(const attn_kv_view& kv, int64_t a, int64_t b, int64_t s0, int64_t n, const float* qt,
               const attn_q_view& q, range_scratch& w, bool ref) {
    const int G = q.n_group, r = kv.r_k, nb = kv_n_blocks(r, KV_Q8_BLOCK);
    const int8_t* codes = (const int8_t*)kv.k.codes;
#ifdef ZK_SIMD_AVX2
    if (!ref && r % 4 == 0 && r <= 256) {
        scores_fast(codes, kv.k.scale, nb, 0, a, b, s0, n, r, qt, q.q_head_stride, G, w.sc);
    } else
#endif
        for (int64_t s = a; s < b; s++) {
            q8_row_to_f32(codes + s * r, kv.k.scale + s * nb, r, w.krow);
            for (int j = 0; j < G; j++) w.sc[j * n + s - s0] = simd::dot_f32(qt + j * q.q_head_stride, w.krow, r);
        }
    for (int j = 0; j < G; j++) simd::scale_f32(w.sc + j * n + a - s0, (int)(b - a), q.scale);
}

void q8_values(const attn_kv_view& kv, int64_t a, int64_t b, int64_t s0, int64_t n, int G, float* acc, range_scratch& w,
               bool ref) {
    const int r = kv.r_v, nb = kv_n_blocks(r, KV_Q8_BLOCK);
    const int8_t* codes = (const int8_t*)kv.v.codes;
#ifdef ZK_SIMD_AVX2
    if (!ref && r % 4 == 0) {
        values_q8_fast(codes, kv.v.scale, nb, a, b, s0, n, r, G, w.sc, acc, w.pw);
        return;
    }
#endif
    for (int64_t s = a; s < b; s++) {
        q8_row_to_f32(codes + s * r, kv.v.scale + s * nb, r, w.vrow);
        for (int j = 0; j < G; j++) simd::axpy_f32(w.sc[j * n + s - s0], w.vrow, acc + j * r, r);
    }
}

}  // namespace attn
}  // namespace zk
