// Prefill attention, flash style (kernels/attention_prefill.h). AVX2 + FMA +
// F16C with 8-float vectors, AVX-512F with 16-float vectors; no kernel (and
// kernel_prefill_supported false) otherwise.
//
// Per call: M = n_tok x G query rows, scaled, in scratch (Qs [M x r_k]). For
// each key block of B = 2W slots (W floats per vector):
//   scores  S [M x B] = Qs K_blk^T: register tiles of RG rows x 2 vectors, one
//           broadcast query element times two vectors of transposed keys per
//           FMA pair (kt [block][c][B]);
//   softmax masked past each token's visible end; running max, sum and the
//           factor the row's value sums are rescaled by;
//   values  O [M x r_v] += P V_blk: tiles of RG2 rows x CW vectors of
//           channels, the value rows (f16 or f32) converted as they are loaded.
#include "kernels/cpu/avx512_warnings.h"  // first: GCC PR 105593

#include "kernels/attention_prefill.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "ggml-like/error.h"
#include "kernels/cpu/simd.h"

namespace zk {

attn_kv_view kernel_prefill_row_tail(const attn_kv_view& kv, int64_t* lo) {
    const int64_t at = std::min(kv.n_slots, std::max({kv.k.n_quant, kv.v.n_quant, kv.n_sink_slots}));
    const size_t elem = kv.type == dtype::F16 ? 2 : 4;
    auto side = [&](const attn_side_view& sv, int r) {
        attn_side_view o;  // KV_LAYOUT_ROWS, nothing quantized
        if (sv.rows) o.rows = (const uint8_t*)sv.rows + (size_t)(at - sv.n_quant) * r * elem;
        return o;
    };
    attn_kv_view t{};
    t.type = kv.type;
    t.pos = kv.pos + at;
    t.n_slots = kv.n_slots - at;
    t.r_k = kv.r_k;
    t.r_v = kv.r_v;
    t.k = side(kv.k, kv.r_k);
    t.v = side(kv.v, kv.r_v);
    *lo = at;
    return t;
}

#ifdef ZK_SIMD_AVX2

namespace {

#define ZK_UNROLL _Pragma("GCC unroll 16")

// ---------------------------------------------------------------- vectors

struct fv8 {
    using v = __m256;
    [[maybe_unused]] static constexpr int W = 8;
    [[maybe_unused]] static constexpr int RG = 6;   // score tile rows: 12 accumulators + 2 key vectors + a broadcast
    [[maybe_unused]] static constexpr int RG2 = 4;  // value tile: 4 rows x 2 vectors
    [[maybe_unused]] static constexpr int CW = 2;
    static v zero() { return _mm256_setzero_ps(); }
    static v load(const float* p) { return _mm256_loadu_ps(p); }
    static v load(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p)); }
    static void store(float* p, v x) { _mm256_storeu_ps(p, x); }
    static v bcast(const float* p) { return _mm256_broadcast_ss(p); }
    static v set1(float x) { return _mm256_set1_ps(x); }
    static v fmadd(v a, v b, v c) { return _mm256_fmadd_ps(a, b, c); }
    static v mul(v a, v b) { return _mm256_mul_ps(a, b); }
    static v sub(v a, v b) { return _mm256_sub_ps(a, b); }
    static v max(v a, v b) { return _mm256_max_ps(a, b); }
    static v add(v a, v b) { return _mm256_add_ps(a, b); }
    static v exp(v x) { return simd::exp8(x); }
    static float hmax(v x) {
        __m128 m = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
        m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
    }
    static float hsum(v x) { return simd::hsum(x); }
};

#if defined(__AVX512F__)
struct fv16 {
    using v = __m512;
    static constexpr int W = 16;
    static constexpr int RG = 12;  // 24 accumulators + 2 key vectors (broadcasts from memory)
    static constexpr int RG2 = 6;  // value tile: 6 rows x 4 vectors = 24 accumulators
    static constexpr int CW = 4;
    static v zero() { return _mm512_setzero_ps(); }
    static v load(const float* p) { return _mm512_loadu_ps(p); }
    static v load(const uint16_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p)); }
    static void store(float* p, v x) { _mm512_storeu_ps(p, x); }
    static v bcast(const float* p) { return _mm512_set1_ps(*p); }
    static v set1(float x) { return _mm512_set1_ps(x); }
    static v fmadd(v a, v b, v c) { return _mm512_fmadd_ps(a, b, c); }
    static v mul(v a, v b) { return _mm512_mul_ps(a, b); }
    static v sub(v a, v b) { return _mm512_sub_ps(a, b); }
    static v max(v a, v b) { return _mm512_max_ps(a, b); }
    static v add(v a, v b) { return _mm512_add_ps(a, b); }
    // the same polynomial as simd::exp8, on two halves
    static v exp(v x) {
        const __m256 lo = simd::exp8(_mm512_castps512_ps256(x));
        const __m256 hi = simd::exp8(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)));
        return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_castps256_ps512(lo)), _mm256_castps_pd(hi), 1));
    }
    static float hmax(v x) { return _mm512_reduce_max_ps(x); }
    static float hsum(v x) { return _mm512_reduce_add_ps(x); }
};
using F = fv16;
#else
using F = fv8;
#endif

