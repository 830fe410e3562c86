// Every operation of the backend interface (engine/backend.h) on every device
// this build can run, against double-precision references written here (not
// the kernels the CPU backend calls), with the tolerance each states:
//   embed, add, add_bias               exact (copies and float adds; a packed table
//                                      gives its GGUF rows' floats)
//   matmul (F32 weights)               1e-5 x sum |w x| per output
//   matmul_multi                       bit-identical to matmul (its contract)
//   rmsnorm, rope, glu, softcap        1e-5 relative (+1e-6 absolute)
//   kv_append + attention              1e-4 absolute, prefill and decode
// and the device choice: cpu made, cuda made where the build and the machine
// have it, else refused in one line naming why. The ops run on host arrays,
// so on the CPU backend; the CUDA backend's are its kernels, each tested
// against its CPU twin (tests/simt/test_cuda_*.cpp), and its forward pass
// against the CPU's end to end (tests/simt/test_backend_cuda.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "engine/backend.h"
#include "engine/evict/evict.h"
#include "engine/kv_cache.h"
#include "ggml-like/error.h"
#include "ggml-like/quant_pack.h"
#include "tests/quant_random.h"
#include "kernels/geglu.h"

using namespace zk;

namespace zk {
// parameter names in gtest's output
void PrintTo(backend_device d, std::ostream* os) { *os << backend_device_name(d); }
}  // namespace zk

namespace {

// The devices whose buffers are host memory.
std::vector<backend_device> devices() { return {backend_device::CPU}; }

model_hparams small_hparams() {
    model_hparams hp;
    hp.n_layer = 1;
    hp.n_embd = 96;
    hp.n_head = 6;
    hp.n_head_kv = 2;
    hp.head_dim = 32;
    hp.n_ff = 80;
    hp.n_vocab = 50;
    hp.rope.n_dims = 32;
    hp.rope.freq_base = 10000.0f;
    hp.rope.style = rope_style::NEOX;
    return hp;
}

std::vector<float> randn(size_t n, uint32_t seed, float sd = 1.0f) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> N(0.0f, sd);
    std::vector<float> v(n);
    for (float& x : v) x = N(rng);
    return v;
}

class BackendOps : public ::testing::TestWithParam<backend_device> {
protected:
    void SetUp() override {
        be = backend_create(backend_params{GetParam(), 2});
        fb = be->buffers_create(hp, 8, 1, 2, 64, 0, false);
    }
    model_hparams hp = small_hparams();
    std::unique_ptr<backend> be;
    std::unique_ptr<forward_buffers> fb;
};

}  // namespace

TEST(Backend, DeviceChoice) {
    EXPECT_EQ(backend_device_parse("cpu"), backend_device::CPU);
    EXPECT_EQ(backend_device_parse("cuda"), backend_device::CUDA);
    EXPECT_STREQ(backend_device_name(backend_device::CUDA), "cuda");
    try {
        backend_device_parse("tpu");
        FAIL() << "tpu accepted";
    } catch (const zk::error& e) {
        EXPECT_NE(std::string(e.what()).find("cpu, cuda"), std::string::npos) << e.what();
    }
    std::unique_ptr<backend> cpu = backend_create(backend_params{backend_device::CPU, 3});
    EXPECT_EQ(cpu->device(), backend_device::CPU);
    EXPECT_EQ(cpu->host_pool().size(), 3);
    // CUDA: made by a CUDA build on a machine with a device, else refused saying why
    try {
        std::unique_ptr<backend> cuda = backend_create(backend_params{backend_device::CUDA, 2});
        EXPECT_TRUE(backend_cuda_built());
        EXPECT_EQ(cuda->device(), backend_device::CUDA);
    } catch (const zk::error& e) {
        const std::string w = e.what();
        EXPECT_NE(w.find("device cuda"), std::string::npos) << w;
        EXPECT_NE(w.find(backend_cuda_built() ? "no CUDA device" : "without CUDA"), std::string::npos) << w;
    }
    EXPECT_THROW(backend_create(backend_params{backend_device::CPU, 0}), zk::error);
}

TEST_P(BackendOps, EmbedAddBias) {
    const int64_t V = 7, E = 12, n = 3;
    std::vector<float> table = randn(V * E, 1);
    const weight_view w{dtype::F32, V, E, table.data()};
    const int32_t tok[n] = {4, 0, 6};
    std::vector<float> x(n * E);
    be->embed(w, tok, n, 0.5f, x.data());
    for (int64_t t = 0; t < n; t++)
        for (int64_t i = 0; i < E; i++) ASSERT_EQ(x[t * E + i], table[tok[t] * E + i] * 0.5f);
    std::vector<float> b = randn(E, 2), y = x;
    be->add_bias(y.data(), b.data(), n, E);
    for (int64_t i = 0; i < n * E; i++) ASSERT_EQ(y[i], x[i] + b[i % E]);
    std::vector<float> z = y;
    be->add(z.data(), x.data(), n * E);
    for (int64_t i = 0; i < n * E; i++) ASSERT_EQ(z[i], y[i] + x[i]);
}

