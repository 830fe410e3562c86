// The small CUDA kernels against their CPU twins: RMSNorm (kernel_rmsnorm),
// RoPE table and rotation (kernel_rope_table / kernel_rope_apply, both pair
// orders), SwiGLU and GeGLU (kernel_swiglu / kernel_geglu, and GeGLU's double
// reference kernel_geglu_ref), the q/k projection onto R_qk
// (kernel_project_head, with per-head ranks and full-rank sink tokens), and
// the forward pass's add, bias, soft-cap and column copy (elementwise.h: the
// CPU backend's loops; add, bias and copy exact, soft-cap 1e-6 relative).
// Tolerances, relative to the magnitude of the values:
//   RMSNorm 2e-6 (float sum of squares vs the CPU's double);
//   RoPE table 1 float ulp (double angle both sides; device cos/sin/pow may
//   differ in the last double bit), rotation 2e-7 (fma contraction);
//   SwiGLU / GeGLU 1e-6 vs the CPU (its exp is a degree-6 polynomial, ~2e-7),
//   GeGLU 1e-6 vs the double reference;
//   projection 1e-6 of sum |P_jc x_c| (summation order).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/glu.h"
#include "kernels/cuda/norm.h"
#include "kernels/cuda/project.h"
#include "kernels/cuda/rope.h"
#include "kernels/geglu.h"
#include "kernels/project.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/swiglu.h"
#include "tests/simt/cuda_test_util.h"

using namespace zk;
using namespace zk::cuda;
using namespace zk::cuda_test;

