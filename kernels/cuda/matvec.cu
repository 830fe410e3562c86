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

// The 32-element block types and the float types (TYPE a dtype, known at
// compile time so decode_elem's switch folds away): a warp per row, a lane per
// element of each 32-element unit (the weight bytes and the activations a warp
// reads are contiguous), k_mv_units units per step. Partial dot products per
// token in registers, then a warp sum.
template <int TYPE>
__global__ void __launch_bounds__(k_mv_block)
    matvec_kernel(int64_t row_bytes, int64_t n_rows, int64_t n_cols, dptr<const uint8_t> W, dptr<const float> x,
                  int n_tok, dptr<float> y) {
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
        for (int k = 0; k < k_mv_units; k++) w[k] = u0 + k < units ? decode_elem(TYPE, row, u0 + k, lane) : 0.0f;
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

// ---------------------------------------------------------------- K-quants
// Q4_K and Q6_K rows of 256-element blocks: 8 lanes a block, 4 blocks a warp
// step, a lane decoding 32 elements (two runs of 16 consecutive columns, one
// sub-block scale each) from 16 code bytes. Wide loads keep many bytes in
// flight per warp (a decode step's mat-vecs are bound by memory latency, not
// bandwidth, when each lane reads 4 bytes a block: 335-443 GB/s on an H100),
// and each sub-block's scale is decoded once per 32 elements instead of once
// per element (the generic kernel's ~40 instructions an element). The
// arithmetic per element is dequantize_q4_K's / dequantize_q6_K's
// (ggml-like/quant.cpp), so the weights are theirs bit for bit; only the
// summation order differs.

// The float of a small non-negative integer v (< 2^23) minus `bias`, exact:
// v's bits under 2^23's exponent make the float 2^23 + v (no int-to-float
// conversion, a quarter-rate instruction).
__device__ __forceinline__ float small_int_to_float(uint32_t v, float bias) {
    return __uint_as_float(0x4B000000u | v) - (8388608.0f + bias);
}

constexpr int k_kq_lanes = 8;              // lanes a block
constexpr int k_kq_blocks = 32 / k_kq_lanes;  // blocks a warp step

// One lane's raw words of one block: what kq_dot turns into 32 weights.
struct kq_words {
    cu_v16 codes{};    // Q4_K: 16 code bytes; Q6_K: 16 low-bit bytes
    cu_v16 codes2{};   // Q6_K: 16 high-bit bytes
    cu_v16 head{};     // Q4_K: d, dmin (word 0), the 12 scale bytes (words 1-3); Q6_K: word 0 = the
                       // lane's two int8 scales (bytes 0, 1), word 1 = d
};

// A 32-bit word from a 2-aligned address (Q6_K blocks are 210 bytes: every
// other block starts 2 bytes off a 4-byte boundary).
__device__ __forceinline__ uint32_t ld_u32_a2(dptr<const uint8_t> p) {
    dptr<const uint16_t> h = dptr_cast<const uint16_t>(p);
    return (uint32_t)h[0] | ((uint32_t)h[1] << 16);
}

// Lane j (< 8) of a block: columns [c0, c0 + 16) and [c0 + off1, c0 + off1 + 16).
template <int TYPE>
__device__ __forceinline__ int kq_col0(int j) {
    // Q4_K: chunk c = j / 2 of 64 columns, half i0 = 16 (j % 2) of its 32 code bytes
    if (TYPE == (int)dtype::Q4_K) return 64 * (j / 2) + 16 * (j % 2);
    // Q6_K: half h = j / 4 (128 columns), part p = (j % 4) / 2 (low bits from ql[32 p + i]), i0 = 16 (j % 2)
    return 128 * (j / 4) + 32 * ((j % 4) / 2) + 16 * (j % 2);
}
constexpr int k_kq_off1_q4_K = 32;  // high nibbles: the next sub-block
constexpr int k_kq_off1_q6_K = 64;  // high nibbles: 64 columns on

template <int TYPE>
__device__ __forceinline__ kq_words kq_load(dptr<const uint8_t> b, int j) {
    kq_words k;
    if (TYPE == (int)dtype::Q4_K) {
        // [d, dmin: 4][scales: 12][qs: 128]: 144-byte blocks stay 16-aligned
        k.head = cu_load<cu_v16>(b, 0);
        k.codes = cu_load<cu_v16>(b, 16 + 16 * j);
    } else {
        // [ql: 128][qh: 64][scales: 16 x int8][d: f16]
        const int h = j / 4, p = (j % 4) / 2, i0 = 16 * (j % 2);
        ZK_UNROLL
        for (int w = 0; w < 4; w++) {
            k.codes.w[w] = ld_u32_a2(b + 64 * h + 32 * p + i0 + 4 * w);
            k.codes2.w[w] = ld_u32_a2(b + 128 + 32 * h + i0 + 4 * w);
        }
        const int g = 8 * h + 2 * p + i0 / 16;  // the scales of the lane's two runs: g and g + 4
        k.head.w[0] = (uint32_t)b[192 + g] | ((uint32_t)b[192 + g + 4] << 8);
        k.head.w[1] = dptr_cast<const uint16_t>(b + 208)[0];
    }
    return k;
}

// Byte i (runtime, < 12) of the Q4_K scale bytes (head words 1-3), without a
// register array indexed at run time (which would go to local memory).
__device__ __forceinline__ int kq_scale_byte(const kq_words& k, int i) {
    const uint32_t w = i < 4 ? k.head.w[1] : i < 8 ? k.head.w[2] : k.head.w[3];
    return (int)((w >> (8 * (i & 3))) & 0xFF);
}

// The lane's scale and offset of its two runs: weight = d[s] q - m[s] (Q4_K), d[s] (q - 32) (Q6_K).
template <int TYPE>
__device__ __forceinline__ void kq_scales(const kq_words& k, int j, float (&d)[2], float (&m)[2]) {
    if (TYPE == (int)dtype::Q4_K) {
        // sub-blocks 2c (low nibbles) and 2c + 1 (high), c = j / 2 (q4_K_scale_min:
        // j < 4 reads bytes j, j + 4; j >= 4 bytes j + 4, j - 4, j)
        const int c = j / 2;
        ZK_UNROLL
        for (int s = 0; s < 2; s++) {
            const int sb = 2 * c + s;
            int sc, mn;
            if (sb < 4) {
                sc = kq_scale_byte(k, sb) & 63;
                mn = kq_scale_byte(k, sb + 4) & 63;
            } else {
                const int hi = kq_scale_byte(k, sb + 4);
                sc = (hi & 0x0F) | ((kq_scale_byte(k, sb - 4) >> 6) << 4);
                mn = (hi >> 4) | ((kq_scale_byte(k, sb) >> 6) << 4);
            }
            d[s] = h2f_lo(k.head.w[0]) * (float)sc;
            m[s] = h2f_hi(k.head.w[0]) * (float)mn;
        }
    } else {
        const float dd = h2f((uint16_t)k.head.w[1]);
        d[0] = dd * (float)(int8_t)(k.head.w[0] & 0xFF);
        d[1] = dd * (float)(int8_t)(k.head.w[0] >> 8);
        m[0] = m[1] = 0.0f;
    }
}

// The 8 weights of code word w (< 4) of the lane: 4 of each run.
template <int TYPE>
__device__ __forceinline__ void kq_weights(const kq_words& k, int j, int w, const float (&d)[2],
                                           const float (&m)[2], float (&out)[8]) {
    if (TYPE == (int)dtype::Q4_K) {
        const uint32_t c = k.codes.w[w];
        ZK_UNROLL
        for (int e = 0; e < 4; e++) {
            out[e] = __fmul_rn(d[0], small_int_to_float((c >> (8 * e)) & 0x0F, 0.0f)) - m[0];
            out[4 + e] = __fmul_rn(d[1], small_int_to_float((c >> (8 * e + 4)) & 0x0F, 0.0f)) - m[1];
        }
    } else {
        // part p: low nibbles with qh bits 2p..2p+1, high nibbles with bits 4 + 2p..
        const int p = (j % 4) / 2;
        const uint32_t cl = k.codes.w[w], ch = k.codes2.w[w];
        ZK_UNROLL
        for (int e = 0; e < 4; e++) {
            const uint32_t ql = (cl >> (8 * e)) & 0xFF, qh = (ch >> (8 * e)) & 0xFF;
            const uint32_t lo = (ql & 0x0F) | (((qh >> (2 * p)) & 3) << 4);
            const uint32_t hi = (ql >> 4) | (((qh >> (4 + 2 * p)) & 3) << 4);
            out[e] = d[0] * small_int_to_float(lo, 32.0f);
            out[4 + e] = d[1] * small_int_to_float(hi, 32.0f);
        }
    }
}

// Warp steps a warp loads before it computes (bytes in flight per lane).
constexpr int k_kq_unroll = 2;

// The K-quant kernels' end: each warp's sums over its lanes; with NW warps a
// row, the first warp of the row adds the others' (part: k_mv_block / 32 x
// k_matvec_max_tok floats of shared memory). Every thread of the block calls.
template <int NW>
__device__ __forceinline__ void kq_store(const float (&acc)[k_matvec_max_tok], int n_tok, int64_t r, int64_t n_rows,
                                         sptr<float> part, dptr<float> y) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, kw = warp % NW;
    ZK_UNROLL
    for (int t = 0; t < k_matvec_max_tok; t++) {
        if (t >= n_tok) break;
        const float s = warp_sum(acc[t]);
        if (NW == 1) {
            if (lane == 0 && r < n_rows) y[t * n_rows + r] = s;
        } else if (lane == 0) {
            part[warp * k_matvec_max_tok + t] = s;
        }
    }
    if (NW > 1) {
        __syncthreads();
        if (kw == 0 && lane < n_tok && r < n_rows) {
            float s = 0.0f;
            ZK_UNROLL
            for (int jw = 0; jw < NW; jw++) s += part[(warp + jw) * k_matvec_max_tok + lane];
            y[(int64_t)lane * n_rows + r] = s;
        }
    }
}

