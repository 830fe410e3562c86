#include "kernels/cuda/glu.h"

#include "kernels/cuda/cuda_common.cuh"

namespace zk {
namespace cuda {

namespace {

constexpr int k_glu_block = 256;
constexpr float k_sqrt_2_over_pi = 0.7978845608028654f;
constexpr float k_gelu_c = 0.044715f;

// expf saturates like the CPU's: e^-g of a large negative g is +inf and the
// quotient goes to -0, of a large positive g 0 and the quotient to g.
__global__ void __launch_bounds__(k_glu_block)
    glu_kernel(dptr<const float> gate, dptr<const float> up, dptr<float> out, int64_t n, int gelu) {
    const int64_t i = (int64_t)blockIdx.x * k_glu_block + threadIdx.x;
    if (i >= n) return;
    const float g = gate[i];
    const float e = gelu ? expf(-2.0f * k_sqrt_2_over_pi * (g + k_gelu_c * g * g * g)) : expf(-g);
    out[i] = g / (1.0f + e) * up[i];
}

void launch_glu(dptr<const float> gate, dptr<const float> up, dptr<float> out, int64_t n, int gelu,
                cuda_stream stream) {
    if (n == 0) return;
    ZK_LAUNCH(glu_kernel, dim3((unsigned)((n + k_glu_block - 1) / k_glu_block)), dim3(k_glu_block), 0, stream, gate,
              up, out, n, gelu);
}

}  // namespace

void cuda_swiglu(dptr<const float> gate, dptr<const float> up, dptr<float> out, int64_t n, cuda_stream stream) {
    launch_glu(gate, up, out, n, 0, stream);
}
void cuda_geglu(dptr<const float> gate, dptr<const float> up, dptr<float> out, int64_t n, cuda_stream stream) {
    launch_glu(gate, up, out, n, 1, stream);
}

}  // namespace cuda
}  // namespace zk
