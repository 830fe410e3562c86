// Key scores over KIVI rows of several parts (4-bit codes, 2-bit ones, a 1-bit
// tail: the plans' rows, attention_q4_parts.cpp and attention_q2.cpp) in the
// wide form of the 4-bit loop (attention_q4.cpp): 16 slots a pass, their rows
// transposed so that vector c holds dword c (row bytes 4c .. 4c + 3) of every
// slot, lane d slot d. A part's codes in that dword (one sub-vector i a nibble,
// a 2-bit plane or a bit plane of each byte: a "unit") meet four query bytes
// broadcast from memory, one dpbusd a unit and head adding 16 slots' products
// into their own lanes: every head in one pass, no horizontal sums. The narrow
// loops take two (parts) or four (2-bit and tail) slots a vector and reduce
// every slot's sums across lanes.
//
// The query dwords are int8 bytes permuted once a group (vpermt2b) into unit
// order, a head's units at a fixed stride so that every (unit, head) address
// is a register plus a constant: for 4-bit rows from one fold of all three
// parts over the group's grid (kivi_wide_parts_group: the bytes and scales of
// the widths' three folds, from one pass, in channel order), for 2-bit rows
// with a tail from their fold's own layout (kivi_wide_parts_scores). A unit's
// bytes outside its part (a dword that straddles two parts) meet zero query
// bytes (the permute's zero mask). Each part's int32 sums are its narrow
// twin's integers; they are scaled by the part's qd in turn, so the scores
// differ from the narrow loops' in float rounding only (tests/
// test_attention_layouts.cpp holds them to it). A range's last, partial 16
// reads zero rows past its end and stores only its own lanes.
#include "kernels/cpu/avx512_warnings.h"  // first: GCC PR 105593

#include <algorithm>
#include <cstdint>
#include <utility>

#include "ggml-like/error.h"
#include "kernels/cpu/attention_kivi.h"

