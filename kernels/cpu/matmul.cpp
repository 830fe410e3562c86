// CPU weight matmul: Y[t][r] = dot(W[r], X[t]).
//
// 1. X [n_tok x n_cols] is quantized to the weight's activation type
//    (dtype_vec_dot_type) into the session's scratch, in parallel for prefill.
// 2. Rows of W are handed to the threads in contiguous chunks of 4-row tiles
//    (parallel_for). Within a chunk, tokens go in blocks of k_tok_block so a
//    block of quantized activations stays in L2 while every 4-row tile of the
//    chunk (a few KB, in L1) meets it; quant_dot_tile then computes 4 rows x 4
//    tokens per pass, loading each weight block once per 4 tokens.
// 3. F32 weights with many tokens go to OpenBLAS sgemm instead.
#include "kernels/matmul.h"

#include <cblas.h>

#include <algorithm>
#include <cstdlib>
#include <vector>

#include "ggml-like/error.h"
#include "ggml-like/quant_ref.h"

namespace zk {

namespace {

// Tokens per activation block: 64 rows of Q8_1 at n_cols = 1536 is ~110 KB.
constexpr int64_t k_tok_block = 64;
// Below this many tokens, F32 weights use the tiled dot loop rather than sgemm.
constexpr int64_t k_blas_min_tok = 16;
// Minimum 4-row tiles per parallel chunk (keeps the shared counter cold for
// small matrices).
constexpr int64_t k_min_tiles_per_chunk = 4;

void check_shapes(const weight_view& w, const float* x, int64_t n_tok, const float* y) {
    if (w.n_rows < 0 || w.n_cols <= 0 || n_tok < 0)
        ZK_THROW("kernel_matmul: bad shapes W [%lld x %lld] (%s), n_tok %lld", (long long)w.n_rows,
                 (long long)w.n_cols, dtype_name(w.type), (long long)n_tok);
    if (w.n_cols % dtype_get_traits(w.type).block_size != 0)
        ZK_THROW("kernel_matmul: W row length %lld is not a multiple of the %s block size %lld",
                 (long long)w.n_cols, dtype_name(w.type), (long long)dtype_get_traits(w.type).block_size);
    if (n_tok > 0 && w.n_rows > 0 && (!w.data || !x || !y))
        ZK_THROW("kernel_matmul: null pointer (W %p, X %p, Y %p)", w.data, (const void*)x, (void*)y);
}

}  // namespace

matmul_scratch::~matmul_scratch() { std::free(buf); }

void* matmul_scratch::reserve(size_t bytes) {
    if (bytes <= cap) return buf;
    // Grow geometrically so a prefill that creeps up in size reallocates rarely.
    size_t want = std::max(bytes, cap + cap / 2);
    want = (want + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, want);
    if (!p) ZK_THROW("matmul_scratch: cannot allocate %zu bytes", want);
    std::free(buf);
    buf = p;
    cap = want;
    return buf;
}

void kernel_matmul(const weight_view& w, const float* x, int64_t n_tok, float* y,
                   thread_pool& pool, matmul_scratch& scratch) {
    check_shapes(w, x, n_tok, y);
    if (n_tok == 0 || w.n_rows == 0) return;
    const int64_t n_rows = w.n_rows, n_cols = w.n_cols;

    if (w.type == dtype::F32 && n_tok >= k_blas_min_tok) {
        // Y [n_tok x n_rows] = X [n_tok x n_cols] * W^T
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n_tok, (int)n_rows, (int)n_cols, 1.0f,
                    x, (int)n_cols, (const float*)w.data, (int)n_cols, 0.0f, y, (int)n_rows);
        return;
    }

    // Activations in the weight's dot type: [n_tok x a_row bytes].
    const dtype at = dtype_vec_dot_type(w.type);
    const uint8_t* a = (const uint8_t*)x;
    size_t a_row = (size_t)n_cols * sizeof(float);
    if (at != dtype::F32) {
        a_row = dtype_row_size(at, n_cols);
        uint8_t* q = (uint8_t*)scratch.reserve(a_row * (size_t)n_tok);
        auto quantize = [&](int64_t t0, int64_t t1, int) {
            for (int64_t t = t0; t < t1; t++) dtype_quantize_row(at, x + t * n_cols, q + t * a_row, n_cols);
        };
        if (n_tok >= 8)
            pool.parallel_for(n_tok, 4, quantize);
        else
            quantize(0, n_tok, 0);
        a = q;
    }

    // Everything the workers need, captured by one pointer so the std::function
    // stays in its small buffer (no heap allocation per call on the decode path).
    struct job {
        dtype type;
        int64_t n_rows, n_cols, n_tok;
        const uint8_t* w;
        size_t w_row;
        const uint8_t* a;
        size_t a_row;
        float* y;
    };
    const job jb{w.type, n_rows, n_cols, n_tok, (const uint8_t*)w.data, dtype_row_size(w.type, n_cols), a, a_row, y};
    const job* j = &jb;
    const int64_t n_tiles = (n_rows + k_tile_rows - 1) / k_tile_rows;
    pool.parallel_for(n_tiles, k_min_tiles_per_chunk, [j](int64_t tile0, int64_t tile1, int) {
        const int64_t r0 = tile0 * k_tile_rows, r1 = std::min(j->n_rows, tile1 * k_tile_rows);
        for (int64_t tb = 0; tb < j->n_tok; tb += k_tok_block) {
            const int64_t te = std::min(j->n_tok, tb + k_tok_block);
            for (int64_t r = r0; r < r1; r += k_tile_rows) {
                const int nr = (int)std::min<int64_t>(k_tile_rows, r1 - r);
                for (int64_t t = tb; t < te; t += k_tile_toks) {
                    const int nt = (int)std::min<int64_t>(k_tile_toks, te - t);
                    quant_dot_tile(j->type, j->n_cols, j->w + r * j->w_row, j->w_row, nr, j->a + t * j->a_row,
                                   j->a_row, nt, j->y + t * j->n_rows + r, (size_t)j->n_rows);
                }
            }
        }
    });
}

void kernel_matmul_reference(const weight_view& w, const float* x, int64_t n_tok, float* y) {
    check_shapes(w, x, n_tok, y);
    const size_t w_row = dtype_row_size(w.type, w.n_cols);
    std::vector<float> row((size_t)w.n_cols);
    for (int64_t r = 0; r < w.n_rows; r++) {
        dtype_dequantize_row(w.type, (const uint8_t*)w.data + r * w_row, row.data(), w.n_cols);
        for (int64_t t = 0; t < n_tok; t++) {
            const float* xt = x + t * w.n_cols;
            double s = 0.0;
            for (int64_t i = 0; i < w.n_cols; i++) s += (double)row[i] * (double)xt[i];
            y[t * w.n_rows + r] = (float)s;
        }
    }
}

}  // namespace zk
