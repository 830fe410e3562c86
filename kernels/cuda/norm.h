// RMSNorm on the GPU: y[t] = x[t] / sqrt(mean(x[t]^2) + eps) * w, x and y
// [n_tok x n] (may alias), w [n]. CPU twin: kernel_rmsnorm (kernels/rmsnorm.h).
#pragma once
#include <cstdint>

#include "kernels/cuda/cuda_types.h"

namespace zk {
namespace cuda {

void cuda_rmsnorm(dptr<const float> x, dptr<const float> w, dptr<float> y, int64_t n_tok, int64_t n, float eps,
                  cuda_stream stream);

}  // namespace cuda
}  // namespace zk
