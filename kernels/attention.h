// Attention of new query tokens against one (layer, KV head) block of the cache.
// Heads may be compressed (r_k, r_v <= head_dim): the cache holds k R[:, :r_k]
// and r_v-dim values, queries arrive already projected, and the scale still uses
// the original head dim. Work is split over slot ranges (flash-decoding): each
// range gives a partial (max, sum, unnormalised accumulator) and a merge combines
// them, so one long head can be shared by several threads.
#pragma once
#include <cstdint>

#include "ggml-like/dtype.h"

namespace zk {

struct attn_kv_view {
    dtype type;          // F32 or F16
    const void* k;       // [n_slots x r_k]
    const void* v;       // [n_slots x r_v]
    const int32_t* pos;  // [n_slots] token position held by each slot
    int64_t n_slots;
    int r_k;
    int r_v;
};

struct attn_q_view {
    const float* q;        // q[t * q_stride + j * q_head_stride + c]: token t, group member j, channel c < r_k
    int64_t q_stride;
    int64_t q_head_stride;
    int n_group;           // query heads sharing this KV head
    int64_t n_tok;
    const int32_t* q_pos;  // [n_tok]: token t sees slots whose pos <= q_pos[t] (causal)
    float scale;           // 1 / sqrt(original head dim)
};

// Partial results over a slot range: m, l [n_tok x n_group] (max score, sum of
// e^(s - m)); acc [n_tok x n_group x r_v] = sum of e^(s - m) v. A range with no
// visible slot gives m = -inf, l = 0, acc = 0.
struct attn_partial {
    float* m;
    float* l;
    float* acc;
};

// scratch: at least n_group * (s1 - s0) + r_k + r_v floats.
void kernel_attention_range(const attn_kv_view& kv, int64_t s0, int64_t s1, const attn_q_view& q,
                            const attn_partial& out, float* scratch);

// Combines n_parts partials of the same queries and writes the normalised
// result to out[t * out_stride + j * out_head_stride + c] for c < r_v.
void kernel_attention_merge(const attn_partial* parts, int n_parts, int64_t n_tok, int n_group,
                            int r_v, float* out, int64_t out_stride, int64_t out_head_stride);

}  // namespace zk