namespace zk {
namespace attn {

#if defined(ZK_SIMD_AVX2) && defined(ZK_KIVI_WIDE_VALUES)
namespace {

constexpr int k_max_parts = 3;
// A part has at most 3 x 16 units (a 1-bit tail of 16 bytes: 5 columns of 8;
// 2-bit parts of 32 bytes: 9 of 4; 4-bit ones of 64: 17 of 2), each part's
// from a 64-byte boundary, so a head's units fill at most this many bytes.
constexpr int k_part_segs = 3;
constexpr int k_head_bytes = k_max_parts * k_part_segs * 64;
constexpr int k_max_heads = 8;

// Where part byte b's sub-vector i finds its query byte (in the bytes a head
// of the source holds): base + e, e = cs (b / 32) + mb (b % 32) + ps i, if e
// < nch. The narrow layouts (kivi_wide_part) have base 0, mb 1 and zero bytes
// past their channels; the fused fold's channel order has a channel's index
// there (4-bit: 2b + i, 2-bit: h + 4b + i, 1-bit: h + mid + i tb + b), where
// e >= nch (the high nibble of an odd 4-bit part's last byte) would be the
// next part's first channel.
struct part_shape {
    int bits, off, len, base, cs, mb, ps, nch;
    bool operator==(const part_shape& o) const {
        return bits == o.bits && off == o.off && len == o.len && base == o.base && cs == o.cs && mb == o.mb &&
               ps == o.ps && nch == o.nch;
    }
};

// Where a row shape's units lie, and how the parts' query bytes permute into
// them: built once a shape (a KV head's rows) and kept for the next groups.
struct unit_table {
    int np = -1;
    part_shape shape[k_max_parts];
    bool ok = false;
    int ncols = 0;                         // columns any part reads
    int c0[k_max_parts], c1[k_max_parts];  // a part's columns [c0, c1)
    int u0[k_max_parts];                   // its first unit in a head's table (a multiple of 16)
    int nseg[k_max_parts];                 // its 64-byte segments of units
    int srcb[k_max_parts];                 // source bytes it reads a head
    alignas(64) uint8_t idx[k_max_parts][k_part_segs][64];
    uint64_t valid[k_max_parts][k_part_segs];  // the unit bytes of the part (others 0)
};

bool unit_table_build(unit_table& t, const part_shape* sh, int np) {
    t.np = np;  // the whole key first: a shape that fails is remembered as failing, not as another's
    for (int p = 0; p < np; p++) t.shape[p] = sh[p];
    t.ncols = 0;
    int u = 0;
    for (int p = 0; p < np; p++) {
        const part_shape& s = sh[p];
        const int nsub = 8 / s.bits;
        t.c0[p] = s.off / 4;
        t.c1[p] = (s.off + s.len + 3) / 4;
        const int units = (t.c1[p] - t.c0[p]) * nsub;
        if (s.len < 1 || t.c1[p] > 16 || units > 16 * k_part_segs) return t.ok = false;
        t.ncols = std::max(t.ncols, t.c1[p]);
        t.u0[p] = u;
        t.nseg[p] = (units + 15) / 16;
        u += 16 * t.nseg[p];
        t.srcb[p] = 0;
        for (int g = 0; g < k_part_segs; g++) {
            t.valid[p][g] = 0;
            for (int k = 0; k < 64; k++) t.idx[p][g][k] = 0;
        }
        for (int v = 0; v < units; v++) {
            const int c = t.c0[p] + v / nsub, i = v % nsub;
            for (int k = 0; k < 4; k++) {
                const int b = 4 * c + k - s.off;
                if (b < 0 || b >= s.len) continue;
                const int ch = s.cs * (b >> 5) + s.mb * (b & 31) + s.ps * i, pos = s.base + ch;
                if (ch >= s.nch) continue;
                if (pos >= 128) return t.ok = false;
                const int e = 4 * (v % 16) + k;
                t.idx[p][v / 16][e] = (uint8_t)pos;
                t.valid[p][v / 16] |= 1ull << e;
                t.srcb[p] = std::max(t.srcb[p], pos + 1);
            }
        }
    }
    return t.ok = true;
}

// The table of this row shape: a few shapes kept a thread (a layer's KV heads
// differ; a head's groups share one).
const unit_table& unit_table_for(const part_shape* sh, int np) {
    constexpr int k_cached = 4;
    thread_local unit_table cache[k_cached];
    thread_local int next = 0;
    for (unit_table& t : cache) {
        if (t.np != np) continue;
        bool same = true;
        for (int p = 0; p < np && same; p++) same = t.shape[p] == sh[p];
        if (same) return t;
    }
    unit_table& t = cache[next];
    next = (next + 1) % k_cached;
    unit_table_build(t, sh, np);
    return t;
}

inline __mmask64 first_bytes(int k) { return k >= 64 ? ~0ull : (1ull << k) - 1; }

using head_units = int8_t[k_max_heads * k_head_bytes];

// A part's units of G heads: of its columns [c0, c1), per sub-vector i the
// bits [B i, B i + B) of every byte (a 16-bit shift: the bits from the next
// byte land above the mask) against the unit's query dword of every head.
template <int G, int B, int... J, int... I>
__attribute__((always_inline)) inline void part_units(const __m512i* col, int c0, int c1, const int8_t* q,
                                                      const head_units& qw, __m512i (&acc)[G],
                                                      std::integer_sequence<int, J...>,
                                                      std::integer_sequence<int, I...>) {
    const __m512i m = _mm512_set1_epi8((char)((1 << B) - 1));
    for (int c = c0; c < c1; c++) {
        const __m512i v = col[c];
        auto sub = [&](auto ii) __attribute__((always_inline)) {
            constexpr int i = decltype(ii)::value;
            const __m512i x = _mm512_and_si512(i ? _mm512_srli_epi16(v, B * i) : v, m);
            ((acc[J] = kivi_dpbusd512_bcast<J * k_head_bytes>(acc[J], x, q, qw)), ...);
            q += 4;
        };
        (sub(std::integral_constant<int, I>()), ...);
    }
}

// Rows of at most 32 bytes: rows i and i + 8 in the halves of z[i] (8 dwords
// each), an 8 x 8 transpose in both halves at once, the halves' quarters
// interleaved: col[c] lane d = dword c of row d, for c < ncols. Rows from cnt
// on (a range's last, partial 16) are zeros, not read.
__attribute__((always_inline)) inline void columns8(const uint8_t* c0, int rb, int cnt, __m512i* col, int ncols) {
    __m512i z[8], t[8], x[8];
    auto row = [&](int i) {
        return i < cnt ? _mm256_loadu_si256((const __m256i*)(c0 + i * rb)) : _mm256_setzero_si256();
    };
    for (int i = 0; i < 8; i++) z[i] = _mm512_inserti64x4(_mm512_castsi256_si512(row(i)), row(i + 8), 1);
    for (int k = 0; k < 4; k++) {  // a 128-bit lane of rows A, B: A0 B0 A1 B1, A2 B2 A3 B3
        t[2 * k] = _mm512_unpacklo_epi32(z[2 * k], z[2 * k + 1]);
        t[2 * k + 1] = _mm512_unpackhi_epi32(z[2 * k], z[2 * k + 1]);
    }
    // x[4h + m], lane L: dword 4 (L % 2) + m of rows 4h .. 4h + 3 (L < 2) or 8 + 4h .. (L >= 2)
    for (int h = 0; h < 2; h++) {
        x[4 * h] = _mm512_unpacklo_epi64(t[4 * h], t[4 * h + 2]);
        x[4 * h + 1] = _mm512_unpackhi_epi64(t[4 * h], t[4 * h + 2]);
        x[4 * h + 2] = _mm512_unpacklo_epi64(t[4 * h + 1], t[4 * h + 3]);
        x[4 * h + 3] = _mm512_unpackhi_epi64(t[4 * h + 1], t[4 * h + 3]);
    }
    const __m512i lo = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13), hi = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
    for (int c = 0; c < ncols; c++) {
        const int m = c & 3;
        col[c] = _mm512_permutex2var_epi64(x[m], c < 4 ? lo : hi, x[4 + m]);
    }
}

// Rows of 33..64 bytes: the 4-bit loop's 16 x 16 transpose.
__attribute__((always_inline)) inline void columns16(const uint8_t* c0, int rb, int cnt, __m512i* col, int ncols) {
    __m512i x[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++) x[i] = i < cnt ? _mm512_loadu_si512(c0 + i * rb) : _mm512_setzero_si512();
    kivi_transpose16_dwords(x);
    for (int c = 0; c < ncols; c++) col[c] = x[c];
}

// sc[j n + s - s0] = bias_j + sum over the parts of qd[p][j] (its units' sums)
// for slots [a, e): 16 a pass, the last pass masked.
template <int G>
void wide_scores_g(const unit_table& t, const float* const* qd, const uint8_t* codes, int rb, int64_t a, int64_t e,
                   int64_t pf_end, int64_t s0, int64_t n, const head_units& qw, const float* bias, float* sc) {
    constexpr auto heads = std::make_integer_sequence<int, G>();
    for (int64_t s = a; s < e; s += 16) {
        const int cnt = (int)std::min<int64_t>(16, e - s);
        const uint8_t* c0 = codes + s * rb;
        const int64_t p = s + KIVI_SCORE_PREFETCH_SLOTS;
        if (p + 16 <= pf_end) simd::prefetch_l2(codes + p * rb, 16 * (size_t)rb);
        alignas(64) __m512i col[16];
        if (rb <= 32)
            columns8(c0, rb, cnt, col, t.ncols);
        else
            columns16(c0, rb, cnt, col, t.ncols);
        __m512 f[G];
#pragma GCC unroll 8
        for (int j = 0; j < G; j++) f[j] = _mm512_set1_ps(bias[j]);
        for (int pi = 0; pi < t.np; pi++) {
            __m512i acc[G];
#pragma GCC unroll 8
            for (int j = 0; j < G; j++) acc[j] = _mm512_setzero_si512();
            const int8_t* q = qw + 4 * t.u0[pi];
            switch (t.shape[pi].bits) {
                case 4:
                    part_units<G, 4>(col, t.c0[pi], t.c1[pi], q, qw, acc, heads, std::make_integer_sequence<int, 2>());
                    break;
                case 2:
                    part_units<G, 2>(col, t.c0[pi], t.c1[pi], q, qw, acc, heads, std::make_integer_sequence<int, 4>());
                    break;
                default:
                    part_units<G, 1>(col, t.c0[pi], t.c1[pi], q, qw, acc, heads, std::make_integer_sequence<int, 8>());
            }
#pragma GCC unroll 8
            for (int j = 0; j < G; j++)
                f[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[j]), _mm512_set1_ps(qd[pi][j]), f[j]);
        }
        const __mmask16 keep = (__mmask16)((1u << cnt) - 1);
#pragma GCC unroll 8
        for (int j = 0; j < G; j++) _mm512_mask_storeu_ps(sc + j * n + s - s0, keep, f[j]);
    }
}

void wide_scores(int G, const unit_table& t, const float* const* qd, const uint8_t* codes, int rb, int64_t a,
                 int64_t b, int64_t pf_end, int64_t s0, int64_t n, const head_units& qw, const float* bias, float* sc) {
    kivi_with_heads<k_max_heads>(G, [&](auto gb) {
        wide_scores_g<decltype(gb)::value>(t, qd, codes, rb, a, b, pf_end, s0, n, qw, bias, sc);
    });
}

// The units of head j from its source bytes (at most 128: lo, hi).
__attribute__((always_inline)) inline void permute_units(const unit_table& t, int pi, __m512i lo, __m512i hi,
                                                         int8_t* qwj) {
    for (int g = 0; g < t.nseg[pi]; g++)
        _mm512_store_si512(qwj + 4 * t.u0[pi] + 64 * g,
                           _mm512_maskz_permutex2var_epi8(t.valid[pi][g], lo, _mm512_load_si512(t.idx[pi][g]), hi));
}

// The parts of a 4-bit row with 2-bit channels and/or a 1-bit tail, as the
// fused fold lays their query out (channel order).
int row_parts(int h4, int mid, int tail, part_shape* sh) {
    const int b4 = kv_kivi_row_bytes(4, h4), bm = kv_kivi_row_bytes(2, mid), tb = kv_tail_bytes(tail);
    int np = 0;
    if (b4) sh[np++] = {4, 0, b4, 0, 64, 2, 1, h4};
    if (bm) sh[np++] = {2, b4, bm, h4, 128, 4, 1, mid};
    if (tb) sh[np++] = {1, b4 + bm, tb, h4 + mid, 0, 1, tb, tail};
    return np;
}

inline __mmask16 lanes_between(int c, int lo, int hi) {  // lanes l of c + l in [lo, hi)
    const int a = std::min(std::max(lo - c, 0), 16), b = std::min(std::max(hi - c, 0), 16);
    return (__mmask16)(((1u << b) - 1) & ~((1u << a) - 1));
}

}  // namespace

