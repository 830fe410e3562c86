// Prefill attention: a block of query tokens (all query heads of one KV head)
// against the full-precision rows of one (layer, KV head) block of the cache,
// flash-attention style. kernel_attention_range (attention.h) serves decode and
// every other cache form; this kernel is for the case that dominates a long
// prompt: many tokens, each seeing a long causal prefix of f16/f32 rows.
//
// How: the M = n_tok x n_group query rows (scaled by the softmax scale) meet
// the keys in blocks of B slots as a small matrix product (register tiles of
// rows x B scores), with the keys read from a transposed f32 copy of the block
// ([slot block][channel][B], built once per layer and KV head for the whole
// prompt chunk by kernel_prefill_keys, since every query block reads it); an
// online softmax per row; and the value sums as a second matrix product
// (rows x channel-stripe tiles, the f16/f32 value rows read in place). Outputs
// are normalised. Results equal kernel_attention_range + merge up to float
// summation order.
#pragma once
#include <cstdint>

#include "kernels/attention.h"

namespace zk {

// The row tail of a block: slots [lo, n_slots) where both sides hold
// full-precision rows and no exact sink is (lo = max(k.n_quant, v.n_quant,
// n_sink_slots)), as a view of KV_LAYOUT_ROWS sides; *lo is set. The engine
// hands a dequantized block (all rows, exact sinks first) to the tiled kernel
// through it; the sinks' partial is merged after (kernel_attention_sinks).
attn_kv_view kernel_prefill_row_tail(const attn_kv_view& kv, int64_t* lo);
// Slots per key block of the transposed copy.
int kernel_prefill_key_block();
// True when this build has the kernel and the block is one it handles: keys and
// values in KV_LAYOUT_ROWS (no quantized slots), no exact sinks. A block with
// quantized slots serves through a view of its row tail (kv_view_row_tail).
bool kernel_prefill_supported(const attn_kv_view& kv);
// Floats of the transposed copy of n_slots slots of r_k channels.
int64_t kernel_prefill_keys_size(int64_t n_slots, int r_k);
// Writes the key blocks covering slots [b0 * B, min(b1 * B, n_slots)) (B =
// kernel_prefill_key_block()) of kv into the transposed copy kt (zeros past
// n_slots and past r_k), so threads can share the work by block ranges.
void kernel_prefill_keys(const attn_kv_view& kv, int64_t b0, int64_t b1, float* kt);
// Query tokens per call that fill the kernel's register tiles for n_group heads.
int kernel_prefill_tokens(int n_group);
// Floats of scratch for one call of n_tok tokens.
int64_t kernel_prefill_scratch(int n_group, int64_t n_tok, int r_k, int r_v);
// out[t * out_stride + j * out_head_stride + c] = softmax(q_tj . K^T) V [c] for
// c < r_v, over the slots visible to token t (pos <= q.q_pos[t]); q.n_tok <=
// the n_tok given to kernel_prefill_scratch.
void kernel_attention_prefill(const attn_kv_view& kv, const float* kt, const attn_q_view& q, float* out,
                              int64_t out_stride, int64_t out_head_stride, float* scratch);
// The same, unnormalised, as the partial of the slots of kv (attn_partial's
// layout: rows t x n_group + j; acc rows of acc_dim or r_v floats; no logits),
// for kernel_attention_merge with the partials of the slots before them.
void kernel_attention_prefill_partial(const attn_kv_view& kv, const float* kt, const attn_q_view& q,
                                      const attn_partial& out, float* scratch);

}  // namespace zk
