#include "engine/kv_cache.h"

#include <cstring>

#include "ggml-like/error.h"
#include "kernels/convert.h"

namespace zk {

namespace {

size_t elem_size(dtype t) { return t == dtype::F32 ? 4 : 2; }

void store_row(dtype t, const float* src, uint8_t* dst, int n) {
    if (t == dtype::F32)
        std::memcpy(dst, src, sizeof(float) * n);
    else
        kernel_f32_to_f16(src, (uint16_t*)dst, n);
}

}  // namespace

kv_cache::kv_cache(int n_layer, int n_head_kv, int64_t capacity, dtype type,
                   const std::vector<int>& ranks_k, const std::vector<int>& ranks_v)
    : n_layer_(n_layer), n_head_kv_(n_head_kv), capacity_(capacity), type_(type) {
    if (type != dtype::F32 && type != dtype::F16)
        ZK_THROW("KV cache type %s is not supported (f32, f16)", dtype_name(type));
    if (capacity <= 0) ZK_THROW("KV cache capacity must be positive, got %lld", (long long)capacity);
    const size_t n = (size_t)n_layer * n_head_kv;
    ZK_ASSERT(ranks_k.size() == n && ranks_v.size() == n);
    blocks_.resize(n);
    for (size_t i = 0; i < n; i++) {
        kv_block& b = blocks_[i];
        b.r_k = ranks_k[i];
        b.r_v = ranks_v[i];
        b.k.resize((size_t)capacity * b.r_k * elem_size(type));
        b.v.resize((size_t)capacity * b.r_v * elem_size(type));
        b.pos.resize((size_t)capacity);
    }
}

void kv_cache::append(int layer, int head, int64_t n_tok, const float* k_rows, int64_t k_stride,
                      const float* v_rows, int64_t v_stride, const int32_t* pos) {
    kv_block& b = block(layer, head);
    if (b.n_used + n_tok > capacity_)
        ZK_THROW("KV cache is full (%lld of %lld slots used, %lld more needed)", (long long)b.n_used,
                 (long long)capacity_, (long long)n_tok);
    const size_t es = elem_size(type_);
    for (int64_t t = 0; t < n_tok; t++) {
        const int64_t s = b.n_used + t;
        store_row(type_, k_rows + t * k_stride, b.k.data() + (size_t)s * b.r_k * es, b.r_k);
        store_row(type_, v_rows + t * v_stride, b.v.data() + (size_t)s * b.r_v * es, b.r_v);
        b.pos[s] = pos[t];
    }
    b.n_used += n_tok;
}

attn_kv_view kv_cache::view(int layer, int head) const {
    const kv_block& b = block(layer, head);
    return attn_kv_view{type_, b.k.data(), b.v.data(), b.pos.data(), b.n_used, b.r_k, b.r_v};
}

void kv_cache::clear() {
    for (auto& b : blocks_) b.n_used = 0;
}

size_t kv_cache::bytes_allocated() const {
    size_t s = 0;
    for (const auto& b : blocks_) s += b.k.size() + b.v.size() + b.pos.size() * sizeof(int32_t);
    return s;
}

size_t kv_cache::bytes_per_token() const {
    size_t s = 0;
    for (const auto& b : blocks_) s += (size_t)(b.r_k + b.r_v) * elem_size(type_) + sizeof(int32_t);
    return s;
}

}  // namespace zk
