// The decode attention kernel over every pair of key and value layouts (16-bit
// rows, 8-bit, 4-bit and 2-bit KIVI; kernels/attention.h), against attention in
// double precision over the cache as it reads back dequantized (kv_cache::
// read_slot, with exact sinks at full head dim): for G = 1, 2, 3, 4, 6 and 7
// query heads per KV head (Qwen2.5-0.5B has 7, the 1.5B 6), ranks small, not a
// multiple of 4 or 32, and past one row chunk, GEAR on the KIVI sides (rank 2,
// and rank 0: its sparse outliers alone), exact
// sinks, positions with gaps and blocks compacted by eviction (KIVI groups
// merged), and 4- and 2-bit keys whose last channels are a 1-bit tail (from
// 3 channels to 96; the 2-bit part from 1 channel to 32, in one pass with
// the tail or in two), and keys whose last quarter of channels are 0-bit group
// means, after such a tail (then 1/2 of the channels; a 2-bit part of 32, the
// one-pass form, from r 64) or alone, and 4-bit keys with 2-bit channels before
// such a tail and 0-bit channels, or alone (3/4 of what those leave: 3 channels
// to 96, past the 2-bit kernel's 64-channel form; such 4-bit rows take one
// pass over all their parts, each part in the 16-byte form (4-bit parts of 18
// to 32 channels, 2-bit ones of 36 to 96, tails of 68 and 96) and in the 8-byte
// one (1 to 16, 2 to 30, 2 to 64)). Both paths are held to the double reference:
//   reference path (kernel_attention_range_ref, float dot products over the
//     dequantized codes): float rounding, relative L2 < 2e-5;
//   fast path: float rounding (< 2e-5) where neither side is KIVI; with a KIVI
//     side the folded query is rounded to int8 per (group, head) and the value
//     weights to 7 bits per 32 slots: relative L2 < 1e-2 (measured ~1e-3, printed).
// Also per-head mixed precision in one cache: exact byte accounting, the
// description, the parameter checks naming kv_bits_k / kv_bits_v, and a
// session on the tiny random model whose tables say "4-bit everywhere" giving
// the logits of --kv-bits 4 bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "engine/kv_cache.h"
#include "engine/model.h"
#include "engine/session.h"
#include "ggml-like/error.h"
#include "kernels/attention.h"
#include "kernels/cpu/attention_layout.h"  // the 4-bit integer kernels and their 256-bit twins
#include "tests/kv_test_data.h"
#include "tests/tiny_model.h"

using namespace zk;
using zk_test::make_rows;
using zk_test::ref_attention;

namespace {

bool is_kivi(int bits) { return bits == 4 || bits == 2; }

double rel_l2(const std::vector<float>& a, const std::vector<float>& ref) {
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size(); i++) num += (a[i] - ref[i]) * (double)(a[i] - ref[i]), den += ref[i] * (double)ref[i];
    return std::sqrt(num / std::max(den, 1e-30));
}

// The kernel (fast or reference path) over the block in `parts` slot ranges
// plus the exact-sink partial, merged: out [G x D].
std::vector<float> run_kernel(const attn_kv_view& kv, const std::vector<float>& q, int G, int D, int32_t qpos,
                              float scale, int parts, bool ref) {
    const int gr = std::max(kv.k.gear.rank, kv.v.gear.rank);
    std::vector<float> m((parts + 1) * G), l((parts + 1) * G), acc((size_t)(parts + 1) * G * D);
    std::vector<float> scratch(kernel_attention_scratch(G, kv.n_slots, kv.r_k, kv.r_v, gr));
    std::vector<float> logits((size_t)G * std::max<int64_t>(kv.n_slots, 1));
    std::vector<attn_partial> ps;
    const attn_q_view qv{q.data(), 0, D, G, 1, &qpos, scale};
    for (int p = 0; p < parts; p++) {
        ps.push_back(attn_partial{m.data() + p * G, l.data() + p * G, acc.data() + (size_t)p * G * kv.r_v,
                                  logits.data(), kv.n_slots});
        (ref ? kernel_attention_range_ref : kernel_attention_range)(kv, kv.n_slots * p / parts,
                                                                    kv.n_slots * (p + 1) / parts, qv, ps.back(),
                                                                    scratch.data());
    }
    if (kv.n_sink_slots > 0) {
        ps.push_back(attn_partial{m.data() + parts * G, l.data() + parts * G, acc.data() + (size_t)parts * G * D,
                                  logits.data(), kv.n_slots, D});
        kernel_attention_sinks(kv, qv, ps.back());
    }
    std::vector<float> out((size_t)G * D, 0.0f);
    kernel_attention_merge(ps.data(), (int)ps.size(), 1, G, kv.r_v, out.data(), 0, D);
    return out;
}

// The 1-bit key tail of a rank-r key in the tail cases: from r >= 64 all but
// 32 channels (the 2-bit kernel's one-pass form: a 2-bit part of h <= 64, h %
// 8 == 0), else 3/4 of them (4 -> 3, the whole row but one code; 13 -> 9; 40 -> 30).
int tail_of(int r) { return r >= 64 ? r - 32 : r * 3 / 4; }
// The 0-bit key channels in the zero cases: the last quarter (4 -> 1, 13 -> 3,
// 100 -> 25), the tail (if any) ending before them.
int zero_of(int r) { return r / 4; }
// The 2-bit channels of 4-bit keys in the mid cases: 3/4 of the channels the
// tail and the 0-bit ones leave (4 -> 3, 128 -> 96; 128 after a tail of 64 and
// 32 0-bit channels -> 24).
int mid_of(int rest) { return rest * 3 / 4; }

