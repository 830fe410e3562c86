// GeGLU gate (Gemma): out[i] = gelu(gate[i]) * up[i] with GELU's tanh
// approximation, gelu(g) = g/2 (1 + tanh(u)), u = sqrt(2/pi) (g + 0.044715 g^3).
// [n] each.
#pragma once
#include <cstdint>

namespace zk {

void kernel_geglu(const float* gate, const float* up, float* out, int64_t n);

// The same in double precision, one element at a time: the tests' reference.
double kernel_geglu_ref(double gate, double up);

}  // namespace zk
