#include "engine/kv_quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "ggml-like/dtype.h"
#include "ggml-like/error.h"
#include "kernels/attention.h"
#include "kernels/cpu/simd.h"

namespace zk {

namespace {

// The next f16 above h (finite inputs; KV activations are far below 65504).
uint16_t f16_next_up(uint16_t h) {
    if (h == 0x8000) return 0x0001;
    return (h & 0x8000) ? (uint16_t)(h - 1) : (uint16_t)(h + 1);
}
// The least f16 >= x: steps round up, so the coded grids cover the data.
uint16_t f16_ceil(float x) {
    uint16_t h = fp32_to_fp16(x);
    while (fp16_to_fp32(h) < x) h = f16_next_up(h);
    return h;
}

// Codes of `bits` (4 or 2) bits, packed 8 / bits per byte, channel c at byte
// c * bits / 8, lowest bits first (4-bit: low nibble first).
inline void put_code(int bits, uint8_t* row, int c, int code) {
    const int per = 8 / bits, sh = bits * (c % per);
    const uint8_t mask = (uint8_t)(((1 << bits) - 1) << sh);
    row[c / per] = (uint8_t)((row[c / per] & ~mask) | (code << sh));
}
inline int get_code(int bits, const uint8_t* row, int c) {
    const int per = 8 / bits;
    return (row[c / per] >> (bits * (c % per))) & ((1 << bits) - 1);
}

inline int q_code(float x, float m, float inv, int top) {
    const int c = (int)std::lround((x - m) * inv);
    return c < 0 ? 0 : (c > top ? top : c);
}

// The range of the values x[i * stride], i < n, not skipped ([0, 0] when all are).
void q_range(const float* x, int n, int64_t stride, const uint8_t* skip, int64_t skip_stride, float* mn,
             float* mx) {
    *mn = INFINITY, *mx = -INFINITY;
    for (int i = 0; i < n; i++) {
        if (skip && skip[i * skip_stride]) continue;
        *mn = std::min(*mn, x[i * stride]);
        *mx = std::max(*mx, x[i * stride]);
    }
    if (*mn > *mx) *mn = *mx = 0;  // everything skipped
}

void check_bits(int bits) { ZK_ASSERT(bits == 4 || bits == 2); }

}  // namespace

// ---- 8-bit ----

void kvq_quantize_q8_row(const float* x, int r, int8_t* codes, uint16_t* d) {
    for (int b0 = 0, bi = 0; b0 < r; b0 += KV_Q8_BLOCK, bi++) {
        const int n = std::min(KV_Q8_BLOCK, r - b0);
        float amax = 0;
        for (int i = 0; i < n; i++) amax = std::max(amax, std::fabs(x[b0 + i]));
        d[bi] = f16_ceil(amax / 127.0f);
        const float dv = fp16_to_fp32(d[bi]);
        const float inv = dv > 0 ? 1.0f / dv : 0.0f;
        for (int i = 0; i < n; i++) {
            const int c = (int)std::lround(x[b0 + i] * inv);
            codes[b0 + i] = (int8_t)(c < -127 ? -127 : (c > 127 ? 127 : c));
        }
    }
}

void kvq_dequantize_q8_row(const int8_t* codes, const uint16_t* d, int r, float* x) {
    for (int c = 0; c < r; c++) x[c] = fp16_to_fp32(d[c / KV_Q8_BLOCK]) * (float)codes[c];
}

// ---- 4-bit / 2-bit values (per token) ----

void kvq_quantize_values(int bits, const float* X, int n, int r, uint8_t* codes, uint16_t* grid, uint16_t* step,
                         const uint8_t* skip) {
    check_bits(bits);
    const int top = (1 << bits) - 1, nb = kv_n_blocks(r, KV_Q4_VBLOCK), rb = kv_qb_row_bytes(bits, r);
    if (n < 1 || (int64_t)n * nb > KV_VALUE_MAX_GRIDS)
        ZK_THROW("%d-bit values: a group of %d tokens x %d channels (at most %d blocks of %d)", bits, n, r,
                 KV_VALUE_MAX_GRIDS, KV_Q4_VBLOCK);
    // [n x nb], every entry written below (not zeroed: 16 KB a group)
    float lo[KV_VALUE_MAX_GRIDS], hi[KV_VALUE_MAX_GRIDS];
    for (int t = 0; t < n; t++)
        for (int bi = 0; bi < nb; bi++) {
            const int b0 = bi * KV_Q4_VBLOCK, len = std::min(KV_Q4_VBLOCK, r - b0);
            const int64_t o = (int64_t)t * r + b0;
            q_range(X + o, len, 1, skip ? skip + o : nullptr, 1, &lo[t * nb + bi], &hi[t * nb + bi]);
        }
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC 12 cannot see the loops above fill [0, n nb)
#endif
    kvq_grid_codes(bits, lo, hi, n * nb, grid, step);
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
    const float ds = fp16_to_fp32(step[0]), dm = fp16_to_fp32(step[1]);
    // a row's unused high bits are zero (not what a compacted slot held): the
    // CPU and CUDA caches stay byte-identical after eviction
    std::memset(codes, 0, (size_t)n * rb);
    for (int t = 0; t < n; t++)
        for (int bi = 0; bi < nb; bi++) {
            const int b0 = bi * KV_Q4_VBLOCK, len = std::min(KV_Q4_VBLOCK, r - b0);
            const uint16_t g = grid[t * nb + bi];
            const float sv = kivi_grid_scale(g, ds), mv = kivi_grid_min(g, dm);
            const float inv = sv > 0 ? 1.0f / sv : 0.0f;
            const float* x = X + (int64_t)t * r;
            for (int i = 0; i < len; i++)
                put_code(bits, codes + (size_t)t * rb, b0 + i, q_code(x[b0 + i], mv, inv, top));
        }
}

void kvq_dequantize_vrow(int bits, const uint8_t* codes, const uint16_t* grid, const uint16_t* step, int r,
                         float* x) {
    check_bits(bits);
    const float ds = fp16_to_fp32(step[0]), dm = fp16_to_fp32(step[1]);
    for (int c = 0; c < r; c++) {
        const uint16_t g = grid[c / KV_Q4_VBLOCK];
        x[c] = kivi_grid_scale(g, ds) * (float)get_code(bits, codes, c) + kivi_grid_min(g, dm);
    }
}

void kvq_dequantize_values(int bits, const uint8_t* codes, const uint16_t* grid, const uint16_t* step, int n, int r,
                           float* X) {
    const int rb = kv_qb_row_bytes(bits, r), nb = kv_n_blocks(r, KV_Q4_VBLOCK);
    for (int t = 0; t < n; t++)
        kvq_dequantize_vrow(bits, codes + (size_t)t * rb, grid + (size_t)t * nb, step, r, X + (size_t)t * r);
}

// ---- 4-bit / 2-bit keys (per channel over a group) ----

float kvq_key_grid_sse(int bits, const float* x, int n, int64_t stride, const uint8_t* skip, int64_t skip_stride,
                       float lo, float hi) {
    const int top = (1 << bits) - 1;
    const float st = (hi - lo) / (float)top, inv = 1.0f / st;
    float e[8] = {};
    for (int t = 0; t < n; t++) {
        const float v = x[t * stride];
        const float q = std::fmin(std::fmax(std::nearbyint((v - lo) * inv), 0.0f), (float)top);
        const float d = (skip && skip[t * skip_stride]) ? 0.0f : v - std::fma(st, q, lo);
        e[t % 8] = std::fma(d, d, e[t % 8]);
    }
    return ((e[0] + e[1]) + (e[2] + e[3])) + ((e[4] + e[5]) + (e[6] + e[7]));
}

namespace {

#ifdef ZK_SIMD_AVX2
// kvq_key_grid_sse over a channel gathered into lanes of 8 (token t in lane
// t % 8 of vector t / 8; keep = all ones for a counted token, zeros for a
// skipped one or the padding): the same fmas in the same order per lane.
float key_grid_sse_avx2(int bits, const float* x, const float* keep, int nv, float lo, float hi) {
    const int top = (1 << bits) - 1;
    const float st = (hi - lo) / (float)top, inv = 1.0f / st;
    const __m256 vlo = _mm256_set1_ps(lo), vst = _mm256_set1_ps(st), vinv = _mm256_set1_ps(inv);
    const __m256 vtop = _mm256_set1_ps((float)top), zero = _mm256_setzero_ps();
    __m256 e = zero;
    for (int k = 0; k < nv; k++) {
        const __m256 v = _mm256_load_ps(x + 8 * k);
        __m256 q = _mm256_round_ps(_mm256_mul_ps(_mm256_sub_ps(v, vlo), vinv),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        q = _mm256_min_ps(_mm256_max_ps(q, zero), vtop);
        const __m256 d = _mm256_and_ps(_mm256_sub_ps(v, _mm256_fmadd_ps(vst, q, vlo)), _mm256_load_ps(keep + 8 * k));
        e = _mm256_fmadd_ps(d, d, e);
    }
    alignas(32) float l[8];
    _mm256_store_ps(l, e);
    return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}
#endif

}  // namespace

void kvq_key_grid_search(int bits, const float* x, int n, int64_t stride, const uint8_t* skip,
                         int64_t skip_stride, float* lo, float* hi, bool ref) {
    float mn, mx;
    q_range(x, n, stride, skip, skip_stride, &mn, &mx);
    *lo = mn, *hi = mx;
    if (!(mx > mn)) return;
#ifdef ZK_SIMD_AVX2
    constexpr int k_lanes_max = 256;
    alignas(32) float xl[k_lanes_max], keep[k_lanes_max];
    const int nv = (n + 7) / 8;
    if (!ref && n <= k_lanes_max) {
        for (int t = 0; t < 8 * nv; t++) {
            const bool in = t < n && !(skip && skip[t * skip_stride]);
            xl[t] = t < n ? x[t * stride] : 0.0f;
            uint32_t m = in ? 0xffffffffu : 0u;
            std::memcpy(&keep[t], &m, sizeof m);
        }
    }
#endif
    auto eval = [&](float l, float h) {
#ifdef ZK_SIMD_AVX2
        if (!ref && n <= k_lanes_max) return key_grid_sse_avx2(bits, xl, keep, nv, l, h);
#endif
        return kvq_key_grid_sse(bits, x, n, stride, skip, skip_stride, l, h);
    };
    const float R = mx - mn;
    float be = eval(mn, mx);
    for (int a = 0; a <= KV_KEY_CLIP_STEPS; a++)
        for (int b = 0; b <= KV_KEY_CLIP_STEPS; b++) {
            if (a == 0 && b == 0) continue;
            const float l = std::fma(R, KV_KEY_CLIP_STEP * (float)a, mn), h = std::fma(R, -KV_KEY_CLIP_STEP * (float)b, mx);
            if (!(h > l)) continue;
            const float e = eval(l, h);
            if (e < be) be = e, *lo = l, *hi = h;
        }
}

namespace {

#ifdef ZK_SIMD_AVX2
// kvq_key_grid_search of channels c .. c + 7 of X [n x r] at once: a vector
// holds the 8 channels of one token (a row load, where one channel's values
// sit r floats apart). Per channel everything is kvq_key_grid_search's: the
// range with its strict comparisons, the candidates in the same order, each
// error's fmas in token order into accumulator t % 8 reduced in the same tree,
// and an update only on a strictly smaller error; so the grids are the same,
// bit for bit. keep [n]: all ones where token t of the 8 channels counts.
void key_grid_search8(int bits, const float* X, int n, int r, const __m256* keep, float* lo, float* hi) {
    __m256 mn = _mm256_set1_ps(INFINITY), mx = _mm256_set1_ps(-INFINITY);
    for (int t = 0; t < n; t++) {  // q_range: a value replaces the min only when below it
        const __m256 v = _mm256_loadu_ps(X + (int64_t)t * r);
        mn = _mm256_blendv_ps(mn, v, _mm256_and_ps(keep[t], _mm256_cmp_ps(v, mn, _CMP_LT_OQ)));
        mx = _mm256_blendv_ps(mx, v, _mm256_and_ps(keep[t], _mm256_cmp_ps(mx, v, _CMP_LT_OQ)));
    }
    const __m256 none = _mm256_cmp_ps(mn, mx, _CMP_GT_OQ);  // every token skipped: [0, 0]
    mn = _mm256_andnot_ps(none, mn), mx = _mm256_andnot_ps(none, mx);
    const __m256 valid = _mm256_cmp_ps(mx, mn, _CMP_GT_OQ);  // else the range itself, unsearched
    const float top = (float)((1 << bits) - 1);
    const __m256 vtop = _mm256_set1_ps(top), zero = _mm256_setzero_ps();
    auto sse = [&](__m256 l, __m256 h) {
        const __m256 st = _mm256_div_ps(_mm256_sub_ps(h, l), vtop);
        const __m256 inv = _mm256_div_ps(_mm256_set1_ps(1.0f), st);
        __m256 e[8];
        for (int i = 0; i < 8; i++) e[i] = zero;
        auto add = [&](int t, __m256& acc) {
            const __m256 v = _mm256_loadu_ps(X + (int64_t)t * r);
            __m256 q = _mm256_round_ps(_mm256_mul_ps(_mm256_sub_ps(v, l), inv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            q = _mm256_min_ps(_mm256_max_ps(q, zero), vtop);
            const __m256 d = _mm256_and_ps(_mm256_sub_ps(v, _mm256_fmadd_ps(st, q, l)), keep[t]);
            acc = _mm256_fmadd_ps(d, d, acc);
        };
        int t = 0;
        for (; t + 8 <= n; t += 8)  // unrolled so the accumulators stay in registers
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++) add(t + i, e[i]);
        for (; t < n; t++) add(t, e[t % 8]);
        return _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(e[0], e[1]), _mm256_add_ps(e[2], e[3])),
                             _mm256_add_ps(_mm256_add_ps(e[4], e[5]), _mm256_add_ps(e[6], e[7])));
    };
    const __m256 R = _mm256_sub_ps(mx, mn);
    __m256 be = sse(mn, mx), bl = mn, bh = mx;
    for (int a = 0; a <= KV_KEY_CLIP_STEPS; a++)
        for (int b = 0; b <= KV_KEY_CLIP_STEPS; b++) {
            if (a == 0 && b == 0) continue;
            const __m256 l = _mm256_fmadd_ps(R, _mm256_set1_ps(KV_KEY_CLIP_STEP * (float)a), mn);
            const __m256 h = _mm256_fmadd_ps(R, _mm256_set1_ps(-KV_KEY_CLIP_STEP * (float)b), mx);
            const __m256 ok = _mm256_and_ps(valid, _mm256_cmp_ps(h, l, _CMP_GT_OQ));
            if (_mm256_movemask_ps(ok) == 0) continue;
            const __m256 e = sse(l, h);
            const __m256 better = _mm256_and_ps(ok, _mm256_cmp_ps(e, be, _CMP_LT_OQ));
            be = _mm256_blendv_ps(be, e, better);
            bl = _mm256_blendv_ps(bl, l, better), bh = _mm256_blendv_ps(bh, h, better);
        }
    _mm256_storeu_ps(lo, bl);
    _mm256_storeu_ps(hi, bh);
}
#endif

}  // namespace

void kvq_key_grid_search_rows(int bits, const float* X, int n, int r, int nc, const uint8_t* skip, float* lo,
                              float* hi, bool ref) {
    int c = 0;
#ifdef ZK_SIMD_AVX2
    constexpr int k_tokens_max = 256;
    if (!ref && n <= k_tokens_max && nc >= 8) {
        alignas(32) __m256 keep[k_tokens_max];
        for (; c + 8 <= nc; c += 8) {
            for (int t = 0; t < n; t++) {
                if (!skip) {
                    keep[t] = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
                    continue;
                }
                uint64_t b;
                std::memcpy(&b, skip + (int64_t)t * r + c, sizeof b);
                const __m256i sk = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)b));
                keep[t] = _mm256_castsi256_ps(_mm256_cmpeq_epi32(sk, _mm256_setzero_si256()));
            }
            key_grid_search8(bits, X + c, n, r, keep, lo + c, hi + c);
        }
    }
