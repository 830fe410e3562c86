// main() of the GPU tests (ctest label `gpu`): the kernel tests of
// tests/simt/test_cuda_*.cpp built against the nvcc-compiled kernels. Without a
// CUDA device they do not run: they say why and exit 77, which ctest reports
// as "Skipped" (these are the only tests allowed to be).
#include <gtest/gtest.h>

#include <cstdio>

#include "kernels/cuda/cuda_device.h"

int main(int argc, char** argv) {
    if (zk::cuda::cuda_device_count() == 0) {
        std::printf("not run: no CUDA device\n");
        return 77;
    }
    const zk::cuda::cuda_device_info d = zk::cuda::cuda_device_query();
    std::printf("device: %s, %d SMs\n", d.name.c_str(), d.sm_count);
    ::testing::InitGoogleTest(&argc, argv);
    return RUN_ALL_TESTS();
}