// The K-quant kernels' walk over the blocks of their row (matvec_kq_kernel has
// the layout of lanes and warps): each warp step loads k_kq_unroll blocks a
// lane before it computes any, then calls f(k, i, j, d, m) for the lane's part
// k of block i (j: the lane within its block, d, m: its two runs' scales and
// mins, kq_scales), and returns the row r of this warp. Both kernels share it
// and differ only in f, what a run is multiplied by.
// The row of this thread's warp: 4 / NW rows a 128-thread block.
template <int NW>
__device__ __forceinline__ int64_t kq_row() {
    return (int64_t)blockIdx.x * (k_mv_block / 32 / NW) + (int64_t)(threadIdx.x / 32 / NW);
}

template <int TYPE, int NW, class F>
__device__ __forceinline__ void kq_walk_row(int64_t row_bytes, int64_t n_rows, int64_t n_cols,
                                            dptr<const uint8_t> W, F&& f) {
    constexpr int block_bytes = TYPE == (int)dtype::Q4_K ? k_q4_K_bytes : k_q6_K_bytes;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, kw = warp % NW;
    const int sub = lane / k_kq_lanes, j = lane % k_kq_lanes;
    const int64_t r = kq_row<NW>();
    const int64_t nb = n_cols / 256;
    if (r >= n_rows) return;
    dptr<const uint8_t> row = W + r * row_bytes;
    for (int64_t i0 = (int64_t)kw * k_kq_blocks; i0 < nb; i0 += (int64_t)NW * k_kq_blocks * k_kq_unroll) {
        kq_words k[k_kq_unroll];
        ZK_UNROLL
        for (int u = 0; u < k_kq_unroll; u++) {
            const int64_t i = i0 + (int64_t)u * NW * k_kq_blocks + sub;
            if (i < nb) k[u] = kq_load<TYPE>(row + i * block_bytes, j);
        }
        ZK_UNROLL
        for (int u = 0; u < k_kq_unroll; u++) {
            const int64_t i = i0 + (int64_t)u * NW * k_kq_blocks + sub;
            if (i >= nb) break;
            float d[2], m[2];
            kq_scales<TYPE>(k[u], j, d, m);
            f(k[u], i, j, d, m);
        }
    }
}

