// KV cache precision: 8/4-bit quantization error against the bound the step
// size implies, the fused attention kernel against an f32 reference at several
// ranks (against the dequantized cache to float rounding, or to the int8 query
// rounding for 4-bit keys; within a stated tolerance against the original data), GEAR against plain 4-bit, compaction, exact memory
// accounting, and rejected parameters.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "engine/evict/evict.h"
#include "engine/kv_cache.h"
#include "engine/kv_layout.h"
#include "engine/kv_quant.h"
#include "ggml-like/dtype.h"
#include "ggml-like/error.h"
#include "kernels/attention.h"
#include "tests/kv_test_data.h"

using namespace zk;
using zk_test::make_rows;
using zk_test::ref_attention;

namespace {

// The kernel over a block in `parts` slot ranges, merged.
std::vector<float> kernel_attention(const kv_cache& c, const float* q, int G, int32_t qpos, float scale, int parts) {
    const attn_kv_view kv = c.view(0, 0);
    const int gr = std::max(kv.k.gear.rank, kv.v.gear.rank);
    std::vector<float> m(parts * G), l(parts * G), acc((size_t)parts * G * kv.r_v);
    std::vector<float> scratch(kernel_attention_scratch(G, kv.n_slots, kv.r_k, kv.r_v, gr));
    std::vector<float> logits((size_t)G * kv.n_slots);
    std::vector<attn_partial> ps(parts);
    for (int p = 0; p < parts; p++) {
        ps[p] = attn_partial{m.data() + p * G, l.data() + p * G, acc.data() + (size_t)p * G * kv.r_v,
                             logits.data(), kv.n_slots};
        attn_q_view qv{q, 0, kv.r_k, G, 1, &qpos, scale};
        kernel_attention_range(kv, kv.n_slots * p / parts, kv.n_slots * (p + 1) / parts, qv, ps[p], scratch.data());
    }
    std::vector<float> out((size_t)G * kv.r_v);
    kernel_attention_merge(ps.data(), parts, 1, G, kv.r_v, out.data(), 0, kv.r_v);
    return out;
}

// 4-bit with a one-group residual window, so that most test slots are quantized.
kv_cache_params qparams(int bits, bool gear = false) {
    kv_cache_params p;
    p.bits = bits;
    p.gear = gear;
    p.residual = bits == 4 ? p.group : 0;
    return p;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
    double m = 0;
    for (size_t i = 0; i < a.size(); i++) m = std::max(m, (double)std::fabs(a[i] - b[i]));
    return m;
}

// The fused kernel against attention over the dequantized cache. 16/8-bit:
// float rounding only, max |diff| < 1e-4. 4-bit: the key scores use the folded
// query rounded to int8 (one scale per query head, relative step 1/254, as
// llama.cpp rounds Q for a quantized cache) and the value sums use the weights
// p s rounded to 7 bits per chunk of 32 slots (relative step 1/254 of the
// chunk's largest, against centred codes), so the bound is on the relative L2
// error of the output: < 1%, below the 4-bit quantization error itself (0.7-1.7%
// against f32, measured below; 0.07-0.26% from the two roundings). Returns the
// measured figure.
double expect_kernel_matches_dequant(int bits, const std::vector<float>& out, const std::vector<float>& ref) {
    if (bits != 4) {
        const double d = max_abs_diff(out, ref);
        EXPECT_LT(d, 1e-4);
        return d;
    }
    double num = 0, den = 0;
    for (size_t i = 0; i < out.size(); i++) num += (out[i] - ref[i]) * (out[i] - ref[i]), den += ref[i] * ref[i];
    const double e = std::sqrt(num / std::max(den, 1e-30));
    EXPECT_LT(e, 1e-2);
    return e;
}

}  // namespace

// ---- element-wise quantization error ----

TEST(KvQuant, Q8RowWithinHalfStep) {
    const int r = 72;  // two full blocks and a partial one
    std::vector<float> x = make_rows(1, r, 1), y(r);
    std::vector<int8_t> codes(r);
    std::vector<uint16_t> d(kv_n_blocks(r, KV_Q8_BLOCK));
    kvq_quantize_q8_row(x.data(), r, codes.data(), d.data());
    kvq_dequantize_q8_row(codes.data(), d.data(), r, y.data());
    for (int c = 0; c < r; c++) {
        const float step = fp16_to_fp32(d[c / KV_Q8_BLOCK]);
        EXPECT_LE(std::fabs(x[c] - y[c]), 0.5f * step * 1.0001f) << "channel " << c;
    }
}

// 4-bit and 2-bit KIVI keys (per channel over a group): each channel's grid
// (decoded from its 8-bit codes and the group's steps) covers the range the
// clipping search chose for it, overshooting by at most a step and a min step;
// elements inside the grid are within half a step, those outside it are
// clamped to its nearest end; the search never raises the squared error of
// the unclipped range.
TEST(KvQuant, KiviKeysClippedGridsCoverTheirRange) {
    for (int bits : {4, 2})
        for (int r : {4, 17, 64}) {
            const int n = 32, top = (1 << bits) - 1;
            std::vector<float> X = make_rows(n, r, 2), Y(X.size());
            X[7 * r + 1] = 9.0f;  // an outlier the search can clip
            std::vector<uint8_t> codes((size_t)n * kv_qb_row_bytes(bits, r));
            std::vector<uint16_t> grid(r), step(KV_GRID_STEPS);
            kvq_quantize_keys(bits, X.data(), n, r, codes.data(), grid.data(), step.data());
            kvq_dequantize_keys(bits, codes.data(), grid.data(), step.data(), n, r, Y.data());
            const float ds = fp16_to_fp32(step[0]), dm = fp16_to_fp32(step[1]);
            for (int c = 0; c < r; c++) {
                const std::string at = "bits " + std::to_string(bits) + " r " + std::to_string(r) + " c " +
                                       std::to_string(c);
                float lo, hi, mn = INFINITY, mx = -INFINITY;
                kvq_key_grid_search(bits, X.data() + c, n, r, nullptr, 0, &lo, &hi);
                for (int t = 0; t < n; t++) mn = std::min(mn, X[t * r + c]), mx = std::max(mx, X[t * r + c]);
                EXPECT_LE(kvq_key_grid_sse(bits, X.data() + c, n, r, nullptr, 0, lo, hi),
                          kvq_key_grid_sse(bits, X.data() + c, n, r, nullptr, 0, mn, mx))
                    << at;
                const float s = kivi_grid_scale(grid[c], ds), m = kivi_grid_min(grid[c], dm), g_hi = m + top * s;
                EXPECT_LE(m, lo) << at;
                EXPECT_GT(m, lo - dm * 1.0001f - 1e-6f) << at;
                EXPECT_GE(g_hi, hi * (hi > 0 ? 0.9999f : 1.0001f)) << at;
                EXPECT_LT(g_hi - hi, top * ds + dm + 1e-6f) << at;
                for (int t = 0; t < n; t++) {
                    const float x = X[t * r + c], y = Y[t * r + c];
                    if (x >= m && x <= g_hi)
                        EXPECT_LE(std::fabs(x - y), 0.5f * s * 1.0001f + 1e-6f) << at << " t " << t;
                    else
                        EXPECT_NEAR(y, x < m ? m : g_hi, 1e-6f * std::fabs(g_hi)) << at << " t " << t;
                }
            }
            // at 2 bits the outlier's channel is clipped: the outlier's error grows, the
            // channel's total falls (at 4 bits keeping it is cheaper)
            float lo1, hi1;
            kvq_key_grid_search(bits, X.data() + 1, n, r, nullptr, 0, &lo1, &hi1);
            if (bits == 2) {
                EXPECT_LT(hi1, 9.0f) << "r " << r;
            }
        }
}

