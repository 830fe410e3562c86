// OpenBLAS's kernel choice (ggml-like/blas_core.h): which fallbacks are
// corrected, to what, and that the binary running these tests got it.
#include <gtest/gtest.h>

#include <cblas.h>

#include <cmath>
#include <cstdlib>
#include <vector>

#include "ggml-like/blas_core.h"

namespace zk {
namespace {

TEST(BlasCore, PreAvx2KernelsOnANewerCpuAreReplaced) {
    const blas_cpu avx512{true, true}, avx2{true, false}, none{false, false};
    EXPECT_EQ(blas_core_override("Prescott", avx512), "SkylakeX");  // Emerald Rapids under OpenBLAS 0.3.21
    EXPECT_EQ(blas_core_override("Prescott", avx2), "Haswell");
    EXPECT_EQ(blas_core_override("sandybridge", avx2), "Haswell");  // the names are matched without case
    EXPECT_EQ(blas_core_override("Nehalem", avx512), "SkylakeX");
    // a CPU without AVX2 keeps what was chosen; so does any AVX2-class or unknown set
    EXPECT_EQ(blas_core_override("Prescott", none), "");
    for (const char* core : {"Haswell", "SkylakeX", "Cooperlake", "SapphireRapids", "Zen", "NEOVERSEN1", ""})
        EXPECT_EQ(blas_core_override(core, avx512), "") << core;
}

// This binary's main() is tests/gtest_main.cpp: on a CPU with AVX2 the loaded
// OpenBLAS (Debian's, with runtime dispatch) runs an AVX2-class kernel set,
// whatever it guessed from the CPU model, and its sgemm (which the calibration
// runs on) agrees with a plain triple loop.
TEST(BlasCore, ThisProcessRunsKernelsForItsCpu) {
    const int M = 37, N = 29, K = 130;  // not multiples of any kernel's tile
    std::vector<float> a((size_t)M * K), b((size_t)K * N), c((size_t)M * N);
    for (size_t i = 0; i < a.size(); i++) a[i] = (float)((i * 7919) % 23) / 11.0f - 1.0f;
    for (size_t i = 0; i < b.size(); i++) b[i] = (float)((i * 104729) % 19) / 9.0f - 1.0f;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, 1.0f, a.data(), K, b.data(), N, 0.0f, c.data(), N);
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = 0;
            for (int k = 0; k < K; k++) s += (double)a[(size_t)i * K + k] * b[(size_t)k * N + j];
            ASSERT_NEAR(c[(size_t)i * N + j], s, 1e-4 * (1 + std::fabs(s))) << i << "," << j;
        }
    const std::string core = blas_core_name();
    ASSERT_FALSE(core.empty()) << "the tests link Debian's OpenBLAS (libopenblas-dev)";
    EXPECT_EQ(blas_core_override(core, blas_cpu_detect()), "")
        << "OpenBLAS runs its " << core << " kernels (OPENBLAS_CORETYPE="
        << (std::getenv("OPENBLAS_CORETYPE") ? std::getenv("OPENBLAS_CORETYPE") : "unset") << ")";
}

}  // namespace
}  // namespace zk
