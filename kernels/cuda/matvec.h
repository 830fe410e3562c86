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
// to 8 bits there, not here).
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

// n_tok <= k_matvec_max_tok.
void cuda_matvec(const cuda_weight& w, dptr<const float> x, int64_t n_tok, dptr<float> y, cuda_stream stream);

// out[i][c] = scale * W[row_i][c], row_i = ids[i] (ids null: row0 + i), for
// i < n; f32 into out32 or f16 (rounded to nearest even) into out16 (one of
// them set), rows of n_cols.
void cuda_dequantize(const cuda_weight& w, dptr<const int32_t> ids, int64_t row0, int64_t n, float scale,
                     dptr<float> out32, dptr<uint16_t> out16, cuda_stream stream);

}  // namespace cuda
}  // namespace zk