// The clipping search's AVX2 errors and its scalar reference pick the same
// grid, bit for bit (the CUDA twin is held to the scalar one by
// tests/simt/test_cuda_kv_append.cpp), over group sizes that do and do not fill
// the 8 lanes and with skipped elements.
TEST(KvQuant, KeyGridSearchSimdMatchesReference) {
    std::mt19937 g(5);
    std::normal_distribution<float> N(0, 1);
    std::uniform_real_distribution<float> U(0, 1);
    int clipped = 0;
    for (int bits : {4, 2})
        for (int n : {3, 8, 13, 32, 64})
            for (int trial = 0; trial < 20; trial++) {
                std::vector<float> x(n);
                std::vector<uint8_t> skip(n);
                for (int t = 0; t < n; t++) {
                    x[t] = N(g) * (U(g) < 0.1f ? 6.0f : 1.0f) + 0.5f;
                    skip[t] = trial % 3 == 0 && U(g) < 0.15f;
                }
                const uint8_t* sk = trial % 3 == 0 ? skip.data() : nullptr;
                float lo0, hi0, lo1, hi1;
                kvq_key_grid_search(bits, x.data(), n, 1, sk, 1, &lo0, &hi0, true);
                kvq_key_grid_search(bits, x.data(), n, 1, sk, 1, &lo1, &hi1, false);
                ASSERT_EQ(lo0, lo1) << bits << "-bit n " << n << " trial " << trial;
                ASSERT_EQ(hi0, hi1) << bits << "-bit n " << n << " trial " << trial;
                float mn = INFINITY, mx = -INFINITY;
                for (int t = 0; t < n; t++)
                    if (!sk || !sk[t]) mn = std::min(mn, x[t]), mx = std::max(mx, x[t]);
                clipped += lo0 > mn || hi0 < mx;
            }
    EXPECT_GT(clipped, 50);  // the cases exercise the clipping, not only the full range
}

// The search over a group's channels at once (eight a vector) picks the grids
// the one-channel scalar reference picks, bit for bit: widths that do and do
// not fill the vectors, groups that do and do not fill the accumulators,
// skipped elements, a channel with every element skipped and a constant one.
TEST(KvQuant, KeyGridSearchRowsMatchesReference) {
    std::mt19937 g(11);
    std::normal_distribution<float> N(0, 1);
    std::uniform_real_distribution<float> U(0, 1);
    int clipped = 0, cases = 0;
    for (int bits : {4, 2})
        for (int r : {8, 13, 24, 128})
            for (int n : {3, 8, 13, 32, 64})
                for (int trial = 0; trial < 3; trial++) {
                    std::vector<float> X((size_t)n * r);
                    std::vector<uint8_t> skip((size_t)n * r);
                    for (size_t i = 0; i < X.size(); i++) {
                        X[i] = N(g) * (U(g) < 0.1f ? 6.0f : 1.0f) + 0.5f;
                        skip[i] = trial == 1 && U(g) < 0.15f;
                    }
                    if (trial == 1)
                        for (int t = 0; t < n; t++) skip[(size_t)t * r + 2] = 1;  // channel 2: nothing counts
                    if (trial == 2)
                        for (int t = 0; t < n; t++) X[(size_t)t * r + 5] = 1.25f;  // channel 5: constant
                    const uint8_t* sk = trial == 1 ? skip.data() : nullptr;
                    std::vector<float> lo0(r), hi0(r), lo1(r), hi1(r);
                    kvq_key_grid_search_rows(bits, X.data(), n, r, r, sk, lo0.data(), hi0.data(), true);
                    kvq_key_grid_search_rows(bits, X.data(), n, r, r, sk, lo1.data(), hi1.data());
                    for (int c = 0; c < r; c++) {
                        ASSERT_EQ(lo0[c], lo1[c]) << bits << "-bit r " << r << " n " << n << " trial " << trial << " c " << c;
                        ASSERT_EQ(hi0[c], hi1[c]) << bits << "-bit r " << r << " n " << n << " trial " << trial << " c " << c;
                        float mn = INFINITY, mx = -INFINITY;
                        for (int t = 0; t < n; t++)
                            if (!sk || !sk[(size_t)t * r + c]) mn = std::min(mn, X[(size_t)t * r + c]), mx = std::max(mx, X[(size_t)t * r + c]);
                        clipped += lo0[c] > mn || hi0[c] < mx;
                        cases++;
                    }
                    if (trial == 1) {
                        EXPECT_EQ(lo1[2], 0.0f);
                        EXPECT_EQ(hi1[2], 0.0f);
                    }
                    if (trial == 2) {
                        EXPECT_EQ(lo1[5], 1.25f);
                        EXPECT_EQ(hi1[5], 1.25f);
                    }
                }
    EXPECT_GT(clipped, cases / 10);  // the cases exercise the clipping
}

// The grid codes: a channel of zeros and a constant channel are exact, and the
// group's steps are the largest min / 127 and scale / 255 rounded up to f16.
TEST(KvQuant, KiviKeyGridCodesEdgeCases) {
    const int r = 3, n = 8;
    std::vector<float> X((size_t)n * r);
    for (int t = 0; t < n; t++) X[t * r + 0] = 0.0f, X[t * r + 1] = -1.5f, X[t * r + 2] = (float)t;
    std::vector<uint8_t> codes((size_t)n * kv_qb_row_bytes(2, r));
    std::vector<uint16_t> grid(r), step(KV_GRID_STEPS);
    std::vector<float> Y(X.size());
    kvq_quantize_keys(2, X.data(), n, r, codes.data(), grid.data(), step.data());
    kvq_dequantize_keys(2, codes.data(), grid.data(), step.data(), n, r, Y.data());
    for (int t = 0; t < n; t++) {
        EXPECT_EQ(Y[t * r + 0], 0.0f) << t;
        EXPECT_NEAR(Y[t * r + 1], -1.5f, 1.5f / 127) << t;
    }
    EXPECT_GE(fp16_to_fp32(step[1]) * 127, 1.5f);
    EXPECT_LT(fp16_to_fp32(step[1]) * 127, 1.5f * 1.002f);
}

TEST(KvQuant, KiviValuesPerTokenWithinHalfStep) {
    for (int bits : {4, 2}) {
        const int r = 40;
        std::vector<float> x = make_rows(1, r, 3), y(r);
        std::vector<uint8_t> codes(kv_qb_row_bytes(bits, r));
        std::vector<uint16_t> g(kv_n_blocks(r, KV_Q4_VBLOCK)), st(KV_GRID_STEPS);
        kvq_quantize_vrow(bits, x.data(), r, codes.data(), g.data(), st.data());
        kvq_dequantize_vrow(bits, codes.data(), g.data(), st.data(), r, y.data());
        const float ds = fp16_to_fp32(st[0]);
        for (int c = 0; c < r; c++)
            EXPECT_LE(std::fabs(x[c] - y[c]), 0.5f * kivi_grid_scale(g[c / KV_Q4_VBLOCK], ds) * 1.0001f + 1e-6f)
                << "bits " << bits << " c " << c;
    }
}

