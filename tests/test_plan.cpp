// KV plans with a precision per head (calib/plan.h) on synthetic loss tables:
// the knapsack against brute force, the per-head plan against every
// combination of (precision, key basis, rank) on a tiny model, the byte
// accounting against the cache's own, the target respected, and the plan file
// (version 2) read back and refused when malformed; the warning a session gives
// for 8-bit keys that calibration measured to wreck a head.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <random>

#include "calib/alloc.h"
#include "calib/plan.h"
#include "calib/sensitivity.h"
#include "engine/kv_cache.h"
#include "engine/session.h"
#include "ggml-like/error.h"

namespace {

// The least summed loss over every combination (one option per item) within the budget.
double brute_knapsack(const std::vector<std::vector<zk::knap_option>>& items, int64_t budget) {
    double best = std::numeric_limits<double>::infinity();
    std::function<void(size_t, int64_t, double)> rec = [&](size_t i, int64_t cost, double loss) {
        if (cost > budget) return;
        if (i == items.size()) {
            best = std::min(best, loss);
            return;
        }
        for (const zk::knap_option& o : items[i]) rec(i + 1, cost + o.cost, loss + o.loss);
    };
    rec(0, 0, 0.0);
    return best;
}

TEST(Knapsack, MatchesBruteForce) {
    std::mt19937 rng(5);
    std::uniform_int_distribution<int> cost(0, 9), n_opt(1, 5);
    std::uniform_real_distribution<double> loss(0.0, 3.0);
    for (int trial = 0; trial < 200; trial++) {
        std::vector<std::vector<zk::knap_option>> items(1 + trial % 5);
        int64_t least = 0;
        for (auto& it : items) {
            const int n = n_opt(rng);
            int64_t m = 1 << 30;
            for (int k = 0; k < n; k++) {
                // every third option repeats the previous one's cost: ties and dominated options
                const int64_t c = (k % 3 == 2) ? it.back().cost : cost(rng);
                it.push_back({c, std::round(loss(rng) * 4) / 4});
                m = std::min(m, c);
            }
            least += m;
        }
        const int64_t budget = least + trial % 13;
        const std::vector<int> pick = zk::alloc_knapsack(items, budget);
        ASSERT_EQ(pick.size(), items.size());
        int64_t used = 0;
        double got = 0;
        for (size_t i = 0; i < items.size(); i++) {
            ASSERT_GE(pick[i], 0);
            ASSERT_LT(pick[i], (int)items[i].size());
            used += items[i][pick[i]].cost;
            got += items[i][pick[i]].loss;
        }
        EXPECT_LE(used, budget) << "trial " << trial;
        EXPECT_NEAR(got, brute_knapsack(items, budget), 1e-12) << "trial " << trial;
    }
}

TEST(Knapsack, OverBudgetThrows) {
    std::vector<std::vector<zk::knap_option>> items = {{{3, 0.0}, {2, 1.0}}, {{4, 0.0}}};
    EXPECT_THROW(zk::alloc_knapsack(items, 5), zk::error);
    EXPECT_NO_THROW(zk::alloc_knapsack(items, 6));
    EXPECT_THROW(zk::alloc_knapsack({{}}, 6), zk::error);
}

// The bytes a plan counts per side and per head are what the cache allocates
// per token (uniform precision, the layouts the cache has).
TEST(PlanBytes, MatchCacheAccounting) {
    const int L = 2, KV = 3, d = 64;
    std::mt19937 rng(3);
    std::uniform_int_distribution<int> rank(1, d);
    for (int bits : {16, 8, 4})
        for (int trial = 0; trial < 4; trial++) {
            std::vector<int> rk(L * KV), rv(L * KV);
            for (int i = 0; i < L * KV; i++) rk[i] = trial ? rank(rng) : d, rv[i] = trial ? rank(rng) : d;
            zk::kv_cache_params kp;
            kp.bits = bits;
            const zk::kv_cache c(L, KV, 256, kp, rk, rv);
            double want = zk::plan_cache_bytes();  // the positions: one ramp, not one per head
            for (int i = 0; i < L * KV; i++)
                want += zk::plan_side_bytes(bits, true, rk[i]) + zk::plan_side_bytes(bits, false, rv[i]) +
                        zk::plan_head_bytes(bits, bits);
            EXPECT_NEAR(c.bytes_per_token_exact(), want, 1e-9) << bits << "-bit, trial " << trial;
            EXPECT_NEAR(zk::plan_bytes(L, KV, d, bits, rk, rv), want, 1e-9);
        }
    // 2-bit: a quarter byte per code, the 4-bit layout's grids (keys: a 2-byte grid
    // code per channel; values: per block of 64 channels; two f16 steps per group of 32)
    static_assert(zk::KV_Q4_VBLOCK == 64, "the figures below");
    EXPECT_DOUBLE_EQ(zk::plan_side_bytes(2, true, 64), 16 + (2.0 * 64 + 4) / 32);
    EXPECT_DOUBLE_EQ(zk::plan_side_bytes(2, false, 64), 16 + 2.0 + 4.0 / 32);
    EXPECT_DOUBLE_EQ(zk::plan_side_bytes(2, false, 128), 32 + 2.0 * 2 + 4.0 / 32);
    EXPECT_DOUBLE_EQ(zk::plan_side_bytes(2, false, 7), 2 + 2.0 + 4.0 / 32);
    EXPECT_THROW(zk::plan_side_bytes(3, true, 8), zk::error);
}

// Loss tables of a tiny model: rank curves in two key bases, and the loss of
// every (key, value) precision pair growing as the precisions fall, with keys
// and values together losing more than apart.
zk::plan_inputs tiny_inputs(uint32_t seed, int L, int KV, int d, std::vector<int> grid) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<double> u(0.0, 1.0);
    zk::plan_inputs in;
    zk::rank_curves& c = in.curves;
    c.n_layer = L, c.n_kv = KV, c.d = d, c.grid = grid;
    const size_t nh = (size_t)L * KV, nr = grid.size();
    auto curve = [&](std::vector<double>& l) {
        l.assign(nh * nr, 0.0);
        for (size_t h = 0; h < nh; h++) {
            double x = 0;
            for (int r = (int)nr - 2; r >= 0; r--) l[h * nr + r] = x += u(rng) * u(rng) * 2;
        }
    };
    curve(c.loss_k[0]);
    curve(c.loss_k[2]);
    curve(c.loss_v);
    in.qbits = {16, 8, 4, 2};
    in.q.assign(16 * nh, 0.0);
    for (size_t h = 0; h < nh; h++) {
        const double side[2][4] = {{0, 0.001 * u(rng), 0.05 * u(rng), 0.5 * u(rng) + 0.2},
                                   {0, 0.001 * u(rng), 0.05 * u(rng), 0.5 * u(rng) + 0.2}};
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 4; j++)
                in.q[(i * 4 + j) * nh + h] = side[0][i] + side[1][j] + 0.5 * std::min(side[0][i], side[1][j]);
    }
    in.source_sha256 = "abc";
    return in;
}

