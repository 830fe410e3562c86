// The 4-bit tier (kv_cache_params::tier): a tiered block holds, for each slot,
// exactly what the tier's definition says, rebuilt here from the quantizers
// alone: the window's rows in f16; the tier's groups as 4-bit KIVI codes of
// those rows; older groups at the block's own widths (a 4-bit key row with
// 2-bit, 1-bit and 0-bit channels, 2-bit values) coded from the 4-bit codes'
// f16 rows. The attention kernel over the tiered block (plan codes, tier codes
// and window in one range or cut in three) agrees with the double reference
// over those rows; read_quant / read_tier_quant are what read_slot gives; the
// tier is a fixed cost (accounting); a block without narrow codes is not
// tiered; bad combinations are refused in one line.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "engine/kv_cache.h"
#include "engine/kv_quant.h"
#include "ggml-like/dtype.h"
#include "ggml-like/error.h"
#include "kernels/attention.h"
#include "tests/kv_test_data.h"

using namespace zk;
using zk_test::make_rows;
using zk_test::ref_attention;

namespace {

constexpr int k_group = 32;

// Rows rounded to f16, as a window holds them.
std::vector<float> f16_rows(const float* x, size_t n) {
    std::vector<float> y(n);
    for (size_t i = 0; i < n; i++) y[i] = fp16_to_fp32(fp32_to_fp16(x[i]));
    return y;
}

// One group of n rows through a KIVI quantizer and back.
std::vector<float> kivi_round(bool keys, int bits, const float* X, int n, int r, int tail = 0, int zero = 0,
                              int mid = 0) {
    std::vector<uint8_t> codes((size_t)n * 256 + KV_Q4_PAD);
    std::vector<uint16_t> grid((size_t)n * r + 2 * r + 16), step(KV_GRID_STEPS);
    std::vector<float> Y((size_t)n * r);
    if (keys) {
        kvq_quantize_keys(bits, X, n, r, codes.data(), grid.data(), step.data(), nullptr, tail, zero, mid);
        kvq_dequantize_keys(bits, codes.data(), grid.data(), step.data(), n, r, Y.data(), tail, zero, mid);
    } else {
        kvq_quantize_values(bits, X, n, r, codes.data(), grid.data(), step.data());
        kvq_dequantize_values(bits, codes.data(), grid.data(), step.data(), n, r, Y.data());
    }
    return Y;
}

struct tier_case {
    int bits_k, bits_v;
    int tail, zero, mid;  // of the keys
    int tier, residual;
    int chunk;            // tokens an append
};

kv_cache_params tier_params(const tier_case& c) {
    kv_cache_params p;
    p.bits_k = {c.bits_k};
    p.bits_v = {c.bits_v};
    p.key_tail = c.tail;
    p.key_zero = c.zero;
    p.key_mid = c.mid;
    p.tier = c.tier;
    p.residual = c.residual;
    return p;
}

// The kernel over block (0, 0) in `parts` slot ranges, merged: out [G x r_v].
std::vector<float> kernel_attention(const kv_cache& c, const float* q, int G, int32_t qpos, float scale, int parts) {
    const attn_kv_view kv = c.view(0, 0);
    std::vector<float> m(parts * G), l(parts * G), acc((size_t)parts * G * kv.r_v);
    std::vector<float> scratch(kernel_attention_scratch(G, kv.n_slots, kv.r_k, kv.r_v, 0));
    std::vector<attn_partial> ps(parts);
    for (int p = 0; p < parts; p++) {
        ps[p] = attn_partial{m.data() + p * G, l.data() + p * G, acc.data() + (size_t)p * G * kv.r_v};
        const attn_q_view qv{q, 0, kv.r_k, G, 1, &qpos, scale};
        kernel_attention_range(kv, kv.n_slots * p / parts, kv.n_slots * (p + 1) / parts, qv, ps[p], scratch.data());
    }
    std::vector<float> out((size_t)G * kv.r_v);
    kernel_attention_merge(ps.data(), parts, 1, G, kv.r_v, out.data(), 0, kv.r_v);
    return out;
}

class KvTier : public ::testing::TestWithParam<tier_case> {};

}  // namespace