// A group's (token, block) grids share its two steps: blocks 100x apart in
// magnitude, one offset from zero, one constant, and a second token 100x
// smaller than the first. Each coded grid covers its values (every value
// within half a step), and costs at most one step of the group more than the
// block's own range needs: s <= (hi - lo) / top + ds + dm / top and m in
// (lo - dm, lo].
TEST(KvQuant, KiviValueGridCodesShareTheGroupsSteps) {
    constexpr int B = KV_Q4_VBLOCK, nb = 4, r = nb * B, n = 2;
    std::vector<float> X(n * r);
    for (int c = 0; c < B; c++) X[c] = 100.0f * std::sin(0.7f * c);                // wide
    for (int c = B; c < 2 * B; c++) X[c] = 0.5f + 0.5f * std::cos(0.3f * c);      // small, offset
    for (int c = 2 * B; c < 3 * B; c++) X[c] = -3.0f;                             // constant
    for (int c = 3 * B; c < r; c++) X[c] = 0.01f * (c - 3.5f * B);                // tiny, centred
    for (int c = 0; c < r; c++) X[r + c] = 0.01f * X[c];                          // a quiet token
    for (int bits : {4, 2}) {
        const int top = (1 << bits) - 1;
        std::vector<uint8_t> codes(n * kv_qb_row_bytes(bits, r));
        uint16_t g[n * nb], st[KV_GRID_STEPS];
        std::vector<float> Y(n * r);
        kvq_quantize_values(bits, X.data(), n, r, codes.data(), g, st);
        kvq_dequantize_values(bits, codes.data(), g, st, n, r, Y.data());
        const float ds = fp16_to_fp32(st[0]), dm = fp16_to_fp32(st[1]);
        for (int t = 0; t < n; t++)
            for (int b = 0; b < nb; b++) {
                const float* x = &X[t * r + B * b];
                const float lo = *std::min_element(x, x + B), hi = *std::max_element(x, x + B);
                const float sb = kivi_grid_scale(g[t * nb + b], ds), mb = kivi_grid_min(g[t * nb + b], dm);
                EXPECT_LE(mb, lo) << bits << "-bit token " << t << " block " << b;
                EXPECT_GT(mb, lo - dm * 1.0001f) << bits << "-bit token " << t << " block " << b;
                EXPECT_GE(sb * top, (hi - mb) * 0.9999f) << bits << "-bit token " << t << " block " << b;
                EXPECT_LE(sb, (hi - lo) / top + ds + dm / top + 1e-6f) << bits << "-bit token " << t << " block " << b;
                for (int c = 0; c < B; c++)
                    EXPECT_LE(std::fabs(x[c] - Y[t * r + B * b + c]), 0.5f * sb * 1.0001f + 1e-6f)
                        << bits << "-bit token " << t << " c " << B * b + c;
            }
    }
}

// The 2-bit packing: four codes per byte, channel c in bits 2 (c % 4) of byte c / 4.
TEST(KvQuant, Q2PackingOrder) {
    const int r = 8;
    const float x[r] = {0, 1, 2, 3, 3, 2, 1, 0};  // one block, grid 0..3 with step 1 (coded: within 0.1%)
    uint8_t codes[2] = {0xAA, 0xAA};
    uint16_t g, st[KV_GRID_STEPS];
    kvq_quantize_vrow(2, x, r, codes, &g, st);
    EXPECT_NEAR(kivi_grid_scale(g, fp16_to_fp32(st[0])), 1.0f, 1e-3f);
    EXPECT_EQ(kivi_grid_min(g, fp16_to_fp32(st[1])), 0.0f);
    EXPECT_EQ(codes[0], 0 | 1 << 2 | 2 << 4 | 3 << 6);
    EXPECT_EQ(codes[1], 3 | 2 << 2 | 1 << 4 | 0 << 6);
}

// GEAR's low-rank + sparse correction lowers the reconstruction error of a group
// (measured, asserted lower) for keys and values.
TEST(KvQuant, GearLowersGroupError) {
    for (int bits : {4, 2})
        for (bool per_channel : {true, false}) {
            const int n = 32, r = 64, rank = 2, rb = kv_qb_row_bytes(bits, r), vb = kv_n_blocks(r, KV_Q4_VBLOCK);
            const std::vector<float> X = make_rows(n, r, 4);
            std::vector<float> Y(X.size()), Z(X.size());
            const int nb = per_channel ? r : n * vb;
            std::vector<uint8_t> codes((size_t)n * rb);
            std::vector<uint16_t> s(nb), m(per_channel ? KV_GRID_STEPS : n * KV_GRID_STEPS);
            // plain
            if (per_channel) {
                kvq_quantize_keys(bits, X.data(), n, r, codes.data(), s.data(), m.data());
                kvq_dequantize_keys(bits, codes.data(), s.data(), m.data(), n, r, Y.data());
            } else {
                for (int t = 0; t < n; t++) {
                    kvq_quantize_vrow(bits, &X[t * r], r, &codes[t * rb], &s[t * vb], &m[t * KV_GRID_STEPS]);
                    kvq_dequantize_vrow(bits, &codes[t * rb], &s[t * vb], &m[t * KV_GRID_STEPS], r, &Y[t * r]);
                }
            }
            // GEAR
            const int n_out = kvq_gear_n_outliers(n, r, 0.02f);
            std::vector<uint16_t> a(n * rank), b(r * rank), oi(n_out), ov(n_out);
            std::vector<float> work(kvq_gear_work(n, r));
            kvq_quantize_gear(X.data(), n, r, per_channel, rank, n_out, codes.data(), s.data(), m.data(),
                              kvq_gear_out{a.data(), b.data(), oi.data(), ov.data()}, work.data(), bits);
            kvq_dequantize_gear(codes.data(), s.data(), m.data(), n, r, per_channel, rank, n_out, a.data(),
                                b.data(), oi.data(), ov.data(), Z.data(), bits);
            double e_plain = 0, e_gear = 0, norm = 0;
            for (size_t i = 0; i < X.size(); i++) {
                e_plain += (X[i] - Y[i]) * (X[i] - Y[i]);
                e_gear += (X[i] - Z[i]) * (X[i] - Z[i]);
                norm += X[i] * X[i];
            }
            std::printf("[ measured ] %s: relative error plain %d-bit %.4f, GEAR %.4f\n",
                        per_channel ? "keys" : "values", bits, std::sqrt(e_plain / norm), std::sqrt(e_gear / norm));
            EXPECT_LT(e_gear, 0.8 * e_plain) << bits << "-bit " << (per_channel ? "keys" : "values");
        }
}

// ---- attention over a quantized cache ----

struct attn_case {
    int bits;
    bool gear;
    int r_k, r_v;
};

