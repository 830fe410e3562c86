// Row conversions between f32 and the KV cache's storage types.
#pragma once
#include <cstdint>

namespace zk {

void kernel_f32_to_f16(const float* src, uint16_t* dst, int64_t n);
void kernel_f16_to_f32(const uint16_t* src, float* dst, int64_t n);

}  // namespace zk