// NW warps per row (1, 2 or 4) split its blocks (warp step i: blocks 4i ..
// 4i + 3, steps round robin over the NW warps); the warps' sums meet in shared
// memory. 4 / NW rows per 128-thread block.
template <int TYPE, int NW>
__global__ void __launch_bounds__(k_mv_block)
    matvec_kq_kernel(int64_t row_bytes, int64_t n_rows, int64_t n_cols, dptr<const uint8_t> W, dptr<const float> x,
                     int n_tok, dptr<float> y) {
    constexpr int off1 = TYPE == (int)dtype::Q4_K ? k_kq_off1_q4_K : k_kq_off1_q6_K;
    ZK_SHARED(float, part, k_mv_block / 32 * k_matvec_max_tok);
    float acc[k_matvec_max_tok];
    ZK_UNROLL
    for (int t = 0; t < k_matvec_max_tok; t++) acc[t] = 0.0f;
    const int c0 = kq_col0<TYPE>(threadIdx.x % 32 % k_kq_lanes);  // the lane's first column in a block
    kq_walk_row<TYPE, NW>(row_bytes, n_rows, n_cols, W,
                          [&](const kq_words& k, int64_t i, int j, const float (&d)[2], const float (&m)[2]) {
                              ZK_UNROLL
                              for (int w = 0; w < 4; w++) {
                                  float wt[8];
                                  kq_weights<TYPE>(k, j, w, d, m, wt);
                                  ZK_UNROLL
                                  for (int t = 0; t < k_matvec_max_tok; t++) {
                                      if (t >= n_tok) break;
                                      const int64_t xo = t * n_cols + 256 * i + c0 + 4 * w;
                                      const cu_f4 a = cu_load<cu_f4>(x, xo), b = cu_load<cu_f4>(x, xo + off1);
                                      ZK_UNROLL
                                      for (int e = 0; e < 4; e++) acc[t] += wt[e] * a.x[e] + wt[4 + e] * b.x[e];
                                  }
                              }
                          });
    kq_store<NW>(acc, n_tok, kq_row<NW>(), n_rows, part, y);
}

