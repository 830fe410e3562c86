// The KV cache of one sequence, stored per (layer, KV head) so that heads can
// have their own ranks (compressed .zack models), precisions and token sets
// (eviction). Each block holds, for up to `capacity` slots:
//   k   [capacity x r_k]   keys after RoPE (and after the R_qk projection when compressed)
//   v   [capacity x r_v]   values (in the rotated basis when compressed)
//   pos [capacity]         the token position held by each slot, ascending
// Slots are filled in token order; RoPE is applied before caching, so removing
// slots later needs no re-rotation.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "ggml-like/dtype.h"
#include "kernels/attention.h"

namespace zk {

struct kv_block {
    int r_k = 0;
    int r_v = 0;
    int64_t n_used = 0;
    std::vector<uint8_t> k;   // capacity * r_k elements of the cache type
    std::vector<uint8_t> v;   // capacity * r_v elements
    std::vector<int32_t> pos; // capacity
};

class kv_cache {
public:
    // ranks_k/ranks_v: [n_layer x n_head_kv] (row-major); type F32 or F16.
    kv_cache(int n_layer, int n_head_kv, int64_t capacity, dtype type,
             const std::vector<int>& ranks_k, const std::vector<int>& ranks_v);

    int n_layer() const { return n_layer_; }
    int n_head_kv() const { return n_head_kv_; }
    int64_t capacity() const { return capacity_; }
    dtype type() const { return type_; }
    kv_block& block(int layer, int head) { return blocks_[(size_t)layer * n_head_kv_ + head]; }
    const kv_block& block(int layer, int head) const { return blocks_[(size_t)layer * n_head_kv_ + head]; }

    // Appends n_tok rows: k_rows[t * k_stride + c] for c < r_k, likewise v; pos[t].
    void append(int layer, int head, int64_t n_tok, const float* k_rows, int64_t k_stride,
                const float* v_rows, int64_t v_stride, const int32_t* pos);
    attn_kv_view view(int layer, int head) const;

    void clear();
    // Bytes held for keys, values and positions at full capacity.
    size_t bytes_allocated() const;
    // Bytes one cached token costs summed over every (layer, head), positions included.
    size_t bytes_per_token() const;

private:
    int n_layer_;
    int n_head_kv_;
    int64_t capacity_;
    dtype type_;
    std::vector<kv_block> blocks_;
};

}  // namespace zk
