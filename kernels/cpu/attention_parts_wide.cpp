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
// The query dwords are the parts' own folded bytes (their widths' folds, in
// the layout the narrow loops read), permuted once a group (vpermt2b) into unit
// order, a head's units at a fixed stride so that every (unit, head) address
// is a register plus a constant. A unit's bytes outside its part (a dword that
// straddles two parts) meet zero query bytes (the permute's zero mask). Each part's int32
// sums are its narrow twin's integers; they are scaled by the part's qd in
// turn, so the scores differ from the narrow loops' in float rounding only
// (tests/test_attention_layouts.cpp holds them to it).
// GCC 12's AVX-512 headers trip -Wuninitialized on their own placeholders
// (GCC PR 105593; attention_q4.cpp says more).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <algorithm>
#include <cstdint>
#include <utility>

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

struct part_shape {
    int bits, off, len, cs, ps;
    bool operator==(const part_shape& o) const {
        return bits == o.bits && off == o.off && len == o.len && cs == o.cs && ps == o.ps;
    }
};

// Where a row shape's units lie, and how the parts' query bytes permute into
// them: built once a shape (a KV head's rows) and kept for the next groups.
struct unit_table {
    int np = -1;
    part_shape shape[k_max_parts];
    bool ok = false;
    int ncols = 0;                       // columns any part reads
    int c0[k_max_parts], c1[k_max_parts];  // a part's columns [c0, c1)
    int u0[k_max_parts];                 // its first unit in a head's table (a multiple of 16)
    int nseg[k_max_parts];               // its 64-byte segments of units
    int srcb[k_max_parts];               // query bytes it reads a head
    alignas(64) uint8_t idx[k_max_parts][k_part_segs][64];
    uint64_t valid[k_max_parts][k_part_segs];  // the unit bytes of the part (others 0)
};

bool unit_table_build(unit_table& t, const part_shape* sh, int np) {
    t.np = np;
    t.ncols = 0;
    int u = 0;
    for (int p = 0; p < np; p++) {
        const part_shape& s = sh[p];
        t.shape[p] = s;
        const int nsub = 8 / s.bits;
        t.c0[p] = s.off / 4;
        t.c1[p] = (s.off + s.len + 3) / 4;
        const int units = (t.c1[p] - t.c0[p]) * nsub;
        if (t.c1[p] > 16 || units > 16 * k_part_segs) return t.ok = false;
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
                const int pos = s.cs * (b >> 5) + s.ps * i + (b & 31);
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
const unit_table& unit_table_for(const kivi_wide_part* parts, int np) {
    constexpr int k_cached = 4;
    thread_local unit_table cache[k_cached];
    thread_local int next = 0;
    part_shape sh[k_max_parts];
    for (int p = 0; p < np; p++) sh[p] = {parts[p].bits, parts[p].off, parts[p].len, parts[p].cs, parts[p].ps};
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

// acc + u (u8) . the query dword at q + OFF (s8), broadcast; in asm with a
// constant offset a head (see q4_dpbusd_bcast in attention_q4.cpp), qw the
// table q points into (so that its stores stay before).
template <int OFF>
__attribute__((always_inline)) inline __m512i unit_dpbusd(__m512i acc, __m512i u, const int8_t* q,
                                                          const head_units& qw) {
    asm("vpdpbusd %c3(%2)%{1to16%}, %1, %0" : "+v"(acc) : "v"(u), "r"(q), "i"(OFF), "m"(qw));
    return acc;
}

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
            ((acc[J] = unit_dpbusd<J * k_head_bytes>(acc[J], x, q, qw)), ...);
            q += 4;
        };
        (sub(std::integral_constant<int, I>()), ...);
    }
}

// Rows of at most 32 bytes: rows i and i + 8 in the halves of z[i] (8 dwords
// each), an 8 x 8 transpose in both halves at once, the halves' quarters
// interleaved: col[c] lane d = dword c of row d, for c < ncols.
__attribute__((always_inline)) inline void columns8(const uint8_t* c0, int rb, __m512i* col, int ncols) {
    __m512i z[8], t[8], x[8];
    for (int i = 0; i < 8; i++)
        z[i] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i*)(c0 + i * rb))),
                                  _mm256_loadu_si256((const __m256i*)(c0 + (i + 8) * rb)), 1);
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
__attribute__((always_inline)) inline void columns16(const uint8_t* c0, int rb, __m512i* col, int ncols) {
    __m512i x[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++) x[i] = _mm512_loadu_si512(c0 + i * rb);
    kivi_transpose16_dwords(x);
    for (int c = 0; c < ncols; c++) col[c] = x[c];
}

template <int G>
void wide_scores_g(const unit_table& t, const kivi_wide_part* parts, const uint8_t* codes, int rb, int64_t a,
                   int64_t e, int64_t pf_end, int64_t s0, int64_t n, const head_units& qw, const float* bias,
                   float* sc) {
    constexpr auto heads = std::make_integer_sequence<int, G>();
    for (int64_t s = a; s < e; s += 16) {
        const uint8_t* c0 = codes + s * rb;
        const int64_t p = s + KIVI_SCORE_PREFETCH_SLOTS;
        if (p + 16 <= pf_end) simd::prefetch_l2(codes + p * rb, 16 * (size_t)rb);
        alignas(64) __m512i col[16];
        if (rb <= 32)
            columns8(c0, rb, col, t.ncols);
        else
            columns16(c0, rb, col, t.ncols);
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
            const float* qd = parts[pi].qd;
#pragma GCC unroll 8
            for (int j = 0; j < G; j++)
                f[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[j]), _mm512_set1_ps(qd[j]), f[j]);
        }
#pragma GCC unroll 8
        for (int j = 0; j < G; j++) _mm512_storeu_ps(sc + j * n + s - s0, f[j]);
    }
}

}  // namespace

int64_t kivi_wide_parts_scores(int G, const kivi_wide_part* parts, int np, const uint8_t* codes, int rb, int64_t a,
                               int64_t b, int64_t pf_end, int64_t s0, int64_t n, const float* bias, float* sc) {
    const int64_t e = a + (b - a) / 16 * 16;
    if (e == a || G > k_max_heads || np < 1 || np > k_max_parts || rb > KIVI_WIDE_PARTS_MAX_ROW) return a;
    const unit_table& t = unit_table_for(parts, np);
    if (!t.ok) return a;
    // the parts' query bytes of every head in unit order
    alignas(64) head_units qw;
    for (int pi = 0; pi < np; pi++) {
        const int sb = t.srcb[pi];
        for (int g = 0; g < t.nseg[pi]; g++) {
            const __m512i idx = _mm512_load_si512(t.idx[pi][g]);
            const __mmask64 valid = t.valid[pi][g];
            for (int j = 0; j < G; j++) {
                const int8_t* src = parts[pi].q + (int64_t)j * parts[pi].qs;
                const __m512i lo = _mm512_maskz_loadu_epi8(first_bytes(sb), src);
                const __m512i hi = sb > 64 ? _mm512_maskz_loadu_epi8(first_bytes(sb - 64), src + 64)
                                           : _mm512_setzero_si512();
                _mm512_store_si512(qw + j * k_head_bytes + 4 * t.u0[pi] + 64 * g,
                                   _mm512_maskz_permutex2var_epi8(valid, lo, idx, hi));
            }
        }
    }
    kivi_with_heads<k_max_heads>(G, [&](auto gb) {
        wide_scores_g<decltype(gb)::value>(t, parts, codes, rb, a, e, pf_end, s0, n, qw, bias, sc);
    });
    return e;
}

#endif

}  // namespace attn
}  // namespace zk
