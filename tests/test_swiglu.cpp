// kernel_swiglu against a double-precision reference: relative error 1e-6
// (the SIMD exp is good to ~2e-7), over ordinary activations, the saturated
// ends (|g| past 88, where e^-g overflows a float) and a length that leaves a
// scalar tail.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/swiglu.h"

using namespace zk;

TEST(Swiglu, MatchesDoubleReference) {
    const int64_t n = 1000 + 5;
    std::mt19937 rng(1);
    std::normal_distribution<float> N(0.0f, 4.0f);
    std::vector<float> g((size_t)n), u((size_t)n), y((size_t)n);
    for (int64_t i = 0; i < n; i++) g[i] = N(rng), u[i] = N(rng);
    const float ends[] = {-200.0f, -90.0f, -88.5f, -20.0f, 0.0f, 20.0f, 87.5f, 90.0f, 200.0f};
    for (int k = 0; k < 9; k++) g[10 * k] = ends[k];
    kernel_swiglu(g.data(), u.data(), y.data(), n);
    for (int64_t i = 0; i < n; i++) {
        const double ref = (double)g[i] / (1.0 + std::exp(-(double)g[i])) * u[i];
        ASSERT_NEAR(y[i], ref, 1e-6 * std::fabs(ref) + 1e-30) << "g " << g[i] << " u " << u[i] << " at " << i;
    }
}
