// Sampler tests. The reference for the truncation filters is written here from
// their definitions (llama.cpp's chain: top-k -> top-p -> min-p on the T = 1
// softmax, then temperature on the survivors), sorting the whole vocabulary the
// slow way; empirical frequencies of many draws are checked against it with a
// chi-square test. Seeds are fixed, so every test is deterministic.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "engine/sampler.h"
#include "ggml-like/error.h"

namespace {

zk::sampler_params params_off(float temp, uint64_t seed = 1234) {
    zk::sampler_params p;
    p.temp = temp;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.repeat_penalty = 1.0f;
    p.seed = seed;
    return p;
}

std::vector<float> random_logits(int n, uint32_t seed, float scale = 3.0f) {
    std::mt19937 gen(seed);
    std::normal_distribution<float> d(0.0f, scale);
    std::vector<float> l(n);
    for (auto& x : l) x = d(gen);
    return l;
}

// The filtered, renormalized distribution the sampler must draw from.
std::vector<double> reference_distribution(const std::vector<float>& logits, const zk::sampler_params& p) {
    const size_t n = logits.size();
    std::vector<size_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
        return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    size_t keep = n;
    if (p.top_k > 0) keep = std::min(keep, (size_t)p.top_k);
    // softmax at T = 1 over the top-k set
    const double mx = logits[order[0]];
    std::vector<double> prob(keep);
    double z = 0;
    for (size_t i = 0; i < keep; ++i) z += prob[i] = std::exp(logits[order[i]] - mx);
    for (auto& x : prob) x /= z;
    if (p.top_p < 1.0f) {
        double cum = 0;
        size_t i = 0;
        while (i < keep) {
            cum += prob[i++];
            if (cum >= p.top_p) break;
        }
        keep = i;
    }
    if (p.min_p > 0.0f) {
        size_t i = 0;
        while (i < keep && prob[i] >= p.min_p * prob[0]) ++i;
        keep = i;
    }
    std::vector<double> out(n, 0.0);
    double t = 0;
    for (size_t i = 0; i < keep; ++i) t += out[order[i]] = std::exp((logits[order[i]] - mx) / p.temp);
    for (auto& x : out) x /= t;
    return out;
}

// Upper chi-square quantile, Wilson-Hilferty approximation; z = 4.75 is a tail of ~1e-6.
double chi2_critical(int df, double z = 4.75) {
    const double a = 2.0 / (9.0 * df);
    return df * std::pow(1.0 - a + z * std::sqrt(a), 3.0);
}

// Draws `draws` tokens and checks them against the reference: tokens with
// probability 0 are never drawn, the others pass a chi-square goodness-of-fit test.
void check_frequencies(const std::vector<float>& logits, const zk::sampler_params& p, int draws) {
    const auto expect = reference_distribution(logits, p);
    zk::sampler s(p, (int32_t)logits.size());
    std::vector<int> count(logits.size(), 0);
    for (int i = 0; i < draws; ++i) count[s.sample(logits.data())]++;
    double chi2 = 0;
    int support = 0;
    for (size_t t = 0; t < logits.size(); ++t) {
        if (expect[t] == 0.0) {
            EXPECT_EQ(count[t], 0) << "token " << t << " must be filtered out";
            continue;
        }
        ++support;
        const double e = expect[t] * draws;
        chi2 += (count[t] - e) * (count[t] - e) / e;
    }
    ASSERT_GE(support, 1);
    if (support > 1) {
        EXPECT_LT(chi2, chi2_critical(support - 1))
            << "support " << support << " top_k " << p.top_k << " top_p " << p.top_p << " min_p " << p.min_p
            << " temp " << p.temp;
    }
}

}  // namespace

TEST(sampler, greedy_picks_argmax) {
    for (uint32_t seed = 0; seed < 20; ++seed) {
        auto l = random_logits(1000, seed);
        const int32_t want = (int32_t)(std::max_element(l.begin(), l.end()) - l.begin());
        zk::sampler_params p;  // defaults for the filters: greedy ignores them
        p.temp = 0.0f;
        zk::sampler s(p, 1000);
        EXPECT_EQ(s.sample(l.data()), want);
    }
    // ties go to the lowest id
    std::vector<float> tie = {0.0f, 5.0f, 1.0f, 5.0f};
    zk::sampler s(params_off(0.0f), 4);
    EXPECT_EQ(s.sample(tie.data()), 1);
}

