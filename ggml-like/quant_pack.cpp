// Packing and unpacking of the interleaved K-quant, Q8_0 and Q5_0 layouts
// (quant_pack.h), the activation quantizers and the scalar reference dots. The SIMD
// kernels are in quant_tile_k.cpp.
#include "ggml-like/quant_pack.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "ggml-like/error.h"
#include "ggml-like/quant_ref.h"
#include "ggml-like/quant_tile_k.h"

namespace zk {

namespace {

// ---------------------------------------------------------------- Q4_K

// The 12-byte scale field from 8 scales and 8 mins (the inverse of q4_K_scale_min).
void q4_K_pack_scales(const int* sc, const int* m, uint8_t* s) {
    for (int j = 0; j < 4; j++) {
        s[j] = (uint8_t)((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
        s[j + 4] = (uint8_t)((m[j] & 63) | ((m[j + 4] >> 4) << 6));
        s[j + 8] = (uint8_t)((sc[j + 4] & 15) | ((m[j + 4] & 15) << 4));
    }
}

void pack_q4_K(const block_q4_K* const* rows, block_q4_Kp& p) {
    std::memset(&p, 0, sizeof p);
    for (int r = 0; r < k_pack_rows; r++) {
        if (!rows[r]) continue;  // padding row: zero scales, zero output
        const block_q4_K& b = *rows[r];
        p.d[r] = b.d;
        p.dmin[r] = b.dmin;
        for (int j = 0; j < 8; j++) {
            int sc, m;
            q4_K_scale_min(b.scales, j, sc, m);
            p.sc[j][r] = (uint8_t)sc;
            p.m[j / 2][r][j % 2] = (uint8_t)m;
        }
        // qs[32k + l] holds elements 64k + l (low) and 64k + 32 + l (high),
        // the same pair as packed qs[k][l / 4][r][l % 4].
        for (int k = 0; k < 4; k++)
            for (int i = 0; i < 8; i++) std::memcpy(p.qs[k][i][r], b.qs + 32 * k + 4 * i, 4);
    }
}

void unpack_q4_K(const block_q4_Kp& p, int r, block_q4_K& b) {
    b.d = p.d[r];
    b.dmin = p.dmin[r];
    int sc[8], m[8];
    for (int j = 0; j < 8; j++) {
        sc[j] = p.sc[j][r];
        m[j] = p.m[j / 2][r][j % 2];
    }
    q4_K_pack_scales(sc, m, b.scales);
    for (int k = 0; k < 4; k++)
        for (int i = 0; i < 8; i++) std::memcpy(b.qs + 32 * k + 4 * i, p.qs[k][i][r], 4);
}

// ---------------------------------------------------------------- Q6_K

// The 256 6-bit codes (0..63) of a Q6_K block, in element order.
void q6_K_codes(const block_q6_K& b, uint8_t* q) {
    for (int h = 0; h < 2; h++) {
        const uint8_t* ql = b.ql + 64 * h;
        const uint8_t* qh = b.qh + 32 * h;
        uint8_t* o = q + 128 * h;
        for (int l = 0; l < 32; l++) {
            o[l] = (uint8_t)((ql[l] & 15) | (((qh[l] >> 0) & 3) << 4));
            o[l + 32] = (uint8_t)((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4));
            o[l + 64] = (uint8_t)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4));
            o[l + 96] = (uint8_t)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4));
        }
    }
}

void q6_K_from_codes(const uint8_t* q, block_q6_K& b) {
    for (int h = 0; h < 2; h++) {
        uint8_t* ql = b.ql + 64 * h;
        uint8_t* qh = b.qh + 32 * h;
        const uint8_t* c = q + 128 * h;
        for (int l = 0; l < 32; l++) {
            ql[l] = (uint8_t)((c[l] & 15) | ((c[l + 64] & 15) << 4));
            ql[l + 32] = (uint8_t)((c[l + 32] & 15) | ((c[l + 96] & 15) << 4));
            qh[l] = (uint8_t)((c[l] >> 4) | ((c[l + 32] >> 4) << 2) | ((c[l + 64] >> 4) << 4) | ((c[l + 96] >> 4) << 6));
        }
    }
}

