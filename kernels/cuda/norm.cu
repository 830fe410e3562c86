#include "kernels/cuda/norm.h"

#include "kernels/cuda/cuda_common.cuh"

namespace zk {
namespace cuda {

namespace {

constexpr int k_norm_block = 256;

// A block per token: the sum of squares over the block, then the scaling.
__global__ void __launch_bounds__(k_norm_block)
    rmsnorm_kernel(dptr<const float> x, dptr<const float> w, dptr<float> y, int64_t n, float eps) {
    ZK_SHARED(float, red, 32);
    const int64_t t = blockIdx.x;
    dptr<const float> xt = x + t * n;
    dptr<float> yt = y + t * n;
    float ss = 0;
    for (int64_t i = threadIdx.x; i < n; i += k_norm_block) {
        const float v = xt[i];
        ss += v * v;
    }
    ss = block_sum(ss, red);
    const float inv = 1.0f / sqrtf(ss / (float)n + eps);
    for (int64_t i = threadIdx.x; i < n; i += k_norm_block) yt[i] = xt[i] * inv * w[i];
}

}  // namespace

void cuda_rmsnorm(dptr<const float> x, dptr<const float> w, dptr<float> y, int64_t n_tok, int64_t n, float eps,
                  cuda_stream stream) {
    if (n_tok == 0) return;
    ZK_LAUNCH(rmsnorm_kernel, dim3((unsigned)n_tok), dim3(k_norm_block), 0, stream, x, w, y, n, eps);
}

}  // namespace cuda
}  // namespace zk
