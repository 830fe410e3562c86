// Packing and unpacking of the interleaved K-quant layouts (quant_pack.h), the
// activation quantizer's reference and the scalar reference dots. The SIMD
// kernels are in quant_tile_k.cpp.
#include "ggml-like/quant_pack.h"

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

void check_type(dtype t, const char* what) {
    if (t != dtype::Q4_K && t != dtype::Q6_K)
        ZK_THROW("%s: no packed layout for %s (Q4_K, Q6_K)", what, dtype_name(t));
}

}  // namespace

bool quant_pack_supported(dtype t) { return (t == dtype::Q4_K || t == dtype::Q6_K) && quant_tile_k_has_simd(); }

size_t quant_pack_block_bytes(dtype t) {
    check_type(t, "quant_pack_block_bytes");
    return t == dtype::Q4_K ? sizeof(block_q4_Kp) : sizeof(block_q6_Kp);
}

size_t quant_pack_size(dtype t, int64_t n_rows, int64_t n_cols) {
    const int64_t groups = (n_rows + k_pack_rows - 1) / k_pack_rows;
    return (size_t)groups * (size_t)(n_cols / 256) * quant_pack_block_bytes(t);
}

void quant_pack_groups(dtype t, const void* src, int64_t n_rows, int64_t n_cols, int64_t g0, int64_t g1, void* dst) {
    check_type(t, "quant_pack_groups");
    if (n_cols % 256 != 0) ZK_THROW("quant_pack_groups: row length %lld is not a multiple of 256", (long long)n_cols);
    const int64_t nb = n_cols / 256;
    const size_t row = dtype_row_size(t, n_cols), bb = quant_pack_block_bytes(t);
    const size_t tsz = dtype_get_traits(t).type_size;
    for (int64_t g = g0; g < g1; g++)
        for (int64_t ib = 0; ib < nb; ib++) {
            const void* rows[k_pack_rows];
            for (int r = 0; r < k_pack_rows; r++) {
                const int64_t rr = g * k_pack_rows + r;
                rows[r] = rr < n_rows ? (const uint8_t*)src + rr * row + ib * tsz : nullptr;
            }
            uint8_t* out = (uint8_t*)dst + (size_t)(g * nb + ib) * bb;
            if (t == dtype::Q4_K)
                pack_q4_K((const block_q4_K* const*)rows, *(block_q4_Kp*)out);
            else
                pack_q6_K((const block_q6_K* const*)rows, *(block_q6_Kp*)out);
        }
}

void quant_unpack_row(dtype t, const void* packed, int64_t n_cols, int64_t r, void* dst) {
    check_type(t, "quant_unpack_row");
    const int64_t nb = n_cols / 256, g = r / k_pack_rows;
    const size_t bb = quant_pack_block_bytes(t);
    for (int64_t ib = 0; ib < nb; ib++) {
        const uint8_t* p = (const uint8_t*)packed + (size_t)(g * nb + ib) * bb;
        if (t == dtype::Q4_K)
            unpack_q4_K(*(const block_q4_Kp*)p, (int)(r % k_pack_rows), ((block_q4_K*)dst)[ib]);
        else
            unpack_q6_K(*(const block_q6_Kp*)p, (int)(r % k_pack_rows), ((block_q6_K*)dst)[ib]);
    }
}

// ---------------------------------------------------------------- activations

size_t quant_pack_act_row_size(int64_t n_cols) { return (size_t)(n_cols / 256) * sizeof(block_q8_Kp); }

// The Q8_K quantizer, then the group sums.
void quant_pack_quantize_ref(const float* x, void* dst, int64_t n_cols) {
    if (n_cols % 256 != 0) ZK_THROW("quant_pack_quantize: row length %lld is not a multiple of 256", (long long)n_cols);
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

void quant_pack_quantize(const float* x, void* dst, int64_t n_cols) {
    if (n_cols % 256 != 0) ZK_THROW("quant_pack_quantize: row length %lld is not a multiple of 256", (long long)n_cols);
    if (!quant_tile_k_quantize(x, dst, n_cols)) quant_pack_quantize_ref(x, dst, n_cols);
}

// ---------------------------------------------------------------- dots

// Integer sums as dot_ref_q4_K / dot_ref_q6_K in quant.cpp, scaled in the same order.
float quant_pack_dot_ref(dtype t, int64_t n_cols, const void* group, int r, const void* a) {
    check_type(t, "quant_pack_dot_ref");
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
            sum += fp16_to_fp32(p.d[r]) * x[ib].d * (float)isum - fp16_to_fp32(p.dmin[r]) * x[ib].d * (float)msum;
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
            sum += fp16_to_fp32(p.d[r]) * x[ib].d * (float)isum;
        }
    }
    return sum;
}

void quant_pack_tile(dtype t, int64_t n_cols, const void* group, int nr, const void* a, size_t a_stride, int nt,
                     float* y, size_t y_stride, const void* prefetch) {
    ZK_ASSERT(nr >= 1 && nr <= k_pack_rows && nt >= 1 && nt <= k_pack_toks);
    if (quant_tile_k_run(t, n_cols / 256, group, nr, a, a_stride, nt, y, y_stride, prefetch)) return;
    for (int k = 0; k < nt; k++)
        for (int r = 0; r < nr; r++)
            y[k * y_stride + r] = quant_pack_dot_ref(t, n_cols, group, r, (const uint8_t*)a + k * a_stride);
}

}  // namespace zk
