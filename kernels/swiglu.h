// SwiGLU gate: out[i] = silu(gate[i]) * up[i], silu(x) = x / (1 + e^-x). [n] each.
#pragma once
#include <cstdint>

namespace zk {

void kernel_swiglu(const float* gate, const float* up, float* out, int64_t n);

}  // namespace zk
