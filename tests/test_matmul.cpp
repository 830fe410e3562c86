// kernel_matmul against kernel_matmul_reference (dequantize + double dot on the
// unquantized activations) for every weight type, and the thread pool.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <stdexcept>
#include <thread>
#include <vector>

#include "ggml-like/error.h"
#include "ggml-like/quant_pack.h"
#include "ggml-like/quant_ref.h"
#include "ggml-like/threadpool.h"
#include "kernels/matmul.h"
#include "tests/quant_random.h"

using namespace zk;

namespace {

std::vector<float> random_floats(int64_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(lo, hi);
    std::vector<float> v((size_t)n);
    for (auto& x : v) x = u(rng);
    return v;
}

// Weight matrix [n_rows x n_cols] of type t (tests/quant_random.h).
std::vector<uint8_t> random_weights(dtype t, int64_t n_rows, int64_t n_cols, uint32_t seed) {
    return quant_random_rows(t, n_rows, n_cols, seed);
}

// A packed copy of a weight (quant_pack.h), owned by the test.
struct packed_weight {
    std::unique_ptr<void, void (*)(void*)> buf{nullptr, std::free};
    weight_view view;
    packed_weight(const weight_view& w, thread_pool& pool) {
        buf.reset(std::aligned_alloc(64, (quant_pack_size(w.type, w.n_rows, w.n_cols) + 63) / 64 * 64));
        view = kernel_matmul_pack(w, buf.get(), pool);
    }
};

// Types with a packed kernel in this build (the packed tests name them).
std::vector<dtype> packed_types() {
    std::vector<dtype> v;
    for (dtype t : quant_weight_types())
        if (quant_pack_supported(t, 256)) v.push_back(t);
    return v;
}

}  // namespace

// Tolerance per output, derived from what the kernel is allowed to lose:
//   sum_i |w_i| |x_i - a_i|     the activation quantization (a = dequantized
//                               quantized x, computed here from the data),
//   + (Q4_1, Q5_1) sum_b |m_b| |sum_b a| 2^-10   the f16 block sums s,
//   + 1e-5 sum_i |w_i x_i|      float accumulation.
namespace {

// kernel_matmul (packed copy when `pack`) of each shape and token count
// against kernel_matmul_reference, with the tolerance above.
void check_against_reference(dtype t, bool pack) {
    struct shape {
        int64_t rows, cols;
    };
    const shape shapes[] = {{5, 256}, {37, 512}, {130, 768}};
    const dtype at = dtype_vec_dot_type(t);  // packed activations hold the same values
    for (const shape& s : shapes) {
        const auto wdata = random_weights(t, s.rows, s.cols, 1000 + (uint32_t)s.rows);
        weight_view w{t, s.rows, s.cols, wdata.data()};
        thread_pool pack_pool(2);
        std::unique_ptr<packed_weight> pw;
        if (pack) {
            pw = std::make_unique<packed_weight>(w, pack_pool);
            w = pw->view;
        }
        std::vector<float> wf((size_t)(s.rows * s.cols));
        for (int64_t r = 0; r < s.rows; r++)
            dtype_dequantize_row(t, wdata.data() + r * dtype_row_size(t, s.cols), wf.data() + r * s.cols, s.cols);
        for (int64_t n_tok : {1, 3, 17, 70}) {
            if (!pack && n_tok == 70) continue;
            const auto x = random_floats(n_tok * s.cols, 77 + (uint32_t)n_tok, -2.0f, 2.0f);
            // What the activations become after quantization.
            std::vector<float> xa(x.size());
            std::vector<uint8_t> qrow(dtype_row_size(at, s.cols));
            for (int64_t k = 0; k < n_tok; k++) {
                dtype_quantize_row(at, x.data() + k * s.cols, qrow.data(), s.cols);
                dtype_dequantize_row(at, qrow.data(), xa.data() + k * s.cols, s.cols);
            }
            std::vector<float> ref((size_t)(n_tok * s.rows));
            kernel_matmul_reference(w, x.data(), n_tok, ref.data());
            for (int n_threads : {1, 3}) {
                thread_pool pool(n_threads);
                matmul_scratch scratch;
                std::vector<float> y((size_t)(n_tok * s.rows), NAN);
                kernel_matmul(w, x.data(), n_tok, y.data(), pool, scratch);
                for (int64_t k = 0; k < n_tok; k++)
                    for (int64_t r = 0; r < s.rows; r++) {
                        const float* wr = wf.data() + r * s.cols;
                        const float* xk = x.data() + k * s.cols;
                        const float* ak = xa.data() + k * s.cols;
                        double tol = 0;
                        for (int64_t i = 0; i < s.cols; i++)
                            tol += std::fabs(wr[i]) * std::fabs(xk[i] - ak[i]) + 1e-5 * std::fabs(wr[i] * xk[i]);
                        if (t == dtype::Q4_1 || t == dtype::Q5_1) {
                            const uint8_t* wrow = wdata.data() + r * dtype_row_size(t, s.cols);
                            const size_t bs = dtype_get_traits(t).type_size;
                            for (int64_t b = 0; b < s.cols / 32; b++) {
                                const uint16_t m = t == dtype::Q4_1 ? ((const block_q4_1*)(wrow + b * bs))->m
                                                                    : ((const block_q5_1*)(wrow + b * bs))->m;
                                double sum = 0;
                                for (int j = 0; j < 32; j++) sum += ak[32 * b + j];
                                tol += std::fabs(fp16_to_fp32(m) * sum) * std::ldexp(1.0, -10);
                            }
                        }
                        ASSERT_NEAR(y[k * s.rows + r], ref[k * s.rows + r], tol)
                            << dtype_name(t) << (pack ? " packed" : "") << " W " << s.rows << "x" << s.cols
                            << " n_tok " << n_tok << " threads " << n_threads << " at token " << k << " row " << r;
                    }
            }
        }
    }
}

}  // namespace

