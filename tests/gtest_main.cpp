// main() of every tests/test_*.cpp GoogleTest binary: OpenBLAS's kernels are
// corrected first (ggml-like/blas_core.h), as zack's own main() does, so the
// calibration units run the sgemm zack runs.
#include <gtest/gtest.h>

#include "ggml-like/blas_core.h"

int main(int argc, char** argv) {
    zk::blas_core_reexec(argv);
    ::testing::InitGoogleTest(&argc, argv);
    return RUN_ALL_TESTS();
}