TEST(sampler, same_seed_same_sequence_different_seeds_differ) {
    auto l = random_logits(500, 7, 1.0f);  // flat enough that draws vary
    zk::sampler_params p;
    p.temp = 1.0f;
    p.seed = 42;
    zk::sampler a(p, 500), b(p, 500);
    p.seed = 43;
    zk::sampler c(p, 500);
    EXPECT_EQ(a.seed(), 42u);
    std::vector<int32_t> sa, sb, sc;
    for (int i = 0; i < 200; ++i) {
        sa.push_back(a.sample(l.data()));
        sb.push_back(b.sample(l.data()));
        sc.push_back(c.sample(l.data()));
    }
    EXPECT_EQ(sa, sb);
    EXPECT_NE(sa, sc);

    // reset() replays the sequence
    a.reset();
    std::vector<int32_t> again;
    for (int i = 0; i < 200; ++i) again.push_back(a.sample(l.data()));
    EXPECT_EQ(sa, again);
}

TEST(sampler, random_seed_is_reported_and_reproduces) {
    auto l = random_logits(300, 9, 1.0f);
    zk::sampler_params p;
    p.temp = 1.0f;
    p.seed = zk::sampler_seed_random;
    zk::sampler a(p, 300);
    EXPECT_NE(a.seed(), zk::sampler_seed_random);
    p.seed = a.seed();
    zk::sampler b(p, 300);
    for (int i = 0; i < 100; ++i) EXPECT_EQ(a.sample(l.data()), b.sample(l.data()));
}

TEST(sampler, top_k_1_is_greedy) {
    for (uint32_t seed = 0; seed < 10; ++seed) {
        auto l = random_logits(2000, 100 + seed, 1.0f);
        const int32_t want = (int32_t)(std::max_element(l.begin(), l.end()) - l.begin());
        for (float temp : {0.5f, 1.0f, 3.0f}) {
            zk::sampler_params p = params_off(temp, seed);
            p.top_k = 1;
            zk::sampler s(p, 2000);
            for (int i = 0; i < 20; ++i) EXPECT_EQ(s.sample(l.data()), want);
        }
    }
}

TEST(sampler, small_distribution_frequencies_match_filters) {
    // probabilities at T = 1 (sorted): .403 .244 .148 .090 .055 .033 .020 .007;
    // every cut below falls clearly between two tokens.
    const std::vector<float> l = {1.0f, 3.0f, -1.0f, 2.5f, 0.0f, 2.0f, 1.5f, 0.5f};
    const int draws = 200000;
    {
        auto p = params_off(1.0f);
        check_frequencies(l, p, draws);  // no filter: the plain softmax
    }
    {
        auto p = params_off(1.0f);
        p.top_k = 3;
        check_frequencies(l, p, draws);
    }
    {
        auto p = params_off(1.0f);
        p.top_p = 0.7f;  // .403 + .244 = .647 < .7 -> 3 tokens
        check_frequencies(l, p, draws);
    }
    {
        auto p = params_off(1.0f);
        p.min_p = 0.2f;  // keeps p >= .081: 4 tokens
        check_frequencies(l, p, draws);
    }
    {
        auto p = params_off(0.6f);
        p.top_k = 6;
        p.top_p = 0.95f;
        p.min_p = 0.1f;
        check_frequencies(l, p, draws);
    }
    {
        auto p = params_off(2.0f);  // a hot temperature over the survivors of top-p
        p.top_p = 0.9f;
        check_frequencies(l, p, draws);
    }
}

