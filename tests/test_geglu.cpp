// kernel_geglu against its double-precision reference (kernel_geglu_ref).
// Bound: relative 1e-6 plus the float rounding of the exponent's argument
// x = -2 sqrt(2/pi) (g + 0.044715 g^3), which carries into e^x as a relative
// error of ~|x| 2^-23 (|x| reaches ~88 before e^x saturates), so
// rel <= 1e-6 + 4e-7 |x|. Ordinary activations, the saturated ends and a
// length that leaves a scalar tail.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/geglu.h"

using namespace zk;

TEST(Geglu, MatchesDoubleReference) {
    const int64_t n = 1000 + 5;
    std::mt19937 rng(1);
    std::normal_distribution<float> N(0.0f, 3.0f);
    std::vector<float> g((size_t)n), u((size_t)n), y((size_t)n);
    for (int64_t i = 0; i < n; i++) g[i] = N(rng), u[i] = N(rng);
    const float ends[] = {-200.0f, -12.0f, -6.0f, -3.0f, -1e-3f, 0.0f, 1e-3f, 3.0f, 12.0f, 200.0f};
    for (int k = 0; k < 10; k++) g[10 * k] = ends[k];
    kernel_geglu(g.data(), u.data(), y.data(), n);
    for (int64_t i = 0; i < n; i++) {
        const double gd = g[i];
        const double ref = kernel_geglu_ref(gd, u[i]);
        const double x = std::fabs(2 * std::sqrt(2 / M_PI) * (gd + 0.044715 * gd * gd * gd));
        const double tol = (1e-6 + 4e-7 * std::min(x, 100.0)) * std::fabs(ref) + 1e-30;
        ASSERT_NEAR(y[i], ref, tol) << "g " << g[i] << " u " << u[i] << " at " << i;
    }
    // far out it is the identity (times up) and zero (e^x saturates at ~e^88:
    // -200 / e^88 is ~1e-36, not an overflow or a NaN)
    EXPECT_FLOAT_EQ(y[90], 200.0f * u[90]);
    EXPECT_LE(std::fabs(y[0]), 1e-30f);
}
