#include "kernels/cuda/elementwise.h"

#include "kernels/cuda/cuda_common.cuh"

namespace zk {
namespace cuda {

namespace {

constexpr int k_ew_block = 256;

unsigned ew_blocks(int64_t n) { return (unsigned)((n + k_ew_block - 1) / k_ew_block); }

__global__ void __launch_bounds__(k_ew_block) add_kernel(dptr<float> x, dptr<const float> y, int64_t n) {
    const int64_t i = (int64_t)blockIdx.x * k_ew_block + threadIdx.x;
    if (i < n) x[i] = x[i] + y[i];
}

__global__ void __launch_bounds__(k_ew_block)
    add_bias_kernel(dptr<float> y, dptr<const float> b, int64_t n_tok, int64_t n) {
    const int64_t i = (int64_t)blockIdx.x * k_ew_block + threadIdx.x;
    if (i < n_tok * n) y[i] = y[i] + b[i % n];
}

__global__ void __launch_bounds__(k_ew_block) softcap_kernel(dptr<float> y, int64_t n, float c) {
    const int64_t i = (int64_t)blockIdx.x * k_ew_block + threadIdx.x;
    if (i < n) y[i] = c * tanhf(y[i] / c);
}

__global__ void __launch_bounds__(k_ew_block)
    copy_cols_kernel(dptr<const float> src, int64_t w, dptr<float> dst, int64_t ld, int64_t col0, int64_t n_tok) {
    const int64_t i = (int64_t)blockIdx.x * k_ew_block + threadIdx.x;
    if (i >= n_tok * w) return;
    const int64_t t = i / w, j = i % w;
    dst[t * ld + col0 + j] = src[i];
}

// Words of 4 bytes where both ends and the length allow (new cache rows and
// plans are), bytes otherwise (KIVI codes of odd row lengths).
__global__ void __launch_bounds__(k_ew_block) scatter_kernel(dptr<const cuda_copy_piece> pieces) {
    const cuda_copy_piece p = pieces[blockIdx.x];
    if (((p.dst | p.src | p.bytes) & 3) == 0) {
        const dptr<const uint32_t> s((const uint32_t*)p.src);
        const dptr<uint32_t> d((uint32_t*)p.dst);
        for (uint64_t i = threadIdx.x; i < p.bytes / 4; i += k_ew_block) d[(int64_t)i] = s[(int64_t)i];
    } else {
        const dptr<const uint8_t> s((const uint8_t*)p.src);
        const dptr<uint8_t> d((uint8_t*)p.dst);
        for (uint64_t i = threadIdx.x; i < p.bytes; i += k_ew_block) d[(int64_t)i] = s[(int64_t)i];
    }
}

}  // namespace

void cuda_scatter_bytes(dptr<const cuda_copy_piece> pieces, int n, cuda_stream stream) {
    if (n == 0) return;
    ZK_LAUNCH(scatter_kernel, dim3((unsigned)n), dim3(k_ew_block), 0, stream, pieces);
}

void cuda_add(dptr<float> x, dptr<const float> y, int64_t n, cuda_stream stream) {
    if (n == 0) return;
    ZK_LAUNCH(add_kernel, dim3(ew_blocks(n)), dim3(k_ew_block), 0, stream, x, y, n);
}

void cuda_add_bias(dptr<float> y, dptr<const float> b, int64_t n_tok, int64_t n, cuda_stream stream) {
    if (n_tok * n == 0) return;
    ZK_LAUNCH(add_bias_kernel, dim3(ew_blocks(n_tok * n)), dim3(k_ew_block), 0, stream, y, b, n_tok, n);
}

void cuda_softcap(dptr<float> y, int64_t n, float c, cuda_stream stream) {
    if (n == 0) return;
    ZK_LAUNCH(softcap_kernel, dim3(ew_blocks(n)), dim3(k_ew_block), 0, stream, y, n, c);
}

void cuda_copy_cols(dptr<const float> src, int64_t w, dptr<float> dst, int64_t ld, int64_t col0, int64_t n_tok,
                    cuda_stream stream) {
    if (n_tok * w == 0) return;
    ZK_LAUNCH(copy_cols_kernel, dim3(ew_blocks(n_tok * w)), dim3(k_ew_block), 0, stream, src, w, dst, ld, col0,
              n_tok);
}

}  // namespace cuda
}  // namespace zk
