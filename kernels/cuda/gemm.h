// The prefill GEMM: Y [M x N] (f32, row-major) = X [M x K] W^T, W [N x K],
// both row-major of one element type (f16: weights dequantized to f16 tiles
// by cuda_dequantize and activations converted by cuda_f32_to_f16; or f32),
// f32 accumulation. On a device this is cuBLAS (cublasGemmEx, tensor cores
// for f16) and is GPU-only: the SIMT harness build maps it to a CPU loop
// (double sums), so the layout and argument plumbing are tested there, cuBLAS
// itself only by the GPU tests. CPU twin: kernel_matmul_reference.
#pragma once
#include <cstdint>

#include "kernels/cuda/cuda_types.h"

namespace zk {
namespace cuda {

enum cuda_gemm_type : int { CUDA_GEMM_F32 = 0, CUDA_GEMM_F16 = 1 };

struct cuda_gemm_args {
    cuda_gemm_type type = CUDA_GEMM_F16;
    int64_t M = 0, N = 0, K = 0;
    const void* X = nullptr;  // [M x K] device memory
    const void* W = nullptr;  // [N x K] device memory
    float* Y = nullptr;       // [M x N] device memory
};

// Uses the calling thread's cuBLAS handle (created at the first call), bound
// to `stream`.
void cuda_gemm(const cuda_gemm_args& a, cuda_stream stream);

}  // namespace cuda
}  // namespace zk