// ---- the same blocks against 8-bit activations (cuda_act_q8)

// x rows -> int8 codes and per-16 metadata: a thread per 16 columns.
__global__ void __launch_bounds__(k_mv_block)
    quantize_act_kernel(dptr<const float> x, int64_t n, dptr<int8_t> q, dptr<float> meta) {
    const int64_t g = (int64_t)blockIdx.x * k_mv_block + threadIdx.x;  // 16-column group
    if (g >= n) return;
    float v[k_act_q8_block];
    ZK_UNROLL
    for (int k = 0; k < k_act_q8_block / 4; k++) {
        const cu_f4 f = cu_load<cu_f4>(x, g * k_act_q8_block + 4 * k);
        ZK_UNROLL
        for (int e = 0; e < 4; e++) v[4 * k + e] = f.x[e];
    }
    float amax = 0.0f, sum = 0.0f;
    ZK_UNROLL
    for (int e = 0; e < k_act_q8_block; e++) amax = fmaxf(amax, fabsf(v[e])), sum += v[e];
    const float d = amax / 127.0f, id = amax > 0.0f ? 127.0f / amax : 0.0f;
    cu_v16 codes;
    int isum = 0;
    ZK_UNROLL
    for (int k = 0; k < 4; k++) {
        uint32_t w = 0;
        ZK_UNROLL
        for (int e = 0; e < 4; e++) {
            const int c = __float2int_rn(v[4 * k + e] * id);
            isum += c;
            w |= (uint32_t)(c & 0xFF) << (8 * e);
        }
        codes.w[k] = w;
    }
    dptr_cast<cu_v16>(q + g * k_act_q8_block)[0] = codes;
    cu_f4 m;
    m.x[0] = d;
    m.x[1] = sum;
    m.x[2] = (float)isum;
    m.x[3] = 0.0f;
    dptr_cast<cu_f4>(meta + 4 * g)[0] = m;
}

