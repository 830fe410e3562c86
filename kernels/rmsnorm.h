// RMSNorm over the last dimension: y[t] = x[t] / sqrt(mean(x[t]^2) + eps) * w.
// x, y: [n_tok x n] (may alias); w: [n].
#pragma once
#include <cstdint>

namespace zk {

void kernel_rmsnorm(const float* x, const float* w, float* y, int64_t n_tok, int64_t n, float eps);

}  // namespace zk