TEST_P(KvTier, SlotsHoldWhatTheTierDefines) {
    const tier_case tc = GetParam();
    const int rk = 64, rv = 48, n = 421, G = 3;
    const std::vector<float> K = make_rows(n, rk, 61, false), V = make_rows(n, rv, 62, false);
    std::vector<int32_t> pos(n);
    for (int t = 0; t < n; t++) pos[t] = t;
    kv_cache c(1, 1, 512, tier_params(tc), {rk}, {rv});
    const kv_block& b = c.block(0, 0);
    ASSERT_TRUE(b.tiered);
    for (int t = 0; t < n;) {
        const int k = std::min(n - t, tc.chunk);
        c.append(0, 0, k, &K[(size_t)t * rk], rk, &V[(size_t)t * rv], rv, &pos[t]);
        t += k;
    }
    // the counts: a window of [residual - group, residual), the tier full, the rest in the block's codes
    const int64_t nw = b.n_used - b.n_quant - b.t_quant;
    EXPECT_EQ(b.n_used, n);
    EXPECT_EQ(b.t_quant, tc.tier);
    EXPECT_TRUE(nw >= tc.residual - k_group && nw < tc.residual) << nw;
    EXPECT_EQ(b.n_quant % k_group, 0);
    EXPECT_EQ(b.n_quant + b.t_quant + nw, n);

    // what each slot must hold, from the quantizers alone
    const std::vector<float> K16 = f16_rows(K.data(), K.size()), V16 = f16_rows(V.data(), V.size());
    std::vector<float> Ke(K16), Ve(V16);
    for (int64_t g0 = 0; g0 < b.n_quant + b.t_quant; g0 += k_group) {
        const std::vector<float> k4 = kivi_round(true, 4, &K16[(size_t)g0 * rk], k_group, rk);
        const std::vector<float> v4 = kivi_round(false, 4, &V16[(size_t)g0 * rv], k_group, rv);
        std::vector<float> ke = k4, ve = v4;
        if (g0 < b.n_quant) {  // left the tier: its 4-bit rows, staged in f16, at the block's widths
            const std::vector<float> k4h = f16_rows(k4.data(), k4.size()), v4h = f16_rows(v4.data(), v4.size());
            ke = kivi_round(true, tc.bits_k, k4h.data(), k_group, rk, tc.tail, tc.zero, tc.mid);
            ve = kivi_round(false, tc.bits_v, v4h.data(), k_group, rv);
        }
        std::copy(ke.begin(), ke.end(), Ke.begin() + g0 * rk);
        std::copy(ve.begin(), ve.end(), Ve.begin() + g0 * rv);
    }
    std::vector<float> Kd((size_t)n * rk), Vd((size_t)n * rv);
    for (int s = 0; s < n; s++) {
        c.read_slot(0, 0, s, &Kd[(size_t)s * rk], &Vd[(size_t)s * rv]);
        for (int i = 0; i < rk; i++) ASSERT_EQ(Kd[(size_t)s * rk + i], Ke[(size_t)s * rk + i]) << "key slot " << s;
        for (int i = 0; i < rv; i++) ASSERT_EQ(Vd[(size_t)s * rv + i], Ve[(size_t)s * rv + i]) << "value slot " << s;
    }
    // what a prefill chunk's tiled attention reads: the same
    std::vector<float> X((size_t)n * std::max(rk, rv));
    c.read_quant(0, 0, true, 0, b.n_quant, X.data());
    EXPECT_TRUE(std::equal(X.begin(), X.begin() + b.n_quant * rk, Kd.begin()));
    for (auto [s0, s1] : {std::pair<int64_t, int64_t>{0, b.t_quant}, {5, b.t_quant - 3}, {33, 34}}) {
        c.read_tier_quant(0, 0, true, s0, s1, X.data());
        EXPECT_TRUE(std::equal(X.begin(), X.begin() + (s1 - s0) * rk, Kd.begin() + (b.n_quant + s0) * rk)) << s0;
        c.read_tier_quant(0, 0, false, s0, s1, X.data());
        EXPECT_TRUE(std::equal(X.begin(), X.begin() + (s1 - s0) * rv, Vd.begin() + (b.n_quant + s0) * rv)) << s0;
    }

    // attention: the kernel over codes, tier and window against the double reference over those rows (the
    // int8 query and weight roundings of the 4- and 2-bit kernels: relative L2 below 1%), in one range and
    // in three (which cut the block's codes, the tier and the window)
    std::mt19937 g(5);
    std::normal_distribution<float> N(0, 1);
    std::vector<float> q((size_t)G * rk);
    for (auto& x : q) x = N(g);
    for (int32_t qpos : {n - 1, (int32_t)(b.n_quant + b.t_quant / 2)}) {
        std::vector<float> ref((size_t)G * rv);
        ref_attention(q.data(), G, Kd.data(), Vd.data(), pos.data(), n, rk, rv, qpos, 0.125f, ref.data());
        for (int parts : {1, 3}) {
            const std::vector<float> out = kernel_attention(c, q.data(), G, qpos, 0.125f, parts);
            double num = 0, den = 0;
            for (size_t i = 0; i < out.size(); i++) num += (out[i] - ref[i]) * (out[i] - ref[i]), den += ref[i] * ref[i];
            EXPECT_LT(std::sqrt(num / den), 1e-2) << "qpos " << qpos << " parts " << parts;
        }
    }

    // a fixed cost: allocated as accounted, the per-token cost that of the same cache without the tier
    EXPECT_EQ(c.bytes_allocated(), c.bytes_for_capacity(c.capacity()));
    kv_cache_params p0 = tier_params(tc);
    p0.tier = 0;
    const kv_cache c0(1, 1, 512, p0, {rk}, {rv});
    EXPECT_DOUBLE_EQ(c.bytes_per_token_exact(), c0.bytes_per_token_exact());
    EXPECT_GT(c.bytes_allocated(), c0.bytes_allocated());
    EXPECT_NE(c.describe(rk).find("4-bit tier"), std::string::npos) << c.describe(rk);

    // clear: empty, then the same again
    c.clear();
    EXPECT_EQ(b.n_used + b.n_quant + b.t_quant + b.t_groups, 0);
    c.append(0, 0, n, K.data(), rk, V.data(), rv, pos.data());
    std::vector<float> k1(rk), v1(rv);
    for (int s : {0, (int)b.n_quant, n - 1}) {
        c.read_slot(0, 0, s, k1.data(), v1.data());
        for (int i = 0; i < rk; i++) ASSERT_EQ(k1[i], Ke[(size_t)s * rk + i]) << "after clear, key slot " << s;
    }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, KvTier,
    ::testing::Values(tier_case{4, 2, 16, 8, 12, 96, 64, 1},    // a plan's 4-bit keys with parts, 2-bit values
                      tier_case{4, 2, 16, 8, 12, 96, 64, 37},   // the same appended in chunks
                      tier_case{2, 2, 20, 0, 0, 64, 128, 1},    // 2-bit keys with a 1-bit tail
                      tier_case{2, 4, 0, 0, 0, 160, 32, 50}));  // 2-bit keys under 4-bit values