// The inputs with 2-bit keys with a 1-bit tail measured too (precision code
// k_plan_tail_code, keys only, with 4- and 2-bit values): 2-bit keys' loss
// plus a random extra; NaN for the pairs a calibration does not measure. With
// zero, also that tail ending in 0-bit channels (k_plan_zero_code): the
// tail's loss plus another extra.
// wide (with zero): also the per-head widths codes, 4-bit keys with a head's own
// 2-bit channels, tail and 0-bit channels (head h, row w: 1 + h + w % 2
// four-bit channels, 2 + w % 2 two-bit in rows 2 and 3 (none in 0 and 1, as
// older files' rows), 8 one-bit, the rest 0-bit).
zk::plan_inputs with_tails(zk::plan_inputs in, uint32_t seed, bool zero = false, bool wide = false) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<double> u(0.0, 1.0);
    const size_t nh = (size_t)in.curves.n_layer * in.curves.n_kv, np = in.qbits.size();
    const size_t n2 = np + 1 + zero + (wide ? zk::k_plan_n_wide : 0);
    std::vector<double> q(n2 * n2 * nh, std::nan(""));
    for (size_t i = 0; i < np; i++)
        for (size_t j = 0; j < np; j++) std::copy_n(in.q.begin() + (i * np + j) * nh, nh, q.begin() + (i * n2 + j) * nh);
    for (size_t h = 0; h < nh; h++) {
        const double extra = 0.3 * u(rng) * u(rng), extra0 = 0.05 * u(rng) * u(rng);
        for (int bv : {4, 2}) {
            const size_t j = std::find(in.qbits.begin(), in.qbits.end(), bv) - in.qbits.begin();
            q[(np * n2 + j) * nh + h] = in.qloss(2, bv, h) + extra;
            if (zero) q[((np + 1) * n2 + j) * nh + h] = in.qloss(2, bv, h) + extra + extra0;
            for (int w = 0; wide && w < zk::k_plan_n_wide; w++)
                q[((np + 2 + w) * n2 + j) * nh + h] = in.qloss(4, bv, h) + (w % 2 ? 0.1 : 0.4) * u(rng) * u(rng);
        }
    }
    in.qbits.push_back(zk::k_plan_tail_code);
    if (zero) in.qbits.push_back(zk::k_plan_zero_code);
    for (int w = 0; wide && w < zk::k_plan_n_wide; w++) {
        in.qbits.push_back(zk::k_plan_wide_code[w]);
        in.wide[w].resize(nh);
        for (size_t h = 0; h < nh; h++) {
            const int d = in.curves.d, n4 = 1 + (int)h + w % 2, m2 = w >= 2 ? 2 + w % 2 : 0;
            in.wide[w][h] = zk::key_widths{n4, m2, 8, d - n4 - m2 - 8};
        }
    }
    in.q = q;
    return in;
}

