// KIVI key rows whose channels take unequal widths (kernels/attention.h):
// 1-bit tails, 0-bit channels (each its group's mean) and 2-bit channels of
// 4-bit keys: each part's bytes where the layout puts them, each element read
// back from its own grid within the bound its width implies, the grids against
// the searches that chose them, and bad counts refused (kv_quant and the
// cache's parameters).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
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

// 1-bit key tails: channel h + i of a row whose last `tail` channels are 1-bit
// is bit i / tb of tail byte i % tb (tb = kv_tail_bytes(tail)), after the h
// codes of the width; each tail element reads back as the nearer of its
// channel's two coded levels, those levels lie within a min step and a scale
// step of Lloyd's two means, and those beat the range's ends in squared error;
// the channels before the tail read back within half a step inside their grids.
TEST(KvKeyParts, KeyTailsOneBitLevels) {
    for (int bits : {4, 2})
        for (int r : {4, 17, 64, 128})
            for (int tail : {1, 3, 9, 16, 24, r}) {
                if (tail > r || tail > KV_KEY_TAIL_MAX) continue;
                const int n = 32, h = r - tail, tb = kv_tail_bytes(tail), rb = kv_key_row_bytes(bits, r, tail);
                const std::string at =
                    "bits " + std::to_string(bits) + " r " + std::to_string(r) + " tail " + std::to_string(tail);
                ASSERT_EQ(rb, kv_qb_row_bytes(bits, h) + tb) << at;
                std::vector<float> X = make_rows(n, r, 3 + r + tail), Y(X.size());
                std::vector<uint8_t> codes((size_t)n * rb, 0xAA);
                std::vector<uint16_t> grid(r), step(KV_GRID_STEPS);
                kvq_quantize_keys(bits, X.data(), n, r, codes.data(), grid.data(), step.data(), nullptr, tail);
                kvq_dequantize_keys(bits, codes.data(), grid.data(), step.data(), n, r, Y.data(), tail);
                const float ds = fp16_to_fp32(step[0]), dm = fp16_to_fp32(step[1]);
                for (int i = 0; i < tail; i++) {
                    const int c = h + i;
                    const float m = kivi_grid_min(grid[c], dm), s = kivi_grid_scale(grid[c], ds);
                    float lo, hi, mn = INFINITY, mx = -INFINITY;
                    kvq_key_levels_1bit(X.data() + c, n, r, nullptr, 0, &lo, &hi);
                    for (int t = 0; t < n; t++) mn = std::min(mn, X[t * r + c]), mx = std::max(mx, X[t * r + c]);
                    EXPECT_LE(kvq_key_grid_sse(1, X.data() + c, n, r, nullptr, 0, lo, hi),
                              kvq_key_grid_sse(1, X.data() + c, n, r, nullptr, 0, mn, mx) * 1.0001f)
                        << at << " c " << c;
                    EXPECT_LE(m, lo) << at << " c " << c;
                    EXPECT_GT(m, lo - dm * 1.0001f - 1e-6f) << at << " c " << c;
                    EXPECT_GE(m + s, hi - 1e-6f) << at << " c " << c;
                    EXPECT_LT(m + s - hi, ds + dm + 1e-6f) << at << " c " << c;
                    for (int t = 0; t < n; t++) {
                        const float x = X[t * r + c], y = Y[t * r + c];
                        const int bit = (codes[(size_t)t * rb + kv_qb_row_bytes(bits, h) + i % tb] >> (i / tb)) & 1;
                        EXPECT_FLOAT_EQ(y, bit ? m + s : m) << at << " c " << c << " t " << t;
                        EXPECT_LE(std::fabs(x - y), std::fabs(x - (bit ? m : m + s)) + 1e-5f)
                            << at << " c " << c << " t " << t;
                    }
                }
                // the head of the row: codes of the width, within half a step inside the channel's grid
                for (int c = 0; c < h; c++) {
                    const float m = kivi_grid_min(grid[c], dm), s = kivi_grid_scale(grid[c], ds);
                    const float g_hi = m + ((1 << bits) - 1) * s;
                    for (int t = 0; t < n; t++) {
                        const float x = X[t * r + c], y = Y[t * r + c];
                        if (x >= m && x <= g_hi)
                            EXPECT_LE(std::fabs(x - y), 0.5f * s * 1.0001f + 1e-6f) << at << " c " << c << " t " << t;
                        else
                            EXPECT_NEAR(y, x < m ? m : g_hi, 1e-5f * std::fabs(g_hi) + 1e-6f) << at << " c " << c;
                    }
                }
            }
    kv_cache_params p;
    p.bits = 2;
    p.key_tail = KV_KEY_TAIL_MAX + 1;
    EXPECT_THROW(kv_cache_validate_params(p), zk::error);
    p.key_tail = 8;
    p.gear = true;
    EXPECT_THROW(kv_cache_validate_params(p), zk::error);
    p.gear = false;
    p.tails_k = {8, -1};
    EXPECT_THROW(kv_cache_validate_params(p), zk::error);
    p.tails_k = {8, 8};
    EXPECT_THROW(kv_cache_validate_params(p, 1, 3), zk::error);
    EXPECT_NO_THROW(kv_cache_validate_params(p, 1, 2));
}