TEST(KvTierParams, WhereItAppliesAndWhereNot) {
    kv_cache_params p;
    p.bits = 4;
    p.tier = 64;
    // a plan's 4-bit block has nothing narrower to protect: no tier (a plain
    // 4-bit cache, with no block that could be tiered, is refused below)
    p.bits_k = {4, 4};
    p.bits_v = {4, 2};
    const kv_cache mixed(1, 2, 256, p, {32, 32}, {32, 32});
    EXPECT_FALSE(mixed.block(0, 0).tiered);
    EXPECT_TRUE(mixed.block(0, 1).tiered);
    // one line each, naming kv.tier
    auto refused = [](kv_cache_params q, const char* why) {
        try {
            kv_cache(1, 1, 256, q, {32}, {32});
            ADD_FAILURE() << why << ": accepted";
        } catch (const error& e) {
            const std::string m = e.what();
            EXPECT_NE(m.find("kv.tier"), std::string::npos) << why << ": " << m;
            EXPECT_EQ(m.find('\n'), std::string::npos) << why << ": " << m;
        }
    };
    // a tier longer than the cache holds: every token stays 4-bit or in the window, the tier is no larger
    // than the cache, and the per-token cost is still that of the block's codes
    kv_cache_params sp;
    sp.bits = 2;
    sp.tier = 320;
    kv_cache small(1, 1, 256, sp, {32}, {32});
    sp.tier = 0;
    EXPECT_DOUBLE_EQ(small.bytes_per_token_exact(), kv_cache(1, 1, 256, sp, {32}, {32}).bytes_per_token_exact());
    EXPECT_EQ(small.bytes_allocated(), small.bytes_for_capacity(small.capacity()));
    {
        const std::vector<float> R = make_rows(256, 32, 71, false);
        std::vector<int32_t> pos(256);
        for (int t = 0; t < 256; t++) pos[t] = t;
        small.append(0, 0, 256, R.data(), 32, R.data(), 32, pos.data());
        EXPECT_EQ(small.block(0, 0).n_quant, 0);
        EXPECT_EQ(small.block(0, 0).t_quant, 256 - 96);  // the rest: the window (half the cache, less the group just flushed)
    }
    kv_cache_params q;
    q.bits = 2;
    q.tier = 48;
    refused(q, "not a multiple of the group");
    q.tier = -32;
    refused(q, "negative");
    q.tier = 64;
    q.evicting = true;
    refused(q, "with eviction");
    q.evicting = false;
    q.gear = true;
    refused(q, "with GEAR");
    q.gear = false;
    q.bits = 8;
    refused(q, "an 8-bit cache");
    q.bits = 4;
    refused(q, "a 4-bit cache without narrower key channels");
    q.key_tail = 16;
    EXPECT_TRUE(kv_cache(1, 1, 256, q, {32}, {32}).block(0, 0).tiered) << "a 4-bit cache with a 1-bit key tail";
    q.key_tail = 0;
    q.bits = 2;
    kv_cache c(1, 1, 256, q, {32}, {32});
    EXPECT_THROW(c.append_plan(0, 0, 1), error);  // the GPU's mirror: not for a tier yet
    const std::vector<uint8_t> keep(1, 0);
    std::vector<float> row(32, 1.0f);
    const int32_t pos0 = 0;
    c.append(0, 0, 1, row.data(), 32, row.data(), 32, &pos0);
    EXPECT_THROW(c.compact(0, 0, keep.data()), error);
}
