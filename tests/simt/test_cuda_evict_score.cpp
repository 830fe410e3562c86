// Eviction scores on the GPU (kernels/cuda/evict_score.cu) against the CPU
// policies (engine/evict): H2O's and SnapKV's observe() over every query row
// of a decode step and of a prompt chunk, from logits with masked (-inf)
// slots and an all-masked row; SnapKV's max-pooled ranking. Tolerance: scores
// 1e-6 relative (float exps: the device's expf and glibc's differ by an ulp or
// two; the sums are double on both sides); pooling bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "engine/evict/evict.h"
#include "kernels/cuda/evict_score.h"
#include "tests/simt/cuda_test_util.h"

using namespace zk;
using namespace zk::cuda;
using namespace zk::cuda_test;

namespace {

TEST(CudaEvictScore, AccumulateMatchesPolicies) {
    for (const char* policy : {"h2o", "snapkv"}) {
        evict_params ep;
        ep.policy = policy;
        ep.budget = 64;
        ep.snap_window = 5;
        const auto pol = evict_policy_create(ep, 4096);
        struct shape {
            int n_tok, G;
            int64_t n;
        };
        const shape shapes[] = {{1, 3, 300}, {12, 2, 777}, {3, 1, 5}};
        device_pool pool;
        std::vector<cuda_evict_item> items;
        std::vector<std::vector<float>> want, logits_h;
        std::vector<dptr<float>> scores;
        std::mt19937 g(8);
        std::normal_distribution<float> N(0, 3);
        for (const shape& sh : shapes) {
            const int rows = sh.n_tok * sh.G;
            std::vector<float> lg((size_t)rows * sh.n);
            for (int r = 0; r < rows; r++)
                for (int64_t s = 0; s < sh.n; s++) {
                    const int t = r / sh.G;  // causal: token t sees a prefix
                    lg[r * sh.n + s] = s > sh.n - sh.n_tok + t ? -INFINITY : N(g);
                }
            if (rows > 2)
                for (int64_t s = 0; s < sh.n; s++) lg[1 * sh.n + s] = -INFINITY;  // a row that sees nothing
            std::vector<float> sc((size_t)sh.n);
            for (auto& v : sc) v = std::fabs(N(g));  // scores carried over
            const dptr<float> dsc = pool.zeros<float>(sc.size(), "score");
            cuda_copy_to_device(&*dsc, sc.data(), sc.size() * 4);
            // the CPU: observe() every row in order
            for (int t = 0; t < sh.n_tok; t++)
                for (int j = 0; j < sh.G; j++) {
                    const evict_observation o{0, 0, 0, t, sh.n_tok, 4096, nullptr};
                    pol->observe(o, &lg[(size_t)(t * sh.G + j) * sh.n], sh.n, sc.data());
                }
            cuda_evict_item it;
            it.logits = pool.up(lg, "logits");
            it.logits_stride = sh.n;
            it.n_tok = sh.n_tok;
            it.n_group = sh.G;
            it.t_from = std::string(policy) == "snapkv" ? std::max(0, sh.n_tok - ep.snap_window) : 0;
            it.n = sh.n;
            it.score = dsc;
            items.push_back(it);
            want.push_back(sc);
            scores.push_back(dsc);
        }
        cuda_evict_accumulate(pool.up(items, "items"), (int)items.size(), nullptr);
        for (size_t i = 0; i < items.size(); i++) {
            const std::vector<float> got = pool.down(scores[i], want[i].size());
            for (size_t s = 0; s < got.size(); s++)
                ASSERT_LE(std::fabs(got[s] - want[i][s]), 1e-6f * std::fabs(want[i][s]) + 1e-12f)
                    << policy << " item " << i << " slot " << s;
        }
    }
}

TEST(CudaEvictScore, SnapKvPoolingMatchesRank) {
    evict_params ep;
    ep.policy = "snapkv";
    ep.budget = 64;
    ep.snap_pool = 7;
    const auto pol = evict_policy_create(ep, 4096);
    kv_block b;
    b.n_used = 500;
    std::mt19937 g(2);
    std::uniform_real_distribution<float> U(0, 1);
    b.score.resize(500);
    for (auto& v : b.score) v = U(g);
    std::vector<float> want(500);
    pol->rank(b, want.data());
    device_pool pool;
    const dptr<float> imp = pool.zeros<float>(500, "importance");
    cuda_evict_pool_max(pool.up(b.score, "score"), 500, ep.snap_pool / 2, imp, nullptr);
    const std::vector<float> got = pool.down(imp, 500);
    for (int s = 0; s < 500; s++) ASSERT_EQ(simt_bits(got[s]), simt_bits(want[s])) << s;
}

}  // namespace