class KvAttention : public ::testing::TestWithParam<attn_case> {};

// Against the dequantized cache the fused kernel must agree to float rounding
// (1e-4); against the original f32 data the error is the quantization's: the
// relative L2 error of the output is asserted below 1e-3 (f16), 5e-3 (8-bit)
// and 0.05 (4-bit), measured and printed.
TEST_P(KvAttention, MatchesReference) {
    const attn_case pc = GetParam();
    const int n = 301, G = 3;  // 9 full groups of 32 + a partial residual window
    const std::vector<float> K = make_rows(n, pc.r_k, 10 + pc.r_k, false), V = make_rows(n, pc.r_v, 20 + pc.r_v, false);
    std::vector<int32_t> pos(n);
    for (int t = 0; t < n; t++) pos[t] = 3 * t;  // gaps, as after eviction
    kv_cache_params p = qparams(pc.bits, pc.gear);
    p.evicting = true;  // positions of its own (a cache without eviction holds consecutive ones)
    kv_cache c(1, 1, n, p, {pc.r_k}, {pc.r_v});
    for (int t = 0; t < n;) {  // uneven appends: prefill chunks then single tokens
        const int k = std::min(n - t, t < 200 ? 37 : 1);
        c.append(0, 0, k, &K[(size_t)t * pc.r_k], pc.r_k, &V[(size_t)t * pc.r_v], pc.r_v, &pos[t]);
        t += k;
    }
    std::vector<float> Kd((size_t)n * pc.r_k), Vd((size_t)n * pc.r_v);
    for (int t = 0; t < n; t++) c.read_slot(0, 0, t, &Kd[(size_t)t * pc.r_k], &Vd[(size_t)t * pc.r_v]);

    std::mt19937 g(7);
    std::normal_distribution<float> N(0, 1);
    std::vector<float> q((size_t)G * pc.r_k);
    for (auto& x : q) x = N(g);
    const float scale = 1.0f / 8.0f;
    for (int32_t qpos : {3 * (n - 1), 3 * 150 + 1}) {
        std::vector<float> ref_deq(G * pc.r_v), ref_orig(G * pc.r_v);
        ref_attention(q.data(), G, Kd.data(), Vd.data(), pos.data(), n, pc.r_k, pc.r_v, qpos, scale, ref_deq.data());
        ref_attention(q.data(), G, K.data(), V.data(), pos.data(), n, pc.r_k, pc.r_v, qpos, scale, ref_orig.data());
        double norm = 0;
        for (float x : ref_orig) norm += x * x;
        norm = std::sqrt(norm);
        for (int parts : {1, 3}) {
            const std::vector<float> out = kernel_attention(c, q.data(), G, qpos, scale, parts);
            const double ed = expect_kernel_matches_dequant(pc.bits, out, ref_deq);
            double d = 0;
            for (size_t i = 0; i < out.size(); i++) d += (out[i] - ref_orig[i]) * (out[i] - ref_orig[i]);
            const double e = std::sqrt(d) / norm;
            if (parts == 1 && qpos == 3 * (n - 1))
                std::printf("[ measured ] bits %d%s r_k %d r_v %d: relative L2 error vs f32 = %.5f, vs dequantized %s %.2g\n",
                            pc.bits, pc.gear ? "+gear" : "", pc.r_k, pc.r_v, e,
                            pc.bits == 4 ? "(relative L2)" : "(max abs)", ed);
            EXPECT_LT(e, pc.bits == 16 ? 1e-3 : pc.bits == 8 ? 5e-3 : 0.05);
        }
    }
}

INSTANTIATE_TEST_SUITE_P(Ranks, KvAttention,
                         ::testing::Values(attn_case{16, false, 64, 64}, attn_case{8, false, 16, 16},
                                           attn_case{8, false, 32, 32}, attn_case{8, false, 64, 64},
                                           attn_case{4, false, 16, 16}, attn_case{4, false, 32, 32},
                                           attn_case{4, false, 64, 64}, attn_case{4, false, 20, 12},
                                           attn_case{4, true, 16, 16}, attn_case{4, true, 32, 32},
                                           attn_case{4, true, 64, 64}, attn_case{4, true, 13, 7},
                                           // ZACK ranks are multiples of 4: every key tail (r % 8 == 4)
                                           // and every partial last value block (4..28 channels)
                                           attn_case{4, false, 4, 4}, attn_case{4, false, 12, 44},
                                           attn_case{4, false, 36, 60}, attn_case{4, false, 52, 24},
                                           attn_case{4, false, 44, 56}, attn_case{4, false, 28, 40},
                                           attn_case{4, true, 36, 52}, attn_case{16, false, 36, 44},
                                           // head dims past 64: several 64-channel row chunks of the
                                           // 4-bit integer paths, an odd block count, and past 256 (keys
                                           // fall back to float dot products)
                                           attn_case{4, false, 128, 128}, attn_case{4, false, 100, 84},
                                           attn_case{4, true, 72, 96}, attn_case{4, false, 264, 200},
                                           // 8-bit fast paths: 4-channel key tails, partial value blocks
                                           attn_case{8, false, 4, 4}, attn_case{8, false, 12, 44},
                                           attn_case{8, false, 36, 60}, attn_case{8, false, 52, 28},
                                           attn_case{8, false, 20, 12}));

// GEAR lowers the attention output error against plain 4-bit on the same data.
TEST(KvAttentionGear, LowerErrorThanPlain4Bit) {
    const int n = 256, G = 3, r = 64;
    const std::vector<float> K = make_rows(n, r, 31), V = make_rows(n, r, 32);
    std::vector<int32_t> pos(n);
    for (int t = 0; t < n; t++) pos[t] = t;
    std::mt19937 g(9);
    std::normal_distribution<float> N(0, 1);
    double err[2] = {0, 0};
    for (int trial = 0; trial < 8; trial++) {
        std::vector<float> q((size_t)G * r), ref(G * r);
        for (auto& x : q) x = N(g);
        ref_attention(q.data(), G, K.data(), V.data(), pos.data(), n, r, r, n - 1, 0.125f, ref.data());
        for (int gear = 0; gear < 2; gear++) {
            kv_cache c(1, 1, n, qparams(4, gear), {r}, {r});
            c.append(0, 0, n, K.data(), r, V.data(), r, pos.data());
            const std::vector<float> out = kernel_attention(c, q.data(), G, n - 1, 0.125f, 2);
            for (size_t i = 0; i < out.size(); i++) err[gear] += (out[i] - ref[i]) * (out[i] - ref[i]);
        }
    }
    std::printf("[ measured ] attention output squared error: plain 4-bit %.5f, GEAR %.5f\n", err[0], err[1]);
    EXPECT_LT(err[1], err[0]);
}

// ---- compaction ----