int64_t kivi_wide_parts_scores(int G, const kivi_wide_part* parts, int np, const uint8_t* codes, int rb, int64_t a,
                               int64_t b, int64_t pf_end, int64_t s0, int64_t n, const float* bias, float* sc) {
    if (a >= b || G > k_max_heads || np < 1 || np > k_max_parts || rb > KIVI_WIDE_PARTS_MAX_ROW) return a;
    part_shape sh[k_max_parts];
    const float* qd[k_max_parts];
    for (int p = 0; p < np; p++) {
        sh[p] = {parts[p].bits, parts[p].off, parts[p].len, 0, parts[p].cs, 1, parts[p].ps, 1 << 20};
        qd[p] = parts[p].qd;
    }
    const unit_table& t = unit_table_for(sh, np);
    if (!t.ok) return a;
    // the parts' query bytes of every head in unit order
    alignas(64) head_units qw;
    for (int pi = 0; pi < np; pi++) {
        const int sb = t.srcb[pi];
        for (int j = 0; j < G; j++) {
            const int8_t* src = parts[pi].q + (int64_t)j * parts[pi].qs;
            const __m512i lo = _mm512_maskz_loadu_epi8(first_bytes(sb), src);
            const __m512i hi =
                sb > 64 ? _mm512_maskz_loadu_epi8(first_bytes(sb - 64), src + 64) : _mm512_setzero_si512();
            permute_units(t, pi, lo, hi, qw + j * k_head_bytes);
        }
    }
    wide_scores(G, t, qd, codes, rb, a, b, pf_end, s0, n, qw, bias, sc);
    return b;
}