TEST(Matmul, MatchesReferenceEveryType) {
    for (dtype t : quant_weight_types()) check_against_reference(t, false);
}

// The packed kernels (quant_pack.h) against the same reference, with row counts
// that end mid-group and token counts that end mid-tile and span token blocks.
TEST(Matmul, PackedMatchesReference) {
    const auto types = packed_types();
    std::printf("  packed types in this build: %zu (rows per group %d)\n", types.size(), k_pack_rows);
    for (dtype t : types) check_against_reference(t, true);
}

// Packing in slices of row groups (as model_pack_weights does, releasing each
// slice's file pages) writes the bytes of one whole packing; a range outside
// the matrix's groups throws.
TEST(Matmul, PackInSlicesEqualsWhole) {
    for (dtype t : packed_types()) {
        const int64_t rows = 3 * k_pack_rows + 5, cols = 512;
        const auto wdata = random_weights(t, rows, cols, 9);
        const weight_view w{t, rows, cols, wdata.data()};
        thread_pool pool(2);
        const packed_weight whole(w, pool);
        const size_t bytes = quant_pack_size(t, rows, cols);
        std::unique_ptr<void, void (*)(void*)> sliced(std::aligned_alloc(64, (bytes + 63) / 64 * 64), std::free);
        std::memset(sliced.get(), 0x5A, bytes);
        const int64_t groups = (rows + k_pack_rows - 1) / k_pack_rows;
        for (int64_t g0 = 0; g0 < groups; g0 += 3) kernel_matmul_pack(w, sliced.get(), pool, g0, std::min(groups, g0 + 3));
        ASSERT_EQ(std::memcmp(sliced.get(), whole.buf.get(), bytes), 0) << dtype_name(t);
        EXPECT_THROW(kernel_matmul_pack(w, sliced.get(), pool, 2, 1), zk::error) << dtype_name(t);
        EXPECT_THROW(kernel_matmul_pack(w, sliced.get(), pool, 0, groups + 1), zk::error) << dtype_name(t);
    }
}