namespace {

std::vector<float> randn(size_t n, uint32_t seed, float sd = 1.0f) {
    std::mt19937 g(seed);
    std::normal_distribution<float> N(0, sd);
    std::vector<float> x(n);
    for (auto& v : x) v = N(g);
    return x;
}

TEST(CudaElementwise, RmsNormMatchesCpu) {
    for (int64_t n : {1, 64, 576, 1536, 2049}) {
        const int64_t T = 3;
        std::vector<float> x = randn((size_t)(T * n), 1 + (uint32_t)n, 3.0f), w = randn((size_t)n, 2);
        std::vector<float> want(x.size());
        kernel_rmsnorm(x.data(), w.data(), want.data(), T, n, 1e-6f);
        device_pool pool;
        const dptr<const float> dx = pool.up(x, "x"), dw = pool.up(w, "w");
        const dptr<float> dy = pool.zeros<float>(x.size(), "y");
        cuda_rmsnorm(dx, dw, dy, T, n, 1e-6f, nullptr);
        EXPECT_LE(rel_err(pool.down(dy, x.size()), want), 2e-6) << n;
        // in place (y aliases x)
        const dptr<float> dxy = pool.zeros<float>(x.size(), "xy");
        cuda_copy_to_device(&*dxy, x.data(), x.size() * 4);
        cuda_rmsnorm(dxy, dw, dxy, T, n, 1e-6f, nullptr);
        EXPECT_LE(rel_err(pool.down(dxy, x.size()), want), 2e-6) << n << " in place";
    }
}

TEST(CudaElementwise, RopeMatchesCpu) {
    for (rope_style st : {rope_style::NORM, rope_style::NEOX}) {
        rope_params p;
        p.n_dims = 64;
        p.freq_base = 1000000.0f;
        p.freq_scale = 0.5f;
        p.style = st;
        const int64_t T = 5, H = 3, D = 80;  // only 64 of 80 channels rotate
        const std::vector<int32_t> pos = {0, 1, 17, 4095, 131071};
        std::vector<float> cs((size_t)T * p.n_dims);
        kernel_rope_table(p, pos.data(), T, cs.data());
        std::vector<float> x = randn((size_t)(T * H * D), 3), want = x;
        kernel_rope_apply(want.data(), T, H, D, p, cs.data());
        device_pool pool;
        const dptr<const int32_t> dpos = pool.up(pos, "pos");
        const dptr<float> dcs = pool.zeros<float>(cs.size(), "cs");
        cuda_rope_table(p, dpos, T, dcs, nullptr);
        const std::vector<float> gcs = pool.down(dcs, cs.size());
        for (size_t i = 0; i < cs.size(); i++) ASSERT_LE(std::fabs(gcs[i] - cs[i]), 1.2e-7f * std::fabs(cs[i]) + 1e-30f) << i;
        const dptr<float> dx = pool.zeros<float>(x.size(), "x");
        cuda_copy_to_device(&*dx, x.data(), x.size() * 4);
        cuda_rope_apply(dx, T, H, D, p, dcs, nullptr);
        const std::vector<float> got = pool.down(dx, x.size());
        EXPECT_LE(rel_err(got, want), 2e-7);
        for (int64_t t = 0; t < T; t++)  // the channels past n_dims are untouched
            for (int64_t h = 0; h < H; h++)
                for (int64_t c = p.n_dims; c < D; c++) ASSERT_EQ(got[(t * H + h) * D + c], x[(t * H + h) * D + c]);
    }
}

TEST(CudaElementwise, GatedActivationsMatchCpu) {
    const int64_t n = 5000;
    std::vector<float> gate = randn(n, 4, 4.0f), up = randn(n, 5);
    gate[0] = -100.0f, gate[1] = 100.0f, gate[2] = 0.0f, gate[3] = -20.0f;  // saturated ends
    std::vector<float> sw(n), ge(n), ge_ref(n);
    kernel_swiglu(gate.data(), up.data(), sw.data(), n);
    kernel_geglu(gate.data(), up.data(), ge.data(), n);
    for (int64_t i = 0; i < n; i++) ge_ref[i] = (float)kernel_geglu_ref(gate[i], up[i]);
    device_pool pool;
    const dptr<const float> dg = pool.up(gate, "gate"), du = pool.up(up, "up");
    const dptr<float> o1 = pool.zeros<float>(n, "swiglu"), o2 = pool.zeros<float>(n, "geglu");
    cuda_swiglu(dg, du, o1, n, nullptr);
    cuda_geglu(dg, du, o2, n, nullptr);
    const std::vector<float> g1 = pool.down(o1, n), g2 = pool.down(o2, n);
    for (int64_t i = 0; i < n; i++) {
        const float tol = 1e-6f * (std::fabs(gate[i] * up[i]) + 1e-30f);
        ASSERT_LE(std::fabs(g1[i] - sw[i]), tol) << i << " swiglu " << gate[i];
        ASSERT_LE(std::fabs(g2[i] - ge[i]), tol) << i << " geglu " << gate[i];
        ASSERT_LE(std::fabs(g2[i] - ge_ref[i]), tol) << i << " geglu ref " << gate[i];
    }
}

// Without and with the mean keys' shift (keys: the first ranks[h] channels of
// every row, sink rows too, less shift[h]).
TEST(CudaElementwise, ProjectionMatchesCpu) {
    const int d = 64, H = 4;
    const int64_t T = 3;
    // heads 0, 1 share a matrix (the query heads of one KV head); ranks differ
    const std::vector<float> P0 = randn((size_t)d * d, 6), P1 = randn((size_t)d * d, 7);
    const std::vector<int32_t> ranks = {4, 4, 40, 64};
    const std::vector<int32_t> pos = {2, 9, 30};  // token 0 is an exact sink (pos < 4): full rank
    const std::vector<float> x = randn((size_t)(T * H * d), 8), shift = randn((size_t)(H * d), 9, 50.0f);
    const float* mats_h[H] = {P0.data(), P0.data(), P1.data(), P1.data()};
    for (bool shifted : {false, true}) {
        std::vector<float> want = x;
        for (int64_t t = 0; t < T; t++)
            for (int h = 0; h < H; h++) {
                float* w = &want[(t * H + h) * d];
                kernel_project_head(mats_h[h], pos[t] < 4 ? d : ranks[h], d, w);
                if (shifted)
                    for (int j = 0; j < ranks[h]; j++) w[j] -= shift[(size_t)h * d + j];
            }
        device_pool pool;
        const dptr<const float> d0 = pool.up(P0, "P0"), d1 = pool.up(P1, "P1");
        const std::vector<dptr<const float>> mats = {d0, d0, d1, d1};
        const dptr<float> dx = pool.zeros<float>(x.size(), "x");
        cuda_copy_to_device(&*dx, x.data(), x.size() * 4);
        cuda_project_heads(dx, T, H, d, pool.up(mats, "mats"), pool.up(ranks, "ranks"), pool.up(pos, "pos"), 4,
                           shifted ? pool.up(shift, "shift") : dptr<const float>(nullptr), nullptr);
        const std::vector<float> got = pool.down(dx, x.size());
        for (size_t i = 0; i < got.size(); i++) {
            const size_t row = i / d;
            const int j = (int)(i % d), h = (int)(row % H);
            double mag = 1e-30;  // sum_c |P_jc x_c| (+ the shift) bounds the rounding of output j
            for (int c = 0; c < d; c++) mag += std::fabs(mats_h[h][(size_t)j * d + c] * x[row * d + c]);
            if (shifted) mag += std::fabs(shift[(size_t)h * d + j]);
            ASSERT_LE(std::fabs(got[i] - want[i]), 1e-6 * mag) << i << (shifted ? " shifted" : "");
        }
    }
}

TEST(CudaElementwise, AddBiasSoftcapAndColumnCopy) {
    const int64_t T = 3, n = 1000;
    const std::vector<float> x = randn((size_t)(T * n), 41, 4.0f), y = randn((size_t)(T * n), 42),
                             b = randn((size_t)n, 43);
    device_pool pool;
    const dptr<float> dx = pool.zeros<float>(x.size(), "x");
    cuda_copy_to_device(&*dx, x.data(), x.size() * 4);
    cuda_add(dx, pool.up(y, "y"), T * n, nullptr);
    std::vector<float> want = x;
    for (size_t i = 0; i < want.size(); i++) want[i] += y[i];
    EXPECT_EQ(pool.down(dx, x.size()), want);
    cuda_add_bias(dx, pool.up(b, "b"), T, n, nullptr);
    for (int64_t t = 0; t < T; t++)
        for (int64_t i = 0; i < n; i++) want[(size_t)(t * n + i)] += b[(size_t)i];
    EXPECT_EQ(pool.down(dx, x.size()), want);
    cuda_softcap(dx, T * n, 3.0f, nullptr);
    for (auto& v : want) v = 3.0f * std::tanh(v / 3.0f);
    EXPECT_LE(rel_err(pool.down(dx, x.size()), want), 1e-6);
    // a 7-column tile into columns [5, 12) of rows of 20
    const int64_t w = 7, ld = 20, col0 = 5;
    const std::vector<float> tile = randn((size_t)(T * w), 44);
    const dptr<float> dst = pool.zeros<float>((size_t)(T * ld), "dst");
    cuda_copy_cols(pool.up(tile, "tile"), w, dst, ld, col0, T, nullptr);
    std::vector<float> want_dst((size_t)(T * ld), 0.0f);
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < w; j++) want_dst[(size_t)(t * ld + col0 + j)] = tile[(size_t)(t * w + j)];
    EXPECT_EQ(pool.down(dst, want_dst.size()), want_dst);
}

