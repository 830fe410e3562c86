// KV_LAYOUT_Q8: a side quantized per token to int8, blocks of KV_Q8_BLOCK (32)
// channels with one f16 scale each (x = d * code; engine/kv_quant.h):
// codes [capacity x r], scales [capacity x blocks(r)]. In a block that is not
// windowed each token is quantized as it arrives; in a windowed block (the
// other side KIVI) the newest tokens wait in the block's residual window
// ([residual x r] rows of the cache's type) and are quantized, token by
// token, when their group leaves it. Eviction moves codes; groups never change
// them.
#pragma once
#include "engine/kv_layout.h"

namespace zk {

const kv_layout& kv_layout_q8();

}  // namespace zk