// Element e of a packed Q6_K row: group n = e / 16, chunk j = (e / 4) % 4 of
// the group, byte b = e % 4. Its low 4 bits are in ql[2n + j / 2] (low nibble
// for even j, high for odd), its high 2 bits in bits 2j..2j+1 of qh[n].
void pack_q6_K(const block_q6_K* const* rows, block_q6_Kp& p) {
    std::memset(&p, 0, sizeof p);
    for (int r = 0; r < k_pack_rows; r++) {
        if (!rows[r]) continue;
        const block_q6_K& b = *rows[r];
        p.d[r] = b.d;
        for (int n = 0; n < 16; n++) p.sc[n][r] = b.scales[n];
        uint8_t q[256];
        q6_K_codes(b, q);
        for (int e = 0; e < 256; e++) {
            const int n = e / 16, j = (e / 4) % 4, bb = e % 4;
            p.ql[2 * n + j / 2][r][bb] |= (uint8_t)((q[e] & 15) << (4 * (j & 1)));
            p.qh[n][r][bb] |= (uint8_t)((q[e] >> 4) << (2 * j));
        }
    }
}

void unpack_q6_K(const block_q6_Kp& p, int r, block_q6_K& b) {
    b.d = p.d[r];
    for (int n = 0; n < 16; n++) b.scales[n] = p.sc[n][r];
    uint8_t q[256];
    for (int e = 0; e < 256; e++) {
        const int n = e / 16, j = (e / 4) % 4, bb = e % 4;
        const int lo = (p.ql[2 * n + j / 2][r][bb] >> (4 * (j & 1))) & 15;
        const int hi = (p.qh[n][r][bb] >> (2 * j)) & 3;
        q[e] = (uint8_t)(lo | (hi << 4));
    }
    q6_K_from_codes(q, b);
}

// ---------------------------------------------------------------- Q8_0, Q5_0
// rows[r] points at two consecutive GGUF blocks of row r (64 elements).

void pack_q8_0(const block_q8_0* const* rows, block_q8_0p& p) {
    std::memset(&p, 0, sizeof p);
    for (int r = 0; r < k_pack_rows; r++) {
        if (!rows[r]) continue;  // padding row: zero scales, zero output
        for (int h = 0; h < 2; h++) {
            const block_q8_0& b = rows[r][h];
            p.d[h][r] = b.d;
            for (int e = 0; e < 32; e++) p.qs[8 * h + e / 4][r][e % 4] = (uint8_t)(b.qs[e] + 128);
        }
    }
}

void unpack_q8_0(const block_q8_0p& p, int r, block_q8_0* b) {
    for (int h = 0; h < 2; h++) {
        b[h].d = p.d[h][r];
        for (int e = 0; e < 32; e++) b[h].qs[e] = (int8_t)(p.qs[8 * h + e / 4][r][e % 4] - 128);
    }
}

void pack_q5_0(const block_q5_0* const* rows, block_q5_0p& p) {
    std::memset(&p, 0, sizeof p);
    for (int r = 0; r < k_pack_rows; r++) {
        if (!rows[r]) continue;
        for (int h = 0; h < 2; h++) {
            const block_q5_0& b = rows[r][h];
            p.d[h][r] = b.d;
            int q[32];
            q5_unpack(b.qh, b.qs, q);
            for (int e = 0; e < 32; e++) {
                const int i = e / 4, bb = e % 4;
                p.qs[i][r][bb] |= (uint8_t)((q[e] & 15) << (4 * h));
                p.qh[h][r][bb] |= (uint8_t)(((q[e] >> 4) & 1) << i);
            }
        }
    }
}

void unpack_q5_0(const block_q5_0p& p, int r, block_q5_0* b) {
    for (int h = 0; h < 2; h++) {
        b[h].d = p.d[h][r];
        int q[32];
        for (int e = 0; e < 32; e++) {
            const int i = e / 4, bb = e % 4;
            q[e] = ((p.qs[i][r][bb] >> (4 * h)) & 15) | (((p.qh[h][r][bb] >> i) & 1) << 4);
        }
        q5_pack(q, b[h].qh, b[h].qs);
    }
}

// The code of element e (0..63) of row r of a packed Q8_0 / Q5_0 block, less
// its offset: the GGUF value before the scale.
int q32_value(dtype t, const void* blk, int r, int e) {
    const int h = e / 32, i = (e % 32) / 4, bb = e % 4;
    if (t == dtype::Q8_0) return ((const block_q8_0p*)blk)->qs[8 * h + i][r][bb] - 128;
    const block_q5_0p& p = *(const block_q5_0p*)blk;
    return (((p.qs[i][r][bb] >> (4 * h)) & 15) | (((p.qh[h][r][bb] >> i) & 1) << 4)) - 16;
}

bool is_kquant(dtype t) { return t == dtype::Q4_K || t == dtype::Q6_K; }

void check_type(dtype t, const char* what) {
    if (!is_kquant(t) && t != dtype::Q8_0 && t != dtype::Q5_0)
        ZK_THROW("%s: no packed layout for %s (Q4_K, Q6_K, Q8_0, Q5_0)", what, dtype_name(t));
}

