#include "kernels/cuda/rope.h"

#include <cmath>

#include "kernels/cuda/cuda_common.cuh"

namespace zk {
namespace cuda {

namespace {

constexpr int k_rope_block = 128;

// A thread per (token, pair).
__global__ void __launch_bounds__(k_rope_block)
    rope_table_kernel(dptr<const int32_t> pos, int64_t n_tok, int n_dims, float freq_base, float freq_scale,
                      dptr<float> cs) {
    const int half = n_dims / 2;
    const int64_t k = (int64_t)blockIdx.x * k_rope_block + threadIdx.x;
    if (k >= n_tok * half) return;
    const int64_t t = k / half;
    const int i = (int)(k % half);
    const double theta = (double)pos[t] * (double)freq_scale * pow((double)freq_base, -2.0 * i / n_dims);
    cs[2 * k] = (float)cos(theta);
    cs[2 * k + 1] = (float)sin(theta);
}

// A thread per (token, head, pair).
__global__ void __launch_bounds__(k_rope_block)
    rope_apply_kernel(dptr<float> x, int64_t n_tok, int64_t n_heads, int64_t head_dim, int n_dims, int neox,
                      dptr<const float> cs) {
    const int half = n_dims / 2;
    const int64_t k = (int64_t)blockIdx.x * k_rope_block + threadIdx.x;
    if (k >= n_tok * n_heads * half) return;
    const int i = (int)(k % half);
    const int64_t th = k / half, t = th / n_heads;
    dptr<float> v = x + th * head_dim;
    const float c = cs[(t * half + i) * 2], s = cs[(t * half + i) * 2 + 1];
    const int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
    const float x0 = v[a], x1 = v[b];
    v[a] = x0 * c - x1 * s;
    v[b] = x0 * s + x1 * c;
}

unsigned blocks_for(int64_t n) { return (unsigned)((n + k_rope_block - 1) / k_rope_block); }

}  // namespace

void cuda_rope_table(const rope_params& p, dptr<const int32_t> pos, int64_t n_tok, dptr<float> cs,
                     cuda_stream stream) {
    const int64_t n = n_tok * (p.n_dims / 2);
    if (n == 0) return;
    ZK_LAUNCH(rope_table_kernel, dim3(blocks_for(n)), dim3(k_rope_block), 0, stream, pos, n_tok, p.n_dims,
              p.freq_base, p.freq_scale, cs);
}

void cuda_rope_apply(dptr<float> x, int64_t n_tok, int64_t n_heads, int64_t head_dim, const rope_params& p,
                     dptr<const float> cs, cuda_stream stream) {
    const int64_t n = n_tok * n_heads * (p.n_dims / 2);
    if (n == 0) return;
    ZK_LAUNCH(rope_apply_kernel, dim3(blocks_for(n)), dim3(k_rope_block), 0, stream, x, n_tok, n_heads, head_dim,
              p.n_dims, p.style == rope_style::NEOX ? 1 : 0, cs);
}

}  // namespace cuda
}  // namespace zk
