// Quantized weights on the GPU (matvec.h): one decoder of 32-element units
// shared by the mat-vec and the dequantization kernels. The arithmetic of
// each element is ggml-like/quant.cpp's (products rounded before the min is
// subtracted, as there), so dequantized values match it bit for bit.
#include "kernels/cuda/matvec.h"

#include "ggml-like/error.h"
#include "kernels/cuda/cuda_common.cuh"

namespace zk {
namespace cuda {

namespace {

constexpr int k_mv_block = 128;  // 4 warps, a row each

// Block layouts (ggml-like/quant_ref.h): bytes per block.
constexpr int k_q4_0_bytes = 18, k_q4_1_bytes = 20, k_q5_0_bytes = 22, k_q8_0_bytes = 34;
constexpr int k_q4_K_bytes = 144, k_q6_K_bytes = 210;

__device__ __forceinline__ float ld_f16(dptr<const uint8_t> p, int64_t off) {
    return h2f(dptr_cast<const uint16_t>(p + off)[0]);
}

// The 6-bit scale and min of sub-block j of a Q4_K block (scales: 12 bytes).
__device__ inline void q4_K_scale_min_dev(dptr<const uint8_t> s, int j, int& sc, int& m) {
    if (j < 4) {
        sc = s[j] & 63;
        m = s[j + 4] & 63;
    } else {
        sc = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
        m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

// Element e (0..31) of the row's 32-element unit u: the arithmetic of
// ggml-like/quant.cpp's dequantization for that element alone, so a warp can
// decode a unit a lane per element (coalesced loads) and one thread a unit.
__device__ __forceinline__ float decode_elem(int type, dptr<const uint8_t> row, int64_t u, int e) {
    switch (type) {
        case (int)dtype::F32: return dptr_cast<const float>(row)[32 * u + e];
        case (int)dtype::F16: return h2f(dptr_cast<const uint16_t>(row)[32 * u + e]);
        case (int)dtype::BF16: return __uint_as_float((uint32_t)dptr_cast<const uint16_t>(row)[32 * u + e] << 16);
        case (int)dtype::Q4_0: {
            // element j (< 16) is the low nibble of byte j, element j + 16 its high nibble
            dptr<const uint8_t> b = row + u * k_q4_0_bytes;
            const int q = b[2 + (e & 15)];
            return ld_f16(b, 0) * (float)((e < 16 ? q & 0x0F : q >> 4) - 8);
        }
        case (int)dtype::Q4_1: {
            dptr<const uint8_t> b = row + u * k_q4_1_bytes;
            const int q = b[4 + (e & 15)];
            return __fmul_rn(ld_f16(b, 0), (float)(e < 16 ? q & 0x0F : q >> 4)) + ld_f16(b, 2);
        }
        case (int)dtype::Q5_0: {
            // the fifth bit of element e is bit e of the 32-bit qh
            dptr<const uint8_t> b = row + u * k_q5_0_bytes;
            const int q = b[6 + (e & 15)];
            const int hb = (b[2 + e / 8] >> (e % 8)) & 1;
            return ld_f16(b, 0) * (float)(((e < 16 ? q & 0x0F : q >> 4) | (hb << 4)) - 16);
        }
        case (int)dtype::Q8_0: {
            dptr<const uint8_t> b = row + u * k_q8_0_bytes;
            return (float)dptr_cast<const int8_t>(b + 2)[e] * ld_f16(b, 0);
        }
        case (int)dtype::Q4_K: {
            // sub-block j of block u / 8: elements 64 (j / 2) + 32 (j % 2) + l are the
            // low (j even) or high nibbles of qs[32 (j / 2) + l]
            dptr<const uint8_t> b = row + (u / 8) * k_q4_K_bytes;
            const int j = (int)(u % 8);
            int sc, m;
            q4_K_scale_min_dev(b + 4, j, sc, m);
            const float d0 = ld_f16(b, 0) * (float)sc, dm = ld_f16(b, 2) * (float)m;
            const int q = b[16 + 32 * (j / 2) + e];
            return __fmul_rn(d0, (float)((q >> ((j & 1) * 4)) & 0x0F)) - dm;
        }
        case (int)dtype::Q6_K: {
            // half h of the block (128 elements), quarter k of it: low bits in
            // ql[64h + 32 (k % 2) + l] (high nibble for k >= 2), high bits
            // 2k..2k+1 of qh[32h + l]; scale of group 8h + (32 k + l) / 16
            dptr<const uint8_t> b = row + (u / 8) * k_q6_K_bytes;
            const int j = (int)(u % 8), h = j / 4, k = j % 4;
            const float d = ld_f16(b, 208);
            const float dk = d * (float)dptr_cast<const int8_t>(b + 192)[8 * h + 2 * k + (e >= 16)];
            const int ql = b[64 * h + 32 * (k % 2) + e], qh = b[128 + 32 * h + e];
            const int lo = k < 2 ? (ql & 0x0F) : (ql >> 4);
            return dk * (float)((lo | (((qh >> (2 * k)) & 3) << 4)) - 32);
        }
        default: return 0.0f;  // refused on the host
    }
}

// Elements 32u .. 32u + 31 of a row.
__device__ inline void decode_unit(int type, dptr<const uint8_t> row, int64_t u, float (&w)[32]) {
    ZK_UNROLL
    for (int e = 0; e < 32; e++) w[e] = decode_elem(type, row, u, e);
}

// Units of a row a warp decodes per step of the mat-vec: independent loads in
// flight per lane.
constexpr int k_mv_units = 4;

// A warp per row, a lane per element of each 32-element unit (the weight
// bytes and the activations a warp reads are contiguous), k_mv_units units per
// step. Partial dot products per token in registers, then a warp sum.
__global__ void __launch_bounds__(k_mv_block)
    matvec_kernel(int type, int64_t row_bytes, int64_t n_rows, int64_t n_cols, dptr<const uint8_t> W,
                  dptr<const float> x, int n_tok, dptr<float> y) {
    const int lane = threadIdx.x % 32;
    const int64_t r = (int64_t)blockIdx.x * (k_mv_block / 32) + threadIdx.x / 32;
    if (r >= n_rows) return;  // a whole warp: no collective is left waiting
    dptr<const uint8_t> row = W + r * row_bytes;
    const int64_t units = n_cols / 32;
    float acc[k_matvec_max_tok];
    ZK_UNROLL
    for (int t = 0; t < k_matvec_max_tok; t++) acc[t] = 0.0f;
    for (int64_t u0 = 0; u0 < units; u0 += k_mv_units) {
        float w[k_mv_units];
        ZK_UNROLL
        for (int k = 0; k < k_mv_units; k++) w[k] = u0 + k < units ? decode_elem(type, row, u0 + k, lane) : 0.0f;
        ZK_UNROLL
        for (int t = 0; t < k_matvec_max_tok; t++) {
            if (t >= n_tok) break;
            ZK_UNROLL
            for (int k = 0; k < k_mv_units; k++)
                if (u0 + k < units) acc[t] += w[k] * x[t * n_cols + 32 * (u0 + k) + lane];
        }
    }
    ZK_UNROLL
    for (int t = 0; t < k_matvec_max_tok; t++) {
        if (t >= n_tok) break;
        const float s = warp_sum(acc[t]);
        if (lane == 0) y[t * n_rows + r] = s;
    }
}

// A thread per 32-element unit of an output row.
__global__ void __launch_bounds__(k_mv_block)
    dequantize_kernel(int type, int64_t row_bytes, int64_t n_cols, dptr<const uint8_t> W, dptr<const int32_t> ids,
                      int64_t row0, int64_t n, float scale, dptr<float> out32, dptr<uint16_t> out16) {
    const int64_t units = n_cols / 32;
    const int64_t k = (int64_t)blockIdx.x * k_mv_block + threadIdx.x;
    if (k >= n * units) return;
    const int64_t i = k / units, u = k % units;
    const int64_t r = ids ? (int64_t)ids[i] : row0 + i;
    float w[32];
    decode_unit(type, W + r * row_bytes, u, w);
    const int64_t o = i * n_cols + 32 * u;
    if (out32) {
        ZK_UNROLL
        for (int e = 0; e < 32; e++) out32[o + e] = scale == 1.0f ? w[e] : w[e] * scale;
    } else {
        ZK_UNROLL
        for (int e = 0; e < 32; e++) out16[o + e] = f2h(scale == 1.0f ? w[e] : w[e] * scale);
    }
}

void check_weight(const cuda_weight& w, const char* what) {
    if (!cuda_weight_supported(w.type))
        ZK_THROW("%s: weight type %s is not supported by the CUDA kernels", what, dtype_name(w.type));
    if (w.n_cols % 256 != 0 && (w.type == dtype::Q4_K || w.type == dtype::Q6_K))
        ZK_THROW("%s: %s rows of %lld columns (a multiple of 256 needed)", what, dtype_name(w.type),
                 (long long)w.n_cols);
    if (w.n_cols % 32 != 0) ZK_THROW("%s: rows of %lld columns (a multiple of 32 needed)", what, (long long)w.n_cols);
}

}  // namespace

bool cuda_weight_supported(dtype t) {
    switch (t) {
        case dtype::F32:
        case dtype::F16:
        case dtype::BF16:
        case dtype::Q4_0:
        case dtype::Q4_1:
        case dtype::Q5_0:
        case dtype::Q8_0:
        case dtype::Q4_K:
        case dtype::Q6_K: return true;
        default: return false;
    }
}

void cuda_matvec(const cuda_weight& w, dptr<const float> x, int64_t n_tok, dptr<float> y, cuda_stream stream) {
    check_weight(w, "cuda_matvec");
    if (n_tok < 1 || n_tok > k_matvec_max_tok)
        ZK_THROW("cuda_matvec: %lld tokens (1..%d; prefill goes through cuda_dequantize + the GEMM)",
                 (long long)n_tok, k_matvec_max_tok);
    if (w.n_rows == 0) return;
    const int rows_per_block = k_mv_block / 32;
    ZK_LAUNCH(matvec_kernel, dim3((unsigned)((w.n_rows + rows_per_block - 1) / rows_per_block)), dim3(k_mv_block), 0,
              stream, (int)w.type, (int64_t)dtype_row_size(w.type, w.n_cols), w.n_rows, w.n_cols, w.data, x,
              (int)n_tok, y);
}

void cuda_dequantize(const cuda_weight& w, dptr<const int32_t> ids, int64_t row0, int64_t n, float scale,
                     dptr<float> out32, dptr<uint16_t> out16, cuda_stream stream) {
    check_weight(w, "cuda_dequantize");
    if (!out32 == !out16) ZK_THROW("cuda_dequantize: exactly one of the f32 and f16 outputs must be given");
    const int64_t k = n * (w.n_cols / 32);
    if (k == 0) return;
    ZK_LAUNCH(dequantize_kernel, dim3((unsigned)((k + k_mv_block - 1) / k_mv_block)), dim3(k_mv_block), 0, stream,
              (int)w.type, (int64_t)dtype_row_size(w.type, w.n_cols), w.n_cols, w.data, ids, row0, n, scale, out32,
              out16);
}

}  // namespace cuda
}  // namespace zk
