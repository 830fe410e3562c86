// KV_LAYOUT_ROWS: a side kept at full precision, one row of the cache's type
// (F16, or F32 with --kv-type f32) per slot, [capacity x r]. The 16-bit cache;
// in a block whose other side is KIVI it holds every slot (no window). Eviction
// moves rows; nothing is ever re-quantized.
#pragma once
#include "engine/kv_layout.h"

namespace zk {

const kv_layout& kv_layout_rows();

}  // namespace zk
