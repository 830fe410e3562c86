#include "kernels/convert.h"

#include "kernels/cpu/simd.h"

namespace zk {

void kernel_f32_to_f16(const float* src, uint16_t* dst, int64_t n) { simd::f32_to_f16_row(src, dst, (int)n); }
void kernel_f16_to_f32(const uint16_t* src, float* dst, int64_t n) { simd::f16_to_f32_row(src, dst, (int)n); }

}  // namespace zk