TEST(sampler, filters_agree_with_reference_on_a_larger_vocabulary) {
    // A peaked distribution (60 likely tokens over a flat background): top-p and
    // min-p without top-k exercise the bucketed top-p, top-k the heap selection.
    const int n_vocab = 4096;
    auto l = random_logits(n_vocab, 5, 1.0f);
    std::vector<int> perm(n_vocab);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), std::mt19937(77));
    for (int i = 0; i < 60; ++i) l[perm[i]] += 4.0f + 0.03f * i;
    struct cfg {
        int top_k;
        float top_p, min_p, temp;
    };
    for (cfg c : {cfg{0, 0.6f, 0.0f, 1.0f}, cfg{0, 1.0f, 0.02f, 0.8f}, cfg{0, 0.8f, 0.01f, 1.3f},
                  cfg{40, 0.95f, 0.05f, 0.8f}, cfg{25, 1.0f, 0.0f, 1.0f}}) {
        auto p = params_off(c.temp, 99);
        p.top_k = c.top_k;
        p.top_p = c.top_p;
        p.min_p = c.min_p;
        check_frequencies(l, p, 15000);
    }
}

TEST(sampler, repetition_penalty_changes_argmax) {
    auto p = params_off(0.0f);
    p.repeat_penalty = 1.5f;
    p.repeat_last_n = 2;
    {
        // positive logit divided: 2.0 / 1.5 = 1.33 < 1.8
        std::vector<float> l = {2.0f, 1.8f, -1.0f, 0.0f, 0.0f, 0.0f, 0.0f};
        zk::sampler s(p, 7);
        EXPECT_EQ(s.sample(l.data()), 0);
        s.accept(0);
        EXPECT_EQ(s.sample(l.data()), 1);
        // the window holds 2 tokens: after two more, token 0 is no longer penalized
        s.accept(5);
        EXPECT_EQ(s.sample(l.data()), 1);
        s.accept(6);
        EXPECT_EQ(s.sample(l.data()), 0);
        s.accept(0);
        s.reset();  // forgets the history
        EXPECT_EQ(s.sample(l.data()), 0);
    }
    {
        // negative logit multiplied: -1.0 * 1.5 = -1.5 < -1.2
        std::vector<float> l = {-1.0f, -1.2f, -3.0f};
        zk::sampler s(p, 3);
        EXPECT_EQ(s.sample(l.data()), 0);
        s.accept(0);
        EXPECT_EQ(s.sample(l.data()), 1);
    }
    {
        // a token repeated in the window is penalized once: 2.0 / 1.5 = 1.33 > 1.2
        // (twice would give 0.89 < 1.2)
        std::vector<float> l = {2.0f, 1.2f};
        zk::sampler s(p, 2);
        s.accept(0);
        s.accept(0);
        EXPECT_EQ(s.sample(l.data()), 0);
    }
    {
        // repeat_last_n = 0 turns the penalty off
        auto q = p;
        q.repeat_last_n = 0;
        std::vector<float> l = {2.0f, 1.8f};
        zk::sampler s(q, 2);
        s.accept(0);
        EXPECT_EQ(s.sample(l.data()), 0);
    }
}

