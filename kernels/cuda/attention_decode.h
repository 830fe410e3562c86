// Decode attention over the compressed KV cache on the GPU: a batch of
// (sequence, KV head) items, each with its own ranks (r_k, r_v: 4 .. 256),
// precision (f16/f32 rows, 8-bit, 4-bit KIVI with optional GEAR), evicted slots
// (positions with gaps) and exact sinks, in the layouts of kernels/attention.h
// and engine/kv_cache.h. The CPU twin is kernel_attention_range /
// kernel_attention_sinks / kernel_attention_merge.
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
// shared by a group of L lanes (L = rank / 8 rounded up to a power of two) with
// 4/8-bit dequantization fused; an online softmax per query row (a warp per
// row, a lane per slot); the chunk's value rows dequantized once into shared
// memory; the accumulators in shared memory. Nothing dequantized is written to
// global memory.
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/cuda/cuda_types.h"

namespace zk {
namespace cuda {

constexpr int k_attn_max_rank = 256;     // channels of a key/value row or sink row
constexpr int k_attn_chunk = 32;         // slots per chunk (a lane per slot in the softmax)
constexpr int k_attn_block = 128;        // threads per block

enum cuda_kv_type : int { CUDA_KV_F32 = 0, CUDA_KV_F16 = 1 };

// One (sequence, layer, KV head) block of the cache in device memory; fields as
// in attn_kv_view (kernels/attention.h). Exactly one of k32/k16 (v32/v16) is
// set, by `type`.
struct cuda_kv_head {
    int type = CUDA_KV_F16;
    int quant = 0;  // kv_quant_kind: 0 none, 1 Q8, 2 Q4
    int r_k = 0, r_v = 0;
    int64_t n_slots = 0, n_quant = 0;
    dptr<const int32_t> pos;                  // [n_slots]
    dptr<const float> k32, v32;               // [(n_slots - n_quant) x r] rows
    dptr<const uint16_t> k16, v16;
    // Q8: int8 codes [n_quant x r], f16 scales [n_quant x blocks32(r)]
    dptr<const int8_t> kq8, vq8;
    // Q4: codes [n_quant x (r + 1) / 2]; keys: f16 scale/min [n_groups x r_k];
    // values: f16 scale/min [n_quant x blocks32(r_v)]
    dptr<const uint8_t> kq4, vq4;
    dptr<const uint16_t> ks, km, vs, vm;
    int group = 0;
    int64_t n_groups = 0;
    dptr<const int32_t> group_start;          // [n_groups + 1]
    // GEAR (Q4): rank-`gear_rank` A [n_groups x group x rank], B [n_groups x r x rank],
    // sparse out_idx/out_val [n_groups x n_out] (KV_GEAR_NONE pads)
    int gear_rank = 0, gear_nout_k = 0, gear_nout_v = 0;
    dptr<const uint16_t> ka, kb, koi, kov, va, vb, voi, vov;
    // exact sinks: slots [0, n_sink_slots) read f32 rows of sink_dim channels,
    // row pos[s]
    int64_t n_sink_slots = 0;
    int sink_dim = 0;
    dptr<const float> sink_k, sink_v;
};

// One item of the batch: a cache block and the query rows that attend to it.
struct cuda_attn_item {
    cuda_kv_head kv;
    // q[t * q_stride + j * q_head_stride + c]: token t < n_tok, group member
    // j < n_group, channel c < r_k (< sink_dim when the block has exact sinks)
    dptr<const float> q;
    int64_t q_stride = 0, q_head_stride = 0;
    int n_group = 1;
    int n_tok = 1;
    dptr<const int32_t> q_pos;  // [n_tok]: token t sees slots with pos <= q_pos[t]
    float scale = 1.0f;         // 1 / sqrt(original head dim)
    // out[t * out_stride + j * out_head_stride + c], c < max(r_v, sink_dim)
    dptr<float> out;
    int64_t out_stride = 0, out_head_stride = 0;
    // optional: scaled scores at logits[(t * n_group + j) * logits_stride + s]
    // for every slot (-inf where token t cannot see it), for eviction policies
    dptr<float> logits;
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
    std::vector<cuda_attn_task> tasks;   // longest first
    std::vector<cuda_attn_part> parts;   // item i's parts: [item_parts[i], item_parts[i + 1])
    std::vector<int32_t> item_parts;     // [n_items + 1]
    int64_t partial_floats = 0;          // scratch the partials need
    size_t smem_bytes = 0;               // dynamic shared memory per block
};

// Splits the items' slots into tasks of equal cost for about `blocks` blocks
// (e.g. 2 x the SM count): an item of cost C gets round(C / W) ranges of equal
// slot count, W = total / blocks, but no range shorter than min_range slots
// (unless the item has fewer). Throws zk::error for ranks above 256 or
// inconsistent items.
cuda_attn_plan cuda_attn_plan_make(const std::vector<cuda_attn_item>& items, int blocks, int64_t min_range = 32);

// The plan in device memory (uploaded once per plan; reused while the shapes
// stay the same).
struct cuda_attn_plan_device {
    dptr<const cuda_attn_task> tasks;
    int n_tasks = 0;
    dptr<const cuda_attn_part> parts;
    dptr<const int32_t> item_parts;
};

// Runs the tasks (partials into `partials`, plan.partial_floats floats), then
// the merge into every item's out. items: [n_items] in device memory.
void cuda_attention_decode(dptr<const cuda_attn_item> items, int n_items, const cuda_attn_plan& plan,
                           const cuda_attn_plan_device& dplan, dptr<float> partials, cuda_stream stream);

}  // namespace cuda
}  // namespace zk