// A packed token's outputs do not depend on the other tokens of the call (the
// property batched decoding relies on): 70 tokens at once equal 70 calls of one.
TEST(Matmul, PackedTokensIndependentOfBatch) {
    for (dtype t : packed_types()) {
        const int64_t rows = 45, cols = 1024, n_tok = 70;
        const auto wdata = random_weights(t, rows, cols, 5);
        thread_pool pool(3);
        const packed_weight pw({t, rows, cols, wdata.data()}, pool);
        const auto x = random_floats(n_tok * cols, 6);
        matmul_scratch scratch;
        std::vector<float> all((size_t)(rows * n_tok)), one((size_t)rows);
        kernel_matmul(pw.view, x.data(), n_tok, all.data(), pool, scratch);
        for (int64_t k = 0; k < n_tok; k++) {
            kernel_matmul(pw.view, x.data() + k * cols, 1, one.data(), pool, scratch);
            for (int64_t r = 0; r < rows; r++)
                ASSERT_EQ(all[k * rows + r], one[r]) << dtype_name(t) << " token " << k << " row " << r;
        }
    }
}

// Threads and tiling only change which thread computes an output, never its
// value: every output equals the single dot product of its row and token.
TEST(Matmul, EqualsSingleDotsExactly) {
    for (dtype t : quant_weight_types()) {
        if (t == dtype::F32 || t == dtype::BF16) continue;  // F16 stands for the float path
        const int64_t rows = 67, cols = 512, n_tok = 9;
        const dtype at = dtype_vec_dot_type(t);
        const auto wdata = random_weights(t, rows, cols, 5);
        const auto x = random_floats(n_tok * cols, 6);
        const size_t as = dtype_row_size(at, cols), ws = dtype_row_size(t, cols);
        std::vector<uint8_t> a(as * n_tok);
        for (int64_t k = 0; k < n_tok; k++) dtype_quantize_row(at, x.data() + k * cols, a.data() + k * as, cols);
        thread_pool pool(3);
        matmul_scratch scratch;
        std::vector<float> y((size_t)(rows * n_tok));
        kernel_matmul({t, rows, cols, wdata.data()}, x.data(), n_tok, y.data(), pool, scratch);
        for (int64_t k = 0; k < n_tok; k++)
            for (int64_t r = 0; r < rows; r++)
                ASSERT_EQ(y[k * rows + r], dtype_vec_dot(t, wdata.data() + r * ws, a.data() + k * as, cols))
                    << dtype_name(t) << " token " << k << " row " << r;
    }
}

// Q/K/V and gate/up run as one multi-matmul: the same numbers as separate calls,
// bit for bit, for decode (1 token) and prefill (37 tokens, one partial tile), with
// row counts that end mid-tile, and with a weight of another type (F32 reads f32
// activations, so it runs on its own).
TEST(Matmul, MultiEqualsSeparateCallsExactly) {
    const int64_t n_cols = 96;
    struct spec {
        dtype t;
        int64_t rows;
    };
    const std::vector<std::vector<spec>> sets = {
        {{dtype::Q4_1, 40}, {dtype::Q4_1, 14}, {dtype::Q4_1, 14}},
        {{dtype::Q8_0, 33}, {dtype::Q8_0, 7}},
        {{dtype::Q4_0, 12}, {dtype::F32, 9}, {dtype::Q4_0, 0}, {dtype::Q4_0, 5}},
        // Qwen2.5-Coder 0.5B's Q/K/V: Q5_0, Q5_0, Q8_0 (one shared Q8_0 activation copy)
        {{dtype::Q5_0, 14}, {dtype::Q5_0, 2}, {dtype::Q8_0, 2}},
        {{dtype::IQ4_NL, 9}, {dtype::Q5_1, 6}, {dtype::Q4_1, 3}},
    };
    thread_pool pool(3);
    matmul_scratch sa, sb;
    for (const auto& set : sets) {
        std::vector<std::vector<uint8_t>> data;
        std::vector<weight_view> ws;
        for (size_t i = 0; i < set.size(); i++) data.push_back(random_weights(set[i].t, set[i].rows, n_cols, 7 + (uint32_t)i));
        for (size_t i = 0; i < set.size(); i++) ws.push_back({set[i].t, set[i].rows, n_cols, data[i].data()});
        for (int64_t n_tok : {1, 37}) {
            const auto x = random_floats(n_tok * n_cols, 99);
            std::vector<std::vector<float>> ya, yb;
            std::vector<float*> pa;
            for (const auto& w : ws) {
                ya.emplace_back((size_t)(n_tok * w.n_rows), -1.0f);
                yb.emplace_back((size_t)(n_tok * w.n_rows), -2.0f);
            }
            for (auto& y : ya) pa.push_back(y.data());
            kernel_matmul_multi(ws.data(), pa.data(), (int)ws.size(), x.data(), n_tok, pool, sa);
            for (size_t i = 0; i < ws.size(); i++) kernel_matmul(ws[i], x.data(), n_tok, yb[i].data(), pool, sb);
            for (size_t i = 0; i < ws.size(); i++)
                for (size_t k = 0; k < ya[i].size(); k++)
                    ASSERT_EQ(ya[i][k], yb[i][k]) << "weight " << i << " (" << dtype_name(ws[i].type) << ") n_tok "
                                                  << n_tok << " element " << k;
        }
    }
    weight_view w = {dtype::Q4_1, 4, n_cols, nullptr};
    float* y = nullptr;
    EXPECT_THROW(kernel_matmul_multi(&w, &y, 0, nullptr, 1, pool, sa), error);
}