#endif
    for (; c < nc; c++) kvq_key_grid_search(bits, X + c, n, r, skip ? skip + c : nullptr, r, &lo[c], &hi[c], ref);
}

void kvq_grid_codes(int bits, const float* lo, const float* hi, int r, uint16_t* grid, uint16_t* step, int tail,
                    int zero, int mid) {
    const int rc = r - zero;  // channels with codes; [rc, r) are 0-bit, lo = their mean
    // the levels above a channel's min: 2^bits - 1, 3 in the 2-bit part, 1 in a 1-bit tail
    auto top = [&](int c) {
        return c < rc - tail - mid ? (float)((1 << bits) - 1) : c < rc - tail ? 3.0f : 1.0f;
    };
    float mabs = 0;
    for (int c = 0; c < r; c++) mabs = std::fmax(mabs, std::fabs(lo[c]));
    step[1] = f16_ceil(mabs / 127.0f);
    const float dm = fp16_to_fp32(step[1]);
    auto min_code = [&](int c) { return dm > 0 ? std::fmin(std::fmax(std::floor(lo[c] / dm), -127.0f), 127.0f) : 0.0f; };
    float smax = 0;
    // hi - m as one fma, as kernels/cuda/kv_append.cu computes it
    for (int c = 0; c < rc; c++) smax = std::fmax(smax, std::fma(-dm, min_code(c), hi[c]) / top(c));
    step[0] = f16_ceil(smax / 255.0f);
    const float ds = fp16_to_fp32(step[0]);
    for (int c = 0; c < rc; c++) {
        const float mc = min_code(c), need = std::fma(-dm, mc, hi[c]) / top(c);
        const int sc = ds > 0 ? (int)std::fmin(std::fmax(std::ceil(need / ds), 0.0f), 255.0f) : 0;
        grid[c] = (uint16_t)(sc | (((int)mc & 0xff) << 8));
    }
    // a 0-bit channel is its level: the nearest min code, not one below
    int8_t* zb = (int8_t*)(grid + rc);
    for (int c = rc; c < r; c++)
        zb[c - rc] = (int8_t)(dm > 0 ? std::fmin(std::fmax(std::nearbyint(lo[c] / dm), -127.0f), 127.0f) : 0.0f);
    if (zero % 2) zb[zero] = 0;
}