// 0-bit key channels: the last `zero` channels of a row have no codes, each
// reads back as its group's mean (within half a min step; skipped elements
// left out of the mean), their min codes follow the others' grid codes as
// bytes, and the rest of the row (its codes and the tail before the 0-bit
// channels) comes out exactly as a key of r - zero channels with that tail.
TEST(KvKeyParts, KeyZeroChannelsAreGroupMeans) {
    for (int bits : {4, 2})
        for (int r : {4, 17, 64, 128})
            for (int zero : {1, 3, 16, 32, r})
                for (int tail : {0, 5, 64}) {
                    if (zero > r || tail + zero > r) continue;
                    const int n = 32, rc = r - zero, rb = kv_key_row_bytes(bits, r, tail, zero);
                    const std::string at = "bits " + std::to_string(bits) + " r " + std::to_string(r) + " zero " +
                                           std::to_string(zero) + " tail " + std::to_string(tail);
                    ASSERT_EQ(rb, kv_key_row_bytes(bits, rc, tail)) << at;
                    std::vector<float> X = make_rows(n, r, 7 + r + zero + tail), Y(X.size());
                    for (int t = 0; t < n; t++)  // an offset per 0-bit channel: the mean is not ~0
                        for (int c = rc; c < r; c++) X[(size_t)t * r + c] += 0.3f * (float)((c % 5) - 2);
                    std::vector<uint8_t> skip((size_t)n * r, 0);
                    for (int t = 0; t < n; t += 7) skip[(size_t)t * r + r - 1] = 1;
                    const int gw = kv_key_grid_words(r, zero);
                    ASSERT_EQ(gw, rc + (zero + 1) / 2) << at;
                    std::vector<uint8_t> codes((size_t)n * rb + 1, 0xAA);
                    std::vector<uint16_t> grid(gw + 1, 0xBEEF), step(KV_GRID_STEPS);
                    kvq_quantize_keys(bits, X.data(), n, r, codes.data(), grid.data(), step.data(), skip.data(), tail,
                                      zero);
                    EXPECT_EQ(grid[gw], 0xBEEF) << at << ": grid written past its words";
                    EXPECT_EQ(codes[(size_t)n * rb], 0xAA) << at << ": codes written past their rows";
                    kvq_dequantize_keys(bits, codes.data(), grid.data(), step.data(), n, r, Y.data(), tail, zero);
                    const float dm = fp16_to_fp32(step[1]);
                    for (int c = rc; c < r; c++) {
                        double s = 0;
                        int k = 0;
                        for (int t = 0; t < n; t++)
                            if (!skip[(size_t)t * r + c]) s += X[(size_t)t * r + c], k++;
                        const float mean = (float)(s / k);
                        const float m = dm * (float)((const int8_t*)(grid.data() + rc))[c - rc];
                        EXPECT_LE(std::fabs(m - mean), 0.5f * dm * 1.0001f + 1e-6f) << at << " c " << c;
                        for (int t = 0; t < n; t++) EXPECT_EQ(Y[(size_t)t * r + c], m) << at << " c " << c;
                    }
                    // the coded channels: the same bits as a key of rc channels with the same steps
                    if (rc == 0) continue;
                    std::vector<float> Xc((size_t)n * rc), Yc((size_t)n * rc);
                    std::vector<uint8_t> skc((size_t)n * rc);
                    for (int t = 0; t < n; t++)
                        for (int c = 0; c < rc; c++)
                            Xc[(size_t)t * rc + c] = X[(size_t)t * r + c], skc[(size_t)t * rc + c] = skip[(size_t)t * r + c];
                    kvq_dequantize_keys(bits, codes.data(), grid.data(), step.data(), n, rc, Yc.data(), tail);
                    for (int t = 0; t < n; t++)
                        for (int c = 0; c < rc; c++)
                            EXPECT_EQ(Yc[(size_t)t * rc + c], Y[(size_t)t * r + c]) << at << " c " << c;
                    // and within the coded range of each channel's grid (tail: one of its two levels)
                    const float ds = fp16_to_fp32(step[0]);
                    for (int c = 0; c < rc; c++) {
                        const int top = c < rc - tail ? (1 << bits) - 1 : 1;
                        const float m = kivi_grid_min(grid[c], dm), s = kivi_grid_scale(grid[c], ds);
                        for (int t = 0; t < n; t++) {
                            const float y = Y[(size_t)t * r + c];
                            EXPECT_GE(y, m - 1e-6f) << at << " c " << c;
                            EXPECT_LE(y, m + top * s + 1e-5f) << at << " c " << c;
                        }
                    }
                }
    kv_cache_params p;
    p.bits = 2;
    p.key_zero = KV_KEY_MAX_R + 1;
    EXPECT_THROW(kv_cache_validate_params(p), zk::error);
    p.key_zero = 16;
    p.gear = true;
    EXPECT_THROW(kv_cache_validate_params(p), zk::error);
    p.gear = false;
    EXPECT_NO_THROW(kv_cache_validate_params(p));
    p.zeros_k = {16, -1};
    EXPECT_THROW(kv_cache_validate_params(p), zk::error);
    p.zeros_k = {16, 16};
    EXPECT_THROW(kv_cache_validate_params(p, 1, 3), zk::error);
    EXPECT_NO_THROW(kv_cache_validate_params(p, 1, 2));
    std::vector<float> X = make_rows(32, 8, 1);
    std::vector<uint8_t> codes(64);
    std::vector<uint16_t> grid(8), step(KV_GRID_STEPS);
    EXPECT_THROW(kvq_quantize_keys(2, X.data(), 32, 8, codes.data(), grid.data(), step.data(), nullptr, 4, 5),
                 zk::error);
}

