// Decode-time key-group selection (engine/kv_select.h, kernel_attention_group_bounds):
//   - at spread 1 a group's bound is at least the score of every key the group
//     holds (the keys as the cache reads them back), for 4-bit keys (also with
//     2-bit channels, a tail and 0-bit channels) and 2-bit keys with a 1-bit
//     tail and 0-bit channels, G = 1, 6 and 9 query heads,
//     128 and 124 channels; at spreads 1, 0.5 (the one selection uses) and 0
//     the estimate equals its CPU twin, sum_c q_c (lo_c + hi_c) / 2 + spread
//     |q_c| (hi_c - lo_c) / 2 over the grids decoded one channel at a time in
//     double (relative 1e-5), which at spread 1 is sum_c max(q_c lo_c, q_c hi_c);
//   - the partial over a list of runs (kernel_attention_runs) equals the
//     ranges' partials merged (4- and 2-bit keys with tails and 0-bit
//     channels, runs cut inside groups, into the 16-bit window, empty, into
//     and across a 4-bit tier; float sums in another order: relative 1e-4, the
//     max exact);
//   - the group holding a key planted along the heads' summed queries is chosen at
//     a budget of two groups; runs ascend, hold the residual window (and a
//     tier before it), and count their slots; a budget at or past the
//     quantized slots does not apply;
//   - 8-bit and 16-bit keys: kernel_attention_scores equals the range kernel's
//     logits bit for bit (also 4- and 2-bit); the pages chosen hold the most
//     softmax mass by the float reference's scores (within 0.01 a head), the
//     planted key's among them;
//   - a kept choice serves later steps with the slots appended since (also
//     when a group leaves a tier meanwhile), and is stale after a compaction;
//   - a session on the tiny random model (16-, 8-, 4- and 2-bit caches, 2-bit
//     with a 64-token tier, attended to like the window): a
//     budget that keeps every slot gives the logits of no selection bit for
//     bit; a small budget changes them and stays finite.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "engine/kv_cache.h"
#include "engine/kv_select.h"
#include "engine/model.h"
#include "engine/session.h"
#include "ggml-like/error.h"
#include "kernels/attention.h"
#include "tests/kv_test_data.h"
#include "tests/tiny_model.h"

using namespace zk;
using zk_test::make_rows;

