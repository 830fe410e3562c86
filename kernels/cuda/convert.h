// Row conversions between f32 and f16 on the GPU (round to nearest even).
// CPU twins: kernel_f32_to_f16 / kernel_f16_to_f32 (kernels/convert.h), bit
// for bit.
#pragma once
#include <cstdint>

#include "kernels/cuda/cuda_types.h"

namespace zk {
namespace cuda {

void cuda_f32_to_f16(dptr<const float> src, dptr<uint16_t> dst, int64_t n, cuda_stream stream);
void cuda_f16_to_f32(dptr<const uint16_t> src, dptr<float> dst, int64_t n, cuda_stream stream);

}  // namespace cuda
}  // namespace zk
