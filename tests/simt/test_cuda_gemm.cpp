// The prefill path of a weight matrix on the GPU: W dequantized to f16 (or
// f32) rows, X converted to f16, Y = X W^T by cuda_gemm (cuBLAS on a device,
// a CPU loop in the harness: cuBLAS itself runs only in the GPU tests).
// Against kernel_matmul_reference (dequantized rows, double dot):
//   f32 path: |y - ref| <= 1e-6 x sum_c |w_rc x_c|
//   f16 path: <= 2e-3 x sum |w x| (weights and activations rounded to f16:
//             2^-11 relative each)
// cuda_f32_to_f16 / cuda_f16_to_f32 against kernel_f32_to_f16 /
// kernel_f16_to_f32: bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/convert.h"
#include "kernels/cuda/convert.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/matvec.h"
#include "kernels/matmul.h"
#include "tests/quant_random.h"
#include "tests/simt/cuda_test_util.h"

using namespace zk;
using namespace zk::cuda;
using namespace zk::cuda_test;

namespace {

TEST(CudaConvert, BitExact) {
    std::mt19937 g(3);
    std::normal_distribution<float> N(0, 100);
    std::vector<float> x(4099);
    for (auto& v : x) v = N(g);
    x[0] = 65519.0f, x[1] = 1e-7f, x[2] = -0.0f;
    std::vector<uint16_t> want(x.size());
    kernel_f32_to_f16(x.data(), want.data(), (int64_t)x.size());
    std::vector<float> back(x.size());
    kernel_f16_to_f32(want.data(), back.data(), (int64_t)x.size());
    device_pool pool;
    const dptr<uint16_t> h = pool.zeros<uint16_t>(x.size(), "h");
    const dptr<float> f = pool.zeros<float>(x.size(), "f");
    cuda_f32_to_f16(pool.up(x, "x"), h, (int64_t)x.size(), nullptr);
    cuda_f16_to_f32(dptr<const uint16_t>(h), f, (int64_t)x.size(), nullptr);
    const std::vector<uint16_t> gh = pool.down(h, x.size());
    const std::vector<float> gf = pool.down(f, x.size());
    for (size_t i = 0; i < x.size(); i++) {
        ASSERT_EQ(gh[i], want[i]) << i;
        ASSERT_EQ(simt_bits(gf[i]), simt_bits(back[i])) << i;
    }
}

TEST(CudaGemm, DequantizedTilesTimesActivations) {
    const int64_t M = 19, N = 45, K = 512;
    const dtype wt = dtype::Q4_K;
    const std::vector<uint8_t> w = quant_random_rows(wt, N, K, 9);
    std::mt19937 g(4);
    std::normal_distribution<float> Nd(0, 1);
    std::vector<float> x((size_t)(M * K));
    for (auto& v : x) v = Nd(g);
    std::vector<float> ref((size_t)(M * N));
    kernel_matmul_reference(weight_view{wt, N, K, w.data()}, x.data(), M, ref.data());
    std::vector<double> mag((size_t)(M * N), 1e-30);
    std::vector<float> row(K);
    for (int64_t n = 0; n < N; n++) {
        dtype_dequantize_row(wt, w.data() + n * dtype_row_size(wt, K), row.data(), K);
        for (int64_t m = 0; m < M; m++)
            for (int64_t k = 0; k < K; k++) mag[m * N + n] += std::fabs((double)row[k] * x[m * K + k]);
    }
    for (cuda_gemm_type t : {CUDA_GEMM_F32, CUDA_GEMM_F16}) {
        device_pool pool;
        const cuda_weight cw{wt, N, K, pool.up(w, "W")};
        const dptr<const float> dx = pool.up(x, "x");
        const dptr<float> y = pool.zeros<float>((size_t)(M * N), "y");
        cuda_gemm_args a;
        a.type = t;
        a.M = M, a.N = N, a.K = K;
        if (t == CUDA_GEMM_F32) {
            const dptr<float> wf = pool.zeros<float>((size_t)(N * K), "W f32");
            cuda_dequantize(cw, dptr<const int32_t>(), 0, N, 1.0f, wf, dptr<uint16_t>(), nullptr);
            a.X = &*dx;
            a.W = &*wf;
        } else {
            const dptr<uint16_t> wh = pool.zeros<uint16_t>((size_t)(N * K), "W f16");
            const dptr<uint16_t> xh = pool.zeros<uint16_t>((size_t)(M * K), "x f16");
            cuda_dequantize(cw, dptr<const int32_t>(), 0, N, 1.0f, dptr<float>(), wh, nullptr);
            cuda_f32_to_f16(dx, xh, M * K, nullptr);
            a.X = &*xh;
            a.W = &*wh;
        }
        a.Y = &*y;
        cuda_gemm(a, nullptr);
        cuda_stream_sync(nullptr);
        const std::vector<float> got = pool.down(y, (size_t)(M * N));
        double worst = 0;
        for (size_t i = 0; i < got.size(); i++) worst = std::max(worst, std::fabs(got[i] - ref[i]) / mag[i]);
        EXPECT_LE(worst, t == CUDA_GEMM_F32 ? 1e-6 : 2e-3) << (t == CUDA_GEMM_F32 ? "f32" : "f16");
        std::printf("%s GEMM: max error %.2e of sum |w x|\n", t == CUDA_GEMM_F32 ? "f32" : "f16", worst);
    }
}

}  // namespace