// 2-bit channels of 4-bit keys: channel h4 + i of a row whose `mid` channels
// after its h4 4-bit ones are 2-bit is 2-bit code i of the kv_qb_row_bytes(2,
// mid) bytes after the 4-bit part's (then the tail's bytes); each reads back as
// m + code s, its grid [m, m + 3 s] covering the 2-bit clipped grid search's
// [lo, hi] within a min step and three scale steps, and values inside the grid
// within half a step; the 4-bit part likewise with 15 steps, the tail at one of
// its two levels, the 0-bit channels at their min code. Bad counts throw.
TEST(KvKeyParts, KeyMidChannelsAreTwoBit) {
    for (int r : {4, 17, 64, 128})
        for (int mid : {1, 3, 8, 33, 64, 96})
            for (int tail : {0, 5, 32})
                for (int zero : {0, 3}) {
                    if (mid + tail + zero > r) continue;
                    const int n = 32, h4 = r - zero - tail - mid, h = h4 + mid;
                    const int rb4 = kv_qb_row_bytes(4, h4), rbm = kv_qb_row_bytes(2, mid), tb = kv_tail_bytes(tail);
                    const int rb = kv_key_row_bytes(4, r, tail, zero, mid);
                    const std::string at = "r " + std::to_string(r) + " mid " + std::to_string(mid) + " tail " +
                                           std::to_string(tail) + " zero " + std::to_string(zero);
                    ASSERT_EQ(rb, rb4 + rbm + tb) << at;
                    std::vector<float> X = make_rows(n, r, 5 + r + mid + tail), Y(X.size());
                    const int gw = kv_key_grid_words(r, zero);
                    std::vector<uint8_t> codes((size_t)n * rb + 1, 0xAA);
                    std::vector<uint16_t> grid(gw + 1, 0xBEEF), step(KV_GRID_STEPS);
                    kvq_quantize_keys(4, X.data(), n, r, codes.data(), grid.data(), step.data(), nullptr, tail, zero,
                                      mid);
                    EXPECT_EQ(grid[gw], 0xBEEF) << at << ": grid written past its words";
                    EXPECT_EQ(codes[(size_t)n * rb], 0xAA) << at << ": codes written past their rows";
                    kvq_dequantize_keys(4, codes.data(), grid.data(), step.data(), n, r, Y.data(), tail, zero, mid);
                    const float ds = fp16_to_fp32(step[0]), dm = fp16_to_fp32(step[1]);
                    for (int c = 0; c < h + tail; c++) {
                        const int top = c < h4 ? 15 : c < h ? 3 : 1;
                        const float m = kivi_grid_min(grid[c], dm), s = kivi_grid_scale(grid[c], ds);
                        if (c >= h4 && c < h) {  // the 2-bit grid against the 2-bit search
                            float lo, hi;
                            kvq_key_grid_search(2, X.data() + c, n, r, nullptr, 0, &lo, &hi);
                            EXPECT_LE(m, lo + 1e-6f) << at << " c " << c;
                            EXPECT_GT(m, lo - dm * 1.0001f - 1e-6f) << at << " c " << c;
                            EXPECT_GE(m + 3 * s, hi - 1e-5f) << at << " c " << c;
                            EXPECT_LT(m + 3 * s - hi, 3 * ds + dm + 1e-5f) << at << " c " << c;
                        }
                        for (int t = 0; t < n; t++) {
                            const uint8_t* row = codes.data() + (size_t)t * rb;
                            int code;
                            if (c < h4)
                                code = (row[c / 2] >> (4 * (c % 2))) & 15;
                            else if (c < h)
                                code = (row[rb4 + (c - h4) / 4] >> (2 * ((c - h4) % 4))) & 3;
                            else
                                code = (row[rb4 + rbm + (c - h) % tb] >> ((c - h) / tb)) & 1;
                            const float x = X[(size_t)t * r + c], y = Y[(size_t)t * r + c];
                            EXPECT_FLOAT_EQ(y, m + (float)code * s) << at << " c " << c << " t " << t;
                            if (c < h && x >= m && x <= m + top * s) {
                                EXPECT_LE(std::fabs(x - y), 0.5f * s * 1.0001f + 1e-6f) << at << " c " << c << " t " << t;
                            }
                        }
                    }
                    for (int c = h + tail; c < r; c++)
                        for (int t = 0; t < n; t++)
                            EXPECT_EQ(Y[(size_t)t * r + c], dm * (float)((const int8_t*)(grid.data() + r - zero))[c - h - tail])
                                << at << " c " << c;
                }
    std::vector<float> X = make_rows(32, 8, 1);
    std::vector<uint8_t> codes(64);
    std::vector<uint16_t> grid(8), step(KV_GRID_STEPS);
    // 2-bit keys, and more channels than the row has
    EXPECT_THROW(kvq_quantize_keys(2, X.data(), 32, 8, codes.data(), grid.data(), step.data(), nullptr, 0, 0, 4),
                 zk::error);
    EXPECT_THROW(kvq_quantize_keys(4, X.data(), 32, 8, codes.data(), grid.data(), step.data(), nullptr, 3, 2, 4),
                 zk::error);
    kv_cache_params p;
    p.bits = 4;
    p.key_mid = KV_KEY_MAX_R + 1;
    EXPECT_THROW(kv_cache_validate_params(p), zk::error);
    p.key_mid = 16;
    p.gear = true;
    EXPECT_THROW(kv_cache_validate_params(p), zk::error);
    p.gear = false;
    EXPECT_NO_THROW(kv_cache_validate_params(p));
    p.mids_k = {16, -1};
    EXPECT_THROW(kv_cache_validate_params(p), zk::error);
    p.mids_k = {16, 16};
    EXPECT_THROW(kv_cache_validate_params(p, 1, 3), zk::error);
    EXPECT_NO_THROW(kv_cache_validate_params(p, 1, 2));
}
