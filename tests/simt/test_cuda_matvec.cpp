// Quantized weights on the GPU (kernels/cuda/matvec.cu) against the CPU:
//   cuda_dequantize vs dtype_dequantize_row: bit for bit (f32), and the f16
//     tiles equal fp32_to_fp16 of those values; gathered rows (embedding) with
//     a scale equal the CPU's product bit for bit.
//   cuda_matvec vs kernel_matmul_reference (dequantized rows, double dot):
//     |y - ref| <= 1e-6 x sum_c |w_rc x_c| (float sums in another order;
//     measured in the harness: <= 4e-8);
//     vs kernel_matmul, the CPU's production path, which quantizes the
//     activations to 8 bits (Q8_0/Q8_1/Q8_K): <= 5e-3 x sum |w x| (measured
//     <= 1.8e-3).
// Every supported type, rows not a multiple of the 4 a block handles, 1-8
// tokens.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "ggml-like/dtype.h"
#include "ggml-like/threadpool.h"
#include "kernels/cuda/matvec.h"
#include "kernels/matmul.h"
#include "tests/quant_random.h"
#include "tests/simt/cuda_test_util.h"

using namespace zk;
using namespace zk::cuda;
using namespace zk::cuda_test;

namespace {

const dtype k_types[] = {dtype::F32, dtype::F16, dtype::BF16, dtype::Q4_0, dtype::Q4_1,
                         dtype::Q5_0, dtype::Q8_0, dtype::Q4_K, dtype::Q6_K};

class CudaMatvec : public ::testing::TestWithParam<dtype> {};

TEST_P(CudaMatvec, DequantizeIsBitExact) {
    const dtype t = GetParam();
    const int64_t rows = 13, cols = 512;
    const std::vector<uint8_t> w = quant_random_rows(t, rows, cols, 11);
    const size_t rb = dtype_row_size(t, cols);
    std::vector<float> want((size_t)(rows * cols));
    for (int64_t r = 0; r < rows; r++) dtype_dequantize_row(t, w.data() + r * rb, &want[r * cols], cols);
    device_pool pool;
    const cuda_weight cw{t, rows, cols, pool.up(w, "W")};
    const dptr<float> o32 = pool.zeros<float>(want.size(), "out32");
    const dptr<uint16_t> o16 = pool.zeros<uint16_t>(want.size(), "out16");
    cuda_dequantize(cw, dptr<const int32_t>(), 0, rows, 1.0f, o32, dptr<uint16_t>(), nullptr);
    cuda_dequantize(cw, dptr<const int32_t>(), 0, rows, 1.0f, dptr<float>(), o16, nullptr);
    const std::vector<float> g32 = pool.down(o32, want.size());
    const std::vector<uint16_t> g16 = pool.down(o16, want.size());
    for (size_t i = 0; i < want.size(); i++) {
        ASSERT_EQ(simt_bits(g32[i]), simt_bits(want[i])) << dtype_name(t) << " " << i;
        ASSERT_EQ(g16[i], fp32_to_fp16(want[i])) << dtype_name(t) << " " << i;
    }
    // embedding rows: gathered by id, scaled
    const std::vector<int32_t> ids = {7, 0, 12, 7};
    const float scale = 3.5f;
    const dptr<float> emb = pool.zeros<float>(ids.size() * cols, "emb");
    cuda_dequantize(cw, pool.up(ids, "ids"), 0, (int64_t)ids.size(), scale, emb, dptr<uint16_t>(), nullptr);
    const std::vector<float> ge = pool.down(emb, ids.size() * cols);
    for (size_t i = 0; i < ids.size(); i++)
        for (int64_t c = 0; c < cols; c++)
            ASSERT_EQ(simt_bits(ge[i * cols + c]), simt_bits(want[ids[i] * cols + c] * scale)) << i << " " << c;
}

TEST_P(CudaMatvec, MatchesCpuReferenceAndProductionPath) {
    const dtype t = GetParam();
    thread_pool tp(2);
    matmul_scratch scratch;
    // the K-quants: 2304 columns fill a warp step and part of the next; 4096 and
    // 8448 take two and four warps a row (8448: the warps' shares uneven)
    for (int64_t cols : {256, 768, 2304, 4096, 8448}) {
        const int64_t rows = 37;
        const std::vector<uint8_t> w = quant_random_rows(t, rows, cols, 21 + (uint32_t)cols);
        const size_t rb = dtype_row_size(t, cols);
        for (int64_t n_tok : {1, 3, 8}) {
            std::mt19937 g(5);
            std::normal_distribution<float> N(0, 1);
            std::vector<float> x((size_t)(n_tok * cols));
            for (auto& v : x) v = N(g);
            const weight_view wv{t, rows, cols, w.data()};
            std::vector<float> ref((size_t)(n_tok * rows)), cpu(ref.size());
            kernel_matmul_reference(wv, x.data(), n_tok, ref.data());
            kernel_matmul(wv, x.data(), n_tok, cpu.data(), tp, scratch);
            device_pool pool;
            const cuda_weight cw{t, rows, cols, pool.up(w, "W")};
            const dptr<float> y = pool.zeros<float>(ref.size(), "y");
            cuda_matvec(cw, pool.up(x, "x"), n_tok, y, nullptr);
            const std::vector<float> got = pool.down(y, ref.size());
            // max over outputs of |a - b| / sum_c |w_rc x_c|
            std::vector<double> mag(ref.size(), 1e-30);
            std::vector<float> row(cols);
            for (int64_t r = 0; r < rows; r++) {
                dtype_dequantize_row(t, w.data() + r * rb, row.data(), cols);
                for (int64_t k = 0; k < n_tok; k++)
                    for (int64_t c = 0; c < cols; c++)
                        mag[(size_t)(k * rows + r)] += std::fabs((double)row[c] * x[k * cols + c]);
            }
            auto worst = [&](const std::vector<float>& a, const std::vector<float>& b) {
                double e = 0;
                for (size_t i = 0; i < a.size(); i++) e = std::max(e, std::fabs(a[i] - b[i]) / mag[i]);
                return e;
            };
            const double worst_ref = worst(got, ref), worst_cpu = worst(got, cpu);
            EXPECT_LE(worst_ref, 1e-6) << dtype_name(t) << " cols " << cols << " tokens " << n_tok;
            EXPECT_LE(worst_cpu, 5e-3) << dtype_name(t) << " cols " << cols << " tokens " << n_tok;
            if (n_tok == 3)
                std::printf("%-5s cols %4lld: vs reference %.2e, vs kernel_matmul %.2e (of sum |w x|)\n", dtype_name(t),
                            (long long)cols, worst_ref, worst_cpu);
            if (!cuda_matvec_takes_q8(t)) continue;
            // the K-quants against 8-bit activations (what the backend runs):
            // within the production path's tolerance of the exact product
            const cuda_act_q8 xq{pool.zeros<int8_t>(x.size(), "xq"), pool.zeros<float>(x.size() / 4, "xq meta")};
            cuda_quantize_act(pool.up(x, "x"), n_tok, cols, xq, nullptr);
            const dptr<float> y8 = pool.zeros<float>(ref.size(), "y8");
            cuda_matvec(cw, pool.up(x, "x"), n_tok, y8, nullptr, &xq);
            const std::vector<float> got8 = pool.down(y8, ref.size());
            const double worst8 = worst(got8, ref);
            EXPECT_LE(worst8, 5e-3) << dtype_name(t) << " 8-bit activations, cols " << cols << " tokens " << n_tok;
            if (n_tok == 3)
                std::printf("%-5s cols %4lld, 8-bit activations: vs reference %.2e (of sum |w x|)\n", dtype_name(t),
                            (long long)cols, worst8);
        }
    }
}

INSTANTIATE_TEST_SUITE_P(Types, CudaMatvec, ::testing::ValuesIn(k_types),
                         [](const ::testing::TestParamInfo<dtype>& i) { return std::string(dtype_name(i.param)); });

// 8-bit activations: codes and metadata as a host computation of the stated
// rule gives them (d = max |x| / 127, codes rounded to nearest even, sums).
TEST(CudaMatvec, ActivationQuantizationIsTheRule) {
    const int64_t n_tok = 3, cols = 96;
    std::mt19937 g(9);
    std::normal_distribution<float> N(0, 2);
    std::vector<float> x((size_t)(n_tok * cols));
    for (auto& v : x) v = N(g);
    for (int64_t c = 16; c < 32; c++) x[(size_t)c] = 0.0f;  // an all-zero group: codes 0, d 0
    device_pool pool;
    const cuda_act_q8 xq{pool.zeros<int8_t>(x.size(), "xq"), pool.zeros<float>(x.size() / 4, "xq meta")};
    cuda_quantize_act(pool.up(x, "x"), n_tok, cols, xq, nullptr);
    const std::vector<int8_t> q = pool.down(xq.q, x.size());
    const std::vector<float> meta = pool.down(xq.meta, x.size() / 4);
    for (size_t b = 0; b < x.size() / 16; b++) {
        float amax = 0.0f, sum = 0.0f;
        for (int e = 0; e < 16; e++) amax = std::max(amax, std::fabs(x[16 * b + e])), sum += x[16 * b + e];
        const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
        int isum = 0;
        for (int e = 0; e < 16; e++) {
            const int c = (int)std::nearbyint(x[16 * b + e] * id);
            isum += c;
            ASSERT_EQ(q[16 * b + e], c) << "group " << b << " element " << e;
        }
        EXPECT_EQ(meta[4 * b], amax / 127.0f) << b;
        EXPECT_NEAR(meta[4 * b + 1], sum, 1e-5f * (1 + std::fabs(sum))) << b;
        EXPECT_EQ(meta[4 * b + 2], (float)isum) << b;
    }
    EXPECT_THROW(cuda_quantize_act(pool.up(x, "x"), 1, 40, xq, nullptr), zk::error);
}

TEST(CudaMatvecRefuses, UnsupportedTypesAndShapes) {
    device_pool pool;
    const std::vector<uint8_t> w(dtype_row_size(dtype::Q2_K, 256) * 2);
    const dptr<float> y = pool.zeros<float>(2, "y");
    const dptr<const float> x = pool.up(std::vector<float>(256), "x");
    EXPECT_THROW(cuda_matvec(cuda_weight{dtype::Q2_K, 2, 256, pool.up(w, "W")}, x, 1, y, nullptr), zk::error);
    EXPECT_THROW(cuda_matvec(cuda_weight{dtype::F32, 2, 256, pool.up(std::vector<uint8_t>(2048), "W")}, x, 9, y, nullptr),
                 zk::error);
}

}  // namespace
