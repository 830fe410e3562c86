// The fast path of decode attention (attention_decode_fast.cu), used by
// cuda_attention_decode for the tasks it can take; the generic kernel
// (attention_decode.cu) keeps the rest. Same tasks, same partials (m, l, acc
// per query row), same merge.
//
// It takes an item when: the full-precision rows are f16; neither side has
// GEAR, nor the keys a plan's 2/1/0-bit parts, nor the values vector codes
// (kv_head.h); no logits are asked for (eviction policies read them from the generic
// kernel); at most k_fast_rows query rows (tokens x query heads); ranks and the
// sink width multiples of 8 and at most k_fast_rank. A task then reads each
// side in one layout only (the plan cuts ranges at a windowed block's n_quant,
// so a task is all codes or all rows per side), chosen per block from the
// task's (key layout, value layout) pair; sink tasks read the exact f32 rows.
//
// Each warp stages a chunk of slots (keys, values, scales, still quantized)
// into shared memory with many loads in flight, then scores it a lane per slot
// (the key row decoded 8 channels at a time against the scaled queries in
// shared memory) with its own online softmax in registers, and accumulates the
// values a lane per 4 channels; the block's warps are combined once at the end
// (attention_decode_fast.cu has the details). Arithmetic in f32 throughout, as
// the generic kernel (its tolerances hold); the order of the sums differs, and
// KIVI codes are read as floats without conversions against grids folded for
// them (kv_read.cuh: a few ulps of a grid's range). A launch is compiled for 4
// or 8 query rows (the widest item's, rounded up).
#pragma once
#include <cstddef>

#include "kernels/cuda/attention_decode.h"

namespace zk {
namespace cuda {

constexpr int k_fast_rows = 8;    // query rows of an item (n_tok x n_group)
constexpr int k_fast_rank = 128;  // widest key / value / sink row

// Whether the fast kernel can take the item's tasks (host side, from the
// item's description alone).
bool cuda_attn_fast_item(const cuda_attn_item& it);

// Blocks of variant 0 an SM holds at once for items of at most `rows` query
// rows (its launch bounds, checked by the occupancy the device reports): 3 for
// 4 rows (168 registers, 73 KiB of shared memory a block), 2 for 8. A plan for
// that many blocks an SM fills the GPU in one wave.
int cuda_attn_fast_blocks_per_sm(int rows);

// Runs tasks [0, n_tasks) of `tasks` (all of fast items, none of more than
// max_rows query rows) into partials. variant 0: 4 warps a block, chunks of 32
// slots (a slot per lane), compiled for 4 and for 8 rows (max_rows chooses);
// 1: 2 warps, chunks of 64 (two slots per lane), 8 rows.
void cuda_attention_decode_fast(dptr<const cuda_attn_item> items, dptr<const cuda_attn_task> tasks, int n_tasks,
                                int variant, int max_rows, dptr<float> partials, cuda_stream stream);

}  // namespace cuda
}  // namespace zk
