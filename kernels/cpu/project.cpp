#include "kernels/project.h"

#include <cstring>

#include "ggml-like/error.h"
#include "kernels/cpu/simd.h"

namespace zk {

void kernel_project_head(const float* P, int r, int d, float* x) {
    ZK_ASSERT(r <= d && d <= 256);
    float tmp[256];
    for (int j = 0; j < r; j++) tmp[j] = simd::dot_f32(P + (size_t)j * d, x, d);
    std::memcpy(x, tmp, sizeof(float) * r);
}

}  // namespace zk