// matvec_kq_kernel's layout of lanes and blocks; each run of 16 weights
// against 16 activation codes by four DP4As, then once in floats:
// Q4_K  sum w x = d_run d_x sum q xq - m_run sum x
// Q6_K  sum w x = d_run d_x (sum q xq - 32 sum xq)   (q unsigned 6-bit codes)
template <int TYPE, int NW>
__global__ void __launch_bounds__(k_mv_block)
    matvec_kq_q8_kernel(int64_t row_bytes, int64_t n_rows, int64_t n_cols, dptr<const uint8_t> W,
                        dptr<const int8_t> xq, dptr<const float> xm, int n_tok, dptr<float> y) {
    constexpr int off1 = TYPE == (int)dtype::Q4_K ? k_kq_off1_q4_K : k_kq_off1_q6_K;
    ZK_SHARED(float, part, k_mv_block / 32 * k_matvec_max_tok);
    float acc[k_matvec_max_tok];
    ZK_UNROLL
    for (int t = 0; t < k_matvec_max_tok; t++) acc[t] = 0.0f;
    const int c0 = kq_col0<TYPE>(threadIdx.x % 32 % k_kq_lanes);  // the lane's first column in a block
    kq_walk_row<TYPE, NW>(
        row_bytes, n_rows, n_cols, W, [&](const kq_words& k, int64_t i, int j, const float (&d)[2], const float (&m)[2]) {
            // the lane's two runs as four code words each
            uint32_t lo[4], hi[4];
            ZK_UNROLL
            for (int w = 0; w < 4; w++) {
                if (TYPE == (int)dtype::Q4_K) {
                    lo[w] = k.codes.w[w] & 0x0F0F0F0Fu;
                    hi[w] = (k.codes.w[w] >> 4) & 0x0F0F0F0Fu;
                } else {
                    const int p = (j % 4) / 2;
                    const uint32_t ql = k.codes.w[w], qh = k.codes2.w[w];
                    lo[w] = (ql & 0x0F0F0F0Fu) | (((qh >> (2 * p)) & 0x03030303u) << 4);
                    hi[w] = ((ql >> 4) & 0x0F0F0F0Fu) | (((qh >> (4 + 2 * p)) & 0x03030303u) << 4);
                }
            }
            ZK_UNROLL
            for (int t = 0; t < k_matvec_max_tok; t++) {
                if (t >= n_tok) break;
                const int64_t xo = t * n_cols + 256 * i + c0;
                const cu_v16 a = cu_load<cu_v16>(xq, xo);
                const cu_v16 b = cu_load<cu_v16>(xq, xo + off1);
                const cu_f4 ma = cu_load<cu_f4>(xm, 4 * (xo / k_act_q8_block));
                const cu_f4 mb = cu_load<cu_f4>(xm, 4 * ((xo + off1) / k_act_q8_block));
                int sa = 0, sb = 0;
                ZK_UNROLL
                for (int w = 0; w < 4; w++) {
                    sa = __dp4a((int)lo[w], (int)a.w[w], sa);
                    sb = __dp4a((int)hi[w], (int)b.w[w], sb);
                }
                if (TYPE == (int)dtype::Q4_K)
                    acc[t] += d[0] * ma.x[0] * (float)sa - m[0] * ma.x[1] + d[1] * mb.x[0] * (float)sb -
                              m[1] * mb.x[1];
                else
                    acc[t] += d[0] * ma.x[0] * ((float)sa - 32.0f * ma.x[2]) +
                              d[1] * mb.x[0] * ((float)sb - 32.0f * mb.x[2]);
            }
        });
    kq_store<NW>(acc, n_tok, kq_row<NW>(), n_rows, part, y);
}

// Warps per row of a K-quant mat-vec: enough warps in the grid to keep the
// device's memory busy, at least one full unrolled step (8 blocks) per warp.
int kq_warps_per_row(int64_t n_rows, int64_t nb) {
    int nw = 1;
    while (nw < 4 && n_rows * nw < 16384 && nb >= 2 * nw * k_kq_blocks * k_kq_unroll) nw *= 2;
    return nw;
}