struct layout_case {
    int bits_k, bits_v;
    bool tail = false;  // 1-bit key tails (tail_of; none with GEAR)
    bool zero = false;  // 0-bit key channels (zero_of; the tail then tail_of - zero_of; none with GEAR)
    bool mid = false;   // 2-bit channels of 4-bit keys (mid_of; none with GEAR)
};

class AttentionLayouts : public ::testing::TestWithParam<layout_case> {};

TEST_P(AttentionLayouts, FastAndReferencePathsMatchDoubleAttention) {
    const layout_case pc = GetParam();
    const bool kivi = is_kivi(pc.bits_k) || is_kivi(pc.bits_v);
    const double tol_fast = kivi ? 1e-2 : 2e-5, tol_ref = 2e-5;
    double worst_fast = 0, worst_ref = 0;
    int checked = 0;
    struct ranks {
        int k, v;
    };
    for (const ranks rk : {ranks{4, 4}, ranks{13, 7}, ranks{20, 44}, ranks{64, 64}, ranks{100, 84}, ranks{128, 128},
                             ranks{72, 200}, ranks{40, 150}})
        // r_v 200: four value blocks (past the 1- and 2-block gathers), two row-chunk pairs;
        // r_v 150: three, a pair and a chunk alone
        for (int gear : {0, 1, 2})  // off, rank 2, rank 0 (outliers alone)
            for (bool evict : {false, true}) {
                if (gear && (!kivi || pc.tail || pc.zero || pc.mid)) continue;
                const int n = 300, D = std::max(64, std::max(rk.k, rk.v)), S = evict ? 4 : 0;  // D: the head dim
                kv_cache_params p;
                p.type = evict ? dtype::F32 : dtype::F16;
                p.bits_k = {pc.bits_k};
                p.bits_v = {pc.bits_v};
                p.residual = 32;  // one group: most slots quantized
                p.gear = gear > 0;
                p.gear_rank = gear == 1 ? 2 : 0;
                p.evicting = evict;
                p.sinks = S;
                p.sink_dim = D;
                const int want_zero = pc.zero ? zero_of(rk.k) : 0;
                const int want_tail = pc.tail ? tail_of(rk.k) - want_zero : 0;
                const int want_mid = pc.mid ? mid_of(rk.k - want_tail - want_zero) : 0;
                p.tails_k = {want_tail};
                p.zeros_k = {want_zero};
                p.mids_k = {want_mid};
                kv_cache c(1, 1, n, p, {rk.k}, {rk.v});
                const uint32_t seed = 100 * rk.k + rk.v + 7 * gear + 13 * evict;
                const std::vector<float> K = make_rows(n, D, seed, false), V = make_rows(n, D, seed + 1, false);
                std::vector<int32_t> pos(n);
                // evicting: gaps, positions 0 and 3 are sinks (< 4); else consecutive (the shared ramp)
                for (int t = 0; t < n; t++) pos[t] = evict ? 3 * t : t;
                const int n0 = evict ? 240 : n;
                for (int t = 0; t < n0;) {  // uneven appends: prefill chunks then single tokens
                    const int k = std::min(n0 - t, t < 150 ? 37 : 1);
                    c.append(0, 0, k, &K[(size_t)t * D], D, &V[(size_t)t * D], D, &pos[t]);
                    t += k;
                }
                if (evict) {  // evicted gaps (the second sink too), merged groups, then new tokens
                    std::mt19937 g(seed);
                    std::vector<uint8_t> keep(c.block(0, 0).n_used);
                    for (auto& x : keep) x = (g() % 3) != 0;
                    keep[0] = 1, keep[1] = 0;
                    c.compact(0, 0, keep.data());
                    c.append(0, 0, n - n0, &K[(size_t)n0 * D], D, &V[(size_t)n0 * D], D, &pos[n0]);
                }
                const attn_kv_view kv = c.view(0, 0);
                ASSERT_EQ(kv.k.layout, kv_layout_for_bits(pc.bits_k)->id);
                ASSERT_EQ(kv.v.layout, kv_layout_for_bits(pc.bits_v)->id);
                ASSERT_EQ(kv.k.tail, is_kivi(pc.bits_k) ? want_tail : 0);
                ASSERT_EQ(kv.k.zero, is_kivi(pc.bits_k) ? want_zero : 0);
                ASSERT_EQ(kv.k.mid, pc.bits_k == 4 ? want_mid : 0);
                // the cache as the kernel must see it, widened to D channels: exact
                // rows for the sinks, the dequantized rank-r_k / r_v rows (zeros past them) else
                const int64_t ns = kv.n_slots;
                std::vector<float> Kr((size_t)ns * D, 0.0f), Vr((size_t)ns * D, 0.0f), kd(rk.k), vd(rk.v);
                std::vector<int32_t> pr(kv.pos, kv.pos + ns);
                for (int64_t s = 0; s < ns; s++) {
                    const int t = pr[s] / 3;
                    if (pr[s] < S) {
                        std::copy(&K[(size_t)t * D], &K[(size_t)t * D] + D, &Kr[(size_t)s * D]);
                        std::copy(&V[(size_t)t * D], &V[(size_t)t * D] + D, &Vr[(size_t)s * D]);
                        continue;
                    }
                    c.read_slot(0, 0, s, kd.data(), vd.data());
                    std::copy(kd.begin(), kd.end(), &Kr[(size_t)s * D]);
                    std::copy(vd.begin(), vd.end(), &Vr[(size_t)s * D]);
                }
                for (int G : {1, 2, 3, 4, 6, 7}) {
                    std::mt19937 g(seed + G);
                    std::normal_distribution<float> N(0, 1);
                    std::vector<float> q((size_t)G * D);
                    for (auto& x : q) x = N(g);
                    const float scale = 1.0f / std::sqrt((float)D);
                    for (int32_t qpos : {pr.back(), pr[ns / 2] + 1}) {
                        std::vector<float> want((size_t)G * D);
                        ref_attention(q.data(), G, Kr.data(), Vr.data(), pr.data(), (int)ns, D, D, qpos, scale,
                                      want.data());
                        for (int parts : {1, 3}) {
                            const double ef = rel_l2(run_kernel(kv, q, G, D, qpos, scale, parts, false), want);
                            const double er = rel_l2(run_kernel(kv, q, G, D, qpos, scale, parts, true), want);
                            worst_fast = std::max(worst_fast, ef);
                            worst_ref = std::max(worst_ref, er);
                            checked++;
                            EXPECT_LT(ef, tol_fast) << "fast path: K " << pc.bits_k << " V " << pc.bits_v << " r_k "
                                                    << rk.k << " r_v " << rk.v << " G " << G << " gear " << gear
                                                    << " evict " << evict << " qpos " << qpos << " parts " << parts;
                            EXPECT_LT(er, tol_ref) << "reference path: K " << pc.bits_k << " V " << pc.bits_v
                                                   << " r_k " << rk.k << " r_v " << rk.v << " G " << G << " gear "
                                                   << gear << " evict " << evict << " qpos " << qpos;
                        }
                    }
                }
            }
    std::printf("[ measured ] K %2d-bit%s%s V %2d-bit: %d cases, worst relative L2 vs double: fast %.2e, reference "
                "%.2e\n",
                pc.bits_k, pc.mid ? " + 2-bit" : "",
                pc.tail ? (pc.zero ? " + 1-bit tail + 0-bit" : " + 1-bit tail") : pc.zero ? " + 0-bit" : "",
                pc.bits_v, checked, worst_fast, worst_ref);
}

