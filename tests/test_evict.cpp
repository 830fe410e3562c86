// Every eviction policy, with and without KVCrush, through one parametrised
// suite: on synthetic blocks (budget respected, sinks and the recent window
// kept, order preserved) and on the real model (with a budget >= the context the
// logits and the kept slots are exactly those of `none`; with a small budget the
// cache stays bounded through prefill and decode).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/evict/evict.h"
#include "engine/kv_cache.h"
#include "engine/model.h"
#include "engine/session.h"
#include "engine/vocab.h"
#include "tests/model_fixture.h"

using namespace zk;

namespace {

struct policy_case {
    const char* name;
    float crush;
    int bits;
};

std::string case_name(const ::testing::TestParamInfo<policy_case>& i) {
    return std::string(i.param.name) + (i.param.crush > 0 ? "_crush" : "") + "_q" + std::to_string(i.param.bits);
}

evict_params make_params(const policy_case& c, int64_t budget) {
    evict_params p;
    p.policy = c.name;
    p.budget = budget;
    p.crush = c.crush;
    return p;
}

// Every block: at most budget slots, ascending positions, sinks and the newest
// n_recent positions (of the `all` positions it held) present.
void expect_protected(const kv_cache& c, const evict_params& p, int64_t budget, const std::vector<int32_t>& all) {
    const int64_t recent = evict_n_recent(p);
    for (int l = 0; l < c.n_layer(); l++)
        for (int h = 0; h < c.n_head_kv(); h++) {
            const kv_block& b = c.block(l, h);
            ASSERT_LE(b.n_used, budget) << "layer " << l << " head " << h;
            for (int64_t s = 1; s < b.n_used; s++) ASSERT_LT(b.pos[s - 1], b.pos[s]);
            auto has = [&](int32_t pos) { return std::binary_search(b.pos, b.pos + b.n_used, pos); };
            for (int32_t sp : all) {
                if (sp < p.n_sink) {
                    EXPECT_TRUE(has(sp)) << "sink " << sp << " evicted";
                }
            }
            for (int64_t i = 0; i < recent; i++)
                EXPECT_TRUE(has(all[all.size() - 1 - i])) << "recent position " << all[all.size() - 1 - i] << " evicted";
        }
}

}  // namespace

class Evict : public ::testing::TestWithParam<policy_case> {};

TEST_P(Evict, SyntheticBudgetSinksRecent) {
    const policy_case pc = GetParam();
    const int64_t n = 150, budget = 48;
    const int r = 16;
    kv_cache_params kp;
    kp.bits = pc.bits;
    kp.scores = true;
    kp.evicting = true;
    kv_cache c(2, 3, n, kp, std::vector<int>(6, r), std::vector<int>(6, r));
    const evict_params ep = make_params(pc, budget);
    auto pol = evict_policy_create(ep, 4096);
    std::mt19937 g(1);
    std::normal_distribution<float> N(0, 1);
    std::vector<float> row(r), logits(n);
    std::vector<int32_t> all;
    for (int64_t t = 0; t < n; t++) {
        const int32_t pos = (int32_t)(2 * t);  // positions with gaps
        all.push_back(pos);
        for (int l = 0; l < 2; l++)
            for (int h = 0; h < 3; h++) {
                for (auto& x : row) x = N(g);
                c.append(l, h, 1, row.data(), r, row.data(), r, &pos);
                kv_block& b = c.block(l, h);
                if (!pol->needs_attention()) continue;
                for (int64_t s = 0; s < b.n_used; s++) logits[s] = 2 * N(g);
                const evict_observation o{l, h, pos, 0, 1, 4096, b.pos};
                pol->observe(o, logits.data(), b.n_used, b.score.data());
            }
    }
    evict_run(c, *pol, budget);
    expect_protected(c, ep, budget, all);
    for (int l = 0; l < 2; l++)
        for (int h = 0; h < 3; h++) EXPECT_EQ(c.block(l, h).n_used, budget);
    // a budget larger than the cache keeps everything
    kv_cache c2(1, 1, 10, kp, {r}, {r});
    for (int32_t t = 0; t < 10; t++) c2.append(0, 0, 1, row.data(), r, row.data(), r, &t);
    evict_run(c2, *pol, 64);
    EXPECT_EQ(c2.block(0, 0).n_used, 10);
}