template <int TYPE>
void launch_kq(const cuda_weight& w, dptr<const float> x, int n_tok, dptr<float> y, cuda_stream stream,
               const cuda_act_q8* xq) {
    const int64_t rb = (int64_t)dtype_row_size(w.type, w.n_cols);
    const int nw = kq_warps_per_row(w.n_rows, w.n_cols / 256);
    const int64_t rows_per_block = k_mv_block / 32 / nw;
    const dim3 grid((unsigned)((w.n_rows + rows_per_block - 1) / rows_per_block));
    if (xq) {
        const auto q8_kernel = nw == 1 ? matvec_kq_q8_kernel<TYPE, 1> : nw == 2 ? matvec_kq_q8_kernel<TYPE, 2>
                                                                                : matvec_kq_q8_kernel<TYPE, 4>;
        ZK_LAUNCH(q8_kernel, grid, dim3(k_mv_block), 0, stream, rb, w.n_rows, w.n_cols, w.data,
                  dptr<const int8_t>(xq->q), dptr<const float>(xq->meta), n_tok, y);
        return;
    }
    const auto kq_kernel = nw == 1 ? matvec_kq_kernel<TYPE, 1> : nw == 2 ? matvec_kq_kernel<TYPE, 2>
                                                                       : matvec_kq_kernel<TYPE, 4>;
    ZK_LAUNCH(kq_kernel, grid, dim3(k_mv_block), 0, stream, rb, w.n_rows, w.n_cols, w.data, x, n_tok, y);
}

template <int TYPE>
void launch_generic(const cuda_weight& w, dptr<const float> x, int n_tok, dptr<float> y, cuda_stream stream) {
    const int rows_per_block = k_mv_block / 32;
    const auto generic_kernel = matvec_kernel<TYPE>;
    ZK_LAUNCH(generic_kernel, dim3((unsigned)((w.n_rows + rows_per_block - 1) / rows_per_block)),
              dim3(k_mv_block), 0, stream, (int64_t)dtype_row_size(w.type, w.n_cols), w.n_rows, w.n_cols, w.data, x,
              n_tok, y);
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

bool cuda_matvec_takes_q8(dtype t) { return t == dtype::Q4_K || t == dtype::Q6_K; }

void cuda_quantize_act(dptr<const float> x, int64_t n_tok, int64_t n_cols, const cuda_act_q8& out,
                       cuda_stream stream) {
    if (n_cols % k_act_q8_block != 0)
        ZK_THROW("cuda_quantize_act: rows of %lld columns (a multiple of %d needed)", (long long)n_cols,
                 k_act_q8_block);
    const int64_t n = n_tok * n_cols / k_act_q8_block;
    if (n == 0) return;
    ZK_LAUNCH(quantize_act_kernel, dim3((unsigned)((n + k_mv_block - 1) / k_mv_block)), dim3(k_mv_block), 0, stream,
              x, n, out.q, out.meta);
}

void cuda_matvec(const cuda_weight& w, dptr<const float> x, int64_t n_tok, dptr<float> y, cuda_stream stream,
                 const cuda_act_q8* xq) {
    check_weight(w, "cuda_matvec");
    if (n_tok < 1 || n_tok > k_matvec_max_tok)
        ZK_THROW("cuda_matvec: %lld tokens (1..%d; prefill goes through cuda_dequantize + the GEMM)",
                 (long long)n_tok, k_matvec_max_tok);
    if (w.n_rows == 0) return;
    switch (w.type) {
        case dtype::Q4_K: launch_kq<(int)dtype::Q4_K>(w, x, (int)n_tok, y, stream, xq); break;
        case dtype::Q6_K: launch_kq<(int)dtype::Q6_K>(w, x, (int)n_tok, y, stream, xq); break;
        case dtype::F32: launch_generic<(int)dtype::F32>(w, x, (int)n_tok, y, stream); break;
        case dtype::F16: launch_generic<(int)dtype::F16>(w, x, (int)n_tok, y, stream); break;
        case dtype::BF16: launch_generic<(int)dtype::BF16>(w, x, (int)n_tok, y, stream); break;
        case dtype::Q4_0: launch_generic<(int)dtype::Q4_0>(w, x, (int)n_tok, y, stream); break;
        case dtype::Q4_1: launch_generic<(int)dtype::Q4_1>(w, x, (int)n_tok, y, stream); break;
        case dtype::Q5_0: launch_generic<(int)dtype::Q5_0>(w, x, (int)n_tok, y, stream); break;
        case dtype::Q8_0: launch_generic<(int)dtype::Q8_0>(w, x, (int)n_tok, y, stream); break;
        default: ZK_THROW("cuda_matvec: weight type %s has no mat-vec", dtype_name(w.type));
    }
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