std::vector<layout_case> all_pairs() {
    std::vector<layout_case> v;
    for (int k : {16, 8, 4, 2})
        for (int b : {16, 8, 4, 2}) v.push_back({k, b});
    for (int k : {4, 2})
        for (int b : {16, 4, 2}) v.push_back({k, b, true}), v.push_back({k, b, true, true});
    for (int b : {4, 2}) v.push_back({2, b, false, true});
    for (int b : {16, 4, 2}) v.push_back({4, b, false, false, true});
    v.push_back({4, 4, true, false, true});
    v.push_back({4, 2, true, true, true});
    v.push_back({4, 4, false, true, true});
    return v;
}

INSTANTIATE_TEST_SUITE_P(KeyValue, AttentionLayouts, ::testing::ValuesIn(all_pairs()),
                         [](const ::testing::TestParamInfo<layout_case>& i) {
                             return "K" + std::to_string(i.param.bits_k) + (i.param.mid ? "mid" : "") +
                                    (i.param.tail ? "tail" : "") +
                                    (i.param.zero ? "zero" : "") + "_V" +
                                    std::to_string(i.param.bits_v);
                         });

// Per-head precision in one cache (2 layers x 3 KV heads): every block's sides
// in their own layout, bytes accounted exactly (allocated = accounted, per-token
// cost linear) and equal to the sum of uniform caches' per-head costs.
TEST(KvMixed, PerHeadAccountingIsExact) {
    const std::vector<int> rk = {64, 32, 20, 4, 64, 12}, rv = {64, 16, 12, 8, 44, 64};
    const std::vector<int> bk = {16, 8, 4, 2, 4, 2}, bv = {2, 4, 8, 16, 4, 16};
    for (bool gear : {false, true})
        for (bool evicting : {false, true})
            for (int64_t cap : {100, 4096}) {
                kv_cache_params p;
                p.bits_k = bk;
                p.bits_v = bv;
                p.gear = gear;
                p.evicting = evicting;
                p.scores = evicting;
                p.sinks = evicting ? 4 : 0;
                p.sink_dim = 64;
                kv_cache c(2, 3, cap, p, rk, rv);
                EXPECT_EQ(c.bytes_allocated(), c.bytes_for_capacity(c.capacity())) << gear << evicting << cap;
                for (int i = 0; i < 6; i++) {
                    EXPECT_EQ(c.layout_k(i / 3, i % 3), kv_layout_for_bits(bk[i])->id);
                    EXPECT_EQ(c.layout_v(i / 3, i % 3), kv_layout_for_bits(bv[i])->id);
                }
                EXPECT_DOUBLE_EQ(c.bytes_per_token_exact() * 640,
                                 (double)(c.bytes_for_capacity(c.capacity() + 640) - c.bytes_for_capacity(c.capacity())));
                // per token, a head costs what its own layouts cost: the per-side sums;
                // without eviction the positions are one ramp for the cache, 4 bytes a
                // token however many heads (each one-head cache below counts it too)
                const double ramp = evicting ? 0.0 : sizeof(int32_t);
                double sum = ramp - 6 * ramp;
                for (int i = 0; i < 6; i++) {
                    kv_cache_params pk = p;
                    pk.bits_k = {bk[i]};
                    pk.bits_v = {bv[i]};
                    pk.residual = kv_cache_residual(p, c.capacity());
                    sum += kv_cache(1, 1, cap, pk, {rk[i]}, {rv[i]}).bytes_per_token_exact();
                }
                EXPECT_NEAR(c.bytes_per_token_exact(), sum, 1e-9 * sum);
            }
    // 2-bit values instead of 4-bit at rank 64: 16 bytes of codes less per token, the scales the same
    kv_cache_params p4;
    p4.bits = 4;
    kv_cache_params p42 = p4;
    p42.bits_v = {2};
    const double b4 = kv_cache(1, 1, 4096, p4, {64}, {64}).bytes_per_token_exact();
    const double b42 = kv_cache(1, 1, 4096, p42, {64}, {64}).bytes_per_token_exact();
    EXPECT_DOUBLE_EQ(b4 - b42, 16.0);
    kv_cache_params pm;
    pm.bits_k = bk;
    pm.bits_v = bv;
    const std::string d = kv_cache(2, 3, 1024, pm, rk, rv).describe(64);
    EXPECT_NE(d.find("per head: keys F16 x1, 8-bit x1, 4-bit x2, 2-bit x2; values F16 x2"), std::string::npos) << d;
    std::printf("[ measured ] %s\n", d.c_str());
}

