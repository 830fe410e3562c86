// Weight matrix times activations, the op that dominates decode and prefill.
// W is row-major [n_rows x n_cols] of any dtype (GGUF shape [n_cols, n_rows]),
// X is [n_tok x n_cols] f32, Y is [n_tok x n_rows] f32:  Y[t][r] = dot(W[r], X[t]).
// Activations are quantized on the fly to dtype_vec_dot_type(W) (as llama.cpp
// does); the weights are never dequantized as a whole. Rows are split across the
// pool's threads; several tokens share each loaded weight block when n_tok > 1.
#pragma once
#include <cstdint>

#include "ggml-like/dtype.h"
#include "ggml-like/threadpool.h"

namespace zk {

struct weight_view {
    dtype type;
    int64_t n_rows;
    int64_t n_cols;
    const void* data;  // n_rows * dtype_row_size(type, n_cols) bytes
    // Optional interleaved copy of data for the tiled kernels (quant_pack.h,
    // quant_pack_size bytes, 32-byte aligned, owned by whoever packed it). When
    // set, kernel_matmul reads only this, never data.
    const void* packed = nullptr;
};

// Reusable buffers for quantized activations; owned by a session so no
// allocation happens per token once it has grown to its working size.
struct matmul_scratch {
    void* buf = nullptr;
    size_t cap = 0;
    matmul_scratch() = default;
    matmul_scratch(const matmul_scratch&) = delete;
    matmul_scratch& operator=(const matmul_scratch&) = delete;
    ~matmul_scratch();
    void* reserve(size_t bytes);
};

void kernel_matmul(const weight_view& w, const float* x, int64_t n_tok, float* y,
                   thread_pool& pool, matmul_scratch& scratch);

// Several weights applied to the same X (Q/K/V; gate/up): Y_i = X W_i^T, with X
// quantized once and the rows of all weights in one parallel loop, so a decode
// step synchronises the threads once instead of n_w times. Results equal
// n_w kernel_matmul calls bit for bit. Weights whose row length or activation
// type differ from ws[0] are run one after another.
constexpr int k_matmul_multi_max = 4;
void kernel_matmul_multi(const weight_view* ws, float* const* ys, int n_w, const float* x, int64_t n_tok,
                         thread_pool& pool, matmul_scratch& scratch);

// Packs w (quant_pack_supported types only) into dst, quant_pack_size bytes,
// 32-byte aligned, with the pool's threads; returns w with `packed` set. Only
// row groups [g0, g1) (of k_pack_rows rows; g1 = -1: to the end) are written,
// so a caller may pack a matrix in slices.
weight_view kernel_matmul_pack(const weight_view& w, void* dst, thread_pool& pool, int64_t g0 = 0, int64_t g1 = -1);

// The CPU reference: dequantize each row and use a plain double-accumulated dot.
void kernel_matmul_reference(const weight_view& w, const float* x, int64_t n_tok, float* y);

}  // namespace zk
