#include "kernels/rmsnorm.h"

#include <cmath>

namespace zk {

void kernel_rmsnorm(const float* x, const float* w, float* y, int64_t n_tok, int64_t n, float eps) {
    for (int64_t t = 0; t < n_tok; t++) {
        const float* xt = x + t * n;
        float* yt = y + t * n;
        double ss = 0;  // double: 576-wide sums of squares of residuals can be large
        for (int64_t i = 0; i < n; i++) ss += (double)xt[i] * xt[i];
        const float inv = (float)(1.0 / std::sqrt(ss / (double)n + (double)eps));
        for (int64_t i = 0; i < n; i++) yt[i] = xt[i] * inv * w[i];
    }
}

}  // namespace zk
