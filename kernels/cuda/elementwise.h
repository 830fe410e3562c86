// Elementwise ops of the forward pass on the GPU (the CPU backend's loops in
// engine/backend_cpu.cpp are their twins):
//   cuda_add        x[i] += y[i], n elements
//   cuda_add_bias   y[t * n + i] += b[i] for n_tok rows of n
//   cuda_softcap    y[i] = c tanh(y[i] / c)
//   cuda_copy_cols  dst[t * ld + col0 + j] = src[t * w + j], t < n_tok, j < w:
//                   a GEMM's output tile of w columns into its place in a
//                   wider row-major matrix
//   cuda_scatter_bytes  a batch of copies within device memory, a block per
//                   copy: what a backend uploads in one transfer (many small
//                   pieces: new cache rows, positions, attention plans) goes
//                   to its places in one launch
#pragma once
#include <cstdint>

#include "kernels/cuda/cuda_types.h"

namespace zk {
namespace cuda {

// One copy of cuda_scatter_bytes: `bytes` bytes from device address src to dst.
struct cuda_copy_piece {
    uint64_t dst = 0, src = 0, bytes = 0;
};

void cuda_scatter_bytes(dptr<const cuda_copy_piece> pieces, int n, cuda_stream stream);
void cuda_add(dptr<float> x, dptr<const float> y, int64_t n, cuda_stream stream);
void cuda_add_bias(dptr<float> y, dptr<const float> b, int64_t n_tok, int64_t n, cuda_stream stream);
void cuda_softcap(dptr<float> y, int64_t n, float c, cuda_stream stream);
void cuda_copy_cols(dptr<const float> src, int64_t w, dptr<float> dst, int64_t ld, int64_t col0, int64_t n_tok,
                    cuda_stream stream);

}  // namespace cuda
}  // namespace zk