bool kivi_wide_parts_fit(int G, int h4, int mid, int tail) {
    if (G < 1 || G > k_max_heads || h4 + mid + tail > 128 || kv_key_row_bytes(4, h4 + mid + tail, tail, 0, mid) >
                                                                   KIVI_WIDE_PARTS_MAX_ROW)
        return false;
    part_shape sh[k_max_parts];
    const int np = row_parts(h4, mid, tail, sh);
    return np > 0 && unit_table_for(sh, np).ok;
}

namespace {

// A row shape's fold set-up: its unit table and each part's lanes of the
// query's 16-channel vectors. Building it (the table's lookup, the masks)
// costs about what a group's fold does, so it is kept a thread for the next
// groups: a (head, slot range) task's groups share one shape. It holds its
// own table (unit_table_for's few slots are shared with the 2-bit rows' shapes).
struct fold_shape {
    int h4 = -1, mid = -1, tail = -1;
    unit_table t;
    int np = 0, nv = 0;
    __mmask16 kr[8];                  // channels < r
    __mmask16 kp[k_max_parts][8];     // part p's lanes in vector v (0 for absent parts)
    int v0[k_max_parts], v1[k_max_parts];  // the vectors [v0, v1) part p has lanes in
};

const fold_shape& fold_shape_for(int h4, int mid, int tail) {
    thread_local fold_shape f;
    if (f.h4 == h4 && f.mid == mid && f.tail == tail) return f;
    f.h4 = -1;  // until built
    part_shape sh[k_max_parts];
    f.np = row_parts(h4, mid, tail, sh);
    const bool built = unit_table_build(f.t, sh, f.np);
    ZK_ASSERT(built);
    const int r = h4 + mid + tail;
    f.nv = (r + 15) / 16;
    int lo[k_max_parts], hi[k_max_parts];
    {
        const int bounds[4] = {0, h4, h4 + mid, r};
        int p = 0;
        for (int w = 0; w < 3; w++)
            if (bounds[w + 1] > bounds[w]) lo[p] = bounds[w], hi[p] = bounds[w + 1], p++;
        ZK_ASSERT(p == f.np);
    }
    for (int p = 0; p < k_max_parts; p++) {
        f.v0[p] = p < f.np ? lo[p] / 16 : 0;
        f.v1[p] = p < f.np ? (hi[p] + 15) / 16 : 0;
    }
    for (int v = 0; v < 8; v++) {
        f.kr[v] = lanes_between(16 * v, 0, r);
        for (int p = 0; p < k_max_parts; p++) f.kp[p][v] = p < f.np ? lanes_between(16 * v, lo[p], hi[p]) : 0;
    }
    f.h4 = h4, f.mid = mid, f.tail = tail;
    return f;
}

// The fold of G heads: x_c = q_c s_c over the r coded channels (16 a vector,
// the grid read and converted once for all heads), each part's max |x_c| and
// the bias sum_c q_c m_c; then per part d = max / 127 and the bytes
// round(x_c / d) (the widths' folds round the same floats: kivi_fold_queries),
// in channel order, permuted into the head's units. Each head's products are
// kept (xs) for the bytes; its maxima and bias reduce while the next head's
// products are formed.
template <int G>
void fold_heads(const fold_shape& f, const float* qf, int qfs, const uint16_t* grid, const uint16_t* step,
                const float* bias, head_units& qw, float (&qd)[k_max_parts][16], float* bj) {
    const int nv = f.nv, np = f.np;
    const __m512 ds = _mm512_set1_ps(h2f(step[0])), dm = _mm512_set1_ps(h2f(step[1]));
    __m512 sv[8], mv[8];
    for (int v = 0; v < nv; v++) {
        const __m256i g = _mm256_maskz_loadu_epi16(f.kr[v], grid + 16 * v);
        // s_c = ds * (g & 0xff), m_c = dm * (int8)(g >> 8), as kivi_fold_queries
        sv[v] = _mm512_mul_ps(ds, _mm512_cvtepi32_ps(_mm512_cvtepu16_epi32(_mm256_and_si256(g, _mm256_set1_epi16(0xff)))));
        mv[v] = _mm512_mul_ps(dm, _mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(_mm256_srai_epi16(g, 8))));
    }
    alignas(64) float xs[G][128];
    alignas(64) float mxs[k_max_parts][16] = {}, inv[k_max_parts][16] = {};
    for (int j = 0; j < G; j++) {
        const float* qj = qf + (int64_t)j * qfs;
        __m512 bs = _mm512_setzero_ps();
        for (int v = 0; v < nv; v++) {
            const __m512 q = _mm512_maskz_loadu_ps(f.kr[v], qj + 16 * v);
            _mm512_store_ps(xs[j] + 16 * v, _mm512_mul_ps(q, sv[v]));
            bs = _mm512_fmadd_ps(q, mv[v], bs);
        }
        bj[j] = bias[j] + _mm512_reduce_add_ps(bs);
        // a part's max over its own vectors only (lanes past r are zeros)
        for (int p = 0; p < np; p++) {
            __m512 mx = _mm512_setzero_ps();
            for (int v = f.v0[p]; v < f.v1[p]; v++)
                mx = _mm512_mask_max_ps(mx, f.kp[p][v], mx, _mm512_abs_ps(_mm512_load_ps(xs[j] + 16 * v)));
            mxs[p][j] = _mm512_reduce_max_ps(mx);
        }
    }
    for (int p = 0; p < np; p++) {  // d = max / 127, and 1 / d where d > 0 (kivi_fold_queries' steps)
        const __m512 d = _mm512_div_ps(_mm512_load_ps(mxs[p]), _mm512_set1_ps(127.0f));
        _mm512_store_ps(qd[p], d);
        _mm512_store_ps(inv[p], _mm512_maskz_div_ps(_mm512_cmp_ps_mask(d, _mm512_setzero_ps(), _CMP_GT_OQ),
                                                    _mm512_set1_ps(1.0f), d));
    }
    for (int j = 0; j < G; j++) {
        const __m512 i0 = _mm512_set1_ps(inv[0][j]), i1 = _mm512_set1_ps(inv[1][j]), i2 = _mm512_set1_ps(inv[2][j]);
        __m128i b8[8];
        for (int v = 0; v < 8; v++) {
            if (v >= nv) {
                b8[v] = _mm_setzero_si128();
                continue;
            }
            const __m512 iv = _mm512_mask_mov_ps(_mm512_mask_mov_ps(i0, f.kp[1][v], i1), f.kp[2][v], i2);
            b8[v] = _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(_mm512_load_ps(xs[j] + 16 * v), iv)));
        }
        auto join4 = [](const __m128i* x) {
            __m512i y = _mm512_castsi128_si512(x[0]);
            y = _mm512_inserti32x4(y, x[1], 1);
            y = _mm512_inserti32x4(y, x[2], 2);
            return _mm512_inserti32x4(y, x[3], 3);
        };
        const __m512i lo = join4(b8), hi = join4(b8 + 4);
        for (int pi = 0; pi < np; pi++) permute_units(f.t, pi, lo, hi, qw + j * k_head_bytes);
    }
}

}  // namespace