void kvq_key_levels_1bit(const float* x, int n, int64_t stride, const uint8_t* skip, int64_t skip_stride,
                         float* lo, float* hi) {
    float mn, mx;
    q_range(x, n, stride, skip, skip_stride, &mn, &mx);
    *lo = mn, *hi = mx;
    // Lloyd's iterations for two levels: each level the mean of the values
    // nearer to it; from the range's ends they settle in a few steps
    for (int it = 0; it < 8 && *hi > *lo; it++) {
        const float mid = 0.5f * (*lo + *hi);
        double s0 = 0, s1 = 0;
        int n0 = 0, n1 = 0;
        for (int t = 0; t < n; t++) {
            if (skip && skip[t * skip_stride]) continue;
            const float v = x[t * stride];
            if (v > mid)
                s1 += v, n1++;
            else
                s0 += v, n0++;
        }
        const float l = n0 ? (float)(s0 / n0) : *lo, h = n1 ? (float)(s1 / n1) : *hi;
        if (l == *lo && h == *hi) break;
        *lo = l, *hi = h;
    }
}

namespace {

// Checks a key row's channel counts; h4 (out): its channels at `bits`.
void check_key_parts(int bits, int r, int tail, int zero, int mid, int* h4) {
    check_bits(bits);
    if (r > KV_KEY_MAX_R) ZK_THROW("%d-bit keys of %d channels: at most %d", bits, r, KV_KEY_MAX_R);
    if (zero < 0 || zero > r) ZK_THROW("%d 0-bit key channels in a key of %d: at most %d", zero, r, r);
    if (tail < 0 || tail > r - zero || tail > KV_KEY_TAIL_MAX)
        ZK_THROW("a 1-bit key tail of %d channels in a key of %d (%d of them 0-bit): at most min(%d, %d)", tail, r,
                 zero, r - zero, KV_KEY_TAIL_MAX);
    if (mid < 0 || mid > r - zero - tail || (mid > 0 && bits != 4))
        ZK_THROW("%d 2-bit key channels in %d-bit keys of %d (%d 1-bit, %d 0-bit): 4-bit keys only, at most %d", mid,
                 bits, r, tail, zero, r - zero - tail);
    *h4 = r - zero - tail - mid;
}

}  // namespace