namespace {

struct block_case {
    int bits, tail, zero;
    int mid = 0;  // 2-bit channels of 4-bit keys
    int tier = 0;  // tokens of a 4-bit tier before the window (kv_cache_params::tier)
};

// n random tokens of rank r into head 0 of c (keys from seed, values from
// seed + 1), in chunks of 41 tokens and then one at a time; plant: a key,
// times 4, at slot plant_at.
void fill_block(kv_cache& c, int n, int r, uint32_t seed, const float* plant, int plant_at) {
    std::vector<float> K = make_rows(n, r, seed), V = make_rows(n, r, seed + 1);
    if (plant)
        for (int ch = 0; ch < r; ch++) K[(size_t)plant_at * r + ch] = 4.0f * plant[ch];
    std::vector<int32_t> pos(n);
    for (int t = 0; t < n; t++) pos[t] = t;
    for (int t = 0; t < n;) {
        const int k = std::min(n - t, t < 200 ? 41 : 1);
        c.append(0, 0, k, &K[(size_t)t * r], r, &V[(size_t)t * r], r, &pos[t]);
        t += k;
    }
}

// A one-head cache of n tokens at rank r (16-bit residual window of one group),
// room for `more`; plant: the slot, then its key.
kv_cache make_cache(const block_case& bc, int n, int r, uint32_t seed, const std::vector<float>* plant = nullptr,
                    int more = 0) {
    kv_cache_params p;
    p.bits_k = {bc.bits};
    p.bits_v = {bc.bits};
    p.residual = 32;
    p.tails_k = {bc.tail};
    p.zeros_k = {bc.zero};
    p.mids_k = {bc.mid};
    p.tier = bc.tier;
    kv_cache c(1, 1, n + more, p, {r}, {r});
    fill_block(c, n, r, seed, plant ? plant->data() + 1 : nullptr, plant ? (int)(*plant)[0] : 0);
    return c;
}

std::vector<float> random_q(int G, int r, uint32_t seed) {
    std::mt19937 g(seed);
    std::normal_distribution<float> N(0, 1);
    std::vector<float> q((size_t)G * r);
    for (auto& x : q) x = N(g);
    return q;
}

TEST(KvSelect, BoundsHoldEveryKeyAndMatchTheGrids) {
    const int n = 400;
    // r = 124: coded channels past a multiple of 8; G = 9: past the fused
    // kernel's heads (the generic path)
    for (const int r : {128, 124})
    for (const block_case bc : {block_case{4, 0, 0}, block_case{2, 0, 0}, block_case{2, 72, 24}, block_case{2, 60, 23},
                                block_case{4, 40, 20, 36}})
        for (int G : {1, 6, 9})
            for (const float spread : {1.0f, k_select_spread, 0.0f}) {
                kv_cache c = make_cache(bc, n, r, 11 + bc.bits + bc.tail);
                const attn_kv_view kv = c.view(0, 0);
                ASSERT_GT(kv.n_groups, 8);
                ASSERT_EQ(kv.k.tail, bc.tail);
                ASSERT_EQ(kv.k.zero, bc.zero);
                ASSERT_EQ(kv.k.mid, bc.mid);
                const std::vector<float> q = random_q(G, r, 5 + G);
                const int32_t qpos = n - 1;
                const float scale = 0.0884f;
                const attn_q_view qv{q.data(), 0, r, G, 1, &qpos, scale};
                std::vector<float> bound((size_t)kv.n_groups * G), scratch(kernel_attention_select_scratch(G, r));
                kernel_attention_group_bounds(kv, qv, 0, kv.n_groups, spread, bound.data(), scratch.data());
                std::vector<float> est((size_t)kv.n_groups * G);
                kernel_attention_group_estimates(kv, qv, 0, kv.n_groups, spread, est.data(), scratch.data());
                const int zero = kv.k.zero, rc = r - zero, hm = rc - kv.k.tail, h = hm - kv.k.mid;
                const int gw = kv_key_grid_words(r, zero);
                std::vector<float> kd(r), vd(r);
                double worst_twin = 0, mean_slack = 0, worst_est = 0, mean_tol = 0;
                for (int64_t g = 0; g < kv.n_groups; g++) {
                    const uint16_t* grid = kv.k.scale + g * gw;
                    const float ds = fp16_to_fp32(kv.k.min[g * KV_GRID_STEPS]);
                    const float dm = fp16_to_fp32(kv.k.min[g * KV_GRID_STEPS + 1]);
                    for (int j = 0; j < G; j++) {
                        const float* qj = q.data() + j * r;
                        // the twin: each channel's range from its grid, its centre and half-width
                        double twin = 0;
                        for (int ch = 0; ch < r; ch++) {
                            double lo, hi;
                            if (ch < rc) {
                                lo = kivi_grid_min(grid[ch], dm);
                                hi = lo + kivi_grid_scale(grid[ch], ds) * (ch < h ? (1 << bc.bits) - 1 : ch < hm ? 3 : 1);
                            } else {
                                lo = hi = dm * (double)((const int8_t*)(grid + rc))[ch - rc];
                            }
                            twin += qj[ch] * (lo + hi) / 2 + spread * std::fabs(qj[ch]) * (hi - lo) / 2;
                        }
                        twin *= scale;
                        const double b = bound[j * kv.n_groups + g];
                        worst_twin = std::max(worst_twin, std::fabs(b - twin) / std::max(1.0, std::fabs(twin)));
                        // the integer estimate: within half a rounding step of
                        // each weight (63 levels a side, the coarser build)
                        // times the codes it multiplies
                        double w_max = 0, q_max = 0, s_codes = 0, m_codes = 0;
                        for (int ch = 0; ch < r; ch++) {
                            q_max = std::max(q_max, (double)std::fabs(qj[ch]));
                            if (ch < rc) {
                                const double L = ch < h ? (1 << bc.bits) - 1 : ch < hm ? 3 : 1;
                                w_max = std::max(w_max, std::fabs(0.5 * (qj[ch] + spread * std::fabs(qj[ch])) * L));
                                s_codes += grid[ch] & 0xff;
                                m_codes += std::abs((int)(int8_t)(grid[ch] >> 8));
                            } else {
                                m_codes += std::abs((int)((const int8_t*)(grid + rc))[ch - rc]);
                            }
                        }
                        const double tol = scale * (ds * w_max / 63 / 2 * s_codes + dm * q_max / 63 / 2 * m_codes);
                        const double err =
                            std::fabs(est[j * kv.n_groups + g] - twin) - 1e-5 * std::max(1.0, std::fabs(twin));
                        worst_est = std::max(worst_est, err / tol);
                        mean_tol += tol;
                        // every key the group holds scores at most its bound
                        double best = -1e30;
                        for (int64_t s = kv.group_start[g]; s < kv.group_start[g + 1]; s++) {
                            c.read_slot(0, 0, s, kd.data(), vd.data());
                            double d = 0;
                            for (int ch = 0; ch < r; ch++) d += (double)qj[ch] * kd[ch];
                            best = std::max(best, d * scale);
                            if (spread == 1.0f) {
                                EXPECT_LE(d * scale, b + 1e-4 * std::max(1.0, std::fabs(b)))
                                    << bc.bits << "-bit tail " << bc.tail << " zero " << bc.zero << " G " << G
                                    << " group " << g << " slot " << s;
                            }
                        }
                        mean_slack += b - best;
                    }
                }
                EXPECT_LT(worst_twin, 1e-5) << bc.bits << "-bit tail " << bc.tail << " zero " << bc.zero << " mid "
                                            << bc.mid << " spread " << spread;
                EXPECT_LE(worst_est, 1.0) << "integer estimate: " << bc.bits << "-bit tail " << bc.tail << " zero "
                                          << bc.zero << " G " << G << " spread " << spread;
                std::printf("[ measured ] %d-bit keys, 2-bit %d, tail %d, zero %d, r %d, G %d, spread %.1f: estimate "
                            "over the best key of its group by %.3f on average (scaled scores), vs the twin %.1e; "
                            "integer estimate's worst error %.2f of its bound (%.4f on average)\n",
                            bc.bits, bc.mid, bc.tail, bc.zero, r, G, spread, mean_slack / (kv.n_groups * G), worst_twin,
                            worst_est, mean_tol / (kv.n_groups * G));
            }
}

TEST(KvSelect, RunsEqualTheirRangesMerged) {
    const int n = 300, G = 6;
    // runs: whole groups, groups cut inside, one slot, an empty run, runs into
    // and inside the 16-bit window (the last 32 slots), the whole block, and
    // 134 one-slot runs (more than the value kernel takes in one call)
    std::vector<std::vector<int64_t>> cases = {
        {0, 32, 64, 96, 160, 192}, {5, 40, 41, 42, 100, 100, 250, 300}, {0, 300}, {290, 300}, {31, 33, 200, 275}};
    cases.emplace_back();
    for (int64_t s = 1; s < n; s += 3) cases.back().insert(cases.back().end(), {s, s + 1});
    // value rows of one half-chunk, one chunk and two (kivi_values_unit's HALF, plain and SPLIT paths)
    for (const int r : {32, 64, 128})
    for (const block_case bc : {block_case{4, 0, 0}, block_case{2, 32, 0}, block_case{2, 24, 8}, block_case{4, 8, 4, 12},
                                block_case{2, 24, 8, 0, 64}, block_case{4, 8, 4, 12, 96}}) {
        if (bc.tail + bc.zero + bc.mid >= r) continue;
        const std::vector<float> q = random_q(G, r, 9);
        const int32_t qpos = n - 1;
        const attn_q_view qv{q.data(), 0, r, G, 1, &qpos, 0.125f};
        std::vector<float> scratch(kernel_attention_scratch(G, n, r, r, 0));
        kv_cache c = make_cache(bc, n, r, 3);
        const attn_kv_view kv = c.view(0, 0);
        ASSERT_EQ(kv.tier != nullptr, bc.tier > 0);
        for (const std::vector<int64_t>& runs : cases) {
            const int64_t nr = (int64_t)runs.size() / 2;
            std::vector<float> joined((size_t)G * (2 + r)), out_joined((size_t)G * r);
            const attn_partial pj{joined.data(), joined.data() + G, joined.data() + 2 * G};
            kernel_attention_runs(kv, runs.data(), nr, qv, pj, scratch.data());
            kernel_attention_merge(&pj, 1, 1, G, r, out_joined.data(), 0, r);
            std::vector<std::vector<float>> bufs((size_t)nr, std::vector<float>((size_t)G * (2 + r)));
            std::vector<attn_partial> parts;
            for (int64_t i = 0; i < nr; i++) {
                const attn_partial p{bufs[i].data(), bufs[i].data() + G, bufs[i].data() + 2 * G};
                kernel_attention_range(kv, runs[2 * i], runs[2 * i + 1], qv, p, scratch.data());
                parts.push_back(p);
            }
            std::vector<float> out_parts((size_t)G * r);
            kernel_attention_merge(parts.data(), (int)nr, 1, G, r, out_parts.data(), 0, r);
            for (int j = 0; j < G; j++) {
                float mx = -INFINITY;
                for (const attn_partial& p : parts) mx = std::max(mx, p.m[j]);
                EXPECT_FLOAT_EQ(joined[j], mx) << "m of head " << j << ": the largest score is exact";
            }
            for (size_t i = 0; i < out_parts.size(); i++)
                EXPECT_NEAR(out_joined[i], out_parts[i], 1e-4 * (1 + std::fabs(out_parts[i])))
                    << "r " << r << ", " << bc.bits << "-bit tail " << bc.tail << " zero " << bc.zero << " tier "
                    << bc.tier << ", runs from " << runs[0] << " (" << nr << " runs)"
                    << ", element " << i;
        }
    }
}

TEST(KvSelect, ChoosesThePlantedGroupAndKeepsTheWindow) {
    const int n = 500, r = 128, G = 6, planted = 233;
    const std::vector<float> q = random_q(G, r, 21);
    std::vector<float> plant(1 + r);
    plant[0] = planted;
    // along the sum of the heads' queries: a key they all weigh (each head's
    // own best group competes for a budget of two groups; the heads' sum decides)
    for (int ch = 0; ch < r; ch++) {
        for (int j = 0; j < G; j++) plant[1 + ch] += q[j * r + ch];
        plant[1 + ch] *= 0.25f;
    }
    for (const int tier : {0, 64}) {  // a tier is attended to like the window
        kv_cache c = make_cache({2, 72, 24, 0, tier}, n, r, 17, &plant);
        const attn_kv_view kv = c.view(0, 0);
        ASSERT_EQ(kv.tier != nullptr, tier > 0);
        const int32_t qpos = n - 1;
        const attn_q_view qv{q.data(), 0, r, G, 1, &qpos, 0.0884f};
        const int64_t nq = kv.group_start[kv.n_groups];
        EXPECT_FALSE(kv_select_applies(kv, nq));
        EXPECT_TRUE(kv_select_applies(kv, nq - 1));
        for (int64_t select : {int64_t(64), nq - 1}) {
            std::vector<float> fs(kv_select_float_scratch(kv, G));
            std::vector<int64_t> is(kv_select_index_scratch(kv)), runs(2 * kv_select_max_runs(kv, select));
            int64_t slots = 0;
            const int64_t nr = kv_select_runs(kv, qv, select, fs.data(), is.data(), runs.data(), &slots);
            ASSERT_GT(nr, 0);
            int64_t count = 0;
            bool has_planted = false;
            for (int64_t i = 0; i < nr; i++) {
                EXPECT_LT(runs[2 * i], runs[2 * i + 1]);
                if (i > 0) {
                    EXPECT_GT(runs[2 * i], runs[2 * i - 1]) << "runs ascend and do not touch";
                }
                count += runs[2 * i + 1] - runs[2 * i];
                has_planted |= runs[2 * i] <= planted && planted < runs[2 * i + 1];
            }
            EXPECT_EQ(count, slots);
            EXPECT_EQ(runs[2 * nr - 1], kv.n_slots) << "the residual window is attended to";
            EXPECT_TRUE(has_planted) << "budget " << select;
            if (select >= nq - 1) {  // every group: one run over the block
                EXPECT_EQ(nr, 1);
                EXPECT_EQ(slots, kv.n_slots);
            } else {
                EXPECT_EQ(slots, 2 * kv.group + (kv.n_slots - nq)) << "tier " << tier;
            }
        }
    }
}

TEST(KvSelect, SessionLogits) {
    zk_test::tiny_model_params tp;
    const zk_test::tiny_model_loaded tiny(tp);
    const std::vector<int32_t> toks = zk_test::tiny_model_tokens(400);
    auto logits = [&](const model& m, int64_t select, int bits, int tier) {
        session_params sp;
        sp.n_ctx = 512;
        sp.n_threads = 2;
        sp.kv.bits = bits;
        sp.kv.residual = 32;
        sp.kv.tier = tier;
        sp.kv.select = select;
        return zk_test::tiny_model_session_logits(m, sp, toks, 200, false);
    };
    const model& m = tiny.get();
    // 2-bit with a 64-token tier: groups leave the tier while the choices are
    // kept (--kv-select-every 4), and the tier is attended to like the window
    for (const auto& [bits, tier] : {std::pair{16, 0}, {8, 0}, {4, 0}, {2, 0}, {2, 64}}) {
        const std::vector<float> all = logits(m, 0, bits, tier);
        EXPECT_EQ(logits(m, 512, bits, tier), all)
            << bits << "-bit, tier " << tier << ": a budget past the context selects everything";
        const std::vector<float> few = logits(m, 64, bits, tier);
        for (float x : few) ASSERT_TRUE(std::isfinite(x));
        EXPECT_NE(few, all) << bits << "-bit, tier " << tier << ": a budget of 64 tokens attends to less";
    }
}

// A head's kept choice (kv_select_recall): the same runs while nothing is
// appended; the slots appended since joined to them; none once the block is
// compacted or cleared, or before a choice is kept. A step chooses afresh at
// one position in `every` on each layer.
TEST(KvSelect, RecallKeepsTheChoiceAndJoinsNewSlots) {
    const int n = 400, r = 64, G = 2;
    // 4-bit; 2-bit with a 64-token tier, from which a group leaves into the
    // block's own codes while the 40 tokens are appended (the choice's slots keep their numbers)
    for (const block_case bc : {block_case{4, 0, 0}, block_case{2, 0, 0, 0, 64}}) {
        kv_cache c = make_cache(bc, n, r, 3, nullptr, 40);
        const std::vector<float> q = random_q(G, r, 9);
        const int32_t qpos = n - 1;
        const attn_q_view qv{q.data(), 0, r, G, 1, &qpos, 0.125f};
        const int64_t select = 64;
        attn_kv_view kv = c.view(0, 0);
        std::vector<float> fs(kv_select_float_scratch(kv, G));
        std::vector<int64_t> is(kv_select_index_scratch(kv)), runs(2 * kv_select_max_runs(kv, select));
        std::vector<int64_t> again(runs.size());
        int64_t slots = 0, slots2 = 0;
        kv_block& blk = c.block(0, 0);
        EXPECT_EQ(kv_select_recall(blk.select_memo, kv, blk.edits, again.data(), &slots2), -1) << "nothing kept yet";
        const int64_t nr = kv_select_runs(kv, qv, select, fs.data(), is.data(), runs.data(), &slots);
        ASSERT_GT(nr, 1);
        kv_select_remember(blk.select_memo, kv, blk.edits, runs.data(), nr);
        ASSERT_EQ(kv_select_recall(blk.select_memo, kv, blk.edits, again.data(), &slots2), nr);
        EXPECT_EQ(std::vector<int64_t>(again.begin(), again.begin() + 2 * nr),
                  std::vector<int64_t>(runs.begin(), runs.begin() + 2 * nr));
        EXPECT_EQ(slots2, slots);
        // 40 tokens more (a new group among them): joined to the residual window's run
        const std::vector<float> K = make_rows(40, r, 77);
        std::vector<int32_t> pos(40);
        for (int t = 0; t < 40; t++) pos[t] = n + t;
        const int64_t nq = kv.group_start[kv.n_groups];
        c.append(0, 0, 40, K.data(), r, K.data(), r, pos.data());
        kv = c.view(0, 0);
        ASSERT_GT(kv.group_start[kv.n_groups], nq) << "a group joined the block's codes";
        ASSERT_EQ(kv_select_recall(blk.select_memo, kv, blk.edits, again.data(), &slots2), nr);
        EXPECT_EQ(std::vector<int64_t>(again.begin(), again.begin() + 2 * nr - 1),
                  std::vector<int64_t>(runs.begin(), runs.begin() + 2 * nr - 1));
        EXPECT_EQ(again[2 * nr - 1], kv.n_slots);
        EXPECT_EQ(slots2, slots + 40);
        if (bc.tier) continue;  // a tiered block is never compacted (kv_cache::compact refuses)
        // a compaction moves slots: the choice is stale
        std::vector<uint8_t> keep(kv.n_slots, 1);
        keep[0] = 0;
        c.compact(0, 0, keep.data());
        EXPECT_EQ(kv_select_recall(blk.select_memo, c.view(0, 0), blk.edits, again.data(), &slots2), -1);
    }
    for (int every : {1, 4, 7})
        for (int layer : {0, 1, 27})
            for (int32_t p0 : {0, 13, 1000}) {
                int due = 0;
                for (int32_t p = p0; p < p0 + every; p++) due += kv_select_due(layer, p, every);
                EXPECT_EQ(due, 1) << "every " << every << ", layer " << layer << " from position " << p0;
            }
}

// A one-head cache of n tokens of 8-bit codes or f16 rows, rank r, with key
// `plant` (times 4) at slot plant_at.
kv_cache make_plain_cache(int bits, int n, int r, uint32_t seed, const std::vector<float>& plant, int plant_at) {
    kv_cache_params p;
    p.bits = bits;
    kv_cache c(1, 1, n, p, {r}, {r});
    fill_block(c, n, r, seed, plant.data(), plant_at);
    return c;
}

// kernel_attention_scores leaves the same scores the range kernel writes as logits.
TEST(KvSelect, ScoresEqualTheRangeLogits) {
    const int n = 300, r = 128, G = 6;
    const std::vector<float> q = random_q(G, r, 5);
    const int32_t qpos = n - 1;
    const attn_q_view qv{q.data(), 0, r, G, 1, &qpos, 0.0884f};
    for (const int bits : {16, 8, 4, 2}) {
        const kv_cache c = bits >= 8 ? make_plain_cache(bits, n, r, 7, std::vector<float>(r, 0.0f), 0)
                                     : make_cache({bits, 0, 0}, n, r, 7);
        const attn_kv_view kv = c.view(0, 0);
        for (const auto& [s0, s1] : {std::pair<int64_t, int64_t>{0, n}, {37, 250}, {260, n}, {10, 10}}) {
            const int64_t m = s1 - s0;
            std::vector<float> scratch(kernel_attention_scratch(G, m, r, r, 0)), logits((size_t)G * n);
            std::vector<float> buf((size_t)G * (2 + r));
            attn_partial p{buf.data(), buf.data() + G, buf.data() + 2 * G};
            p.logits = logits.data(), p.logits_stride = n;
            kernel_attention_range(kv, s0, s1, qv, p, scratch.data());
            kernel_attention_scores(kv, s0, s1, qv, scratch.data());
            for (int j = 0; j < G; j++)
                for (int64_t s = s0; s < s1; s++)
                    ASSERT_EQ(scratch[j * m + s - s0], logits[j * n + s]) << bits << "-bit, head " << j << ", slot " << s;
        }
    }
}

// 8-bit and 16-bit keys: the pages chosen are those of most softmax mass (from
// the float reference's scores: no page left out holds more than one chosen,
// beyond the int8 query's rounding), the planted key's page among them; runs
// ascend from the first slot past the sinks; a budget of half the slots or
// more does not apply.
TEST(KvSelect, PagesOfMostMass) {
    const int n = 700, r = 128, G = 6, planted = 333;
    const std::vector<float> q = random_q(G, r, 31);
    std::vector<float> plant(r, 0.0f);
    for (int ch = 0; ch < r; ch++)
        for (int j = 0; j < G; j++) plant[ch] += 0.25f * q[j * r + ch];
    const int32_t qpos = n - 1;
    const attn_q_view qv{q.data(), 0, r, G, 1, &qpos, 0.0884f};
    for (const int bits : {16, 8}) {
        const kv_cache c = make_plain_cache(bits, n, r, 41, plant, planted);
        const attn_kv_view kv = c.view(0, 0);
        EXPECT_FALSE(kv_select_applies(kv, n / 2));
        EXPECT_TRUE(kv_select_applies(kv, n / 2 - 1));
        // the reference's masses per page
        std::vector<float> scratch(kernel_attention_scratch(G, n, r, r, 0)), logits((size_t)G * n);
        std::vector<float> buf((size_t)G * (2 + r));
        attn_partial p{buf.data(), buf.data() + G, buf.data() + 2 * G};
        p.logits = logits.data(), p.logits_stride = n;
        kernel_attention_range_ref(kv, 0, n, qv, p, scratch.data());
        const int np = (n + k_select_page - 1) / k_select_page;
        std::vector<double> mass(np, 0.0);
        for (int j = 0; j < G; j++) {
            const float* lj = logits.data() + (size_t)j * n;
            const double mx = *std::max_element(lj, lj + n);
            double l = 0;
            for (int s = 0; s < n; s++) l += std::exp(lj[s] - mx);
            for (int s = 0; s < n; s++) mass[s / k_select_page] += std::exp(lj[s] - mx) / l;
        }
        for (const int64_t select : {int64_t(64), int64_t(200)}) {
            ASSERT_TRUE(kv_select_applies(kv, select));
            std::vector<float> fs(kv_select_float_scratch(kv, G));
            std::vector<int64_t> is(kv_select_index_scratch(kv)), runs(2 * kv_select_max_runs(kv, select));
            int64_t slots = 0;
            const int64_t nr = kv_select_runs(kv, qv, select, fs.data(), is.data(), runs.data(), &slots);
            std::vector<bool> chosen(np, false);
            int64_t count = 0;
            for (int64_t i = 0; i < nr; i++) {
                ASSERT_LT(runs[2 * i], runs[2 * i + 1]);
                if (i > 0) {
                    EXPECT_GT(runs[2 * i], runs[2 * i - 1]) << "runs ascend and do not touch";
                }
                EXPECT_EQ(runs[2 * i] % k_select_page, 0);
                EXPECT_TRUE(runs[2 * i + 1] % k_select_page == 0 || runs[2 * i + 1] == n);
                for (int64_t s = runs[2 * i]; s < runs[2 * i + 1]; s += k_select_page) chosen[s / k_select_page] = true;
                count += runs[2 * i + 1] - runs[2 * i];
            }
            EXPECT_EQ(count, slots);
            const int keep = (int)((select + k_select_page - 1) / k_select_page);
            EXPECT_EQ(std::count(chosen.begin(), chosen.end(), true), keep);
            EXPECT_TRUE(chosen[planted / k_select_page]) << bits << "-bit, budget " << select;
            double least_in = 1e30, most_out = 0;
            for (int pg = 0; pg < np; pg++) {
                if (chosen[pg]) least_in = std::min(least_in, mass[pg]);
                else most_out = std::max(most_out, mass[pg]);
            }
            EXPECT_GE(least_in, most_out - 0.01 * G) << bits << "-bit, budget " << select;
        }
    }
}

}  // namespace