constexpr int W = F::W;
constexpr int B = 2 * W;  // slots per key block
using fvec = F::v;

// ---------------------------------------------------------------- tiles

// s[i][0..B) = qs_i . kt[c][0..B) over c < rk, for RGN rows (stride ldq).
template <int RGN>
void scores_tile(const float* qs, int64_t ldq, const float* kt, int rk, float* s) {
    fvec a0[RGN], a1[RGN];
    ZK_UNROLL for (int i = 0; i < RGN; i++) a0[i] = a1[i] = F::zero();
    for (int c = 0; c < rk; c++) {
        const fvec b0 = F::load(kt + c * B), b1 = F::load(kt + c * B + W);
        ZK_UNROLL for (int i = 0; i < RGN; i++) {
            const fvec q = F::bcast(qs + i * ldq + c);
            a0[i] = F::fmadd(q, b0, a0[i]);
            a1[i] = F::fmadd(q, b1, a1[i]);
        }
    }
    ZK_UNROLL for (int i = 0; i < RGN; i++) {
        F::store(s + i * B, a0[i]);
        F::store(s + i * B + W, a1[i]);
    }
}

// n <= RGN rows: the largest tile that fits.
template <int RGN>
void scores_rows(int n, const float* qs, int64_t ldq, const float* kt, int rk, float* s) {
    if constexpr (RGN > 0) {
        if (n >= RGN) return scores_tile<RGN>(qs, ldq, kt, rk, s);
        scores_rows<RGN - 1>(n, qs, ldq, kt, rk, s);
    }
}

// o[i][c0 + k W ...] = corr_i o[i][...] + sum_s p[i][s] v_s[...] for RGN rows,
// CWN vectors of channels, ns slots.
template <int RGN, int CWN, typename T>
void values_tile(const float* p, const T* V, int64_t ns, int r_v, int c0, const float* corr, float* o) {
    fvec acc[RGN][CWN];
    ZK_UNROLL for (int i = 0; i < RGN; i++) {
        const fvec ci = F::set1(corr[i]);
        ZK_UNROLL for (int k = 0; k < CWN; k++) acc[i][k] = F::mul(ci, F::load(o + i * r_v + c0 + k * W));
    }
    for (int64_t s = 0; s < ns; s++) {
        fvec vv[CWN];
        ZK_UNROLL for (int k = 0; k < CWN; k++) vv[k] = F::load(V + s * r_v + c0 + k * W);
        ZK_UNROLL for (int i = 0; i < RGN; i++) {
            const fvec pi = F::bcast(p + i * B + s);
            ZK_UNROLL for (int k = 0; k < CWN; k++) acc[i][k] = F::fmadd(pi, vv[k], acc[i][k]);
        }
    }
    ZK_UNROLL for (int i = 0; i < RGN; i++)
        ZK_UNROLL for (int k = 0; k < CWN; k++) F::store(o + i * r_v + c0 + k * W, acc[i][k]);
}

inline float elem_f32(float x) { return x; }
inline float elem_f32(uint16_t x) { return _cvtsh_ss(x); }

// A row group of the value sums over all channel stripes; the last r_v % W
// channels (ranks are multiples of 4, not of W) one at a time.
template <int RGN, typename T>
void values_rows(const float* p, const T* V, int64_t ns, int r_v, const float* corr, float* o) {
    int c0 = 0;
    for (; c0 + F::CW * W <= r_v; c0 += F::CW * W) values_tile<RGN, F::CW>(p, V, ns, r_v, c0, corr, o);
    for (; c0 + W <= r_v; c0 += W) values_tile<RGN, 1>(p, V, ns, r_v, c0, corr, o);
    for (int i = 0; i < RGN; i++)
        for (int c = c0; c < r_v; c++) {
            float a = corr[i] * o[i * r_v + c];
            for (int64_t s = 0; s < ns; s++) a += p[i * B + s] * elem_f32(V[s * r_v + c]);
            o[i * r_v + c] = a;
        }
}

