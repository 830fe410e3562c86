// KV_LAYOUT_VQ: a value side coded per token against its block's codebook
// (engine/kv_vq.h; the format in kernels/attention.h): codes [capacity x
// kv_vq_row_bytes(r / c, bits)] + KV_VQ_PAD, one f16 scale a token [capacity].
// The block is windowed: the newest tokens wait in its residual window
// ([residual x r] rows of the cache's type, as KIVI's) and are coded, token by
// token, when their group leaves it, so the tokens attention leans on most stay
// exact. Eviction moves codes; groups never change them. Values only (keys
// need their small score errors more than a code's bytes: bench/RESULTS.md
// "vector codes"), no GEAR; kv_bits 1 selects it.
#pragma once
#include "engine/kv_layout.h"

namespace zk {

const kv_layout& kv_layout_vq();

}  // namespace zk