void check_cols(dtype t, int64_t n_cols, const char* what) {
    const int64_t be = quant_pack_block_elems(t);
    if (n_cols <= 0 || n_cols % be != 0)
        ZK_THROW("%s: %s row length %lld is not a multiple of %lld", what, dtype_name(t), (long long)n_cols,
                 (long long)be);
}

}  // namespace

bool quant_pack_supported(dtype t, int64_t n_cols) {
    if (!is_kquant(t) && t != dtype::Q8_0 && t != dtype::Q5_0) return false;
    return n_cols > 0 && n_cols % quant_pack_block_elems(t) == 0 && quant_tile_k_has_simd(t);
}

int64_t quant_pack_block_elems(dtype t) {
    check_type(t, "quant_pack_block_elems");
    return is_kquant(t) ? 256 : 64;
}

size_t quant_pack_block_bytes(dtype t) {
    check_type(t, "quant_pack_block_bytes");
    switch (t) {
        case dtype::Q4_K: return sizeof(block_q4_Kp);
        case dtype::Q6_K: return sizeof(block_q6_Kp);
        case dtype::Q8_0: return sizeof(block_q8_0p);
        default: return sizeof(block_q5_0p);
    }
}

size_t quant_pack_size(dtype t, int64_t n_rows, int64_t n_cols) {
    const int64_t groups = (n_rows + k_pack_rows - 1) / k_pack_rows;
    return (size_t)groups * (size_t)(n_cols / quant_pack_block_elems(t)) * quant_pack_block_bytes(t);
}

void quant_pack_groups(dtype t, const void* src, int64_t n_rows, int64_t n_cols, int64_t g0, int64_t g1, void* dst) {
    check_type(t, "quant_pack_groups");
    check_cols(t, n_cols, "quant_pack_groups");
    const int64_t be = quant_pack_block_elems(t), nb = n_cols / be;
    const size_t row = dtype_row_size(t, n_cols), bb = quant_pack_block_bytes(t);
    const size_t src_bytes = dtype_row_size(t, be);  // GGUF bytes of one packed block's elements
    for (int64_t g = g0; g < g1; g++)
        for (int64_t ib = 0; ib < nb; ib++) {
            const void* rows[k_pack_rows];
            for (int r = 0; r < k_pack_rows; r++) {
                const int64_t rr = g * k_pack_rows + r;
                rows[r] = rr < n_rows ? (const uint8_t*)src + rr * row + ib * src_bytes : nullptr;
            }
            uint8_t* out = (uint8_t*)dst + (size_t)(g * nb + ib) * bb;
            switch (t) {
                case dtype::Q4_K: pack_q4_K((const block_q4_K* const*)rows, *(block_q4_Kp*)out); break;
                case dtype::Q6_K: pack_q6_K((const block_q6_K* const*)rows, *(block_q6_Kp*)out); break;
                case dtype::Q8_0: pack_q8_0((const block_q8_0* const*)rows, *(block_q8_0p*)out); break;
                default: pack_q5_0((const block_q5_0* const*)rows, *(block_q5_0p*)out); break;
            }
        }
}

namespace {

// Packed block ib of row r's group (rr = r % k_pack_rows) back to its GGUF
// bytes: one Q4_K / Q6_K block, or two Q8_0 / Q5_0 blocks (64 elements).
void unpack_block(dtype t, const uint8_t* p, int rr, void* dst) {
    switch (t) {
        case dtype::Q4_K: unpack_q4_K(*(const block_q4_Kp*)p, rr, *(block_q4_K*)dst); break;
        case dtype::Q6_K: unpack_q6_K(*(const block_q6_Kp*)p, rr, *(block_q6_K*)dst); break;
        case dtype::Q8_0: unpack_q8_0(*(const block_q8_0p*)p, rr, (block_q8_0*)dst); break;
        default: unpack_q5_0(*(const block_q5_0p*)p, rr, (block_q5_0*)dst); break;
    }
}

}  // namespace

void quant_unpack_row(dtype t, const void* packed, int64_t n_cols, int64_t r, void* dst) {
    check_type(t, "quant_unpack_row");
    check_cols(t, n_cols, "quant_unpack_row");
    const int64_t nb = n_cols / quant_pack_block_elems(t), g = r / k_pack_rows;
    const size_t bb = quant_pack_block_bytes(t), gguf_bytes = dtype_row_size(t, quant_pack_block_elems(t));
    for (int64_t ib = 0; ib < nb; ib++)
        unpack_block(t, (const uint8_t*)packed + (size_t)(g * nb + ib) * bb, (int)(r % k_pack_rows),
                     (uint8_t*)dst + ib * gguf_bytes);
}

