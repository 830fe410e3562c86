// Prefill attention on the GPU, flash-attention style: the query rows of an
// item (n_tok tokens x n_group heads of one KV head, t-major) in tiles; a tile
// streams the keys and values it can see through shared memory in chunks of
// 32 slots, each side dequantized there by its layout (kv_read.cuh: f16/f32
// rows, 8-bit, 4- or 2-bit KIVI with GEAR; every key x value pair), with an
// online softmax, and writes its rows' normalised outputs (no merge). Exact
// sinks are a first pass over their f32 rows at sink_dim channels (queries
// and outputs then have max(r, sink_dim) channels, as the decode kernel's
// merge gives). Rows per tile are chosen per head so that tiles carry equal
// work (paper, section 5.3): a tile costs rows x slots x (r_k + r_v), so a
// head of half the rank gets tiles of twice the rows; tiles run longest first.
// Items are cuda_attn_item (attention_decode.h). Scalar FMAs, no tensor cores
// (see kernels/cuda/README.md). CPU twins: kernel_attention_prefill (rows
// blocks without sinks), kernel_attention_range(_ref) + _sinks + _merge (any).
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/cuda/attention_decode.h"
#include "kernels/cuda/cuda_types.h"

namespace zk {
namespace cuda {

constexpr int k_prefill_max_rows = 64;  // rows per tile, at most

struct cuda_prefill_task {
    int32_t item;
    int32_t row0, n_rows;  // query rows [row0, row0 + n_rows) of the item
    int64_t cost;          // rows x visible slots x (r_k + r_v)
};

struct cuda_prefill_plan {
    std::vector<cuda_prefill_task> tasks;  // longest first
    size_t smem_bytes = 0;
};

// Tiles of rows_base rows for the items of the largest r_k + r_v, more for the
// others (rows_base x max (r_k + r_v) / (r_k + r_v), at most 64 and what fits
// in smem_max bytes of shared memory). Visible slots are estimated as a
// prefill's (the item's tokens are the cache's last n_tok slots). Throws
// zk::error for blocks cuda_kv_head_check refuses, or too wide for smem_max.
cuda_prefill_plan cuda_prefill_plan_make(const std::vector<cuda_attn_item>& items, int rows_base,
                                         size_t smem_max = 48 * 1024);

void cuda_attention_prefill(dptr<const cuda_attn_item> items, const cuda_prefill_plan& plan,
                            dptr<const cuda_prefill_task> tasks, cuda_stream stream);

}  // namespace cuda
}  // namespace zk
