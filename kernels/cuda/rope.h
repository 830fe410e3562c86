// Rotary position embedding on the GPU (kernels/rope.h has the conventions:
// NORM pairs (2i, 2i + 1), NEOX pairs (i, i + n_dims / 2); only the first n_dims
// channels of a head rotate). CPU twins: kernel_rope_table, kernel_rope_apply.
#pragma once
#include <cstdint>

#include "kernels/cuda/cuda_types.h"
#include "kernels/rope.h"

namespace zk {
namespace cuda {

// cs [n_tok x n_dims/2 x 2] (cos, sin) of pos[t] * freq_scale * base^(-2i/n_dims),
// the angle in double as on the CPU.
void cuda_rope_table(const rope_params& p, dptr<const int32_t> pos, int64_t n_tok, dptr<float> cs,
                     cuda_stream stream);
// x [n_tok x n_heads x head_dim], in place.
void cuda_rope_apply(dptr<float> x, int64_t n_tok, int64_t n_heads, int64_t head_dim, const rope_params& p,
                     dptr<const float> cs, cuda_stream stream);

}  // namespace cuda
}  // namespace zk