template <int RGN, typename T>
void values_rows_n(int n, const float* p, const T* V, int64_t ns, int r_v, const float* corr, float* o) {
    if constexpr (RGN > 0) {
        if (n >= RGN) return values_rows<RGN>(p, V, ns, r_v, corr, o);
        values_rows_n<RGN - 1>(n, p, V, ns, r_v, corr, o);
    }
}

template <typename T>
void prefill(const attn_kv_view& kv, const float* kt, const attn_q_view& q, float* out, int64_t out_stride,
             int64_t out_head_stride, const attn_partial* part, float* scratch) {
    const int G = q.n_group, rk = kv.r_k, rv = kv.r_v;
    const int64_t nt = q.n_tok, M = nt * G;
    float* qs = scratch;                 // [M x rk]
    float* sp = qs + M * rk;             // [M x B] scores, then probabilities
    float* o = sp + M * B;               // [M x rv]
    float* mx = o + M * rv;              // [M]
    float* l = mx + M;                   // [M]
    float* corr = l + M;                 // [M]
    int32_t* vis = (int32_t*)(corr + M);  // [nt] visible slots of each token (a prefix)
    const float neg_inf = -std::numeric_limits<float>::infinity();
    int64_t e_max = 0;
    for (int64_t t = 0; t < nt; t++) {
        vis[t] = (int32_t)(std::upper_bound(kv.pos, kv.pos + kv.n_slots, q.q_pos[t]) - kv.pos);
        e_max = std::max<int64_t>(e_max, vis[t]);
        for (int j = 0; j < G; j++) {
            const float* src = q.q + t * q.q_stride + j * q.q_head_stride;
            float* dst = qs + (t * G + j) * rk;
            for (int c = 0; c < rk; c++) dst[c] = src[c] * q.scale;
        }
    }
    std::memset(o, 0, sizeof(float) * M * rv);
    for (int64_t m = 0; m < M; m++) mx[m] = neg_inf, l[m] = 0;
    const T* V = (const T*)kv.v.rows;
    for (int64_t s0 = 0; s0 < e_max; s0 += B) {
        const float* ktb = kt + (s0 / B) * (int64_t)rk * B;
        for (int64_t m = 0; m < M; m += F::RG) scores_rows<F::RG>((int)std::min<int64_t>(F::RG, M - m), qs + m * rk, rk, ktb, rk, sp + m * B);
        for (int64_t m = 0; m < M; m++) {
            float* s = sp + m * B;
            const int64_t valid = vis[m / G] - s0;
            for (int64_t k = std::max<int64_t>(valid, 0); k < B; k++) s[k] = neg_inf;
            const fvec v0 = F::load(s), v1 = F::load(s + W);
            const float mnew = std::max(mx[m], F::hmax(F::max(v0, v1)));
            if (mnew == neg_inf) {  // nothing visible yet (not in a causal prefill): keep the row as it is
                corr[m] = 1.0f;
                F::store(s, F::zero());
                F::store(s + W, F::zero());
                continue;
            }
            const float c = std::exp(mx[m] - mnew);
            const fvec vm = F::set1(mnew);
            const fvec p0 = F::exp(F::sub(v0, vm)), p1 = F::exp(F::sub(v1, vm));
            F::store(s, p0);
            F::store(s + W, p1);
            l[m] = l[m] * c + F::hsum(F::add(p0, p1));
            mx[m] = mnew;
            corr[m] = c;
        }
        const int64_t ns = std::min<int64_t>(B, e_max - s0);
        for (int64_t m = 0; m < M; m += F::RG2)
            values_rows_n<F::RG2>((int)std::min<int64_t>(F::RG2, M - m), sp + m * B, V + s0 * rv, ns, rv, corr + m, o + m * rv);
    }
    if (part) {  // unnormalised, in attn_partial's layout (rows m = t G + j, as here)
        std::memcpy(part->m, mx, sizeof(float) * M);
        std::memcpy(part->l, l, sizeof(float) * M);
        const int d = part->acc_dim > 0 ? part->acc_dim : rv;
        for (int64_t m = 0; m < M; m++) std::memcpy(part->acc + m * d, o + m * rv, sizeof(float) * rv);
        return;
    }
    for (int64_t t = 0; t < nt; t++)
        for (int j = 0; j < G; j++) {
            const int64_t m = t * G + j;
            const float inv = l[m] > 0 ? 1.0f / l[m] : 0.0f;
            float* dst = out + t * out_stride + j * out_head_stride;
            for (int c = 0; c < rv; c++) dst[c] = o[m * rv + c] * inv;
        }
}

}  // namespace