TEST(PlanPerHead, BestOfEveryCombination) {
    const int d = 16;
    const std::vector<int> grid = {8, 16};
    int tailed = 0, zeroed = 0, widened = 0;  // heads the plans gave a tail, 0-bit channels, widths
    for (int tails : {0, 1, 2, 3})  // none, 1-bit tails, tails with 0-bit channels, and per-head widths
    for (uint32_t seed = 1; seed <= 6; seed++)
    for (const double w : {1.0, 3.7})  // rank losses weighted against quantization losses
    for (const bool kivi : {false, true})  // every precision for keys, or KIVI keys only (--kv-select)
    for (const int group : {32, 64}) {  // KIVI groups: what the grids cost
        zk::plan_inputs in = tiny_inputs(seed, 1, 2, d, grid);
        if (tails) in = with_tails(in, seed, tails >= 2, tails == 3);
        in.set_group(group);  // (no proxy here: the widths rows stay the ones set by hand)
        ASSERT_TRUE(in.per_head());
        const std::vector<int> bits = in.qbits;
        in.rank_weight = w;
        in.kivi_keys = kivi;
        const double f16 = zk::plan_f16_bytes(1, 2, d);
        for (double target : {0.12, 0.14, 0.2, 0.3, 0.45, 0.7, 1.0}) {
            // every (bits_k, bits_v, basis, rank_k, rank_v) of both heads, costed as the plan costs them
            struct opt { double loss; int64_t cost; };
            std::vector<opt> o[2];
            // (a tail: 2-bit keys, their last sens_tail(d) channels 1-bit, at full key rank;
            // with 0-bit channels, the last sens_zero(d) of them 0-bit)
            for (int h = 0; h < 2; h++)
                for (int bk : bits)
                    for (int bv : bits) {
                        if (zk::plan_keys_only(bv) || (zk::plan_keys_only(bk) && bv != 4 && bv != 2)) continue;
                        if (kivi && bk > 4) continue;
                        const bool tl = zk::plan_keys_only(bk), zc = bk == zk::k_plan_zero_code;
                        const int wi = zk::plan_wide_index(bk);
                        const int zr = wi >= 0 ? in.wide[wi][h].n0 : zc ? zk::sens_zero(d) : 0;
                        const int tn = wi >= 0 ? in.wide[wi][h].n1 : tl ? zk::sens_tail(d) - zr : 0;
                        const int md = wi >= 0 ? in.wide[wi][h].n2 : 0;
                        for (int b : {0, 2})  // quantized keys: pca only (the basis their loss is measured in)
                            for (int rk = tl ? 1 : 0; rk < 2 && (bk == 16 || b == 0); rk++)
                                for (int rv = 0; rv < 2; rv++)
                                    o[h].push_back({w * (in.curves.loss_k[b][h * 2 + rk] + in.curves.loss_v[h * 2 + rv]) +
                                                        (zc ? in.qloss(zk::k_plan_tail_code, bv, h) +
                                                                  zk::k_plan_zero_weight *
                                                                      (in.qloss(bk, bv, h) - in.qloss(zk::k_plan_tail_code, bv, h))
                                                            : in.qloss(bk, bv, h)),
                                                    zk::plan_head_cost(wi >= 0 ? 4 : tl ? 2 : bk, bv, grid[rk], grid[rv],
                                                                       tn, zr, md, group)});
                    }
            double best = std::numeric_limits<double>::infinity();
            for (const opt& a : o[0])
                for (const opt& b : o[1])
                    if (a.cost + b.cost <= (int64_t)std::floor(target * f16 - zk::plan_cache_bytes() + 1e-9)) best = std::min(best, a.loss + b.loss);
            if (!std::isfinite(best)) {
                EXPECT_THROW(zk::plan_for_target(in, target), zk::error) << "target " << target;
                continue;
            }
            const zk::kv_plan p = zk::plan_for_target(in, target);
            EXPECT_NEAR(p.loss, best, 1e-9) << "seed " << seed << " weight " << w << " target " << target << " "
                                            << p.to_json().dump();
            EXPECT_NEAR(zk::plan_predicted_loss(in, p), p.loss, 1e-12);
            EXPECT_LE(p.kv_fraction, target + 1e-12);
            EXPECT_NEAR(p.kv_fraction, zk::plan_bytes(p) / f16, 1e-12);
            EXPECT_EQ(p.source_sha256, "abc");
            EXPECT_EQ(p.group, group);
            for (size_t h = 0; h < p.tails_k.size(); h++)
                if (p.tails_k[h] > 0) {
                    const int z = p.zeros_k.empty() ? 0 : p.zeros_k[h];
                    EXPECT_EQ(p.ranks_k[h], d);
                    if (p.head_bits_k(h) == 4) {  // per-head widths: the head's own counts
                        ASSERT_EQ(tails, 3);
                        bool found = false;
                        for (int w = 0; w < zk::k_plan_n_wide; w++)
                            found |= p.tails_k[h] == in.wide[w][h].n1 && z == in.wide[w][h].n0 &&
                                     (p.mids_k.empty() ? 0 : p.mids_k[h]) == in.wide[w][h].n2;
                        EXPECT_TRUE(found) << p.to_json().dump();
                        widened++;
                        continue;
                    }
                    EXPECT_TRUE(z == 0 || z == zk::sens_zero(d));
                    EXPECT_EQ(p.tails_k[h] + z, zk::sens_tail(d));
                    EXPECT_EQ(p.head_bits_k(h), 2);
                    tailed++, zeroed += z > 0;
                }
            if (tails < 2) {
                EXPECT_TRUE(p.zeros_k.empty());
            }
            if (tails < 3) {
                EXPECT_TRUE(p.mids_k.empty());
            }
            for (size_t h = 0; h < p.mids_k.size(); h++)  // 2-bit channels only with the widths
                if (p.mids_k[h] > 0) {
                    EXPECT_TRUE(p.head_bits_k(h) == 4 && !p.tails_k.empty() && p.tails_k[h] == 8);
                }
            for (size_t h = 0; h < 2; h++) {
                if (p.head_bits_k(h) < 16) {
                    EXPECT_EQ(p.kbasis[h], 0) << "head " << h;
                }
                if (kivi) {
                    EXPECT_LE(p.head_bits_k(h), 4) << "head " << h;
                }
            }
        }
    }
    EXPECT_GT(tailed, 0);  // the search does take tails where they are the best buy
    EXPECT_GT(zeroed, 0);  // and 0-bit channels
    EXPECT_GT(widened, 0);  // and per-head widths
    std::printf("[ measured ] %d heads of the plans took a 1-bit key tail, %d of them with 0-bit channels; %d took "
                "per-head widths\n", tailed, zeroed, widened);
}