void kvq_quantize_keys(int bits, const float* X, int n, int r, uint8_t* codes, uint16_t* grid, uint16_t* step,
                       const uint8_t* skip, int tail, int zero, int mid) {
    int h4;
    check_key_parts(bits, r, tail, zero, mid, &h4);
    const int rc = r - zero, h = rc - tail, rb = kv_key_row_bytes(bits, r, tail, zero, mid);
    const int rb4 = kv_qb_row_bytes(bits, h4), rbh = rb4 + kv_qb_row_bytes(2, mid), tb = kv_tail_bytes(tail);
    float lo[KV_KEY_MAX_R] = {}, hi[KV_KEY_MAX_R] = {};
    kvq_key_grid_search_rows(bits, X, n, r, h4, skip, lo, hi);
    if (mid > 0) kvq_key_grid_search_rows(2, X + h4, n, r, mid, skip ? skip + h4 : nullptr, lo + h4, hi + h4);
    for (int c = h; c < rc; c++) kvq_key_levels_1bit(X + c, n, r, skip ? skip + c : nullptr, r, &lo[c], &hi[c]);
    for (int c = rc; c < r; c++) {  // 0-bit: the mean of the channel's (kept) tokens
        double sum = 0;
        int cnt = 0;
        for (int t = 0; t < n; t++)
            if (!(skip && skip[(size_t)t * r + c])) sum += X[(size_t)t * r + c], cnt++;
        lo[c] = hi[c] = cnt ? (float)(sum / cnt) : 0.0f;
    }
    kvq_grid_codes(bits, lo, hi, r, grid, step, tail, zero, mid);
    const float ds = fp16_to_fp32(step[0]), dm = fp16_to_fp32(step[1]);
    std::memset(codes, 0, (size_t)n * rb);  // unused high bits zero, as for values
    for (int c = 0; c < rc; c++) {
        const float sv = kivi_grid_scale(grid[c], ds), mv = kivi_grid_min(grid[c], dm);
        const float inv = sv > 0 ? 1.0f / sv : 0.0f;
        if (c < h4) {
            const int top = (1 << bits) - 1;
            for (int t = 0; t < n; t++)
                put_code(bits, codes + (size_t)t * rb, c, q_code(X[(size_t)t * r + c], mv, inv, top));
        } else if (c < h) {  // the 2-bit part: a 2-bit row from byte rb4
            for (int t = 0; t < n; t++)
                put_code(2, codes + (size_t)t * rb + rb4, c - h4, q_code(X[(size_t)t * r + c], mv, inv, 3));
        } else {  // tail channel i: bit i / tb of tail byte i % tb
            const int i = c - h;
            for (int t = 0; t < n; t++)
                codes[(size_t)t * rb + rbh + i % tb] |= (uint8_t)(q_code(X[(size_t)t * r + c], mv, inv, 1) << (i / tb));
        }
    }
}

