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
// 4. Packed weights (weight_view::packed, quant_pack.h) go in groups of
//    k_pack_rows rows through quant_pack_tile, up to k_pack_toks tokens a pass,
//    with activations quantized once per token to the packed kernels' rows
//    (one kind for the K-quants, one for Q8_0 / Q5_0).
#include "kernels/matmul.h"

#include <cblas.h>

#include <algorithm>
#include <cstdlib>
#include <vector>

#include "ggml-like/error.h"
#include "ggml-like/quant_pack.h"
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

namespace {

// Activation rows for the packed kernels: about this many bytes per token block
// (a block of a 8960-column down projection is 16 tokens, of a 1536-column one 64).
constexpr size_t k_pack_tok_block_bytes = 256 * 1024;
// Decode (one token) tiles of packed weights touch the weights this far ahead
// (software prefetch, one block's lines per block). A decode step's matmuls of
// the 1.5B from DRAM, one thread (bench_matmul Qwen15/decode, min of 3
// interleaved): none 76 ms, 1 KB 63, 4 KB 58, 8 KB 64, 16 KB 62 (prefetching
// into L1); into L2, 2 threads: 2 KB 44.6 ms, 4 KB 44.1, 8 KB 45.2, 16 KB 43.6.
// On the 2-vCPU AVX2 EPYC of 2026-12-05 (2 threads, median of 4 rounds): none
// 123.5 ms, 1 KB 99.7, 4 KB 98.0, 8 KB 113.5, 32 KB 105.5 (bench/RESULTS.md).
// Those were 4 KiB pages; in the huge pages the packed weights now ask for
// (engine/model.cpp), on the AVX-512 Xeon, the 1.5B's whole decode step
// (zack bench, 3 interleaved rounds): none 42.4-43.1 ms, 1 KB 39.5-40.3, 2 KB
// 38.7-40.4, 3 KB 39.8-40.7, 4 KB 40.9-42.5, 8 KB 42.8-43.3, 16 KB 42.7-43.7.
// Since the kernels spread a block's prefetches over its arithmetic
// (quant_tile_k.cpp), a longer distance pays: 1 KB 39.7-39.9 ms, 2 KB
// 36.4-36.6, 3 KB 34.1-34.2, 4 KB 34.1-34.4, 6 KB 34.7-35.0.
constexpr size_t k_pack_prefetch_bytes = 3072;

// One weight of a (multi-)matmul, as the workers see it.
struct mm_job {
    dtype type;
    int64_t n_rows, n_cols, n_tok;
    const uint8_t* w;
    size_t w_row;      // bytes per row, or per packed row group
    bool packed;
    const uint8_t* a;  // activations in the weight's dot type [n_tok x a_row]
    size_t a_row;
    float* y;          // [n_tok x n_rows]
    int64_t tok_block;
};

// Rows [r0, r1) of one weight for all tokens: tokens in blocks of tok_block
// so a block of activations stays in L2 while each tile of rows meets it.
void mm_run_rows(const mm_job& j, int64_t r0, int64_t r1) {
    for (int64_t tb = 0; tb < j.n_tok; tb += j.tok_block) {
        const int64_t te = std::min(j.n_tok, tb + j.tok_block);
        if (j.packed) {
            for (int64_t r = r0; r < r1; r += k_pack_rows) {
                const uint8_t* g = j.w + (r / k_pack_rows) * j.w_row;
                const int nr = (int)std::min<int64_t>(k_pack_rows, r1 - r);
                for (int64_t t = tb; t < te; t += k_pack_toks) {
                    const int nt = (int)std::min<int64_t>(k_pack_toks, te - t);
                    quant_pack_tile(j.type, j.n_cols, g, nr, j.a + t * j.a_row, j.a_row, nt, j.y + t * j.n_rows + r,
                                    (size_t)j.n_rows, k_pack_prefetch_bytes ? g + k_pack_prefetch_bytes : nullptr);
                }
            }
            continue;
        }
        for (int64_t r = r0; r < r1; r += k_tile_rows) {
            const int nr = (int)std::min<int64_t>(k_tile_rows, r1 - r);
            for (int64_t t = tb; t < te; t += k_tile_toks) {
                const int nt = (int)std::min<int64_t>(k_tile_toks, te - t);
                quant_dot_tile(j.type, j.n_cols, j.w + r * j.w_row, j.w_row, nr, j.a + t * j.a_row, j.a_row, nt,
                               j.y + t * j.n_rows + r, (size_t)j.n_rows);
            }
        }
    }
}

// What a weight's kernel reads as activations: its dot type, or (packed) the
// packed kernels' own rows. Weights of one multi-matmul share X only when equal.
int act_kind(const weight_view& w) { return w.packed ? -1 - quant_pack_act_kind(w.type) : (int)dtype_vec_dot_type(w.type); }

}  // namespace

void kernel_matmul(const weight_view& w, const float* x, int64_t n_tok, float* y,
                   thread_pool& pool, matmul_scratch& scratch) {
    kernel_matmul_multi(&w, &y, 1, x, n_tok, pool, scratch);
}