// Eviction keeps slots in order; 4-bit groups that lose tokens keep their codes
// (exact), merged groups are re-quantized, and the kernel still matches the
// dequantized cache.
TEST(KvCompact, QuantizedBlocksStayConsistent) {
    for (int bits : {16, 8, 4}) {
        for (bool gear : {false, true}) {
            if (gear && bits != 4) continue;
            const int n = 200, r_k = 32, r_v = 24, G = 3;
            kv_cache_params p = qparams(bits, gear);
            p.evicting = true;
            kv_cache c(1, 1, n, p, {r_k}, {r_v});
            const std::vector<float> K = make_rows(n, r_k, 41), V = make_rows(n, r_v, 42);
            std::vector<int32_t> pos(n);
            for (int t = 0; t < n; t++) pos[t] = t;
            c.append(0, 0, n, K.data(), r_k, V.data(), r_v, pos.data());
            std::vector<float> before_k((size_t)n * r_k), before_v((size_t)n * r_v);
            for (int t = 0; t < n; t++) c.read_slot(0, 0, t, &before_k[t * r_k], &before_v[t * r_v]);
            std::mt19937 g(5);
            for (int round = 0; round < 3; round++) {
                const kv_block& b = c.block(0, 0);
                std::vector<uint8_t> keep(b.n_used);
                for (auto& k : keep) k = (g() % 3) != 0;
                std::vector<int32_t> kept;
                for (int64_t s = 0; s < b.n_used; s++)
                    if (keep[s]) kept.push_back(b.pos[s]);
                c.compact(0, 0, keep.data());
                ASSERT_EQ(b.n_used, (int64_t)kept.size()) << "bits " << bits << " gear " << gear << " round " << round;
                for (int64_t s = 0; s < b.n_used; s++) ASSERT_EQ(b.pos[s], kept[s]);
                // A slot reads back as before (16/8-bit, untouched 4-bit groups), or within
                // a second quantization step (merged 4-bit groups: a step is at most the
                // channel's range / 15).
                std::vector<float> kr(r_k), vr(r_v), range(r_k);
                for (int ch = 0; ch < r_k; ch++) {
                    float lo = 1e30f, hi = -1e30f;
                    for (int t = 0; t < n; t++) lo = std::min(lo, K[t * r_k + ch]), hi = std::max(hi, K[t * r_k + ch]);
                    range[ch] = hi - lo;
                }
                for (int64_t s = 0; s < b.n_used; s++) {
                    c.read_slot(0, 0, s, kr.data(), vr.data());
                    const int t = b.pos[s];
                    if (t >= n) continue;  // refilled below
                    for (int ch = 0; ch < r_k; ch++)
                        EXPECT_NEAR(kr[ch], before_k[t * r_k + ch], bits == 4 ? range[ch] / 15 : 1e-6)
                            << bits << " " << s;
                }
                // refill a little so groups form again
                std::vector<int32_t> np(10);
                for (int i = 0; i < 10; i++) np[i] = 1000 + round * 10 + i;
                c.append(0, 0, 10, K.data(), r_k, V.data(), r_v, np.data());
                std::vector<float> Kd((size_t)b.n_used * r_k), Vd((size_t)b.n_used * r_v);
                for (int64_t s = 0; s < b.n_used; s++) c.read_slot(0, 0, s, &Kd[s * r_k], &Vd[s * r_v]);
                std::vector<float> q((size_t)G * r_k, 0.3f), ref(G * r_v);
                for (int i = 0; i < G * r_k; i++) q[i] = std::sin(0.7f * i);
                ref_attention(q.data(), G, Kd.data(), Vd.data(), b.pos, (int)b.n_used, r_k, r_v, 1 << 30,
                              0.2f, ref.data());
                expect_kernel_matches_dequant(bits, kernel_attention(c, q.data(), G, 1 << 30, 0.2f, 3), ref);
            }
        }
    }
}

// ---- exact sinks ----

// With exact sinks the first positions are attended through f32 rows at full
// head dim (q and k, v of all 64 channels), the rest through the rank-r_k/r_v
// (quantized) cache; the merged output has 64 channels, zero past r_v except
// for the sinks' share. Against that reference built from the dequantized
// cache: float rounding for 16/8-bit (1e-4), the int8 query bound for 4-bit
// (relative L2 < 1%). Eviction of a sink slot removes it from attention.
TEST(KvSinks, ExactRowsReplaceTheirSlots) {
    const int n = 150, G = 3, D = 64, r_k = 20, r_v = 12, S = 4;
    const std::vector<float> K = make_rows(n, D, 41), V = make_rows(n, D, 42);
    std::vector<int32_t> pos(n);
    for (int t = 0; t < n; t++) pos[t] = 3 * t;  // positions 0 and 3 are sinks (< 4)
    std::mt19937 g(9);
    std::normal_distribution<float> N(0, 1);
    std::vector<float> q((size_t)G * D);
    for (auto& x : q) x = N(g);
    const float scale = 1.0f / 8.0f;
    for (int bits : {16, 8, 4}) {
        kv_cache_params p = qparams(bits);
        p.type = dtype::F32;
        p.sinks = S;
        p.sink_dim = D;
        p.evicting = true;
        kv_cache c(1, 1, n, p, {r_k}, {r_v});
        for (int t = 0; t < n;) {
            const int k = std::min(n - t, t < 100 ? 37 : 1);
            c.append(0, 0, k, &K[(size_t)t * D], D, &V[(size_t)t * D], D, &pos[t]);
            t += k;
        }
        for (bool evicted : {false, true}) {
            if (evicted) {  // drop the second sink (position 3) and a few others
                std::vector<uint8_t> keep(c.block(0, 0).n_used, 1);
                keep[1] = keep[40] = keep[41] = 0;
                c.compact(0, 0, keep.data());
            }
            const attn_kv_view kv = c.view(0, 0);
            ASSERT_EQ(kv.n_sink_slots, evicted ? 1 : 2);
            // reference: all slots widened to D channels; sinks from the exact rows
            const int64_t ns = kv.n_slots;
            std::vector<float> Kr((size_t)ns * D, 0.0f), Vr((size_t)ns * D, 0.0f), kd(r_k), vd(r_v);
            std::vector<int32_t> pr(kv.pos, kv.pos + ns);
            for (int64_t s = 0; s < ns; s++) {
                const int t = pr[s] / 3;
                if (pr[s] < S) {
                    std::copy(&K[(size_t)t * D], &K[(size_t)t * D] + D, &Kr[(size_t)s * D]);
                    std::copy(&V[(size_t)t * D], &V[(size_t)t * D] + D, &Vr[(size_t)s * D]);
                    continue;
                }
                c.read_slot(0, 0, s, kd.data(), vd.data());
                std::copy(kd.begin(), kd.end(), &Kr[(size_t)s * D]);  // q's channels past r_k meet zeros
                std::copy(vd.begin(), vd.end(), &Vr[(size_t)s * D]);
            }
            for (int32_t qpos : {3 * (n - 1), 2}) {
                std::vector<float> ref((size_t)G * D);
                ref_attention(q.data(), G, Kr.data(), Vr.data(), pr.data(), (int)ns, D, D, qpos, scale, ref.data());
                std::vector<float> m(4 * G), l(4 * G), acc((size_t)4 * G * D), logits((size_t)G * ns, 7.0f);
                std::vector<float> scratch(kernel_attention_scratch(G, ns, r_k, r_v, 0));
                std::vector<attn_partial> ps;
                const attn_q_view qv{q.data(), 0, D, G, 1, &qpos, scale};
                for (int part = 0; part < 3; part++) {
                    ps.push_back(attn_partial{m.data() + part * G, l.data() + part * G, acc.data() + part * G * D,
                                              logits.data(), ns});
                    kernel_attention_range(kv, ns * part / 3, ns * (part + 1) / 3, qv, ps.back(), scratch.data());
                }
                ps.push_back(attn_partial{m.data() + 3 * G, l.data() + 3 * G, acc.data() + 3 * G * D, logits.data(),
                                          ns, D});
                kernel_attention_sinks(kv, qv, ps.back());
                std::vector<float> out((size_t)G * D);
                kernel_attention_merge(ps.data(), 4, 1, G, r_v, out.data(), 0, D);
                expect_kernel_matches_dequant(bits, out, ref);
                // the sink slots' logits are the exact full-dim scores
                for (int j = 0; j < G; j++)
                    for (int64_t s = 0; s < kv.n_sink_slots; s++) {
                        double d = 0;
                        for (int ch = 0; ch < D; ch++) d += (double)q[j * D + ch] * Kr[(size_t)s * D + ch];
                        const float lg = logits[j * ns + s];
                        if (pr[s] <= qpos) EXPECT_NEAR(lg, d * scale, 1e-4);
                        else EXPECT_TRUE(std::isinf(lg) && lg < 0);
                    }
            }
        }
    }
}