// The same with packed weights (Q/K/V of a Q4_K_M model: Q4_K, Q4_K, Q6_K),
// mixed with a GGUF-layout one, which reads other activations and runs alone.
TEST(Matmul, PackedMultiEqualsSeparateCallsExactly) {
    if (packed_types().size() < 2) GTEST_SKIP() << "no packed kernels in this build";
    const int64_t n_cols = 512;
    thread_pool pool(3);
    matmul_scratch sa, sb;
    const auto d0 = random_weights(dtype::Q4_K, 40, n_cols, 1), d1 = random_weights(dtype::Q4_K, 9, n_cols, 2),
               d2 = random_weights(dtype::Q6_K, 9, n_cols, 3), d3 = random_weights(dtype::Q4_K, 21, n_cols, 4);
    const packed_weight p0({dtype::Q4_K, 40, n_cols, d0.data()}, pool), p1({dtype::Q4_K, 9, n_cols, d1.data()}, pool),
        p2({dtype::Q6_K, 9, n_cols, d2.data()}, pool);
    const std::vector<weight_view> ws = {p0.view, p1.view, p2.view, {dtype::Q4_K, 21, n_cols, d3.data()}};
    for (int64_t n_tok : {1, 37}) {
        const auto x = random_floats(n_tok * n_cols, 99);
        std::vector<std::vector<float>> ya, yb;
        std::vector<float*> pa;
        for (const auto& w : ws) {
            ya.emplace_back((size_t)(n_tok * w.n_rows), -1.0f);
            yb.emplace_back((size_t)(n_tok * w.n_rows), -2.0f);
        }
        for (auto& y : ya) pa.push_back(y.data());
        kernel_matmul_multi(ws.data(), pa.data(), (int)ws.size(), x.data(), n_tok, pool, sa);
        for (size_t i = 0; i < ws.size(); i++) kernel_matmul(ws[i], x.data(), n_tok, yb[i].data(), pool, sb);
        for (size_t i = 0; i < ws.size(); i++)
            for (size_t k = 0; k < ya[i].size(); k++)
                ASSERT_EQ(ya[i][k], yb[i][k]) << "weight " << i << " n_tok " << n_tok << " element " << k;
    }
}

TEST(Matmul, BadShapesThrow) {
    thread_pool pool(1);
    matmul_scratch scratch;
    std::vector<uint8_t> w(4096);
    std::vector<float> x(1024), y(1024);
    EXPECT_THROW(kernel_matmul({dtype::Q4_0, 4, 48, w.data()}, x.data(), 1, y.data(), pool, scratch), zk::error);
    EXPECT_THROW(kernel_matmul({dtype::Q8_1, 4, 64, w.data()}, x.data(), 1, y.data(), pool, scratch), zk::error);
    EXPECT_NO_THROW(kernel_matmul({dtype::Q4_0, 4, 64, w.data()}, x.data(), 0, y.data(), pool, scratch));
}