void kvq_dequantize_keys(int bits, const uint8_t* codes, const uint16_t* grid, const uint16_t* step, int n, int r,
                         float* X, int tail, int zero, int mid) {
    int h4;
    check_key_parts(bits, r, tail, zero, mid, &h4);
    const int rc = r - zero, h = rc - tail, rb = kv_key_row_bytes(bits, r, tail, zero, mid);
    const int rb4 = kv_qb_row_bytes(bits, h4), rbh = rb4 + kv_qb_row_bytes(2, mid), tb = kv_tail_bytes(tail);
    const float ds = fp16_to_fp32(step[0]), dm = fp16_to_fp32(step[1]);
    const int8_t* zb = kv_key_zero_mins(grid, r, zero);
    for (int c = rc; c < r; c++)
        for (int t = 0; t < n; t++) X[(size_t)t * r + c] = dm * (float)zb[c - rc];
    for (int c = 0; c < rc; c++) {
        const float sv = kivi_grid_scale(grid[c], ds), mv = kivi_grid_min(grid[c], dm);
        for (int t = 0; t < n; t++) {
            const uint8_t* row = codes + (size_t)t * rb;
            const int code = c < h4  ? get_code(bits, row, c)
                             : c < h ? get_code(2, row + rb4, c - h4)
                                     : (row[rbh + (c - h) % tb] >> ((c - h) / tb)) & 1;
            X[(size_t)t * r + c] = sv * (float)code + mv;
        }
    }
}