// ---- the append plan (what the CUDA backend replays on its device copy) ----

// append_plan's counts are append's, and its steps cover the call's tokens
// in order: stores of consecutive slots, a flush wherever append quantizes a
// group. Every layout pair (4-bit keys over f16 values and the reverse, 8-bit
// alone and beside KIVI), calls of 1..40 tokens.
TEST(KvAppendPlan, CountsAndStepsMatchAppend) {
    struct cfg {
        int bk, bv;
    };
    for (const cfg f : {cfg{16, 16}, cfg{8, 8}, cfg{4, 4}, cfg{2, 2}, cfg{4, 16}, cfg{16, 2}, cfg{8, 4}}) {
        kv_cache_params p;
        p.bits_k = {f.bk};
        p.bits_v = {f.bv};
        p.residual = 0;  // the default window
        const int64_t cap = 512;
        kv_cache c(1, 1, cap, p, {24}, {16});
        std::mt19937 g(3);
        std::vector<float> rows(64 * 24);
        std::normal_distribution<float> N(0, 1);
        for (auto& x : rows) x = N(g);
        std::vector<int32_t> pos(64);
        int64_t used = 0;
        int flushes = 0;
        while (true) {
            const int64_t n = 1 + (int64_t)(g() % 40);
            if (used + n > c.block(0, 0).capacity) {
                EXPECT_THROW(c.append_plan(0, 0, n), zk::error);
                break;
            }
            const kv_block& b = c.block(0, 0);
            const kv_append_plan pl = c.append_plan(0, 0, n);
            int64_t t = 0, nq = b.n_quant, ng = b.n_groups, nu = b.n_used;
            for (const kv_append_step& st : pl.steps) {
                if (st.flush) {
                    EXPECT_EQ(st.group, ng);
                    EXPECT_EQ(st.s0, nq);
                    EXPECT_EQ(st.rest, nu - nq - p.group);
                    ng++, nq += p.group, flushes++;
                } else {
                    EXPECT_EQ(st.t0, t);
                    EXPECT_EQ(st.s0, nu);
                    EXPECT_EQ(st.rs0, nu - nq);
                    t += st.n, nu += st.n;
                }
            }
            EXPECT_EQ(t, n);
            for (int64_t i = 0; i < n; i++) pos[(size_t)i] = (int32_t)(used + i);
            c.append(0, 0, n, rows.data(), 24, rows.data(), 24, pos.data());
            used += n;
            EXPECT_EQ(pl.n_used, b.n_used) << f.bk << "/" << f.bv;
            EXPECT_EQ(pl.n_quant, b.n_quant) << f.bk << "/" << f.bv;
            EXPECT_EQ(pl.n_groups, b.n_groups) << f.bk << "/" << f.bv;
        }
        if (f.bk <= 4 || f.bv <= 4) {
            EXPECT_GT(flushes, 3) << f.bk << "/" << f.bv;
        }
    }
}

// ---- a prefill chunk attends before its groups are quantized ----

// append(..., hold): the chunk's queries read (view_attend) the groups that
// were quantized before the call in their codes and every later slot, the
// window then and the chunk's own rows, at full precision (f16 rows), while
// the block itself quantizes as always. Checked through the reference kernel
// against float attention over exactly those rows (1e-5), for every layout
// pair with a window (4- and 2-bit keys or values, 8-bit beside KIVI), at
// queries inside the chunk (causal) and at its end; an append without hold
// (a decode step) drops what was kept aside.
TEST(KvHold, ChunkReadsItsOwnRowsAtFullPrecision) {
    struct cfg {
        int bk, bv, tier;
    };
    const int rk = 36, rv = 28, G = 2, n1 = 150, n2 = 100;
    // (tiers, kv_cache_params::tier: of 64 tokens the chunk's append moves the
    // tier's codes down, which the chunk must not see; of 256 it only adds groups)
    for (const cfg f : {cfg{4, 4, 0}, cfg{2, 2, 0}, cfg{4, 16, 0}, cfg{16, 2, 0}, cfg{8, 4, 0}, cfg{2, 2, 64},
                        cfg{2, 2, 256}}) {
        SCOPED_TRACE(std::to_string(f.bk) + "/" + std::to_string(f.bv) + " tier " + std::to_string(f.tier));
        kv_cache_params p;
        p.bits_k = {f.bk};
        p.bits_v = {f.bv};
        p.residual = 64;
        p.tier = f.tier;
        kv_cache c(1, 1, 512, p, {rk}, {rv});
        const int n = n1 + n2 + 1;
        const std::vector<float> K = make_rows(n, rk, 41, false), V = make_rows(n, rv, 42, false);
        std::vector<int32_t> pos(n);
        for (int t = 0; t < n; t++) pos[t] = t;
        c.append(0, 0, n1, K.data(), rk, V.data(), rv, pos.data(), true);
        // what the second chunk must see: slots quantized now as they read now,
        // the rest (window and chunk) as f16 rows of the originals
        const kv_block& b = c.block(0, 0);
        ASSERT_EQ(b.tiered, f.tier > 0);
        const int64_t nq = b.n_quant, ng = b.n_groups, tq = b.t_quant;  // (a tier's codes: after the block's)
        if (f.tier > 0) {
            ASSERT_GT(tq, 0);
        }
        std::vector<float> Ks((size_t)(n1 + n2) * rk), Vs((size_t)(n1 + n2) * rv);
        for (int64_t s = 0; s < n1 + n2; s++) {
            float* ks = &Ks[(size_t)s * rk];
            float* vs = &Vs[(size_t)s * rv];
            if (s < nq + tq) {
                c.read_slot(0, 0, s, ks, vs);
                continue;
            }
            uint8_t buf[4 * 64];
            kv_store_row(dtype::F16, &K[(size_t)s * rk], buf, rk);
            kv_load_row(dtype::F16, buf, ks, rk);
            kv_store_row(dtype::F16, &V[(size_t)s * rv], buf, rv);
            kv_load_row(dtype::F16, buf, vs, rv);
        }
        c.append(0, 0, n2, &K[(size_t)n1 * rk], rk, &V[(size_t)n1 * rv], rv, &pos[n1], true);
        ASSERT_TRUE(c.held(0, 0));
        ASSERT_GT(b.n_quant + b.t_quant, nq + tq + p.group);  // the chunk's append quantized groups
        const attn_kv_view kv = c.view_attend(0, 0);
        EXPECT_EQ(kv.n_slots, n1 + n2);
        EXPECT_EQ(kv.n_groups, ng);
        if (f.bk != 16) {
            EXPECT_EQ(kv.k.n_quant, nq);
        }
        if (f.bv != 16) {
            EXPECT_EQ(kv.v.n_quant, nq);
        }
        if (f.tier > 0) {
            ASSERT_NE(kv.tier, nullptr);
            EXPECT_EQ(kv.tier->k.n_quant, tq);
            EXPECT_EQ(kv.tier->n_slots, n1 + n2 - nq);
            EXPECT_EQ(b.n_quant > nq, f.tier == 64);  // groups left the tier (64) or only joined it (256)
        }
        std::mt19937 g(5);
        std::normal_distribution<float> N(0, 1);
        std::vector<float> q((size_t)G * rk);
        for (auto& x : q) x = N(g);
        for (int32_t qpos : {n1, n1 + 40, n1 + n2 - 1}) {
            std::vector<float> want((size_t)G * rv), got((size_t)G * rv), m(G), l(G), acc((size_t)G * rv);
            ref_attention(q.data(), G, Ks.data(), Vs.data(), pos.data(), n1 + n2, rk, rv, qpos, 0.125f, want.data());
            std::vector<float> scratch(kernel_attention_scratch(G, kv.n_slots, rk, rv, 0));
            const attn_q_view qv{q.data(), 0, rk, G, 1, &qpos, 0.125f};
            const attn_partial pt{m.data(), l.data(), acc.data()};
            kernel_attention_range_ref(kv, 0, qpos + 1, qv, pt, scratch.data());
            kernel_attention_merge(&pt, 1, 1, G, rv, got.data(), 0, rv);
            EXPECT_LT(max_abs_diff(got, want), 1e-5) << "query at " << qpos;
        }
        // a decode step's append: view_attend is view() again
        c.append(0, 0, 1, &K[(size_t)(n1 + n2) * rk], rk, &V[(size_t)(n1 + n2) * rv], rv, &pos[n1 + n2]);
        EXPECT_FALSE(c.held(0, 0));
        EXPECT_EQ(c.view_attend(0, 0).n_groups, c.view(0, 0).n_groups);
        EXPECT_EQ(c.view_attend(0, 0).k.rows, c.view(0, 0).k.rows);
    }
}

