// KV_LAYOUT_Q4 and KV_LAYOUT_Q2: KIVI at 4 or 2 bits (one type, the width a
// parameter; engine/kv_quant.h quantizes, kernels/cpu/attention_q4.cpp and
// attention_q2.cpp read). The block is windowed: the newest tokens wait in a
// residual window of [residual x r] rows of the cache's type, and leave it
// `group` at a time:
//   keys    per channel over the group: codes [capacity x row_bytes(r)] (+ KV_Q4_PAD
//           readable bytes), a packed grid code (scale and min) per (group,
//           channel) [max_groups x r] and the group's two f16 steps [max_groups x 2];
//   values  per token: the same codes, a grid code per block of KV_Q4_VBLOCK
//           channels [capacity x vblocks(r)] and the group's steps [max_groups x 2].
//   GEAR    (optional) per group a rank-k f16 correction A [group x k], B [r x k]
//           and n_out f16 sparse outliers (index t * r + c) of the residual.
// Eviction keeps a group's codes and scales (its tokens stay exact to their
// quantization); when two neighbouring groups fit in one they are merged by
// re-quantizing their dequantized tokens (regroups()), so the groups stay
// bounded (engine/kv_cache.h).
#pragma once
#include "engine/kv_layout.h"

namespace zk {

const kv_layout& kv_layout_q4();
const kv_layout& kv_layout_q2();

}  // namespace zk