// A uniform precision given through the per-head tables is the same cache as
// through `bits`: the same bytes, and the kernel reads the same numbers.
TEST(KvMixed, UniformTablesEqualBits) {
    for (int bits : {16, 8, 4, 2}) {
        const int n = 200, r = 36;
        kv_cache_params pb;
        pb.bits = bits;
        kv_cache_params pt;
        pt.bits = 16;
        pt.bits_k = {bits, bits};
        pt.bits_v = {bits, bits};
        kv_cache a(1, 2, n, pb, {r, r}, {r, r}), b(1, 2, n, pt, {r, r}, {r, r});
        EXPECT_EQ(a.bytes_allocated(), b.bytes_allocated());
        EXPECT_EQ(a.describe(r), b.describe(r));
        const std::vector<float> K = make_rows(n, r, 3), V = make_rows(n, r, 4);
        std::vector<int32_t> pos(n);
        for (int t = 0; t < n; t++) pos[t] = t;
        for (int h = 0; h < 2; h++) {
            a.append(0, h, n, K.data(), r, V.data(), r, pos.data());
            b.append(0, h, n, K.data(), r, V.data(), r, pos.data());
        }
        std::vector<float> ka(r), va(r), kb(r), vb(r);
        for (int64_t s = 0; s < n; s++) {
            a.read_slot(0, 1, s, ka.data(), va.data());
            b.read_slot(0, 1, s, kb.data(), vb.data());
            ASSERT_EQ(ka, kb) << bits << " slot " << s;
            ASSERT_EQ(va, vb) << bits << " slot " << s;
        }
    }
}

std::string error_of(const kv_cache_params& p, int n_layer, int n_head_kv) {
    try {
        kv_cache_validate_params(p, n_layer, n_head_kv);
    } catch (const zk::error& e) {
        return e.what();
    }
    return "";
}

TEST(KvMixed, BadTablesRejectedByName) {
    kv_cache_params p;
    p.bits_k = {4, 4, 4};
    EXPECT_NE(error_of(p, 2, 2).find("kv_bits_k"), std::string::npos);
    EXPECT_NE(error_of(p, 2, 2).find("4 (2 layers x 2 KV heads)"), std::string::npos) << error_of(p, 2, 2);
    EXPECT_EQ(error_of(p, 3, 1), "");
    p.bits_v = {16, 3, 8};
    EXPECT_NE(error_of(p, 3, 1).find("kv_bits_v[1] (layer 1, KV head 0) is 3"), std::string::npos)
        << error_of(p, 3, 1);
    p = kv_cache_params{};
    p.bits = 2;
    EXPECT_EQ(error_of(p, 1, 1), "");
    p.bits = 3;
    EXPECT_NE(error_of(p, 1, 1).find("kv.bits must be 16, 8, 4 or 2"), std::string::npos);
    // the engine names the parameter (main/ spells it as a flag)
    try {
        kv_cache_validate_params(p, 1, 1);
        ADD_FAILURE() << "3 bits accepted";
    } catch (const param_error& e) {
        EXPECT_EQ(e.param, "kv.bits");
    }
    // GEAR needs a KIVI side somewhere: 2-bit values of one head suffice
    p = kv_cache_params{};
    p.gear = true;
    EXPECT_NE(error_of(p, 1, 2).find("kv.gear"), std::string::npos);
    p.bits_v = {16, 2};
    EXPECT_EQ(error_of(p, 1, 2), "");
    EXPECT_NO_THROW(kv_cache(1, 2, 64, p, {32, 32}, {32, 32}));
    // the KIVI group is checked when one side is KIVI
    p.group = 0;
    EXPECT_NE(error_of(p, 1, 2).find("kv.group"), std::string::npos);
    p.bits_v = {16, 8};
    p.gear = false;
    EXPECT_EQ(error_of(p, 1, 2), "");
    // the cache checks the table sizes against its own shape
    p = kv_cache_params{};
    p.bits_k = {8};
    EXPECT_THROW(kv_cache(1, 2, 64, p, {32, 32}, {32, 32}), zk::error);
}