// ---- positions ----

// Without eviction every block reads its positions from one ramp (pos_base +
// slot): appends must bring the next position, and only the oldest slots may
// leave (a sliding window); the positions then go on from the new first slot.
TEST(KvPositions, SharedRampWithoutEviction) {
    for (int bits : {16, 4}) {
        const int r = 16;
        kv_cache c(2, 2, 128, qparams(bits), {r, r, r, r}, {r, r, r, r});
        const std::vector<float> K = make_rows(128, r, 3);
        std::vector<int32_t> pos(128);
        for (int t = 0; t < 128; t++) pos[t] = t;
        for (int l = 0; l < 2; l++)
            for (int h = 0; h < 2; h++) c.append(l, h, 70, K.data(), r, K.data(), r, pos.data());
        EXPECT_EQ(c.block(0, 0).pos, c.block(1, 1).pos) << "one ramp";
        // a gap, or a position already held, is refused with the block named
        const int32_t gap = 71, again = 69;
        try {
            c.append(1, 0, 1, K.data(), r, K.data(), r, &gap);
            ADD_FAILURE() << "a gap was accepted";
        } catch (const zk::error& e) {
            EXPECT_NE(std::string(e.what()).find("block (1, 0): slot 70 would hold position 71"), std::string::npos)
                << e.what();
        }
        EXPECT_THROW(c.append(0, 1, 1, K.data(), r, K.data(), r, &again), zk::error);
        const int32_t run[3] = {70, 71, 73};
        EXPECT_THROW(c.append(1, 1, 3, K.data(), r, K.data(), r, run), zk::error) << "a gap inside a run";
        EXPECT_EQ(c.block(1, 0).n_used, 70);
        EXPECT_EQ(c.block(1, 1).n_used, 70) << "nothing stored by a refused append";
        // a slot removed after kept ones is refused; dropping the oldest 32 is not
        std::vector<uint8_t> keep(70, 1);
        keep[40] = 0;
        EXPECT_THROW(c.compact(0, 0, keep.data()), zk::error);
        std::fill(keep.begin(), keep.end(), 1);
        std::fill(keep.begin(), keep.begin() + 32, 0);
        std::vector<float> k_before(r), v_before(r), k_after(r), v_after(r);
        c.read_slot(0, 0, 32, k_before.data(), v_before.data());
        c.compact(0, 0, keep.data());
        const kv_block& b = c.block(0, 0);
        ASSERT_EQ(b.n_used, 38);
        EXPECT_EQ(b.pos[0], 32);
        EXPECT_EQ(c.view(0, 0).pos[37], 69);
        c.read_slot(0, 0, 0, k_after.data(), v_after.data());
        EXPECT_EQ(k_before, k_after);
        c.append(0, 0, 2, K.data(), r, K.data(), r, &pos[70]);
        EXPECT_EQ(b.pos[39], 71);
        EXPECT_EQ(c.block(0, 1).pos[0], 0) << "the other blocks keep their first slot";
        c.clear();
        EXPECT_EQ(c.block(0, 0).pos[0], 0);
        c.append(0, 0, 1, K.data(), r, K.data(), r, &pos[0]);
    }
}

// ---- accounting ----

TEST(KvAccounting, AccountedEqualsAllocated) {
    const std::vector<int> rk = {64, 32, 20, 4}, rv = {64, 16, 12, 8};
    for (int bits : {16, 8, 4})
        for (bool gear : {false, true})
            for (bool evicting : {false, true})
                for (int64_t cap : {100, 4096}) {
                    if (gear && bits != 4) continue;
                    kv_cache_params p = qparams(bits, gear);
                    p.key_tail = bits == 4 && !gear ? 24 : 0;  // 1-bit key tails (clamped to rank 20 and 4)
                    p.evicting = evicting;
                    p.scores = evicting;
                    p.residual = 0;  // the default window
                    p.sinks = evicting ? 4 : 0;
                    p.sink_dim = 64;
                    kv_cache c(2, 2, cap, p, rk, rv);
                    EXPECT_EQ(c.bytes_allocated(), c.bytes_for_capacity(c.capacity()))
                        << "bits " << bits << " gear " << gear << " evicting " << evicting << " cap " << cap;
                    // per-token cost: exactly linear in the capacity beyond the fixed part
                    const int64_t span = bits == 4 ? 64 : 1;
                    EXPECT_DOUBLE_EQ(c.bytes_per_token_exact() * 10 * span,
                                     (double)(c.bytes_for_capacity(c.capacity() + 10 * span) -
                                              c.bytes_for_capacity(c.capacity())));
                }
    // 16-bit f16 full rank: 2 * 64 * 2 bytes per head + a 4-byte position, shared
    // by the heads of a cache without eviction, one per head with eviction
    kv_cache f16(1, 3, 10, qparams(16), {64, 64, 64}, {64, 64, 64});
    EXPECT_EQ(f16.bytes_per_token(), 3u * 256 + 4);
    kv_cache_params pe = qparams(16);
    pe.evicting = true;
    EXPECT_EQ(kv_cache(1, 3, 10, pe, {64, 64, 64}, {64, 64, 64}).bytes_per_token(), 3u * (256 + 4));
    // 4-bit at rank 32 is well under a quarter of f16 full rank
    kv_cache q4(1, 3, 1024, qparams(4), {32, 32, 32}, {32, 32, 32});
    EXPECT_LT(q4.bytes_per_token_exact(), 0.25 * f16.bytes_per_token_f16(64));
    std::printf("[ measured ] %s\n", q4.describe(64).c_str());
}

