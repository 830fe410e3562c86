// Decode attention over the compressed KV cache on the GPU: a batch of
// (sequence, KV head) items, each with its own ranks (r_k, r_v: 1 .. 256), key
// and value layouts (kv_head.h: f16/f32 rows, 8-bit, 4- or 2-bit KIVI with
// optional GEAR, every key x value pair), evicted slots (positions with gaps,
// KIVI groups shortened or merged) and exact sinks, in the layouts of
// kernels/attention.h and engine/kv_layout*.h. The CPU twin is
// kernel_attention_range (its float reference path, kernel_attention_range_ref,
// does the same arithmetic) / kernel_attention_sinks / kernel_attention_merge.
//
// Work split (flash-decoding, paper section 5.3): each item's slots are cut
// into ranges whose cost, slots x (r_k + r_v), is about the same for every
// range of every item (a head of half the rank gets ranges twice as long), and
// the ranges go to blocks longest first (blocks start in index order). Each
// block writes a partial (max, sum, unnormalised accumulator) for the item's
// query rows; the exact sink rows are one more small task per item; a second
// kernel merges an item's partials into the normalised output.
//
// Per block (attention_decode.cu): the item's scaled queries in shared memory;
// slots in chunks of 32: scores with the key rows read in place, each slot
// shared by a group of L lanes (L = rank / 8 rounded up to a power of two),
// dequantization (8-, 4-, 2-bit, GEAR) fused by the key side's layout; an
// online softmax per query row (a warp per row, a lane per slot); the chunk's
// value rows dequantized once by the value side's layout into shared memory
// (kv_read.cuh); the accumulators in shared memory. Nothing dequantized is
// written to global memory.
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/cuda/cuda_types.h"
#include "kernels/cuda/kv_head.h"

namespace zk {
namespace cuda {

constexpr int k_attn_chunk = 32;         // slots per chunk (a lane per slot in the softmax)
constexpr int k_attn_block = 128;        // threads per block

// One item of the batch: a cache block and the query rows that attend to it.
struct cuda_attn_item {
    cuda_kv_head kv;
    // q[t * q_stride + j * q_head_stride + c]: token t < n_tok, group member
    // j < n_group, channel c < r_k (< sink_dim when the block has exact sinks)
    dptr<const float> q{};
    int64_t q_stride = 0, q_head_stride = 0;
    int n_group = 1;
    int n_tok = 1;
    dptr<const int32_t> q_pos{};  // [n_tok]: token t sees slots with pos <= q_pos[t]
    float scale = 1.0f;         // 1 / sqrt(original head dim)
    // out[t * out_stride + j * out_head_stride + c], c < max(r_v, sink_dim)
    dptr<float> out{};
    int64_t out_stride = 0, out_head_stride = 0;
    // optional: scaled scores at logits[(t * n_group + j) * logits_stride + s]
    // for every slot (-inf where token t cannot see it), for eviction policies
    dptr<float> logits{};
    int64_t logits_stride = 0;
};

// A block's work: item `item`'s slots [s0, s1), or its exact sink slots.
struct cuda_attn_task {
    int32_t item;
    int32_t sink;  // 1: the exact sink rows (s0 = 0, s1 = n_sink_slots)
    int64_t s0, s1;
    int64_t part;  // float offset of its partial: m [rows], l [rows], acc [rows x acc_dim]
    int64_t cost;  // slots x (r_k + r_v) (sink rows: x 2 sink_dim)
};

// Per item, where its partials lie (the merge reads them).
struct cuda_attn_part {
    int64_t off;  // float offset
    int acc_dim;  // r_v, or sink_dim for the sink partial
};

// The whole work split of one launch.
struct cuda_attn_plan {
    // tasks [0, n_fast) run on the fast kernel (attention_decode_fast.h), the
    // rest on the generic one; each part longest first
    std::vector<cuda_attn_task> tasks;
    int n_fast = 0;
    int fast_variant = 0;                // the fast kernel's variant (attention_decode_fast.h)
    std::vector<cuda_attn_part> parts;   // item i's parts: [item_parts[i], item_parts[i + 1])
    std::vector<int32_t> item_parts;     // [n_items + 1]
    int max_rows = 1;                    // query rows of the widest item (the merge's grid)
    int max_fast_rows = 1;               // ... of the widest item the fast kernel takes
    int64_t partial_floats = 0;          // scratch the partials need
    size_t smem_bytes = 0;               // dynamic shared memory per block of the generic kernel
};

// Splits the items' slots into tasks of equal cost for about `blocks` blocks
// (e.g. 2 x the SM count): an item of cost C gets round(C / W) ranges of equal
// slot count, W = total / blocks, but no range shorter than min_range slots
// (unless the item has fewer). An item the fast kernel takes has its ranges
// also cut where a side turns from codes to rows (a windowed block's n_quant).
// Throws zk::error for ranks above 256 or inconsistent items.
// allow_fast = false puts every task on the generic kernel.
cuda_attn_plan cuda_attn_plan_make(const std::vector<cuda_attn_item>& items, int blocks, int64_t min_range = 32,
                                   bool allow_fast = true);

// The plan in device memory (uploaded once per plan; reused while the shapes
// stay the same).
struct cuda_attn_plan_device {
    dptr<const cuda_attn_task> tasks{};
    int n_tasks = 0;
    dptr<const cuda_attn_part> parts{};
    dptr<const int32_t> item_parts{};
};

// Runs the tasks (partials into `partials`, plan.partial_floats floats), then
// the merge into every item's out. items: [n_items] in device memory.
void cuda_attention_decode(dptr<const cuda_attn_item> items, int n_items, const cuda_attn_plan& plan,
                           const cuda_attn_plan_device& dplan, dptr<float> partials, cuda_stream stream);

}  // namespace cuda
}  // namespace zk
