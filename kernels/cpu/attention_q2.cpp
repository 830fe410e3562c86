#include "kernels/cpu/attention_layout.h"

namespace zk {
namespace attn {
const kivi_int_kernels* q2_int_kernels() { return nullptr; }
}  // namespace attn
}  // namespace zk
