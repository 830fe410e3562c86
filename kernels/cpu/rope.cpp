#include "kernels/rope.h"

#include <cmath>

namespace zk {

void kernel_rope_table(const rope_params& p, const int32_t* pos, int64_t n_tok, float* cs) {
    const int half = p.n_dims / 2;
    for (int64_t t = 0; t < n_tok; t++) {
        const double tp = (double)pos[t] * p.freq_scale;
        for (int i = 0; i < half; i++) {
            // double for the angle: positions up to ~1e5 times frequencies near 1
            // lose digits in float.
            const double theta = tp * std::pow((double)p.freq_base, -2.0 * i / p.n_dims);
            cs[(t * half + i) * 2 + 0] = (float)std::cos(theta);
            cs[(t * half + i) * 2 + 1] = (float)std::sin(theta);
        }
    }
}

void kernel_rope_apply(float* x, int64_t n_tok, int64_t n_heads, int64_t head_dim,
                       const rope_params& p, const float* cs) {
    const int half = p.n_dims / 2;
    for (int64_t t = 0; t < n_tok; t++) {
        const float* c = cs + t * half * 2;
        for (int64_t h = 0; h < n_heads; h++) {
            float* v = x + (t * n_heads + h) * head_dim;
            if (p.style == rope_style::NORM) {
                for (int i = 0; i < half; i++) {
                    const float x0 = v[2 * i], x1 = v[2 * i + 1];
                    v[2 * i] = x0 * c[2 * i] - x1 * c[2 * i + 1];
                    v[2 * i + 1] = x0 * c[2 * i + 1] + x1 * c[2 * i];
                }
            } else {
                for (int i = 0; i < half; i++) {
                    const float x0 = v[i], x1 = v[i + half];
                    v[i] = x0 * c[2 * i] - x1 * c[2 * i + 1];
                    v[i + half] = x0 * c[2 * i + 1] + x1 * c[2 * i];
                }
            }
        }
    }
}

}  // namespace zk