TEST(PlanPerHead, SensitiveHeadsKeepMoreBits) {
    const int L = 4, KV = 2, d = 64;
    zk::plan_inputs in = tiny_inputs(9, L, KV, d, {16, 32, 48, 64});
    const size_t nh = L * KV;
    // head 3 loses a lot once its keys are 4-bit or less, head 5 once its values are 2-bit
    for (int j = 0; j < 4; j++) in.q[(2 * 4 + j) * nh + 3] += 5.0, in.q[(3 * 4 + j) * nh + 3] += 50.0;
    for (int i = 0; i < 4; i++) in.q[(i * 4 + 3) * nh + 5] += 50.0;
    const zk::kv_plan p = zk::plan_for_target(in, 0.2);
    ASSERT_TRUE(p.mixed());
    EXPECT_GE(p.bits_k[3], 8);
    EXPECT_GE(p.bits_v[5], 4);
    int two = 0;
    for (size_t h = 0; h < nh; h++) two += (p.bits_k[h] == 2) + (p.bits_v[h] == 2);
    EXPECT_GT(two, 0) << p.describe();
    EXPECT_LE(p.kv_fraction, 0.2);
    EXPECT_NE(p.describe().find("per head"), std::string::npos);
    // for --kv-select every head's keys are KIVI: head 3 pays its 4-bit keys' loss
    {
        zk::plan_inputs k = in;
        k.kivi_keys = true;
        const zk::kv_plan s = zk::plan_for_target(k, 0.2);
        for (size_t h = 0; h < nh; h++) EXPECT_LE(s.head_bits_k(h), 4) << "head " << h;
        EXPECT_GT(s.loss, p.loss + 1.0);  // 5 for head 3, less what its freed key bytes buy elsewhere
        EXPECT_LE(s.kv_fraction, 0.2);
        EXPECT_NE(s.source.find("--kv-select"), std::string::npos);
    }
    // more room, less loss
    double last = p.loss;
    for (double t : {0.3, 0.5, 1.0}) {
        const zk::kv_plan q = zk::plan_for_target(in, t);
        EXPECT_LE(q.loss, last) << "target " << t;
        last = q.loss;
    }
    EXPECT_THROW(zk::plan_for_target(in, 0.01), zk::error);  // below 2-bit at the smallest rank
    // quantization that costs more than any rank cut: one precision (16) for
    // every head, written as a version-1 plan
    for (size_t i = nh; i < in.q.size(); i++) in.q[i] = 100.0;
    const zk::kv_plan r = zk::plan_for_target(in, 0.6);
    EXPECT_FALSE(r.mixed());
    EXPECT_EQ(r.bits, 16);
    EXPECT_GT(r.rate, 0.3);
    EXPECT_EQ(r.to_json()["zack_plan"], 1);
}