void kernel_matmul_multi(const weight_view* ws, float* const* ys, int n_w, const float* x, int64_t n_tok,
                         thread_pool& pool, matmul_scratch& scratch) {
    if (n_w < 1 || n_w > k_matmul_multi_max) ZK_THROW("kernel_matmul_multi: %d weights (1..%d)", n_w, k_matmul_multi_max);
    for (int i = 0; i < n_w; i++) check_shapes(ws[i], x, n_tok, ys[i]);
    if (n_tok == 0) return;
    const int64_t n_cols = ws[0].n_cols;
    const int kind = act_kind(ws[0]);
    bool shared = true;  // one quantized copy of X serves every weight
    for (int i = 1; i < n_w; i++) shared &= ws[i].n_cols == n_cols && act_kind(ws[i]) == kind;
    if (!shared) {
        for (int i = 0; i < n_w; i++) kernel_matmul_multi(ws + i, ys + i, 1, x, n_tok, pool, scratch);
        return;
    }
    const bool packed = kind < 0;
    if (!packed && ws[0].type == dtype::F32 && n_tok >= k_blas_min_tok) {
        for (int i = 0; i < n_w; i++) {
            // Y [n_tok x n_rows] = X [n_tok x n_cols] * W^T
            if (ws[i].n_rows == 0) continue;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n_tok, (int)ws[i].n_rows, (int)n_cols, 1.0f, x,
                        (int)n_cols, (const float*)ws[i].data, (int)n_cols, 0.0f, ys[i], (int)ws[i].n_rows);
        }
        return;
    }
    // Activations in the weights' dot type: [n_tok x a_row bytes].
    const dtype at = packed ? ws[0].type : dtype_vec_dot_type(ws[0].type);  // packed: the weight type's rows
    const uint8_t* a = (const uint8_t*)x;
    size_t a_row = (size_t)n_cols * sizeof(float);
    if (packed || at != dtype::F32) {
        a_row = packed ? quant_pack_act_row_size(at, n_cols) : dtype_row_size(at, n_cols);
        uint8_t* q = (uint8_t*)scratch.reserve(a_row * (size_t)n_tok);
        auto quantize = [&](int64_t t0, int64_t t1, int) {
            for (int64_t t = t0; t < t1; t++) {
                if (packed)
                    quant_pack_quantize(at, x + t * n_cols, q + t * a_row, n_cols);
                else
                    dtype_quantize_row(at, x + t * n_cols, q + t * a_row, n_cols);
            }
        };
        if (n_tok >= 8)
            pool.parallel_for(n_tok, 4, quantize);
        else
            quantize(0, n_tok, 0);
        a = q;
    }
    const int64_t tile_rows = packed ? k_pack_rows : k_tile_rows;
    const int64_t tok_block =
        packed ? std::max<int64_t>(k_pack_toks, (int64_t)(k_pack_tok_block_bytes / a_row) / k_pack_toks * k_pack_toks)
               : k_tok_block;
    // The row tiles of all weights, numbered one after the other, go to the
    // threads in one parallel loop (one dispatch for Q/K/V or gate/up). Everything
    // the workers need is captured by one pointer, so the std::function stays in
    // its small buffer (no heap allocation per call on the decode path).
    struct multi_job {
        mm_job w[k_matmul_multi_max];
        int64_t tile0[k_matmul_multi_max + 1];  // first global tile of each weight
        int64_t tile_rows;
        int n;
    } mj;
    mj.n = n_w;
    mj.tile_rows = tile_rows;
    mj.tile0[0] = 0;
    for (int i = 0; i < n_w; i++) {
        const size_t w_row = packed ? quant_pack_size(ws[i].type, k_pack_rows, n_cols) : dtype_row_size(ws[i].type, n_cols);
        mj.w[i] = mm_job{ws[i].type, ws[i].n_rows, n_cols, n_tok, (const uint8_t*)(packed ? ws[i].packed : ws[i].data),
                         w_row, packed, a, a_row, ys[i], tok_block};
        mj.tile0[i + 1] = mj.tile0[i] + (ws[i].n_rows + tile_rows - 1) / tile_rows;
    }
    const multi_job* j = &mj;
    pool.parallel_for(mj.tile0[n_w], k_min_tiles_per_chunk, [j](int64_t t0, int64_t t1, int) {
        for (int i = 0; i < j->n; i++) {
            const int64_t b = std::max(t0, j->tile0[i]), e = std::min(t1, j->tile0[i + 1]);
            if (b >= e) continue;
            const mm_job& w = j->w[i];
            mm_run_rows(w, (b - j->tile0[i]) * j->tile_rows, std::min(w.n_rows, (e - j->tile0[i]) * j->tile_rows));
        }
    });
}

weight_view kernel_matmul_pack(const weight_view& w, void* dst, thread_pool& pool, int64_t g0, int64_t g1) {
    if (!quant_pack_supported(w.type, w.n_cols))
        ZK_THROW("kernel_matmul_pack: no packed layout for %s weights of %lld columns in this build", dtype_name(w.type),
                 (long long)w.n_cols);
    check_shapes(w, nullptr, 0, nullptr);
    if (((uintptr_t)dst & 31) != 0) ZK_THROW("kernel_matmul_pack: destination %p is not 32-byte aligned", dst);
    const int64_t groups = (w.n_rows + k_pack_rows - 1) / k_pack_rows;
    if (g1 < 0) g1 = groups;
    if (g0 < 0 || g0 > g1 || g1 > groups)
        ZK_THROW("kernel_matmul_pack: row groups [%lld, %lld) outside the %lld of W [%lld x %lld]", (long long)g0,
                 (long long)g1, (long long)groups, (long long)w.n_rows, (long long)w.n_cols);
    pool.parallel_for(g1 - g0, 16, [&](int64_t a, int64_t b, int) {
        quant_pack_groups(w.type, w.data, w.n_rows, w.n_cols, g0 + a, g0 + b, dst);
    });
    weight_view p = w;
    p.packed = dst;
    return p;
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
