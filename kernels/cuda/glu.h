// Gated activations on the GPU, [n] each:
//   SwiGLU: out = silu(gate) * up, silu(g) = g / (1 + e^-g)      (kernel_swiglu)
//   GeGLU:  out = gelu_tanh(gate) * up = g / (1 + e^(-2u)) * up,
//           u = sqrt(2/pi) (g + 0.044715 g^3)                     (kernel_geglu)
#pragma once
#include <cstdint>

#include "kernels/cuda/cuda_types.h"

namespace zk {
namespace cuda {

void cuda_swiglu(dptr<const float> gate, dptr<const float> up, dptr<float> out, int64_t n, cuda_stream stream);
void cuda_geglu(dptr<const float> gate, dptr<const float> up, dptr<float> out, int64_t n, cuda_stream stream);

}  // namespace cuda
}  // namespace zk