// A session (tiny random model, 2 layers x 2 KV heads) whose per-head tables
// give every side the same precision computes what kv_bits gives, bit for bit,
// with eviction too; mixed tables run and reach the cache; a table of the
// wrong size is refused naming it.
TEST(KvMixed, SessionTablesEqualBits) {
    const zk_test::tiny_model_loaded tiny;
    const model& m = tiny.get();
    const std::vector<int32_t> toks = zk_test::tiny_model_tokens(300);
    auto logits = [&](const session_params& sp) { return zk_test::tiny_model_session_logits(m, sp, toks, 200, true); };
    for (int bits : {8, 4, 2})
        for (bool evict : {false, true}) {
            session_params a;
            a.n_ctx = 512;
            a.n_threads = 2;
            a.n_batch = 64;
            if (evict) a.evict.policy = "h2o", a.evict.budget = 96, a.evict.chunk = 16;
            session_params b = a;
            a.kv.bits = bits;
            b.kv.bits_k.assign(4, bits);
            b.kv.bits_v.assign(4, bits);
            EXPECT_EQ(logits(a), logits(b)) << bits << "-bit, evict " << evict;
        }
    session_params mixed;
    mixed.n_ctx = 512;
    mixed.kv.bits_k = {16, 8, 4, 2};
    mixed.kv.bits_v = {2, 4, 8, 16};
    mixed.kv.gear = true;
    mixed.evict.policy = "h2o", mixed.evict.budget = 96, mixed.evict.chunk = 16;
    for (float x : logits(mixed)) ASSERT_TRUE(std::isfinite(x));
    session s(m, mixed);
    EXPECT_EQ(s.cache().layout_k(1, 1), KV_LAYOUT_Q2);
    EXPECT_EQ(s.cache().layout_v(1, 1), KV_LAYOUT_ROWS);
    EXPECT_EQ(s.cache().layout_v(0, 1), KV_LAYOUT_Q4);
    mixed.kv.bits_v = {2, 4, 8};
    try {
        session bad(m, mixed);
        ADD_FAILURE() << "a 3-entry table for 4 heads was accepted";
    } catch (const zk::error& e) {
        EXPECT_NE(std::string(e.what()).find("kv_bits_v"), std::string::npos) << e.what();
    }
}

}  // namespace

// The AVX-512 loops of the 4-bit integer kernels (the query fold, the key
// scores over 16 transposed rows, the value sums four slots a dpbusd;
// kernels/cpu/attention_q4.cpp, attention_kivi.h) against their 256-bit twins
// on random codes, grids and queries, at ranks 65..128 (the rows they take):
// the int8 query and its scale are the same bytes, the integer sums the same
// integers, so scores and value sums must be bit-identical; only the fold's
// bias sums q_c m_c in another order (relative 1e-6). Ranges cover whole 16s of
// slots, tails shorter than one, spans across groups and a short last chunk.
TEST(KiviQ4Kernels, WideLoopsMatchTheirTwins) {
    const attn::kivi_int_kernels* wide = attn::q4_int_kernels();
    const attn::kivi_int_kernels* narrow = attn::q4_int_kernels_narrow();
    if (!wide || !narrow) GTEST_SKIP() << "this build has no AVX2 integer kernels";
#if defined(__AVX512BW__) && defined(__AVX512VNNI__) && defined(__AVX512VBMI__)
    std::printf("[ measured ] the wide loops are built (AVX-512 BW, VNNI, VBMI)\n");
#else
    std::printf("[ measured ] no AVX-512 in this build: both tables run the 256-bit loops\n");
#endif
    std::mt19937 rng(11);
    std::uniform_int_distribution<int> byte(0, 255);
    std::uniform_real_distribution<float> unit(-1.0f, 1.0f), prob(0.0f, 1.0f);
    const int64_t n_slots = 150;
    const std::vector<int32_t> gs = {0, 32, 64, 96, 128, 150};  // groups of 32 slots, a short last one
    int checked = 0;
    for (int r : {72, 100, 128})
        for (int G : {1, 3, 6, 7}) {
            const int nrc = (r + 63) / 64, rb = kv_kivi_row_bytes(4, r), nb = (r + KV_Q4_VBLOCK - 1) / KV_Q4_VBLOCK;
            std::vector<uint8_t> codes((size_t)(n_slots * rb + KV_Q4_PAD));
            for (auto& c : codes) c = (uint8_t)byte(rng);
            // keys: one group's fold, then its scores over sub-ranges
            std::vector<float> q((size_t)G * 64 * nrc, 0.0f);
            for (int j = 0; j < G; j++)
                for (int c = 0; c < r; c++) q[(size_t)j * 64 * nrc + c] = unit(rng);
            std::vector<uint16_t> grid((size_t)r);
            for (auto& g : grid) g = (uint16_t)(byte(rng) | byte(rng) << 8);
            const uint16_t step[2] = {fp32_to_fp16(0.013f), fp32_to_fp16(0.021f)};
            std::vector<int8_t> qi_w((size_t)G * 64 * nrc), qi_n(qi_w.size());
            std::vector<float> qd_w(G), qd_n(G), bias_w(G), bias_n(G);
            wide->fold(G, q.data(), grid.data(), step, r, nrc, qi_w.data(), qd_w.data(), bias_w.data());
            narrow->fold(G, q.data(), grid.data(), step, r, nrc, qi_n.data(), qd_n.data(), bias_n.data());
            ASSERT_EQ(qi_w, qi_n) << "r " << r << " G " << G;
            for (int j = 0; j < G; j++) {
                EXPECT_EQ(qd_w[j], qd_n[j]) << "r " << r << " G " << G << " head " << j;
                EXPECT_NEAR(bias_w[j], bias_n[j], 1e-6f * (1.0f + std::fabs(bias_n[j])));
            }
            const int64_t n = 32;
            struct range {
                int64_t a, b;
            };
            for (const range rg : {range{0, 32}, range{5, 32}, range{0, 17}, range{3, 30}, range{16, 32}, range{9, 12}}) {
                const int64_t g0 = 64;  // the group of slots 64..95
                std::vector<float> sc_w((size_t)G * n, -1.0f), sc_n(sc_w);
                wide->scores(G, r, nrc, codes.data(), rb, g0 + rg.a, g0 + rg.b, n_slots, g0, n, qi_n.data(),
                             qd_n.data(), bias_n.data(), sc_w.data());
                narrow->scores(G, r, nrc, codes.data(), rb, g0 + rg.a, g0 + rg.b, n_slots, g0, n, qi_n.data(),
                               qd_n.data(), bias_n.data(), sc_n.data());
                ASSERT_EQ(sc_w, sc_n) << "scores: r " << r << " G " << G << " slots " << rg.a << ".." << rg.b;
                checked++;
            }
            // values over spans of the whole cache
            std::vector<uint16_t> vs((size_t)(n_slots * nb)), vm((gs.size() - 1) * KV_GRID_STEPS);
            for (auto& g : vs) g = (uint16_t)(byte(rng) | byte(rng) << 8);
            for (size_t i = 0; i < vm.size(); i++) vm[i] = fp32_to_fp16(i % 2 ? 0.017f + 0.001f * i : 0.011f + 0.002f * i);
            std::vector<float> p((size_t)G * n_slots);
            for (auto& x : p) x = prob(rng);
            // (chunks of 32 from slot 3 meet the next group at their slot 29, from 20 at
            // slot 12: both halves of a chunk take a later group's steps)
            const std::vector<std::vector<int64_t>> spans = {
                {0, 150, 0}, {3, 141, 0}, {20, 150, 0}, {3, 40, 0, 70, 141, 0}, {97, 99, 0}};
            for (const auto& sp : spans) {
                const int n_sp = (int)sp.size() / 3;
                const int64_t g0 = sp[0] / 32;
                std::vector<float> acc_w((size_t)G * r, 0.0f), acc_n(acc_w), ms_w((size_t)G * nb, 0.0f), ms_n(ms_w);
                wide->values(G, codes.data(), rb, vs.data(), vm.data(), gs.data(), g0, nb, sp.data(), n_sp, n_slots, r,
                             p.data(), acc_w.data(), ms_w.data());
                narrow->values(G, codes.data(), rb, vs.data(), vm.data(), gs.data(), g0, nb, sp.data(), n_sp, n_slots,
                               r, p.data(), acc_n.data(), ms_n.data());
                ASSERT_EQ(acc_w, acc_n) << "values: r " << r << " G " << G << " span from " << sp[0];
                ASSERT_EQ(ms_w, ms_n) << "min terms: r " << r << " G " << G << " span from " << sp[0];
                checked++;
            }
        }
    std::printf("[ measured ] %d score ranges and value spans bit-identical to the 256-bit loops\n", checked);
}

