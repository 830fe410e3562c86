#include "kernels/geglu.h"

#include <cmath>

#include "kernels/cpu/simd.h"

namespace zk {

namespace {
constexpr float k_sqrt_2_over_pi = 0.7978845608028654f;
constexpr float k_gelu_c = 0.044715f;
}  // namespace

// g/2 (1 + tanh(u)) = g / (1 + e^(-2u)): one exponential, computed like
// SwiGLU's sigmoid (simd::exp8 saturates, so g -> -inf gives -0 and g -> +inf
// gives g, as tanh does).
void kernel_geglu(const float* gate, const float* up, float* out, int64_t n) {
    int64_t i = 0;
#ifdef ZK_SIMD_AVX2
    const __m256 one = _mm256_set1_ps(1.0f), c = _mm256_set1_ps(k_gelu_c),
                 m2s = _mm256_set1_ps(-2.0f * k_sqrt_2_over_pi);
    for (; i + 8 <= n; i += 8) {
        const __m256 g = _mm256_loadu_ps(gate + i);
        const __m256 g3 = _mm256_mul_ps(_mm256_mul_ps(g, g), g);
        const __m256 e = simd::exp8(_mm256_mul_ps(m2s, _mm256_fmadd_ps(c, g3, g)));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), _mm256_loadu_ps(up + i)));
    }
#endif
    for (; i < n; i++) {
        const float g = gate[i];
        out[i] = g / (1.0f + std::exp(-2.0f * k_sqrt_2_over_pi * (g + k_gelu_c * g * g * g))) * up[i];
    }
}

// (1 + tanh(u)) / 2 = 1 / (1 + e^(-2u)): the tanh form cancels to nothing
// for u < -18 even in double, this one does not.
double kernel_geglu_ref(double g, double up) {
    const double u = std::sqrt(2.0 / M_PI) * (g + 0.044715 * g * g * g);
    return g / (1.0 + std::exp(-2.0 * u)) * up;
}

}  // namespace zk
