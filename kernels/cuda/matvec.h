// Weight matrices on the GPU, kept in their GGUF block types (uploaded once,
// never dequantized as a whole):
//   cuda_matvec        decode: y[t][r] = dot(W[r], x[t]) for up to 8 tokens, the
//                      weights dequantized in registers as they are read;
//   cuda_dequantize    rows of W as f32 or f16: embedding rows (get_rows, with a
//                      scale) and the f16 tiles prefill hands to the GEMM (gemm.h).
// W is row-major [n_rows x n_cols] (GGUF shape [n_cols, n_rows]), x [n_tok x
// n_cols] f32, y [n_tok x n_rows] f32. Types: F32, F16, BF16, Q4_0, Q4_1,
// Q5_0, Q8_0, Q4_K, Q6_K. CPU twins: kernel_matmul_reference and
// dtype_dequantize_row (bit for bit), kernel_matmul (activations quantized
// to 8 bits there; here too for Q4_K/Q6_K when given cuda_act_q8, below).
#pragma once
#include <cstdint>

#include "ggml-like/dtype.h"
#include "kernels/cuda/cuda_types.h"

namespace zk {
namespace cuda {

constexpr int k_matvec_max_tok = 8;

struct cuda_weight {
    dtype type = dtype::F32;
    int64_t n_rows = 0, n_cols = 0;
    dptr<const uint8_t> data{};  // n_rows * dtype_row_size(type, n_cols) bytes
};

// True for the types these kernels read.
bool cuda_weight_supported(dtype t);

// Activations rounded to 8 bits for the K-quant mat-vec (as the CPU's
// kernel_matmul rounds them, in finer blocks): per 16 columns of a row, int8
// codes q = round(x / d) with d = max |x| / 127, and (d, the sum of the f32
// x, the sum of the codes as an exact float, 0). Quantized once per input
// row set, read by every matrix that multiplies it (q, k and v; gate and up).
constexpr int k_act_q8_block = 16;
struct cuda_act_q8 {
    dptr<int8_t> q{};   // [n_tok x n_cols]
    dptr<float> meta{};  // [n_tok x n_cols / 16 x 4]
};
// x [n_tok x n_cols] (n_cols a multiple of 16) -> out.
void cuda_quantize_act(dptr<const float> x, int64_t n_tok, int64_t n_cols, const cuda_act_q8& out,
                       cuda_stream stream);
// Whether cuda_matvec reads the 8-bit activations for weights of type t (Q4_K, Q6_K).
bool cuda_matvec_takes_q8(dtype t);

// n_tok <= k_matvec_max_tok. With xq (cuda_quantize_act of the same x), the
// K-quants multiply integer codes four at a time (DP4A): far fewer
// instructions per weight, within 5e-3 of sum |w x| of the exact product
// (tests/simt/test_cuda_matvec.cpp); without it, in f32 (1e-6).
void cuda_matvec(const cuda_weight& w, dptr<const float> x, int64_t n_tok, dptr<float> y, cuda_stream stream,
                 const cuda_act_q8* xq = nullptr);

// out[i][c] = scale * W[row_i][c], row_i = ids[i] (ids null: row0 + i), for
// i < n; f32 into out32 or f16 (rounded to nearest even) into out16 (one of
// them set), rows of n_cols.
void cuda_dequantize(const cuda_weight& w, dptr<const int32_t> ids, int64_t row0, int64_t n, float scale,
                     dptr<float> out32, dptr<uint16_t> out16, cuda_stream stream);

}  // namespace cuda
}  // namespace zk