// ---- GEAR ----

int kvq_gear_n_outliers(int n, int r, float frac) {
    if (frac <= 0) return 0;
    return std::min(n * r, (int)std::ceil(frac * n * r));
}

int64_t kvq_gear_work(int n, int r) { return 3 * (int64_t)n * r + n + r + ((int64_t)n * r + 3) / 4 + 8; }

static void dequantize_group(int bits, const uint8_t* codes, const uint16_t* s, const uint16_t* m, int n, int r,
                             bool per_channel, float* X) {
    if (per_channel)
        kvq_dequantize_keys(bits, codes, s, m, n, r, X);
    else
        kvq_dequantize_values(bits, codes, s, m, n, r, X);
}

void kvq_quantize_gear(const float* X, int n, int r, bool per_channel, int rank, int n_out, uint8_t* codes,
                       uint16_t* s, uint16_t* m, const kvq_gear_out& g, float* work, int bits) {
    check_bits(bits);
    ZK_ASSERT(n * r <= 65536 && n_out <= n * r && rank >= 0);
    const int64_t N = (int64_t)n * r;
    float* R = work;          // [n x r] residual
    float* dev = R + N;       // [n x r] distance from the quantization group's mean
    float* sel = dev + N;     // [n x r] copy for the selection
    float* u = sel + N;       // [n]
    float* v = u + n;         // [r]
    uint8_t* skip = (uint8_t*)(v + r);  // [n x r]

    // 1. outliers: the n_out elements farthest from their group's mean
    const int nb = kv_n_blocks(r, KV_Q4_VBLOCK);
    if (per_channel) {
        for (int c = 0; c < r; c++) {
            double mean = 0;
            for (int t = 0; t < n; t++) mean += X[(int64_t)t * r + c];
            mean /= n;
            for (int t = 0; t < n; t++) dev[(int64_t)t * r + c] = std::fabs(X[(int64_t)t * r + c] - (float)mean);
        }
    } else {
        for (int t = 0; t < n; t++)
            for (int b = 0; b < nb; b++) {
                const int c0 = b * KV_Q4_VBLOCK, c1 = std::min(r, c0 + KV_Q4_VBLOCK);
                double mean = 0;
                for (int c = c0; c < c1; c++) mean += X[(int64_t)t * r + c];
                mean /= (c1 - c0);
                for (int c = c0; c < c1; c++) dev[(int64_t)t * r + c] = std::fabs(X[(int64_t)t * r + c] - (float)mean);
            }
    }
    std::memset(skip, 0, (size_t)N);
    if (n_out > 0) {
        std::memcpy(sel, dev, sizeof(float) * N);
        std::nth_element(sel, sel + (n_out - 1), sel + N, [](float a, float b) { return a > b; });
        const float thr = sel[n_out - 1];
        int k = 0;
        for (int64_t i = 0; i < N && k < n_out; i++)
            if (dev[i] > thr) skip[i] = 1, g.out_idx[k++] = (uint16_t)i;
        for (int64_t i = 0; i < N && k < n_out; i++)
            if (dev[i] == thr && !skip[i]) skip[i] = 1, g.out_idx[k++] = (uint16_t)i;
        std::sort(g.out_idx, g.out_idx + n_out);
    }

    // 2. quantize without the outliers
    if (per_channel) {
        kvq_quantize_keys(bits, X, n, r, codes, s, m, skip);
    } else {
        kvq_quantize_values(bits, X, n, r, codes, s, m, skip);
    }

    // 3. low-rank approximation of the residual (outliers excluded), deflating
    // with the f16-rounded factors so later components see the rounding
    dequantize_group(bits, codes, s, m, n, r, per_channel, R);
    for (int64_t i = 0; i < N; i++) R[i] = skip[i] ? 0.0f : X[i] - R[i];
    for (int i = 0; i < rank; i++) {
        for (int c = 0; c < r; c++) v[c] = 1.0f + 0.37f * (float)((c * 7 + i * 3) % 11);  // fixed, non-degenerate start
        for (int it = 0; it < 12; it++) {
            for (int t = 0; t < n; t++) u[t] = 0;
            for (int t = 0; t < n; t++)
                for (int c = 0; c < r; c++) u[t] += R[(int64_t)t * r + c] * v[c];
            double nrm = 0;
            for (int c = 0; c < r; c++) {
                float acc = 0;
                for (int t = 0; t < n; t++) acc += R[(int64_t)t * r + c] * u[t];
                v[c] = acc;
                nrm += (double)acc * acc;
            }
            nrm = std::sqrt(nrm);
            if (nrm == 0) break;
            for (int c = 0; c < r; c++) v[c] = (float)(v[c] / nrm);
        }
        for (int t = 0; t < n; t++) {
            float acc = 0;
            for (int c = 0; c < r; c++) acc += R[(int64_t)t * r + c] * v[c];
            g.a[t * rank + i] = fp32_to_fp16(acc);
        }
        for (int c = 0; c < r; c++) g.b[c * rank + i] = fp32_to_fp16(v[c]);
        for (int t = 0; t < n; t++) {
            const float at = fp16_to_fp32(g.a[t * rank + i]);
            for (int c = 0; c < r; c++) R[(int64_t)t * r + c] -= at * fp16_to_fp32(g.b[c * rank + i]);
        }
    }

    // 4. outliers: exact up to f16, after the quantized and low-rank parts
    if (n_out > 0) {
        dequantize_group(bits, codes, s, m, n, r, per_channel, R);
        for (int k = 0; k < n_out; k++) {
            const int idx = g.out_idx[k], t = idx / r, c = idx % r;
            float lr = 0;
            for (int i = 0; i < rank; i++) lr += fp16_to_fp32(g.a[t * rank + i]) * fp16_to_fp32(g.b[c * rank + i]);
            g.out_val[k] = fp32_to_fp16(X[idx] - R[idx] - lr);
        }
    }
}

void kvq_dequantize_gear(const uint8_t* codes, const uint16_t* s, const uint16_t* m, int n, int r,
                         bool per_channel, int rank, int n_out, const uint16_t* a, const uint16_t* b,
                         const uint16_t* out_idx, const uint16_t* out_val, float* X, int bits) {
    check_bits(bits);
    dequantize_group(bits, codes, s, m, n, r, per_channel, X);
    for (int t = 0; t < n; t++)
        for (int c = 0; c < r; c++) {
            float lr = 0;
            for (int i = 0; i < rank; i++) lr += fp16_to_fp32(a[t * rank + i]) * fp16_to_fp32(b[c * rank + i]);
            X[(int64_t)t * r + c] += lr;
        }
    for (int k = 0; k < n_out; k++) X[out_idx[k]] += fp16_to_fp32(out_val[k]);
}

}  // namespace zk