// ---- rejected parameters ----

TEST(KvParams, BadValuesRejected) {
    kv_cache_params p;
    p.bits = 3;
    EXPECT_THROW(kv_cache_validate_params(p), zk::error);
    p = qparams(4);
    p.group = 0;
    EXPECT_THROW(kv_cache_validate_params(p), zk::error);
    p = qparams(4);
    p.residual = 48;  // not a multiple of 32
    EXPECT_THROW(kv_cache_validate_params(p), zk::error);
    p = qparams(8, true);  // GEAR needs 4-bit
    EXPECT_THROW(kv_cache_validate_params(p), zk::error);
    p = qparams(4);
    p.sinks = 65;
    EXPECT_THROW(kv_cache_validate_params(p), zk::error);
    p.sinks = 4;  // a row width is needed to build one
    EXPECT_THROW(kv_cache(1, 1, 64, p, {32}, {32}), zk::error);
    p.sink_dim = 64;
    EXPECT_NO_THROW(kv_cache(1, 1, 64, p, {32}, {32}));
    // the default residual window: 128 tokens, a whole number of groups, at most half a small cache
    p = qparams(4);
    p.residual = 0;
    EXPECT_EQ(kv_cache_residual(p, 4096), 128);
    EXPECT_EQ(kv_cache_residual(p, 128), 64);
    EXPECT_EQ(kv_cache_residual(p, 32), 32);
    p.group = 96;
    EXPECT_EQ(kv_cache_residual(p, 4096), 192);
    p.residual = 96;  // given: kept
    EXPECT_EQ(kv_cache_residual(p, 96), 96);
    EXPECT_NO_THROW(kv_cache_validate_params(qparams(4, true)));

    evict_params e;
    e.n_sink = -1;  // sinks matter without eviction too (exact in a lossy cache)
    EXPECT_THROW(evict_validate_params(e, 4096), zk::error);
    e.n_sink = 65;
    EXPECT_THROW(evict_validate_params(e, 4096), zk::error);
    e.n_sink = 4;
    e.policy = "h2o";
    e.budget = 0;
    EXPECT_THROW(evict_validate_params(e, 4096), zk::error);
    e.budget = 256;
    EXPECT_NO_THROW(evict_validate_params(e, 4096));
    e.crush = 1.0f;
    EXPECT_THROW(evict_validate_params(e, 4096), zk::error);
    e.crush = 0.25f;
    e.crush_anchor = "median";
    EXPECT_THROW(evict_validate_params(e, 4096), zk::error);
    e.crush_anchor = "alternate";
    EXPECT_NO_THROW(evict_validate_params(e, 4096));
    e.budget = 20;  // 4 sinks + 5 recent fit, but with --kv-recent 16 nothing is left
    e.n_recent = 16;
    EXPECT_THROW(evict_validate_params(e, 4096), zk::error);
    e = evict_params{};
    e.policy = "lru";
    EXPECT_THROW(evict_validate_params(e, 4096), zk::error);
    e.policy = "none";
    e.budget = 100;
    EXPECT_THROW(evict_validate_params(e, 4096), zk::error);
}

// kv_cache::read_quant (what a prefill chunk's tiled attention reads of the
// quantized slots) is read_slot's dequantization, whole groups and ranges that
// cut groups alike, for KIVI keys and values (with GEAR's correction, with a
// 1-bit tail and 0-bit channels), 8-bit rows and a block without a window.
TEST(KvReadQuant, IsWhatTheKernelReads) {
    struct cfg {
        int bk, bv;
        bool gear;
        int tail, zero;
    };
    const int rk = 36, rv = 28, n = 230;
    for (const cfg f : {cfg{4, 4, false, 0, 0}, cfg{2, 2, true, 0, 0}, cfg{4, 2, false, 8, 4}, cfg{8, 8, false, 0, 0},
                        cfg{8, 4, false, 0, 0}}) {
        SCOPED_TRACE(std::to_string(f.bk) + "/" + std::to_string(f.bv) + (f.gear ? " gear" : "") + " tail " +
                     std::to_string(f.tail) + " zero " + std::to_string(f.zero));
        kv_cache_params p;
        p.bits_k = {f.bk};
        p.bits_v = {f.bv};
        p.residual = 64;
        p.gear = f.gear;
        p.key_tail = f.tail;
        p.key_zero = f.zero;
        kv_cache c(1, 1, 512, p, {rk}, {rv});
        const std::vector<float> K = make_rows(n, rk, 51, false), V = make_rows(n, rv, 52, false);
        std::vector<int32_t> pos(n);
        for (int t = 0; t < n; t++) pos[t] = t;
        c.append(0, 0, 150, K.data(), rk, V.data(), rv, pos.data());
        c.append(0, 0, n - 150, &K[(size_t)150 * rk], rk, &V[(size_t)150 * rv], rv, &pos[150]);
        const int64_t nq = c.block(0, 0).n_quant;
        ASSERT_GT(nq, 100);
        std::vector<float> ks(rk), vs(rv);
        for (auto [s0, s1] : {std::pair<int64_t, int64_t>{0, nq}, {5, nq - 3}, {33, 34}}) {
            std::vector<float> Kq((size_t)(s1 - s0) * rk), Vq((size_t)(s1 - s0) * rv);
            c.read_quant(0, 0, true, s0, s1, Kq.data());
            c.read_quant(0, 0, false, s0, s1, Vq.data());
            for (int64_t s = s0; s < s1; s++) {
                c.read_slot(0, 0, s, ks.data(), vs.data());
                for (int i = 0; i < rk; i++) ASSERT_EQ(Kq[(size_t)(s - s0) * rk + i], ks[i]) << "key slot " << s;
                for (int i = 0; i < rv; i++) ASSERT_EQ(Vq[(size_t)(s - s0) * rv + i], vs[i]) << "value slot " << s;
            }
        }
        EXPECT_THROW(c.read_quant(0, 0, true, 0, nq + 1, std::vector<float>((size_t)(nq + 1) * rk).data()), error);
    }
}