int kernel_prefill_key_block() { return B; }

bool kernel_prefill_supported(const attn_kv_view& kv) {
    return (kv.type == dtype::F16 || kv.type == dtype::F32) && kv.k.layout == KV_LAYOUT_ROWS && kv.v.layout == KV_LAYOUT_ROWS &&
           kv.n_sink_slots == 0 && kv.r_k >= 1 && kv.r_v >= 1;
}

int64_t kernel_prefill_keys_size(int64_t n_slots, int r_k) { return (n_slots + B - 1) / B * B * (int64_t)r_k; }

void kernel_prefill_keys(const attn_kv_view& kv, int64_t b0, int64_t b1, float* kt) {
    const int rk = kv.r_k;
    float row[256 + 16];
    ZK_ASSERT(rk <= 256);
    for (int64_t b = b0; b < b1; b++) {
        float* dst = kt + b * (int64_t)rk * B;
        for (int k = 0; k < B; k++) {
            const int64_t s = b * B + k;
            if (s >= kv.n_slots) {
                for (int c = 0; c < rk; c++) dst[c * B + k] = 0.0f;
                continue;
            }
            if (kv.type == dtype::F16)
                simd::f16_to_f32_row((const uint16_t*)kv.k.rows + s * rk, row, rk);
            else
                std::memcpy(row, (const float*)kv.k.rows + s * rk, sizeof(float) * rk);
            for (int c = 0; c < rk; c++) dst[c * B + k] = row[c];
        }
    }
}

int kernel_prefill_tokens(int n_group) {
    // rows per call a multiple of the score tile and at least 48 (the K and V
    // loads of a block are shared by all rows)
    int nt = F::RG / std::__gcd(F::RG, n_group);
    while (nt * n_group < 48) nt *= 2;
    return nt;
}

int64_t kernel_prefill_scratch(int n_group, int64_t n_tok, int r_k, int r_v) {
    const int64_t M = n_tok * n_group;
    return M * (r_k + B + r_v + 3) + n_tok;
}

void kernel_attention_prefill(const attn_kv_view& kv, const float* kt, const attn_q_view& q, float* out,
                              int64_t out_stride, int64_t out_head_stride, float* scratch) {
    ZK_ASSERT(kernel_prefill_supported(kv));
    if (kv.type == dtype::F16)
        prefill<uint16_t>(kv, kt, q, out, out_stride, out_head_stride, nullptr, scratch);
    else
        prefill<float>(kv, kt, q, out, out_stride, out_head_stride, nullptr, scratch);
}

void kernel_attention_prefill_partial(const attn_kv_view& kv, const float* kt, const attn_q_view& q,
                                      const attn_partial& out, float* scratch) {
    ZK_ASSERT(kernel_prefill_supported(kv) && !out.logits);
    if (kv.type == dtype::F16)
        prefill<uint16_t>(kv, kt, q, nullptr, 0, 0, &out, scratch);
    else
        prefill<float>(kv, kt, q, nullptr, 0, 0, &out, scratch);
}

#else  // no AVX2: kernel_prefill_supported says no, the callers use kernel_attention_range

int kernel_prefill_key_block() { return 1; }
bool kernel_prefill_supported(const attn_kv_view&) { return false; }
int64_t kernel_prefill_keys_size(int64_t n_slots, int r_k) { return n_slots * r_k; }
void kernel_prefill_keys(const attn_kv_view&, int64_t, int64_t, float*) { ZK_THROW("kernel_prefill_keys: not in this build"); }
int kernel_prefill_tokens(int) { return 1; }
int64_t kernel_prefill_scratch(int, int64_t, int, int) { return 0; }
void kernel_attention_prefill(const attn_kv_view&, const float*, const attn_q_view&, float*, int64_t, int64_t, float*) {
    ZK_THROW("kernel_attention_prefill: not in this build");
}
void kernel_attention_prefill_partial(const attn_kv_view&, const float*, const attn_q_view&, const attn_partial&, float*) {
    ZK_THROW("kernel_attention_prefill_partial: not in this build");
}

#endif

}  // namespace zk

#undef ZK_UNROLL  // this file's own; unity builds join it with others