void quant_pack_dequantize_row(dtype t, const void* packed, int64_t n_cols, int64_t r, float* y) {
    check_type(t, "quant_pack_dequantize_row");
    check_cols(t, n_cols, "quant_pack_dequantize_row");
    const int64_t be = quant_pack_block_elems(t), nb = n_cols / be, g = r / k_pack_rows;
    const size_t bb = quant_pack_block_bytes(t);
    // one packed block's GGUF bytes (Q6_K's 210 are the most)
    alignas(16) uint8_t tmp[sizeof(block_q6_K)];
    static_assert(sizeof(block_q4_K) <= sizeof tmp && 2 * sizeof(block_q8_0) <= sizeof tmp &&
                      2 * sizeof(block_q5_0) <= sizeof tmp, "a packed block's GGUF bytes fit tmp");
    for (int64_t ib = 0; ib < nb; ib++) {
        unpack_block(t, (const uint8_t*)packed + (size_t)(g * nb + ib) * bb, (int)(r % k_pack_rows), tmp);
        dtype_dequantize_row(t, tmp, y + ib * be, be);
    }
}

// ---------------------------------------------------------------- activations

int quant_pack_act_kind(dtype t) {
    check_type(t, "quant_pack_act_kind");
    return is_kquant(t) ? 0 : 1;
}

size_t quant_pack_act_row_size(dtype t, int64_t n_cols) {
    check_type(t, "quant_pack_act_row_size");
    return is_kquant(t) ? (size_t)(n_cols / 256) * sizeof(block_q8_Kp) : (size_t)(n_cols / 32) * sizeof(block_q8_0pa);
}

namespace {

// The Q8_K quantizer, then the group sums.
void quantize_kp_ref(const float* x, void* dst, int64_t n_cols) {
    block_q8_Kp* y = (block_q8_Kp*)dst;
    for (int64_t ib = 0; ib < n_cols / 256; ib++) {
        block_q8_K k;
        quant_quantize_ref(dtype::Q8_K, x + 256 * ib, &k, 256);
        block_q8_Kp& b = y[ib];
        std::memset(&b, 0, sizeof b);
        std::memcpy(b.qs, k.qs, 256);
        b.d = k.d;
        for (int g = 0; g < 16; g++) {
            b.s16[g] = k.bsums[g];
            b.n16[g] = -32 * k.bsums[g];
            b.s32[g / 2] = (int16_t)(b.s32[g / 2] + k.bsums[g]);
        }
    }
}

// Q8_0 blocks (from the reference or the SIMD quantizer, the same bytes) to
// the packed kernels' activation blocks.
void q8_0_to_pa(const block_q8_0* q, int64_t nb, block_q8_0pa* y) {
    for (int64_t i = 0; i < nb; i++) {
        block_q8_0pa& b = y[i];
        std::memcpy(b.qs, q[i].qs, 32);
        b.d = fp16_to_fp32(q[i].d);
        int s = 0;
        for (int j = 0; j < 32; j++) s += q[i].qs[j];
        b.n16 = -16 * s;
        b.n128 = -128 * s;
        b.pad = 0;
    }
}

// Q8_0 through `quantize` (its reference or SIMD quantizer), 8 blocks at a time.
template <class F>
void quantize_0pa(const float* x, void* dst, int64_t n_cols, F&& quantize) {
    block_q8_0 q[8];
    for (int64_t i = 0; i < n_cols; i += 256) {
        const int64_t n = std::min<int64_t>(256, n_cols - i);
        quantize(x + i, q, n);
        q8_0_to_pa(q, n / 32, (block_q8_0pa*)dst + i / 32);
    }
}

void check_act_cols(dtype t, int64_t n_cols) {
    const int64_t be = quant_pack_act_kind(t) == 0 ? 256 : 32;
    if (n_cols <= 0 || n_cols % be != 0)
        ZK_THROW("quant_pack_quantize: row length %lld is not a multiple of %lld", (long long)n_cols, (long long)be);
}

}  // namespace

void quant_pack_quantize_ref(dtype t, const float* x, void* dst, int64_t n_cols) {
    check_act_cols(t, n_cols);
    if (quant_pack_act_kind(t) == 0) return quantize_kp_ref(x, dst, n_cols);
    quantize_0pa(x, dst, n_cols, [](const float* s, block_q8_0* d, int64_t n) { quant_quantize_ref(dtype::Q8_0, s, d, n); });
}

