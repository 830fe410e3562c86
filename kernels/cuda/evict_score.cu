#include "kernels/cuda/evict_score.h"

#include "kernels/cuda/cuda_common.cuh"

namespace zk {
namespace cuda {

namespace {

constexpr int k_ev_block = 256;

// A block per item; a thread owns slots s = tid + k * 256, so the rows are
// added in order, as the CPU policies do.
__global__ void __launch_bounds__(k_ev_block) evict_accumulate_kernel(dptr<const cuda_evict_item> items) {
    ZK_SHARED(float, redf, 32);
    ZK_SHARED(double, redd, 32);
    const cuda_evict_item& it = items[blockIdx.x];
    const int rows = it.n_tok * it.n_group;
    for (int r = it.t_from * it.n_group; r < rows; r++) {
        dptr<const float> lg = it.logits + r * it.logits_stride;
        float mx = -INFINITY;
        for (int64_t s = threadIdx.x; s < it.n; s += k_ev_block) mx = fmaxf(mx, lg[s]);
        mx = block_max(mx, redf);
        if (mx == -INFINITY) continue;  // nothing visible: the row adds 0 (uniform across the block)
        double sum = 0;
        for (int64_t s = threadIdx.x; s < it.n; s += k_ev_block) sum += (double)expf(lg[s] - mx);
        const float inv = (float)(1.0 / block_sum_d(sum, redd));
        for (int64_t s = threadIdx.x; s < it.n; s += k_ev_block) it.score[s] += expf(lg[s] - mx) * inv;
    }
}

__global__ void __launch_bounds__(k_ev_block)
    pool_max_kernel(dptr<const float> score, int64_t n, int h, dptr<float> importance) {
    const int64_t s = (int64_t)blockIdx.x * k_ev_block + threadIdx.x;
    if (s >= n) return;
    float m = score[s];
    const int64_t a = s - h < 0 ? 0 : s - h, b = s + h > n - 1 ? n - 1 : s + h;
    for (int64_t u = a; u <= b; u++) m = fmaxf(m, score[u]);
    importance[s] = m;
}

}  // namespace

void cuda_evict_accumulate(dptr<const cuda_evict_item> items, int n_items, cuda_stream stream) {
    if (n_items > 0) ZK_LAUNCH(evict_accumulate_kernel, dim3(n_items), dim3(k_ev_block), 0, stream, items);
}

void cuda_evict_pool_max(dptr<const float> score, int64_t n, int half_width, dptr<float> importance,
                         cuda_stream stream) {
    if (n > 0)
        ZK_LAUNCH(pool_max_kernel, dim3((unsigned)((n + k_ev_block - 1) / k_ev_block)), dim3(k_ev_block), 0, stream,
                  score, n, half_width, importance);
}

}  // namespace cuda
}  // namespace zk