// llama.cpp's penalties: for an id seen c > 0 times in the window, the repeat
// penalty once, then logit -= c * frequency + presence.
TEST(sampler, presence_and_frequency_penalties) {
    auto p = params_off(0.0f);
    p.repeat_last_n = 8;
    {
        // frequency scales with the count: 2.0 - 3 x 0.4 = 0.8 < 1.0, 2.0 - 2 x 0.4 = 1.2 > 1.0
        auto q = p;
        q.frequency_penalty = 0.4f;
        std::vector<float> l = {2.0f, 1.0f};
        zk::sampler s(q, 2);
        s.accept(0), s.accept(0);
        EXPECT_EQ(s.sample(l.data()), 0);
        s.accept(0);
        EXPECT_EQ(s.sample(l.data()), 1);
    }
    {
        // presence counts once: 2.0 - 0.4 = 1.6 > 1.5 however often 0 was seen; 2.0 - 0.6 < 1.5
        auto q = p;
        q.presence_penalty = 0.4f;
        std::vector<float> l = {2.0f, 1.5f};
        zk::sampler s(q, 2);
        for (int i = 0; i < 5; i++) s.accept(0);
        EXPECT_EQ(s.sample(l.data()), 0);
        q.presence_penalty = 0.6f;
        zk::sampler s2(q, 2);
        s2.accept(0);
        EXPECT_EQ(s2.sample(l.data()), 1);
    }
    {
        // order: divided by the repeat penalty first, then the frequency term:
        // 3.0 / 1.5 - 2 x 0.3 = 1.4 < 1.5 (the other order would give 1.6)
        auto q = p;
        q.repeat_penalty = 1.5f;
        q.frequency_penalty = 0.3f;
        std::vector<float> l = {3.0f, 1.5f};
        zk::sampler s(q, 2);
        s.accept(0), s.accept(0);
        EXPECT_EQ(s.sample(l.data()), 1);
    }
    {
        // negative penalties reward repeats
        auto q = p;
        q.presence_penalty = -1.0f;
        std::vector<float> l = {1.0f, 1.5f};
        zk::sampler s(q, 2);
        s.accept(0);
        EXPECT_EQ(s.sample(l.data()), 0);
    }
    // Random logits and windows against the definition, greedy: the argmax of the
    // reference penalized logits (ties to the lowest id).
    std::mt19937 gen(11);
    for (int trial = 0; trial < 200; trial++) {
        const int n = 50;
        auto q = p;
        q.repeat_last_n = 1 + trial % 12;
        q.repeat_penalty = 1.0f + 0.1f * (trial % 5);
        q.frequency_penalty = 0.05f * (trial % 7);
        q.presence_penalty = 0.1f * (trial % 3) - 0.05f;
        auto l = random_logits(n, 100 + trial, 1.0f);
        zk::sampler s(q, n);
        std::vector<int32_t> hist;
        for (int i = 0; i < 20; i++) {
            const int32_t t = (int32_t)(gen() % 6);  // few ids, so they repeat
            s.accept(t);
            hist.push_back(t);
        }
        std::vector<int> count(n, 0);
        for (size_t i = hist.size() - q.repeat_last_n; i < hist.size(); i++) count[hist[i]]++;
        std::vector<float> ref = l;
        for (int id = 0; id < n; id++) {
            if (count[id] == 0) continue;
            float& x = ref[id];
            x = x <= 0.0f ? x * q.repeat_penalty : x / q.repeat_penalty;
            x -= (float)count[id] * q.frequency_penalty + q.presence_penalty;
        }
        const int32_t want = (int32_t)(std::max_element(ref.begin(), ref.end()) - ref.begin());
        ASSERT_EQ(s.sample(l.data()), want) << "trial " << trial;
    }
}

TEST(sampler, invalid_params_throw) {
    auto bad = [](auto mutate) {
        zk::sampler_params p;
        mutate(p);
        EXPECT_THROW(zk::sampler_validate_params(p), zk::error);
        EXPECT_THROW(zk::sampler(p, 10), zk::error);
    };
    bad([](zk::sampler_params& p) { p.temp = -0.1f; });
    bad([](zk::sampler_params& p) { p.temp = NAN; });
    bad([](zk::sampler_params& p) { p.top_p = 0.0f; });
    bad([](zk::sampler_params& p) { p.top_p = 1.01f; });
    bad([](zk::sampler_params& p) { p.min_p = -0.01f; });
    bad([](zk::sampler_params& p) { p.min_p = 1.0f; });
    bad([](zk::sampler_params& p) { p.top_k = -1; });
    bad([](zk::sampler_params& p) { p.repeat_penalty = 0.0f; });
    bad([](zk::sampler_params& p) { p.repeat_penalty = -1.0f; });
    bad([](zk::sampler_params& p) { p.repeat_last_n = -1; });
    bad([](zk::sampler_params& p) { p.presence_penalty = NAN; });
    bad([](zk::sampler_params& p) { p.frequency_penalty = INFINITY; });

    EXPECT_NO_THROW(zk::sampler_validate_params(zk::sampler_params{}));
    EXPECT_THROW(zk::sampler(zk::sampler_params{}, 0), zk::error);

    zk::sampler s(zk::sampler_params{}, 4);
    EXPECT_THROW(s.accept(4), zk::error);
    EXPECT_THROW(s.accept(-1), zk::error);
    std::vector<float> nan_logits = {0.0f, NAN, 1.0f, 2.0f};
    EXPECT_THROW(s.sample(nan_logits.data()), zk::error);
}