// The heavier rank losses weigh against quantization losses, the fewer
// dimensions a plan cuts for the same bytes (it quantizes harder instead).
TEST(PlanPerHead, RankWeightTradesRanksForBits) {
    zk::plan_inputs in = tiny_inputs(11, 4, 2, 64, {16, 32, 48, 64});
    auto first_rate = [&](double t) {
        zk::plan_inputs a = in;
        a.rank_weight = 0.2;
        return zk::plan_for_target(a, t).rate;
    };
    for (double t : {0.15, 0.25, 0.4}) {
        double last = 2.0;
        for (const double w : {0.2, 1.0, 5.0, 50.0}) {
            in.rank_weight = w;
            const zk::kv_plan p = zk::plan_for_target(in, t);
            EXPECT_LE(p.rate, last + 1e-12) << "target " << t << " weight " << w;
            EXPECT_LE(p.kv_fraction, t);
            last = p.rate;
        }
        EXPECT_LT(last, first_rate(t)) << "target " << t << ": the weight changed nothing";
    }
}

TEST(PlanFile, PerHeadRoundTripAndBadInput) {
    zk::plan_inputs in = tiny_inputs(9, 4, 2, 64, {16, 32, 48, 64});
    for (int j = 0; j < 4; j++) in.q[(3 * 4 + j) * 8 + 3] += 50.0;
    const zk::kv_plan p = zk::plan_for_target(in, 0.2);
    ASSERT_TRUE(p.mixed());
    const nlohmann::json j = p.to_json();
    EXPECT_EQ(j["zack_plan"], 2);
    const zk::kv_plan q = zk::kv_plan::from_json(j, "t");
    EXPECT_EQ(q.bits_k, p.bits_k);
    EXPECT_EQ(q.bits_v, p.bits_v);
    EXPECT_EQ(q.ranks_k, p.ranks_k);
    EXPECT_EQ(q.kbasis, p.kbasis);
    EXPECT_NEAR(zk::plan_bytes(q), zk::plan_bytes(p), 1e-12);
    auto bad = [&](const std::function<void(nlohmann::json&)>& f) {
        nlohmann::json b = j;
        f(b);
        return b;
    };
    EXPECT_THROW(zk::kv_plan::from_json(bad([](nlohmann::json& b) { b["bits_k"][0] = 3; }), "t"), zk::error);
    EXPECT_THROW(zk::kv_plan::from_json(bad([](nlohmann::json& b) { b["bits_v"].erase(0); }), "t"), zk::error);
    EXPECT_THROW(zk::kv_plan::from_json(bad([](nlohmann::json& b) { b["zack_plan"] = 3; }), "t"), zk::error);
    EXPECT_THROW(zk::kv_plan::from_json(bad([](nlohmann::json& b) { b["bits"] = 5; }), "t"), zk::error);
    // 1-bit key tails: round trip, their bytes as the cache counts them, and bad tables
    zk::kv_plan t = p;
    t.tails_k.assign(p.bits_k.size(), 0);
    int tailed = 0;
    for (size_t h = 0; h < t.tails_k.size(); h++)
        if (p.bits_k[h] <= 4) t.tails_k[h] = 8 * (int)(h + 1), tailed++;  // some past the head's rank (clamped)
    ASSERT_GT(tailed, 0);
    const nlohmann::json tj = t.to_json();
    const zk::kv_plan tq = zk::kv_plan::from_json(tj, "t");
    EXPECT_EQ(tq.tails_k, t.tails_k);
    EXPECT_NE(t.describe().find("1-bit key tails in " + std::to_string(tailed) + " heads"), std::string::npos)
        << t.describe();
    zk::kv_cache_params kp;
    kp.bits_k = t.bits_k, kp.bits_v = t.bits_v, kp.tails_k = t.tails_k;
    const zk::kv_cache c(t.n_layer, t.n_kv, 256, kp, t.ranks_k, t.ranks_v);
    EXPECT_NEAR(c.bytes_per_token_exact(), zk::plan_bytes(t), 1e-9);
    EXPECT_LT(zk::plan_bytes(t), zk::plan_bytes(p));
    auto badt = [&](const std::function<void(nlohmann::json&)>& f) {
        nlohmann::json b = tj;
        f(b);
        return b;
    };
    EXPECT_THROW(zk::kv_plan::from_json(badt([](nlohmann::json& b) { b["tails_k"].erase(0); }), "t"), zk::error);
    EXPECT_THROW(zk::kv_plan::from_json(badt([](nlohmann::json& b) { b["tails_k"][0] = -1; }), "t"), zk::error);
    EXPECT_THROW(zk::kv_plan::from_json(badt([](nlohmann::json& b) { b["tails_k"][0] = 129; }), "t"), zk::error);
    const size_t wide = (size_t)(std::find_if(p.bits_k.begin(), p.bits_k.end(), [](int b) { return b > 4; }) -
                                 p.bits_k.begin());
    if (wide < p.bits_k.size()) {  // a tail on 8- or 16-bit keys
        EXPECT_THROW(zk::kv_plan::from_json(badt([&](nlohmann::json& b) { b["tails_k"][wide] = 8; }), "t"), zk::error);
    }
    // 0-bit key channels after the tails: the same
    zk::kv_plan z = t;
    z.zeros_k.assign(p.bits_k.size(), 0);
    int zeroed = 0;
    for (size_t h = 0; h < z.zeros_k.size(); h++)
        if (p.bits_k[h] <= 4) z.zeros_k[h] = std::min(12, p.head_dim - t.tails_k[h]), zeroed += z.zeros_k[h] > 0;
    ASSERT_GT(zeroed, 0);
    const nlohmann::json zj = z.to_json();
    const zk::kv_plan zq = zk::kv_plan::from_json(zj, "t");
    EXPECT_EQ(zq.zeros_k, z.zeros_k);
    EXPECT_NE(z.describe().find("0-bit key channels in " + std::to_string(zeroed) + " heads"), std::string::npos)
        << z.describe();
    kp.zeros_k = z.zeros_k;
    const zk::kv_cache cz(z.n_layer, z.n_kv, 256, kp, z.ranks_k, z.ranks_v);
    EXPECT_NEAR(cz.bytes_per_token_exact(), zk::plan_bytes(z), 1e-9);
    EXPECT_LT(zk::plan_bytes(z), zk::plan_bytes(t));
    auto badz = [&](const std::function<void(nlohmann::json&)>& f) {
        nlohmann::json b = zj;
        f(b);
        return b;
    };
    EXPECT_THROW(zk::kv_plan::from_json(badz([](nlohmann::json& b) { b["zeros_k"].erase(0); }), "t"), zk::error);
    EXPECT_THROW(zk::kv_plan::from_json(badz([](nlohmann::json& b) { b["zeros_k"][0] = -1; }), "t"), zk::error);
    EXPECT_THROW(zk::kv_plan::from_json(badz([](nlohmann::json& b) { b["zeros_k"][0] = 65; }), "t"), zk::error);
    if (wide < p.bits_k.size()) {
        EXPECT_THROW(zk::kv_plan::from_json(badz([&](nlohmann::json& b) { b["zeros_k"][wide] = 8; }), "t"), zk::error);
    }
    // 2-bit channels of 4-bit keys before the tails: the same, and only on 4-bit keys
    zk::kv_plan m = z;
    if (std::find(m.bits_k.begin(), m.bits_k.end(), 4) == m.bits_k.end()) m.bits_k[0] = 4;
    zk::kv_plan m0 = m;  // the same without them
    m.mids_k.assign(m.bits_k.size(), 0);
    int mids = 0;
    size_t not4 = m.bits_k.size();
    for (size_t h = 0; h < m.mids_k.size(); h++) {
        if (m.bits_k[h] == 4)
            m.mids_k[h] = std::min(10, m.head_dim - m.tails_k[h] - m.zeros_k[h]), mids += m.mids_k[h] > 0;
        else
            not4 = h;
    }
    ASSERT_GT(mids, 0);
    const nlohmann::json mj = m.to_json();
    const zk::kv_plan mq = zk::kv_plan::from_json(mj, "t");
    EXPECT_EQ(mq.mids_k, m.mids_k);
    EXPECT_NE(m.describe().find("2-bit channels in the 4-bit keys of " + std::to_string(mids) + " heads"),
              std::string::npos)
        << m.describe();
    zk::kv_cache_params km;
    km.bits_k = m.bits_k, km.bits_v = m.bits_v, km.tails_k = m.tails_k, km.zeros_k = m.zeros_k, km.mids_k = m.mids_k;
    const zk::kv_cache cm(m.n_layer, m.n_kv, 256, km, m.ranks_k, m.ranks_v);
    EXPECT_NEAR(cm.bytes_per_token_exact(), zk::plan_bytes(m), 1e-9);
    EXPECT_LT(zk::plan_bytes(m), zk::plan_bytes(m0));
    auto badm = [&](const std::function<void(nlohmann::json&)>& f) {
        nlohmann::json b = mj;
        f(b);
        return b;
    };
    EXPECT_THROW(zk::kv_plan::from_json(badm([](nlohmann::json& b) { b["mids_k"].erase(0); }), "t"), zk::error);
    EXPECT_THROW(zk::kv_plan::from_json(badm([](nlohmann::json& b) { b["mids_k"][0] = -1; }), "t"), zk::error);
    EXPECT_THROW(zk::kv_plan::from_json(badm([](nlohmann::json& b) { b["mids_k"][0] = 65; }), "t"), zk::error);
    if (not4 < m.bits_k.size()) {  // 2-bit channels in 2-, 8- or 16-bit keys
        EXPECT_THROW(zk::kv_plan::from_json(badm([&](nlohmann::json& b) { b["mids_k"][not4] = 4; }), "t"), zk::error);
    }
    // KIVI groups of 64: round trip, the bytes as such a cache counts them (grids and steps
    // a group of 64), plans without the key read as groups of 32, and bad groups
    zk::kv_plan g = m;
    g.group = 64;
    const nlohmann::json gj = g.to_json();
    EXPECT_EQ(zk::kv_plan::from_json(gj, "t").group, 64);
    EXPECT_NE(g.describe().find("KIVI groups of 64 tokens"), std::string::npos) << g.describe();
    EXPECT_EQ(m.describe().find("KIVI groups"), std::string::npos) << m.describe();
    km.group = 64;
    const zk::kv_cache cg(g.n_layer, g.n_kv, 256, km, g.ranks_k, g.ranks_v);
    EXPECT_NEAR(cg.bytes_per_token_exact(), zk::plan_bytes(g), 1e-9);
    EXPECT_LT(zk::plan_bytes(g), zk::plan_bytes(m));
    nlohmann::json old = gj;
    old.erase("group");
    EXPECT_EQ(zk::kv_plan::from_json(old, "t").group, 32);
    for (const int bad_group : {0, -32, 257}) {
        nlohmann::json b = gj;
        b["group"] = bad_group;
        EXPECT_THROW(zk::kv_plan::from_json(b, "t"), zk::error) << bad_group;
    }
    // a tier: round trip, described, not in the per-token bytes; absent = none; bad tiers
    zk::kv_plan ti = g;
    ti.tier = 1920;
    const nlohmann::json tij = ti.to_json();
    EXPECT_EQ(tij["tier"], 1920);
    EXPECT_FALSE(gj.contains("tier"));
    EXPECT_EQ(zk::kv_plan::from_json(tij, "t").tier, 1920);
    EXPECT_EQ(zk::kv_plan::from_json(gj, "t").tier, 0);
    EXPECT_NE(ti.describe().find("a 4-bit tier of 1920 tokens"), std::string::npos) << ti.describe();
    EXPECT_EQ(g.describe().find("tier"), std::string::npos) << g.describe();
    EXPECT_EQ(zk::plan_bytes(ti), zk::plan_bytes(g));
    for (const int bad_tier : {-64, 96}) {  // (96: not a multiple of the plan's group of 64)
        nlohmann::json b = tij;
        b["tier"] = bad_tier;
        EXPECT_THROW(zk::kv_plan::from_json(b, "t"), zk::error) << bad_tier;
    }
    nlohmann::json te = tij;
    te["evict"] = "snapkv", te["budget"] = 512;
    EXPECT_THROW(zk::kv_plan::from_json(te, "t"), zk::error);
}

