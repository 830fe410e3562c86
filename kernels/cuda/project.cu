#include "kernels/cuda/project.h"

#include "ggml-like/error.h"
#include "kernels/cuda/cuda_common.cuh"

namespace zk {
namespace cuda {

namespace {

constexpr int k_proj_block = 128;
constexpr int k_proj_max_d = 256;

// A block per (token, head): the head vector into shared memory, then a warp
// per output row (lanes along the row: coalesced reads of P).
__global__ void __launch_bounds__(k_proj_block)
    project_kernel(dptr<float> x, int n_heads, int d, dptr<const dptr<const float>> mats, dptr<const int32_t> ranks,
                   dptr<const int32_t> pos, int32_t full_below, dptr<const float> shift) {
    ZK_SHARED(float, xs, k_proj_max_d);
    const int64_t t = blockIdx.x / n_heads;
    const int h = blockIdx.x % n_heads;
    dptr<float> v = x + ((int64_t)t * n_heads + h) * d;
    const int r = full_below > 0 && pos[t] < full_below ? d : ranks[h];
    dptr<const float> P = mats[h];
    for (int c = threadIdx.x; c < d; c += k_proj_block) xs[c] = v[c];
    __syncthreads();
    const int lane = threadIdx.x % 32, wid = threadIdx.x / 32;
    for (int j = wid; j < r; j += k_proj_block / 32) {
        float s = 0;
        for (int c = lane; c < d; c += 32) s += P[(int64_t)j * d + c] * xs[c];
        s = warp_sum(s);
        if (shift != nullptr && j < ranks[h]) s -= shift[(int64_t)h * d + j];
        if (lane == 0) v[j] = s;
    }
}

}  // namespace

void cuda_project_heads(dptr<float> x, int64_t n_tok, int n_heads, int d, dptr<const dptr<const float>> mats,
                        dptr<const int32_t> ranks, dptr<const int32_t> pos, int32_t full_below,
                        dptr<const float> shift, cuda_stream stream) {
    if (d < 1 || d > k_proj_max_d) ZK_THROW("CUDA projection: head dim %d (1..%d)", d, k_proj_max_d);
    if (n_tok == 0 || n_heads == 0) return;
    ZK_LAUNCH(project_kernel, dim3((unsigned)(n_tok * n_heads)), dim3(k_proj_block), 0, stream, x, n_heads, d, mats,
              ranks, pos, full_below, shift);
}

}  // namespace cuda
}  // namespace zk
