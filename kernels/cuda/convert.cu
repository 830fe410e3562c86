#include "kernels/cuda/convert.h"

#include "kernels/cuda/cuda_common.cuh"

namespace zk {
namespace cuda {

namespace {

constexpr int k_cvt_block = 256;

__global__ void __launch_bounds__(k_cvt_block) f32_to_f16_kernel(dptr<const float> src, dptr<uint16_t> dst, int64_t n) {
    const int64_t i = (int64_t)blockIdx.x * k_cvt_block + threadIdx.x;
    if (i < n) dst[i] = f2h(src[i]);
}

__global__ void __launch_bounds__(k_cvt_block) f16_to_f32_kernel(dptr<const uint16_t> src, dptr<float> dst, int64_t n) {
    const int64_t i = (int64_t)blockIdx.x * k_cvt_block + threadIdx.x;
    if (i < n) dst[i] = h2f(src[i]);
}

unsigned blocks_for(int64_t n) { return (unsigned)((n + k_cvt_block - 1) / k_cvt_block); }

}  // namespace

void cuda_f32_to_f16(dptr<const float> src, dptr<uint16_t> dst, int64_t n, cuda_stream stream) {
    if (n > 0) ZK_LAUNCH(f32_to_f16_kernel, dim3(blocks_for(n)), dim3(k_cvt_block), 0, stream, src, dst, n);
}
void cuda_f16_to_f32(dptr<const uint16_t> src, dptr<float> dst, int64_t n, cuda_stream stream) {
    if (n > 0) ZK_LAUNCH(f16_to_f32_kernel, dim3(blocks_for(n)), dim3(k_cvt_block), 0, stream, src, dst, n);
}

}  // namespace cuda
}  // namespace zk