// Pieces of every alignment into two buffers, and one of zero bytes.
TEST(CudaElementwise, ScatterBytesCopiesEveryPiece) {
    std::vector<uint8_t> src(1000);
    for (size_t i = 0; i < src.size(); i++) src[i] = (uint8_t)(i * 7 + 3);
    device_pool pool;
    const dptr<const uint8_t> ds = pool.up(src, "staging");
    const dptr<uint8_t> a = pool.zeros<uint8_t>(600, "a"), b = pool.zeros<uint8_t>(333, "b");
    struct want_piece {
        dptr<uint8_t> dst;
        size_t dst_off, src_off, n;
    };
    const want_piece ws[] = {{a, 0, 0, 400}, {a, 401, 400, 199}, {b, 3, 600, 330}, {b, 0, 999, 0}, {a, 400, 998, 1}};
    std::vector<cuda_copy_piece> ps;
    for (const want_piece& w : ws)
        ps.push_back({(uint64_t)(uintptr_t)(dptr_addr(w.dst) + w.dst_off),
                      (uint64_t)(uintptr_t)(dptr_addr(ds) + w.src_off), (uint64_t)w.n});
    cuda_scatter_bytes(pool.up(ps, "pieces"), (int)ps.size(), nullptr);
    std::vector<uint8_t> wa(600, 0), wb(333, 0);
    for (const want_piece& w : ws)
        for (size_t i = 0; i < w.n; i++) (dptr_addr(w.dst) == dptr_addr(a) ? wa : wb)[w.dst_off + i] = src[w.src_off + i];
    EXPECT_EQ(pool.down(a, 600), wa);
    EXPECT_EQ(pool.down(b, 333), wb);
}

}  // namespace
