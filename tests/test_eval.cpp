// Unit tests of the eval module: bisection against a dense scan, the KL / top-1
// / dp statistics against direct formulas, percentiles, configurations and grids,
// and malformed data reported with file and line.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <random>

#include "engine/eval/eval_report.h"
#include "engine/eval/eval_stats.h"
#include "engine/eval/eval_sweep.h"
#include "engine/eval/eval_task.h"
#include "engine/model.h"
#include "ggml-like/error.h"
#include "tests/model_fixture.h"

namespace zk {
namespace {

const std::string k_data = std::string(ZACK_SOURCE_DIR) + "/tests/data/eval/";

// ---- bisection ----

TEST(EvalBisect, MatchesDenseScanOnMonotoneFunctions) {
    std::mt19937 rng(7);
    std::uniform_real_distribution<double> u(-0.1, 1.1);
    for (int steps = 0; steps <= 8; steps++) {
        for (int trial = 0; trial < 200; trial++) {
            const double threshold = u(rng);  // passes while t <= threshold (non-increasing accuracy)
            int calls = 0;
            auto pass = [&](double t) {
                calls++;
                return t <= threshold;
            };
            const eval_bisect_result dense = eval_dense_scan(pass, steps);
            calls = 0;
            const eval_bisect_result b = eval_bisect(pass, steps, true);
            EXPECT_EQ(b.found, dense.found) << "threshold " << threshold << " steps " << steps;
            if (dense.found) {
                EXPECT_DOUBLE_EQ(b.t, dense.t) << "threshold " << threshold << " steps " << steps;
            }
            EXPECT_LE(calls, steps + 2);
        }
    }
}

TEST(EvalBisect, SyntheticAccuracyCurveAtTarget) {
    // accuracy(t) = 1 - 0.05 t^2: keeps 99% up to t = sqrt(0.2) = 0.447...
    auto acc = [](double t) { return 1.0 - 0.05 * t * t; };
    auto pass = [&](double t) { return acc(t) >= 0.99; };
    const eval_bisect_result b = eval_bisect(pass, 10, false);
    ASSERT_TRUE(b.found);
    EXPECT_LE(b.t, std::sqrt(0.2));
    EXPECT_GT(b.t + 1.0 / 1024, std::sqrt(0.2));
    EXPECT_DOUBLE_EQ(b.t, eval_dense_scan(pass, 10).t);
}

TEST(EvalBisect, WeakestSettingFails) {
    const eval_bisect_result b = eval_bisect([](double) { return false; }, 6, true);
    EXPECT_FALSE(b.found);
    EXPECT_EQ(b.tried.size(), 2u);  // t = 1, then t = 0
}

TEST(EvalBisect, FindTargetUsesRunnerAndMemoizes) {
    // A fake runner: retention falls linearly with the zack rate.
    int runs_made = 0;
    eval_run_cache runs([&](const eval_config& c) {
        runs_made++;
        eval_point p;
        p.cfg = c;
        double rate = 0;
        for (const auto& [f, v] : c.flags)
            if (f == "--kv-rate") rate = std::stod(v);
        p.retention = 1.0 - 0.04 * rate;  // 0.99 at rate 0.25
        p.kv_fraction = 1.0 - rate;
        return p;
    });
    eval_method_limits lim;
    lim.zack_max_rate = 1.0;
    const std::vector<eval_method> ms = eval_methods({"zack"}, lim);
    ASSERT_EQ(ms.size(), 1u);
    const eval_target_result r = eval_find_target(ms[0], 0.99, 6, runs);
    ASSERT_TRUE(r.found);
    EXPECT_NEAR(r.best.kv_fraction, 0.75, 1.0 / 64 + 1e-9);
    EXPECT_GE(r.best.retention, 0.99);
    const int made = runs_made;
    eval_find_target(ms[0], 0.99, 6, runs);  // the same points again: all memoized
    EXPECT_EQ(runs_made, made);
}

TEST(EvalBisect, UnavailableFamilyStops) {
    eval_run_cache runs([&](const eval_config& c) {
        eval_point p;
        p.cfg = c;
        p.error = "not available in this build";
        p.available = false;
        return p;
    });
    const eval_target_result r = eval_find_target(eval_methods({"evict"}, {})[0], 0.99, 6, runs);
    EXPECT_FALSE(r.found);
    EXPECT_EQ(r.tried.size(), 1u);
    EXPECT_NE(r.note.find("not available"), std::string::npos);
}

// ---- configurations ----

TEST(EvalConfig, MethodsAndGrid) {
    eval_method_limits lim;
    lim.n_tokens = 512;
    lim.zack_max_rate = 0.75;
    lim.evict_min_keep = 0.125;
    const std::vector<eval_method> all = eval_methods({"all"}, lim);
    ASSERT_EQ(all.size(), 10u);  // plan+evict: one family per eviction level down to 1/8
    EXPECT_EQ(all[5].name, "zack+evict+q4");
    EXPECT_EQ(all[6].name, "plan");
    EXPECT_EQ(all[7].name, "plan+evict 1/2");
    EXPECT_EQ(all[9].name, "plan+evict 1/8");
    // t = 1 is the plan for 10% of the f16 cache, on a 1/1024 grid
    EXPECT_EQ(all[6].at(1.0).cli(), "--kv-target 0.0996094");
    // plans and eviction levels searched jointly: the level stays, the target moves
    EXPECT_EQ(all[8].at(0.5).cli(), "--kv-evict h2o --kv-budget 128 --kv-target 0.549805");
    EXPECT_EQ(all[8].at(1.0).cli(), "--kv-evict h2o --kv-budget 128 --kv-target 0.0996094");
    EXPECT_EQ(eval_methods({"plan+evict", "plan"}, lim).size(), 4u);
    const eval_config c = all[5].at(1.0);
    EXPECT_EQ(c.cli(), "--kv-rate 0.75 --kv-evict h2o --kv-budget 64 --kv-bits 4");
    EXPECT_EQ(all[1].at(0.5).cli(), "--kv-evict h2o --kv-budget 288");
    EXPECT_FALSE(all[2].continuous());
    EXPECT_THROW(eval_methods({"nope"}, lim), error);

    // plan+tier: one plan family per tier of 1/4, 1/8, 1/16 of the item, multiples of the group,
    // by name only (not in "all", which holds 10 families above)
    lim.n_tokens = 4096;
    const std::vector<eval_method> tiers = eval_methods({"plan+tier"}, lim);
    ASSERT_EQ(tiers.size(), 3u);
    EXPECT_EQ(tiers[0].name, "plan+tier 1024");
    EXPECT_EQ(tiers[2].name, "plan+tier 256");
    EXPECT_EQ(tiers[1].at(1.0).cli(), "--kv-target 0.0996094 --kv-tier 512");
    EXPECT_EQ(tiers[1].at(1.0).name, "plan 0.100 + tier 512");
    // --plan-max narrows the knob: t = 0 -> 0.2, 1 -> 0.1
    eval_method_limits band = lim;
    band.plan_max_fraction = 0.2;
    const eval_method pb = eval_methods({"plan"}, band)[0];
    EXPECT_EQ(pb.at(0.0).cli(), "--kv-target 0.200195");
    EXPECT_EQ(pb.at(0.5).cli(), "--kv-target 0.150391");
    EXPECT_EQ(pb.at(1.0).cli(), "--kv-target 0.0996094");
    band.plan_min_fraction = 0.3;
    EXPECT_THROW(eval_methods({"plan"}, band), error);
    lim.n_tokens = 1000;  // 250, 125, 62 tokens: down to multiples of 32
    const std::vector<eval_method> odd = eval_methods({"plan+tier"}, lim);
    ASSERT_EQ(odd.size(), 3u);
    EXPECT_EQ(odd[0].tier, 224);
    EXPECT_EQ(odd[1].tier, 96);
    EXPECT_EQ(odd[2].tier, 32);
    lim.n_tokens = 160;  // 40 -> 32; 20 and 10: no tier
    EXPECT_EQ(eval_methods({"plan+tier"}, lim).size(), 1u);
    lim.n_tokens = 100;  // too short for any
    EXPECT_THROW(eval_methods({"plan+tier"}, lim), error);

    const auto g = eval_grid_configs({{"--kv-bits", {"8", "4"}}, {"--kv-group", {"32", "64", "128"}}});
    ASSERT_EQ(g.size(), 6u);
    EXPECT_EQ(g[0].cli(), "--kv-bits 8 --kv-group 32");
    EXPECT_EQ(g[5].cli(), "--kv-bits 4 --kv-group 128");
}

TEST(EvalConfig, Retention) {
    eval_score base, s;
    base.value = 10;
    base.higher_is_better = s.higher_is_better = false;  // perplexity
    s.value = 12.5;
    EXPECT_DOUBLE_EQ(eval_retention(s, base), 0.8);
    base.higher_is_better = s.higher_is_better = true;  // accuracy
    base.value = 0.5;
    s.value = 0.4;
    EXPECT_DOUBLE_EQ(eval_retention(s, base), 0.8);
    base.value = 0;
    EXPECT_DOUBLE_EQ(eval_retention(s, base), 1.0);
}

// ---- statistics ----

TEST(EvalStats, PercentilesAndMean) {
    const std::vector<double> v = {1, 2, 3, 4, 5};
    EXPECT_DOUBLE_EQ(eval_percentile(v, 0.5), 3);
    EXPECT_DOUBLE_EQ(eval_percentile(v, 0.1), 1.4);  // 0.1 * 4 = 0.4 -> 1 + 0.4
    EXPECT_DOUBLE_EQ(eval_percentile(v, 0.0), 1);
    EXPECT_DOUBLE_EQ(eval_percentile(v, 1.0), 5);
    EXPECT_DOUBLE_EQ(eval_median({1, 2, 3, 10}), 2.5);
    // 12 values 0/1 alternating: mean 0.5, uncertainty sqrt(0.25 / 11)
    const auto mu = eval_mean_unc(6, 6, 12);
    EXPECT_DOUBLE_EQ(mu.first, 0.5);
    EXPECT_NEAR(mu.second, std::sqrt(0.25 / 11), 1e-15);
    EXPECT_EQ(eval_mean_unc(6, 6, 10).second, 0.0);  // too few values for an uncertainty
}

TEST(EvalStats, KlAgainstDirectFormula) {
    const int V = 5;
    const float base_logits[V] = {2.0f, 1.0f, 0.5f, -1.0f, 0.0f};
    const float q_logits[V] = {1.5f, 1.2f, 0.4f, -0.5f, 0.1f};
    float blp[V];
    eval_log_softmax(base_logits, V, blp);
    // Direct: probabilities by normalizing exponentials.
    double zb = 0, zq = 0;
    for (int i = 0; i < V; i++) zb += std::exp((double)base_logits[i]), zq += std::exp((double)q_logits[i]);
    double kl = 0;
    for (int i = 0; i < V; i++) {
        const double pb = std::exp((double)base_logits[i]) / zb, pq = std::exp((double)q_logits[i]) / zq;
        kl += pb * std::log(pb / pq);
    }
    eval_kl_stats st;
    st.add(blp, q_logits, V, 1);
    EXPECT_NEAR(st.kld_mean(), kl, 1e-6);
    EXPECT_EQ(st.same_top(), 1.0);  // both argmax at 0
    const double dp = std::exp((double)q_logits[1]) / zq - std::exp((double)base_logits[1]) / zb;
    EXPECT_NEAR(st.rms_dp(), std::fabs(dp), 1e-6);
    const float q2[V] = {0.0f, 3.0f, 0.0f, 0.0f, 0.0f};
    st.add(blp, q2, V, 1);
    EXPECT_DOUBLE_EQ(st.same_top(), 0.5);
}

TEST(EvalStats, BaselineAgainstItselfIsZero) {
    std::mt19937 rng(3);
    std::normal_distribution<float> n(0, 3);
    const int V = 1000;
    std::vector<float> logits(V), lp(V);
    eval_kl_stats st;
    for (int t = 0; t < 50; t++) {
        for (float& x : logits) x = n(rng);
        eval_log_softmax(logits.data(), V, lp.data());
        st.add(lp.data(), logits.data(), V, t % V);
    }
    const nlohmann::json j = st.summary();
    EXPECT_EQ(j["kld_mean"].get<double>(), 0.0);
    EXPECT_EQ(j["kld_percentiles"]["max"].get<double>(), 0.0);
    EXPECT_EQ(j["same_top_p"].get<double>(), 1.0);
    EXPECT_EQ(j["rms_dp"].get<double>(), 0.0);
    EXPECT_DOUBLE_EQ(j["ppl"].get<double>(), j["ppl_base"].get<double>());
}

// ---- data problems (needs the default model for its tokenizer) ----

class EvalData : public ::testing::Test {
protected:
    void SetUp() override { m_ = &zk_test::source_model(); }
    const model* m_ = nullptr;
};

TEST_F(EvalData, MalformedJsonlStopsWithFileAndLine) {
    const std::string f = k_data + "mc_malformed.jsonl";
    try {
        eval_task_mc(*m_, {f}, {}, eval_on_error::STOP);
        FAIL() << "no error";
    } catch (const error& e) {
        EXPECT_NE(std::string(e.what()).find("mc_malformed.jsonl:3:"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("not valid JSON"), std::string::npos) << e.what();
    }
}

TEST_F(EvalData, MalformedJsonlSkipsAndRecords) {
    const std::string f = k_data + "mc_malformed.jsonl";
    auto t = eval_task_mc(*m_, {f}, {}, eval_on_error::SKIP);
    EXPECT_EQ(t->n_items(), 3);  // lines 1, 4, 7
    ASSERT_EQ(t->issues().size(), 3u);
    EXPECT_EQ(t->issues()[0].line, 3);
    EXPECT_EQ(t->issues()[1].line, 5);
    EXPECT_NE(t->issues()[1].what.find("out of range"), std::string::npos) << t->issues()[1].what;
    EXPECT_EQ(t->issues()[2].line, 6);
    EXPECT_NE(t->issues()[2].what.find("choices"), std::string::npos) << t->issues()[2].what;
    for (const auto& i : t->issues()) EXPECT_EQ(i.file, f);
}

TEST_F(EvalData, EmptyFilesNamed) {
    const std::string f = k_data + "empty.txt";
    for (auto make : {+[](const model& m, const std::string& p) { eval_task_ppl(m, {p}, {}, eval_on_error::STOP); },
                      +[](const model& m, const std::string& p) { eval_task_lastword(m, {p}, {}, eval_on_error::STOP); },
                      +[](const model& m, const std::string& p) { eval_task_mc(m, {p}, {}, eval_on_error::STOP); }}) {
        try {
            make(*m_, f);
            ADD_FAILURE() << "no error for an empty file";
        } catch (const error& e) {
            EXPECT_NE(std::string(e.what()).find("empty.txt"), std::string::npos) << e.what();
            EXPECT_NE(std::string(e.what()).find("empty"), std::string::npos) << e.what();
        }
    }
    // With skip and nothing else left the task still fails, saying there is no data.
    EXPECT_THROW(eval_task_mc(*m_, {f}, {}, eval_on_error::SKIP), error);
}

TEST_F(EvalData, ItemsAreBuiltAsDocumented) {
    auto mc = eval_task_mc(*m_, {k_data + "mc.jsonl"}, {}, eval_on_error::STOP);
    EXPECT_EQ(mc->n_items(), 30);
    auto lw = eval_task_lastword(*m_, {k_data + "gpl3_preamble.txt"}, {}, eval_on_error::STOP);
    EXPECT_GE(lw->n_items(), 5);
    eval_passkey_opts po;
    po.lengths = {200, 300};
    po.depths = {0, 1};
    po.trials = 3;
    auto pk = eval_task_passkey(*m_, po, eval_on_error::STOP);
    EXPECT_EQ(pk->n_items(), 12);
    EXPECT_EQ(pk->n_ctx_needed(), 300 + 8);  // exact lengths + room for the answer
    eval_ppl_opts o;
    o.n_ctx = 64;
    auto ppl = eval_task_ppl(*m_, {k_data + "gpl3_preamble.txt"}, o, eval_on_error::STOP);
    EXPECT_EQ(ppl->n_ctx_needed(), 64);
    o.n_ctx = 4096;
    EXPECT_THROW(eval_task_ppl(*m_, {k_data + "gpl3_preamble.txt"}, o, eval_on_error::STOP), error);
}

// A NaN depth (--passkey-depths nan parses) slipped past "d < 0 || d > 1" and
// hid the key nowhere; it is refused like any depth outside 0..1.
TEST_F(EvalData, PasskeyDepthNanIsRefused) {
    eval_passkey_opts po;
    po.lengths = {200};
    po.depths = {std::nan("")};
    try {
        eval_task_passkey(*m_, po, eval_on_error::STOP);
        FAIL() << "no error";
    } catch (const error& e) {
        EXPECT_NE(std::string(e.what()).find("is outside 0..1"), std::string::npos) << e.what();
    }
}

// Found by fuzzing (tests/data/fuzz/eval/ppl_stride_past_window): a stride over
// twice the context put the scored part before the window's first token, and
// the run read tokens in front of the chunk. Strides up to 2c - 2 keep it inside.
TEST_F(EvalData, PplStrideBeyondTheWindowIsRefused) {
    eval_ppl_opts o;
    o.n_ctx = 16;
    o.stride = 31;
    try {
        eval_task_ppl(*m_, {k_data + "gpl3_preamble.txt"}, o, eval_on_error::STOP);
        FAIL() << "no error";
    } catch (const error& e) {
        EXPECT_NE(std::string(e.what()).find("stride 31 is too large for a context of 16 (at most 30)"),
                  std::string::npos) << e.what();
    }
    o.stride = 30;
    auto t = eval_task_ppl(*m_, {k_data + "gpl3_preamble.txt"}, o, eval_on_error::STOP);
    EXPECT_EQ(t->n_ctx_needed(), 16 + 15);
}

// ---- report ----

// A 4-bit tier is a fixed cost a plan's per-token bytes leave out: the front and
// the smallest passing configuration compare what each cache holds at the
// task's context (and what eviction kept of it).
TEST(EvalReport, SmallestAndFrontCompareWhatIsHeld) {
    auto point = [](const char* name, double per_token, double held, double kept, double retention) {
        eval_point p;
        p.cfg.name = p.cfg.method = name;
        p.kv_fraction = per_token * kept;
        p.kv_held_fraction = held;
        p.score.tokens_kept = kept;
        p.retention = retention;
        return p;
    };
    std::vector<eval_point> pts = {
        point("plan 0.10 + tier 1920", 0.10, 0.22, 1, 0.992),  // least per token, most held
        point("plan 0.13 + tier 608", 0.13, 0.17, 1, 0.991),
        point("plan 0.17", 0.17, 0.20, 1, 0.990),
        point("plan 0.10", 0.10, 0.13, 1, 0.974),            // held least, fails
        point("evict 1/4", 0.27, 0.30, 0.25, 0.995),         // 7.5% held at the context
    };
    EXPECT_DOUBLE_EQ(eval_point_held(pts[4]), 0.075);
    EXPECT_EQ(eval_smallest_passing(pts, 0.99), 4);
    pts[4].retention = 0.9;
    EXPECT_EQ(eval_smallest_passing(pts, 0.99), 1);  // not the tier of 1920 (the least a token)
    EXPECT_EQ(eval_smallest_passing(pts, 0.9915), 0);  // only the tier of 1920 keeps it
    EXPECT_EQ(eval_smallest_passing(pts, 0.999), -1);
    const std::vector<size_t> front = eval_pareto_front(pts);
    EXPECT_EQ(front, (std::vector<size_t>{4, 3, 1, 0}));  // plan 0.17 holds more than 0.13's tier and keeps less
}

TEST(EvalReport, SvgHasOneCurvePerMethod) {
    eval_report r;
    r.task = "ppl";
    r.baseline.score.metric = "ppl";
    r.target = 0.99;
    for (const char* m : {"zack", "evict"})
        for (double t : {0.5, 1.0}) {
            eval_point p;
            p.cfg.method = m;
            p.cfg.name = std::string(m) + " " + std::to_string(t);
            p.retention = 1 - 0.1 * t;
            p.kv_fraction = 1 - 0.5 * t;
            p.kv_held_fraction = 1 - 0.4 * t;
            r.runs.push_back(p);
        }
    const std::string svg = eval_report_svg(r);
    EXPECT_EQ(svg.rfind("<svg", 0), 0u);
    EXPECT_NE(svg.find("</svg>"), std::string::npos);
    size_t n = 0;
    for (size_t at = svg.find("<polyline"); at != std::string::npos; at = svg.find("<polyline", at + 1)) n++;
    EXPECT_EQ(n, 3u);  // one curve per method and the Pareto front under them
    EXPECT_NE(svg.find("Pareto front"), std::string::npos);
    const nlohmann::json j = eval_report_json(r);
    EXPECT_EQ(j["runs"].size(), 4u);
    EXPECT_EQ(j["runs"][0]["config"]["method"], "zack");
}

}  // namespace
}  // namespace zk