// Files from before per-head precision (both sides at 8 or 4 bits): one
// precision for every head, as before.
TEST(PlanPerHead, OlderFilesGetOnePrecision) {
    zk::plan_inputs in = tiny_inputs(2, 2, 2, 32, {8, 16, 24, 32});
    const size_t nh = 4;
    std::vector<double> q(9 * nh, NAN);
    for (size_t h = 0; h < nh; h++) q[h] = 0, q[4 * nh + h] = 0.001, q[8 * nh + h] = 0.01;
    in.qbits = {16, 8, 4};
    in.q = q;
    EXPECT_FALSE(in.per_head());
    EXPECT_THROW(in.qloss(8, 4, 0), zk::error);
    const zk::kv_plan p = zk::plan_for_target(in, 0.3);
    EXPECT_FALSE(p.mixed());
    EXPECT_EQ(p.bits, 4);
    EXPECT_LE(p.kv_fraction, 0.3);
}

// session_key8_hazards names exactly the heads whose keys run at 8 bits in the
// pca basis with a measured 8-bit key loss above 1 (the values' 16-bit column).
TEST(PlanPerHead, EightBitKeyHazardsFromTheSensitivityTable) {
    const int L = 2, KV = 2;
    const size_t nh = L * KV, np = 4;
    zk::zack_info z;
    z.sens_qbits = {16, 8, 4, 2};
    z.sens_q.assign(np * np * nh, 0.001f);
    auto q = [&](int i, int j, size_t h) -> float& { return z.sens_q[((size_t)i * np + j) * nh + h]; };
    q(1, 0, 0) = 38.0f;  // layer 0, head 0: 8-bit keys wreck it
    q(1, 2, 0) = 4.0f;   // (with 4-bit values: not the column read)
    q(1, 0, 3) = 0.5f;   // layer 1, head 1: lossy but below 1
    q(2, 0, 0) = 0.007f;
    zk::kv_cache_params kv;
    kv.bits = 8;
    std::vector<std::string> bad = zk::session_key8_hazards(z, kv, {}, L, KV);
    ASSERT_EQ(bad.size(), 1u);
    EXPECT_EQ(bad[0], "layer 0, KV head 0: loss 38 at 8 bits, 0.007 at 4");
    // 4-bit keys there, or that head in another key basis: nothing to say
    kv.bits_k = {4, 8, 8, 8};
    kv.bits_v = {8, 8, 8, 8};
    EXPECT_TRUE(zk::session_key8_hazards(z, kv, {}, L, KV).empty());
    kv.bits_k = {8, 8, 8, 8};
    EXPECT_TRUE(zk::session_key8_hazards(z, kv, {2, 0, 0, 0}, L, KV).empty());
    EXPECT_EQ(zk::session_key8_hazards(z, kv, {0, 0, 0, 0}, L, KV).size(), 1u);
    // a file without the quantized-cache table (or a mismatched one): nothing
    z.sens_q.resize(3);
    EXPECT_TRUE(zk::session_key8_hazards(z, kv, {}, L, KV).empty());
}

}  // namespace