// A table tied to a packed output matrix (model_pack_weights) gives the rows of
// its GGUF bytes, whichever copy the backend reads.
TEST_P(BackendOps, EmbedFromAPackedTable) {
    const int64_t V = 19, E = 512, n = 4;
    const dtype t = dtype::Q6_K;
    const std::vector<uint8_t> rows = quant_random_rows(t, V, E, 7);
    const size_t packed_bytes = quant_pack_size(t, V, E);
    std::vector<uint8_t> packed(packed_bytes + 64);
    uint8_t* pk = packed.data() + (64 - (uintptr_t)packed.data() % 64) % 64;  // the kernels' alignment
    quant_pack_groups(t, rows.data(), V, E, 0, (V + k_pack_rows - 1) / k_pack_rows, pk);
    weight_view plain{t, V, E, rows.data()}, tied = plain;
    tied.packed = pk;
    const int32_t tok[n] = {18, 0, 9, 8};
    std::vector<float> want(n * E), got(n * E, -1.0f);
    be->embed(plain, tok, n, 1.5f, want.data());
    be->embed(tied, tok, n, 1.5f, got.data());
    for (int64_t k = 0; k < n; k++) {
        std::vector<float> ref(E);
        dtype_dequantize_row(t, rows.data() + dtype_row_size(t, E) * tok[k], ref.data(), E);
        for (int64_t i = 0; i < E; i++) ASSERT_EQ(want[k * E + i], ref[i] * 1.5f) << "token " << tok[k];
    }
    ASSERT_EQ(got, want);
}

TEST_P(BackendOps, Matmul) {
    const int64_t R = 37, C = 64, n = 5;
    std::vector<float> W1 = randn(R * C, 3), W2 = randn(R * C, 4), X = randn(n * C, 5);
    const weight_view w1{dtype::F32, R, C, W1.data()}, w2{dtype::F32, R, C, W2.data()};
    std::vector<float> y1(n * R), y2(n * R), m1(n * R), m2(n * R);
    be->matmul(w1, X.data(), n, y1.data(), *fb);
    be->matmul(w2, X.data(), n, y2.data(), *fb);
    for (int64_t t = 0; t < n; t++)
        for (int64_t r = 0; r < R; r++) {
            double ref = 0, mag = 0;
            for (int64_t c = 0; c < C; c++) {
                ref += (double)W1[r * C + c] * X[t * C + c];
                mag += std::fabs((double)W1[r * C + c] * X[t * C + c]);
            }
            ASSERT_NEAR(y1[t * R + r], ref, 1e-5 * mag) << "row " << r << " token " << t;
        }
    const weight_view ws[2] = {w1, w2};
    float* const ys[2] = {m1.data(), m2.data()};
    be->matmul_multi(ws, ys, 2, X.data(), n, *fb);
    EXPECT_EQ(m1, y1);
    EXPECT_EQ(m2, y2);
}