// With a budget >= the context nothing is evicted: logits (prefill and greedy
// decode) and kept slots are exactly those of `none`, although the policy sees
// the attention.
TEST_P(Evict, RealModelLargeBudgetIsIdentity) {
    const policy_case pc = GetParam();
    const model& m = zk_test::source_model();
    const std::vector<int32_t> prompt =
        m.voc->encode("The quick brown fox jumps over the lazy dog. Then it runs home to", true, false);
    auto run = [&](const evict_params& ep, std::vector<std::vector<int32_t>>* kept) {
        session_params sp;
        sp.n_ctx = 64;
        sp.n_threads = 2;
        sp.kv.bits = pc.bits;
        sp.prefill_tiled = false;  // `none` would take the tiled kernel: another summation order
        sp.evict = ep;
        session s(m, sp);
        std::vector<float> out;
        const float* lg = s.decode(prompt.data(), (int64_t)prompt.size());
        for (int step = 0; step < 3; step++) {
            out.insert(out.end(), lg, lg + m.hp.n_vocab);
            const int32_t next = (int32_t)(std::max_element(lg, lg + m.hp.n_vocab) - lg);
            lg = s.decode(&next, 1);
        }
        for (int l = 0; l < m.hp.n_layer; l++)
            for (int h = 0; h < m.hp.n_head_kv; h++) {
                const kv_block& b = s.cache().block(l, h);
                kept->emplace_back(b.pos, b.pos + b.n_used);
            }
        return out;
    };
    std::vector<std::vector<int32_t>> kept_none, kept_pol;
    const std::vector<float> base = run(evict_params{}, &kept_none);
    const std::vector<float> got = run(make_params(pc, 64), &kept_pol);
    ASSERT_EQ(base.size(), got.size());
    for (size_t i = 0; i < base.size(); i++) ASSERT_EQ(base[i], got[i]) << "logit " << i;
    EXPECT_EQ(kept_none, kept_pol);
}

// A small budget: the cache never holds more than its capacity (budget + one
// chunk), goes down to the budget after the prompt, keeps sinks and recent
// tokens, and decoding keeps producing finite logits.
TEST_P(Evict, RealModelSmallBudgetBounded) {
    const policy_case pc = GetParam();
    const model& m = zk_test::source_model();
    std::string text;
    for (int i = 0; i < 5; i++) text += "Paris is the capital of France, and Berlin is the capital of Germany. ";
    const std::vector<int32_t> prompt = m.voc->encode(text, true, false);
    ASSERT_GT(prompt.size(), 70u);
    const int64_t budget = 40;
    session_params sp;
    sp.n_ctx = 512;
    sp.n_threads = 2;
    sp.n_batch = 32;  // several prefill chunks, evicting between them
    sp.kv.bits = pc.bits;
    sp.evict = make_params(pc, budget);
    sp.evict.chunk = 8;
    session s(m, sp);
    EXPECT_LT(s.cache().capacity(), sp.n_ctx);
    std::vector<int32_t> all(prompt.size());
    for (size_t i = 0; i < all.size(); i++) all[i] = (int32_t)i;
    const float* lg = s.decode(prompt.data(), (int64_t)prompt.size());
    expect_protected(s.cache(), sp.evict, budget, all);
    for (int step = 0; step < 20; step++) {
        for (int v = 0; v < m.hp.n_vocab; v++) ASSERT_TRUE(std::isfinite(lg[v]));
        const int32_t next = (int32_t)(std::max_element(lg, lg + m.hp.n_vocab) - lg);
        lg = s.decode(&next, 1);
        all.push_back((int32_t)all.size());
        ASSERT_LE(s.cache().n_used_max(), budget + sp.evict.chunk);
    }
    EXPECT_EQ(s.n_past(), (int64_t)all.size());
}

INSTANTIATE_TEST_SUITE_P(
    Policies, Evict,
    ::testing::Values(policy_case{"streaming", 0, 16}, policy_case{"h2o", 0, 16}, policy_case{"snapkv", 0, 16},
                      policy_case{"keyformer", 0, 16}, policy_case{"streaming", 0.25f, 16},
                      policy_case{"h2o", 0.25f, 16}, policy_case{"snapkv", 0.25f, 16},
                      policy_case{"keyformer", 0.25f, 16}, policy_case{"h2o", 0, 4}, policy_case{"snapkv", 0.25f, 4},
                      policy_case{"keyformer", 0, 8}),
    case_name);

// The registry knows every policy and builds each with its name.
TEST(EvictRegistry, NamesAndConstruction) {
    const std::vector<std::string> names = evict_policy_names();
    for (const char* want : {"none", "streaming", "h2o", "snapkv", "keyformer"})
        EXPECT_NE(std::find(names.begin(), names.end(), want), names.end()) << want;
    for (const std::string& n : names) {
        evict_params p;
        p.policy = n;
        p.budget = n == "none" ? 0 : 100;
        EXPECT_EQ(evict_policy_create(p, 4096)->name(), n);
    }
    evict_params p;
    p.policy = "h2o";
    p.budget = 100;
    p.crush = 0.5f;
    EXPECT_EQ(evict_policy_create(p, 4096)->name(), "kvcrush(h2o)");
}