void quant_pack_quantize(dtype t, const float* x, void* dst, int64_t n_cols) {
    check_act_cols(t, n_cols);
    if (quant_pack_act_kind(t) == 0) {
        if (!quant_tile_k_quantize(x, dst, n_cols)) quantize_kp_ref(x, dst, n_cols);
        return;
    }
    quantize_0pa(x, dst, n_cols, [](const float* s, block_q8_0* d, int64_t n) { dtype_quantize_row(dtype::Q8_0, s, d, n); });
}

// ---------------------------------------------------------------- dots

// Integer sums as dot_ref_q4_K / dot_ref_q6_K in quant.cpp, scaled in the same order.
// Both add each block with an explicit fused multiply-add: left to the compiler
// (-ffp-contract=fast), `sum += d * da * isum` is contracted or not per call site,
// and a unity build decided differently from one object a file, so the two
// references, which tests compare bit for bit, differed in the last bits.
float quant_pack_dot_ref(dtype t, int64_t n_cols, const void* group, int r, const void* a) {
    check_type(t, "quant_pack_dot_ref");
    if (!is_kquant(t)) {  // as dot_ref_q8_0 / dot_ref_q5_0, block by block
        const block_q8_0pa* x = (const block_q8_0pa*)a;
        const size_t bb = quant_pack_block_bytes(t);
        float sum = 0.0f;
        for (int64_t ib = 0; ib < n_cols / 32; ib++) {
            const void* blk = (const uint8_t*)group + (size_t)(ib / 2) * bb;
            const int h = (int)(ib % 2);
            int sumi = 0;
            for (int e = 0; e < 32; e++) sumi += q32_value(t, blk, r, 32 * h + e) * x[ib].qs[e];
            const uint16_t d = t == dtype::Q8_0 ? ((const block_q8_0p*)blk)->d[h][r] : ((const block_q5_0p*)blk)->d[h][r];
            sum = std::fma(fp16_to_fp32(d) * x[ib].d, (float)sumi, sum);
        }
        return sum;
    }
    const int64_t nb = n_cols / 256;
    const block_q8_Kp* x = (const block_q8_Kp*)a;
    float sum = 0.0f;
    for (int64_t ib = 0; ib < nb; ib++) {
        if (t == dtype::Q4_K) {
            const block_q4_Kp& p = ((const block_q4_Kp*)group)[ib];
            int isum = 0, msum = 0;
            for (int j = 0; j < 8; j++) {
                int s = 0;
                for (int l = 0; l < 32; l++) {
                    const uint8_t q = p.qs[j / 2][l / 4][r][l % 4];
                    s += ((j & 1) ? (q >> 4) : (q & 15)) * x[ib].qs[32 * j + l];
                }
                isum += p.sc[j][r] * s;
                msum += p.m[j / 2][r][j % 2] * x[ib].s32[j];
            }
            sum = std::fma(fp16_to_fp32(p.d[r]) * x[ib].d, (float)isum, sum);
            sum = std::fma(-(fp16_to_fp32(p.dmin[r]) * x[ib].d), (float)msum, sum);
        } else {
            const block_q6_Kp& p = ((const block_q6_Kp*)group)[ib];
            int isum = 0;
            for (int n = 0; n < 16; n++) {
                int s = 0;
                for (int e = 16 * n; e < 16 * n + 16; e++) {
                    const int j = (e / 4) % 4, bb = e % 4;
                    const int lo = (p.ql[2 * n + j / 2][r][bb] >> (4 * (j & 1))) & 15;
                    const int hi = (p.qh[n][r][bb] >> (2 * j)) & 3;
                    s += ((lo | (hi << 4)) - 32) * x[ib].qs[e];
                }
                isum += p.sc[n][r] * s;
            }
            sum = std::fma(fp16_to_fp32(p.d[r]) * x[ib].d, (float)isum, sum);
        }
    }
    return sum;
}

void quant_pack_tile(dtype t, int64_t n_cols, const void* group, int nr, const void* a, size_t a_stride, int nt,
                     float* y, size_t y_stride, const void* prefetch) {
    ZK_ASSERT(nr >= 1 && nr <= k_pack_rows && nt >= 1 && nt <= k_pack_toks);
    if (quant_tile_k_run(t, n_cols / quant_pack_block_elems(t), group, nr, a, a_stride, nt, y, y_stride, prefetch))
        return;
    for (int k = 0; k < nt; k++)
        for (int r = 0; r < nr; r++)
            y[k * y_stride + r] = quant_pack_dot_ref(t, n_cols, group, r, (const uint8_t*)a + k * a_stride);
}

}  // namespace zk