// The wide score loop of the plans' key rows (kernels/cpu/attention_parts_wide.cpp:
// 16 transposed slots a pass, every head at once) against the 256-bit loops it
// stands in for, on random codes, grids and queries: 4-bit rows with 2-bit
// channels and/or a 1-bit tail, folded in one pass (kivi_wide_parts_group)
// against the widths' three folds and the narrow parts loop (rows of 8..64
// bytes through both transposes, parts that share a dword, three parts in one
// vector of 16 channels, no 4-bit part; rows
// of 76 bytes and of 129 channels, which it must decline), and 2-bit rows with
// a tail (one fold, the wide loop reading its bytes) against their narrow loop.
// The int8 query bytes and scales are the same, so the integer sums are; the
// float steps are not (a part's sum scaled as one, where the narrow loops scale
// lane partials; the bias summed in another order): each score within 1e-6 of
// the largest term it could hold (qd_j 127 times the codes' maximum over the
// part's channels), far below one code step of one channel (qd_j 127). Ranges
// start and end inside 16s of slots (the wide loop's last pass is masked).
TEST(KiviPartsKernels, WideLoopMatchesTheNarrowOne) {
    const attn::kivi_parts_kernels* narrow = attn::q4_parts_kernels();
    const attn::kivi_tail_kernels* wide2 = attn::q2_tail_kernels();
    const attn::kivi_tail_kernels* narrow2 = attn::q2_tail_kernels_narrow();
    const attn::kivi_int_kernels* k4 = attn::q4_int_kernels();
    const attn::kivi_int_kernels* k2 = attn::q2_int_kernels();
    const attn::kivi_int_kernels* k1 = attn::q1_tail_kernels();
    if (!narrow || !wide2 || !narrow2) GTEST_SKIP() << "this build has no AVX2 integer kernels";
#if defined(__AVX512BW__) && defined(__AVX512VNNI__) && defined(__AVX512VBMI__)
    const bool built = true;
    std::printf("[ measured ] the wide loop is built (AVX-512 BW, VNNI, VBMI)\n");
#else
    const bool built = false;
    std::printf("[ measured ] no AVX-512 in this build: 2-bit rows run the 256-bit loop twice, 4-bit ones are "
                "declined\n");
#endif
    std::mt19937 rng(23);
    std::uniform_int_distribution<int> byte(0, 255);
    std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
    const int64_t n_slots = 150, g0 = 64, n = 32;  // the group of slots 64..95
    const uint16_t step[2] = {fp32_to_fp16(0.013f), fp32_to_fp16(0.021f)};
    struct range {
        int64_t a, b;
    };
    const range ranges[] = {{0, 32}, {5, 32}, {0, 17}, {3, 30}, {16, 32}, {9, 12}};
    int checked = 0;
    double worst = 0;
    // sc within tol_j of ref (tol_j: 1e-6 of the largest term a score of head j holds)
    auto expect_close = [&](const std::vector<float>& w, const std::vector<float>& ref, const std::vector<double>& tol,
                            int G, const range& rg, const std::string& what) {
        for (int j = 0; j < G; j++)
            for (int64_t s = g0 + rg.a; s < g0 + rg.b; s++) {
                const size_t i = (size_t)j * n + s - g0;
                const double d = std::fabs((double)w[i] - ref[i]);
                worst = std::max(worst, d / tol[j] * 1e-6);
                ASSERT_LE(d, tol[j]) << what << " G " << G << " head " << j << " slot " << s - g0 << " of "
                                     << rg.a << ".." << rg.b << ": " << w[i] << " vs " << ref[i];
            }
        checked++;
    };
    struct shape {
        int h4, mid, tail;
    };
    for (const shape sh : {shape{6, 54, 36}, shape{5, 43, 59}, shape{16, 85, 23}, shape{0, 64, 64}, shape{7, 0, 96},
                           shape{40, 64, 64}, shape{100, 0, 20}, shape{33, 95, 0}, shape{128, 0, 96},
                           shape{30, 64, 35}, shape{5, 8, 60}})
        for (int G : {1, 3, 6, 7, 8}) {
            const int h = sh.h4, mid = sh.mid, tail = sh.tail, r = h + mid + tail, hm = h + mid;
            const int rb = kv_key_row_bytes(4, r, tail, 0, mid);
            const std::string what = "4-bit rows h4 " + std::to_string(h) + " mid " + std::to_string(mid) + " tail " +
                                     std::to_string(tail) + " (" + std::to_string(rb) + " bytes)";
            const bool fits = attn::kivi_wide_parts_fit(G, h, mid, tail);
            ASSERT_EQ(fits, built && rb <= 64 && r <= 128) << what;
            if (!fits) continue;
            const int nrc = (h + 63) / 64, nrm = (mid + 127) / 128;
            std::vector<uint8_t> codes((size_t)(n_slots * rb + KV_Q4_PAD));
            for (auto& c : codes) c = (uint8_t)byte(rng);
            std::vector<uint16_t> grid((size_t)r);
            for (auto& g : grid) g = (uint16_t)(byte(rng) | byte(rng) << 8);
            // the scaled query in channel order, and each part's zero-padded as kivi_scores lays them out
            std::vector<float> qf((size_t)G * r);
            for (auto& x : qf) x = unit(rng);
            std::vector<float> q4((size_t)G * 64 * std::max(nrc, 1), 0.0f), qm((size_t)G * 128 * std::max(nrm, 1), 0.0f),
                qt((size_t)G * KV_KEY_TAIL_MAX, 0.0f);
            for (int j = 0; j < G; j++) {
                for (int c = 0; c < h; c++) q4[(size_t)j * 64 * nrc + c] = qf[(size_t)j * r + c];
                for (int c = 0; c < mid; c++) qm[(size_t)j * 128 * nrm + c] = qf[(size_t)j * r + h + c];
                for (int c = 0; c < tail; c++) qt[(size_t)j * KV_KEY_TAIL_MAX + c] = qf[(size_t)j * r + hm + c];
            }
            std::vector<int8_t> qi((size_t)G * (64 * nrc + 128 * nrm + 128), 0);
            int8_t* qi4 = qi.data();
            int8_t* qim = qi4 + (size_t)G * 64 * nrc;
            int8_t* qit = qim + (size_t)G * 128 * nrm;
            std::vector<float> qd((size_t)3 * G, 0.0f), bp((size_t)3 * G, 0.0f), bias(G), zero(G, 0.0f);
            if (h > 0) k4->fold(G, q4.data(), grid.data(), step, h, nrc, qi4, qd.data(), bp.data());
            if (mid > 0) k2->fold(G, qm.data(), grid.data() + h, step, mid, nrm, qim, qd.data() + G, bp.data() + G);
            if (tail > 0) k1->fold(G, qt.data(), grid.data() + hm, step, tail, 1, qit, qd.data() + 2 * G, bp.data() + 2 * G);
            std::vector<double> tol(G);
            for (int j = 0; j < G; j++) {
                bias[j] = bp[j] + bp[G + j] + bp[2 * G + j];
                tol[j] = 1e-6 * 127 * (qd[j] * 15 * h + qd[G + j] * 3 * mid + qd[2 * G + j] * tail);
            }
            for (const range rg : ranges) {
                std::vector<float> sc_w((size_t)G * n, -1.0f), sc_n(sc_w);
                attn::kivi_wide_parts_group(G, h, mid, tail, qf.data(), r, grid.data(), step, codes.data(), rb, g0 + rg.a,
                                            g0 + rg.b, n_slots, g0, n, zero.data(), sc_w.data());
                narrow->scores(G, h, mid, tail, codes.data(), rb, g0 + rg.a, g0 + rg.b, n_slots, g0, n, qi4, qim, qit,
                               qd.data(), bias.data(), sc_n.data());
                expect_close(sc_w, sc_n, tol, G, rg, what);
            }
        }
    for (int h : {8, 32, 64})
        for (int tail : {3, 64, 96, 128})
            for (int G : {1, 6, 7}) {
                const int r = h + tail, rb = kv_key_row_bytes(2, r, tail);
                std::vector<uint8_t> codes((size_t)(n_slots * rb + KV_Q4_PAD));
                for (auto& c : codes) c = (uint8_t)byte(rng);
                std::vector<uint16_t> grid((size_t)r);
                for (auto& g : grid) g = (uint16_t)(byte(rng) | byte(rng) << 8);
                const int qs = wide2->qstride;
                std::vector<float> q((size_t)G * qs, 0.0f);
                for (int j = 0; j < G; j++)
                    for (int c = 0; c < r; c++) q[(size_t)j * qs + c] = unit(rng);
                std::vector<int8_t> qi((size_t)G * qs);
                std::vector<float> qd(G), bias(G);
                wide2->fold(G, q.data(), grid.data(), step, r, h, qi.data(), qd.data(), bias.data());
                std::vector<double> tol(G);
                for (int j = 0; j < G; j++) tol[j] = 1e-6 * 127 * qd[j] * (3 * h + tail);
                const std::string what = "2-bit rows h " + std::to_string(h) + " tail " + std::to_string(tail);
                for (const range rg : ranges) {
                    std::vector<float> sc_w((size_t)G * n, -1.0f), sc_n(sc_w);
                    wide2->scores(G, h, codes.data(), rb, g0 + rg.a, g0 + rg.b, n_slots, g0, n, qi.data(), qd.data(),
                                  bias.data(), sc_w.data());
                    narrow2->scores(G, h, codes.data(), rb, g0 + rg.a, g0 + rg.b, n_slots, g0, n, qi.data(), qd.data(),
                                    bias.data(), sc_n.data());
                    expect_close(sc_w, sc_n, tol, G, rg, what);
                }
            }
    std::printf("[ measured ] %d score ranges within tolerance of the 256-bit loops (worst %.2e of the largest "
                "term)\n",
                checked, worst);
}