TEST(MatmulScratch, GrowsAlignedNeverShrinks) {
    matmul_scratch s;
    void* p = s.reserve(100);
    EXPECT_EQ((uintptr_t)p % 64, 0u);
    EXPECT_GE(s.cap, 100u);
    EXPECT_EQ(s.reserve(50), p);
    void* q = s.reserve(1 << 20);
    EXPECT_EQ((uintptr_t)q % 64, 0u);
    EXPECT_GE(s.cap, (size_t)1 << 20);
    const size_t cap = s.cap;
    s.reserve(10);
    EXPECT_EQ(s.cap, cap);
}

// ---------------------------------------------------------------- thread pool

TEST(ThreadPool, RejectsZeroThreads) {
    EXPECT_THROW(thread_pool(0), zk::error);
    EXPECT_THROW(thread_pool(-2), zk::error);
}

TEST(ThreadPool, RunCallsEachThreadOnce) {
    for (int n : {1, 2, 3, 5}) {
        thread_pool pool(n);
        EXPECT_EQ(pool.size(), n);
        for (int rep = 0; rep < 200; rep++) {
            std::vector<std::atomic<int>> hits(n);
            for (auto& h : hits) h = 0;
            std::atomic<int> bad{0};
            pool.run([&](int ith, int nth) {
                if (nth != n || ith < 0 || ith >= n) bad++;
                else hits[ith]++;
            });
            ASSERT_EQ(bad.load(), 0);
            for (int i = 0; i < n; i++) ASSERT_EQ(hits[i].load(), 1) << "thread " << i << " of " << n;
        }
    }
}

TEST(ThreadPool, ParallelForCoversEveryIndexOnce) {
    for (int n_threads : {1, 2, 3, 5})
        for (int64_t n : {0, 1, 7, 64, 1000, 12345})
            for (int64_t grain : {1, 3, 64, 5000}) {
                thread_pool pool(n_threads);
                std::vector<std::atomic<int>> hits((size_t)n);
                for (auto& h : hits) h = 0;
                std::atomic<int> bad{0};
                pool.parallel_for(n, grain, [&](int64_t b, int64_t e, int ith) {
                    // Chunks are at least `grain` long except the last one.
                    if (b < 0 || e > n || b >= e || ith < 0 || ith >= n_threads || (e - b < grain && e != n)) bad++;
                    for (int64_t i = b; i < e; i++) hits[(size_t)i]++;
                });
                ASSERT_EQ(bad.load(), 0) << n_threads << " " << n << " " << grain;
                for (int64_t i = 0; i < n; i++)
                    ASSERT_EQ(hits[(size_t)i].load(), 1) << "index " << i << " n " << n << " threads " << n_threads;
            }
}

TEST(ThreadPool, ExceptionsPropagateAndPoolSurvives) {
    thread_pool pool(3);
    for (int thrower : {0, 1, 2}) {
        EXPECT_THROW(pool.run([&](int ith, int) {
            if (ith == thrower) throw std::runtime_error("boom");
        }),
                     std::runtime_error);
    }
    EXPECT_THROW(pool.parallel_for(1000, 1, [&](int64_t b, int64_t, int) {
        if (b > 500) ZK_THROW("index %lld", (long long)b);
    }),
                 zk::error);
    std::atomic<int> count{0};
    pool.run([&](int, int) { count++; });
    EXPECT_EQ(count.load(), 3);
}

// Workers that have gone to sleep (idle longer than the spin window) must wake.
TEST(ThreadPool, WakesSleepingWorkers) {
    thread_pool pool(3);
    for (int rep = 0; rep < 5; rep++) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
        std::atomic<int> count{0};
        pool.run([&](int, int) { count++; });
        ASSERT_EQ(count.load(), 3);
    }
}

TEST(ThreadPool, ManyShortRuns) {
    thread_pool pool(2);
    std::atomic<int64_t> total{0};
    for (int rep = 0; rep < 2000; rep++)
        pool.parallel_for(8, 1, [&](int64_t b, int64_t e, int) { total += e - b; });
    EXPECT_EQ(total.load(), 8 * 2000);
}