TEST_P(BackendOps, NormRopeGluSoftcap) {
    const int64_t n = 4, E = 96;
    std::vector<float> x = randn(n * E, 6, 3.0f), w = randn(E, 7), y(n * E);
    be->rmsnorm(x.data(), w.data(), y.data(), n, E, 1e-6f);
    for (int64_t t = 0; t < n; t++) {
        double ss = 0;
        for (int64_t i = 0; i < E; i++) ss += (double)x[t * E + i] * x[t * E + i];
        const double inv = 1.0 / std::sqrt(ss / E + 1e-6);
        for (int64_t i = 0; i < E; i++) {
            const double ref = x[t * E + i] * inv * w[i];
            ASSERT_NEAR(y[t * E + i], ref, 1e-5 * std::fabs(ref) + 1e-6);
        }
    }
    // RoPE, NeoX pairs (i, i + D/2): theta_i = pos * base^(-2i/D)
    const int64_t H = 3, D = 32;
    const int32_t pos[n] = {0, 5, 17, 300};
    std::vector<float> cs(n * D), q = randn(n * H * D, 8), q0 = q;
    be->rope_table(hp.rope, pos, n, cs.data());
    be->rope_apply(q.data(), n, H, D, hp.rope, cs.data());
    for (int64_t t = 0; t < n; t++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < D / 2; i++) {
                const double th = pos[t] * std::pow(10000.0, -2.0 * i / D);
                const float* a = q0.data() + (t * H + h) * D;
                const double r0 = a[i] * std::cos(th) - a[i + D / 2] * std::sin(th);
                const double r1 = a[i] * std::sin(th) + a[i + D / 2] * std::cos(th);
                ASSERT_NEAR(q[(t * H + h) * D + i], r0, 1e-5 * (std::fabs(a[i]) + std::fabs(a[i + D / 2])) + 1e-6);
                ASSERT_NEAR(q[(t * H + h) * D + i + D / 2], r1,
                            1e-5 * (std::fabs(a[i]) + std::fabs(a[i + D / 2])) + 1e-6);
            }
    // gated activations over rows of F
    const int64_t F = 80;
    for (arch_act act : {arch_act::SILU_GLU, arch_act::GELU_TANH_GLU}) {
        std::vector<float> g = randn(n * F, 9, 3.0f), u = randn(n * F, 10), g0 = g;
        be->glu(act, g.data(), u.data(), n, F);
        for (int64_t i = 0; i < n * F; i++) {
            const double ref = act == arch_act::SILU_GLU ? (double)g0[i] / (1.0 + std::exp(-(double)g0[i])) * u[i]
                                                         : kernel_geglu_ref(g0[i], u[i]);
            ASSERT_NEAR(g[i], ref, 1e-5 * std::fabs(ref) + 1e-6) << (act == arch_act::SILU_GLU ? "silu" : "gelu");
        }
    }
    std::vector<float> s = randn(50, 11, 40.0f), s0 = s;
    be->softcap(s.data(), 50, 30.0f);
    for (int i = 0; i < 50; i++) {
        const double ref = 30.0 * std::tanh(s0[i] / 30.0);
        ASSERT_NEAR(s[i], ref, 1e-5 * std::fabs(ref) + 1e-6);
    }
}

// A prefill of 6 tokens, then one decode token, through kv_append and
// attention, against causal softmax attention in double precision over the
// same (f32) keys and values. Query head h reads KV head h / G.
TEST_P(BackendOps, AppendAndAttention) {
    const int64_t H = hp.n_head, KV = hp.n_head_kv, D = hp.head_dim, G = hp.n_group(), ctx = 64;
    const std::vector<int> full((size_t)KV, (int)D);
    kv_cache cache(1, (int)KV, ctx, dtype::F32, full, full);
    evict_params ep;
    std::unique_ptr<evict_policy> none = evict_policy_create(ep, ctx);
    const int64_t total = 7;
    std::vector<float> Q = randn(total * H * D, 12), K = randn(total * KV * D, 13), V = randn(total * KV * D, 14);
    const double scale = 1.0 / std::sqrt((double)D);
    int64_t done = 0;
    for (int64_t n : {6, 1}) {
        for (int64_t t = 0; t < n; t++) fb->pos[t] = (int32_t)(done + t);
        std::copy(Q.begin() + done * H * D, Q.begin() + (done + n) * H * D, fb->q.data());
        std::copy(K.begin() + done * KV * D, K.begin() + (done + n) * KV * D, fb->k.data());
        std::copy(V.begin() + done * KV * D, V.begin() + (done + n) * KV * D, fb->v.data());
        backend_seq s;
        s.cache = &cache;
        s.policy = none.get();
        s.n = n;
        s.n_past = done;
        s.n_ctx = ctx;
        s.n_threads = 2;
        be->kv_append(&s, 1, hp, 0, *fb);
        be->attention(&s, 1, hp, 0, *fb);
        for (int64_t t = 0; t < n; t++) {
            const int64_t p = done + t;  // sees positions 0 .. p
            for (int64_t h = 0; h < H; h++) {
                const int64_t g = h / G;
                const float* q = Q.data() + (p * H + h) * D;
                std::vector<double> w((size_t)p + 1);
                double mx = -1e300, sum = 0;
                for (int64_t j = 0; j <= p; j++) {
                    double d = 0;
                    for (int64_t c = 0; c < D; c++) d += (double)q[c] * K[(j * KV + g) * D + c];
                    w[j] = d * scale;
                    mx = std::max(mx, w[j]);
                }
                for (int64_t j = 0; j <= p; j++) sum += (w[j] = std::exp(w[j] - mx));
                for (int64_t c = 0; c < D; c++) {
                    double ref = 0;
                    for (int64_t j = 0; j <= p; j++) ref += w[j] / sum * V[(j * KV + g) * D + c];
                    ASSERT_NEAR(fb->attn.data()[(t * H + h) * D + c], ref, 1e-4)
                        << "position " << p << " head " << h << " channel " << c;
                }
            }
        }
        done += n;
    }
    EXPECT_EQ(cache.block(0, 0).n_used, total);
}

INSTANTIATE_TEST_SUITE_P(Devices, BackendOps, ::testing::ValuesIn(devices()),
                         [](const ::testing::TestParamInfo<backend_device>& i) {
                             return std::string(backend_device_name(i.param));
                         });