// The softmax steps of every decode range (kernels/cpu/simd.h: max_f32, then
// exp_shift_sum writing e^(x - max) in place and returning the sum) against
// double precision of the rounded x - max, at lengths through every loop's
// tail (1..300, and a range of 8K scores). The exponential is a degree-6 polynomial (relative error ~2e-7);
// where the build has AVX-512 the long rows take 16-float loops, whose lanes
// must give exp8's values bit for bit (the same operations), so both widths
// are held to the same bound: 1e-6 relative per element and on the sum.
TEST(SimdSoftmax, MaxAndExpSumMatchDouble) {
    std::mt19937 rng(5);
    std::normal_distribution<float> score(0.0f, 6.0f);
    std::vector<int> lengths;
    for (int n = 1; n <= 300; n++) lengths.push_back(n);
    lengths.push_back(8192);
    double worst = 0;
    for (int n : lengths) {
        std::vector<float> x(n);
        for (float& v : x) v = score(rng);
        if (n > 3) x[n / 3] = -200.0f;  // flushed to 0 below e^-87
        const float mx = *std::max_element(x.begin(), x.end());
        ASSERT_EQ(simd::max_f32(x.data(), n), mx) << "n " << n;
        std::vector<float> e = x;
        const float sum = simd::exp_shift_sum(e.data(), n, mx);
        double ref_sum = 0;
        for (int i = 0; i < n; i++) {
            const float arg = x[i] - mx;  // (rounded as the kernel rounds it)
            const double r = std::exp((double)arg);
            ref_sum += r;
            if (arg < -87.0f) {
                ASSERT_EQ(e[i], 0.0f) << "n " << n << " i " << i;
                continue;
            }
            const double rel = std::fabs(e[i] - r) / r;
            worst = std::max(worst, rel);
            ASSERT_LT(rel, 1e-6) << "n " << n << " i " << i << " x " << x[i];
        }
        ASSERT_LT(std::fabs(sum - ref_sum) / ref_sum, 1e-6) << "n " << n;
    }
    std::printf("[ measured ] worst relative error of e^x %.2e\n", worst);
#ifdef ZK_SIMD_AVX512
    // lane for lane, the 16-float exponential is the 8-float one
    for (int t = 0; t < 64; t++) {
        alignas(64) float in[16], a[16], b[16];
        for (float& v : in) v = score(rng) * 4.0f;
        _mm512_store_ps(a, simd::exp16(_mm512_load_ps(in)));
        _mm256_store_ps(b, simd::exp8(_mm256_load_ps(in)));
        _mm256_store_ps(b + 8, simd::exp8(_mm256_load_ps(in + 8)));
        for (int i = 0; i < 16; i++) ASSERT_EQ(a[i], b[i]) << "x " << in[i];
    }
#endif
}

#ifdef ZK_SIMD_AVX2
// simd::transpose8_f32 (the vector-coded values' weights: the heads' rows of 8
// slots turned into each slot's vector of heads): element i of row j lands in
// lane j of vector i, for every (i, j).
TEST(SimdTranspose, EightByEightFloats) {
    alignas(32) float in[8][8], out[8][8];
    for (int j = 0; j < 8; j++)
        for (int i = 0; i < 8; i++) in[j][i] = (float)(10 * j + i);
    __m256 x[8];
    for (int j = 0; j < 8; j++) x[j] = _mm256_load_ps(in[j]);
    simd::transpose8_f32(x);
    for (int i = 0; i < 8; i++) _mm256_store_ps(out[i], x[i]);
    for (int i = 0; i < 8; i++)
        for (int j = 0; j < 8; j++) ASSERT_EQ(out[i][j], in[j][i]) << "element " << i << " of row " << j;
}
#endif