void kivi_wide_parts_group(int G, int h4, int mid, int tail, const float* qf, int qfs, const uint16_t* grid,
                           const uint16_t* step, const uint8_t* codes, int rb, int64_t a, int64_t b, int64_t pf_end,
                           int64_t s0, int64_t n, const float* bias, float* sc) {
    const fold_shape& f = fold_shape_for(h4, mid, tail);
    ZK_ASSERT(G <= k_max_heads);
    alignas(64) head_units qw;
    alignas(64) float qd[k_max_parts][16], bj[k_max_heads];
    kivi_with_heads<k_max_heads>(G, [&](auto gb) {
        fold_heads<decltype(gb)::value>(f, qf, qfs, grid, step, bias, qw, qd, bj);
    });
    const float* qdp[k_max_parts];
    for (int p = 0; p < f.np; p++) qdp[p] = qd[p];
    wide_scores(G, f.t, qdp, codes, rb, a, b, pf_end, s0, n, qw, bj, sc);
}

#else

bool kivi_wide_parts_fit(int, int, int, int) { return false; }
void kivi_wide_parts_group(int, int, int, int, const float*, int, const uint16_t*, const uint16_t*, const uint8_t*,
                           int, int64_t, int64_t, int64_t, int64_t, int64_t, const float*, float*) {
    ZK_ASSERT(false && "kivi_wide_parts_group: not built");
}

#endif

}  // namespace attn
}  // namespace zk
