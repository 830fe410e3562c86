// Test data and the double-precision reference of attention for the KV cache
// and attention kernel tests (test_kv_quant, test_attention_layouts).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace zk_test {

// Keys and values with the structure real caches have: per-channel offsets and
// scales (channels sorted by variance after the ZACK rotation), a low-rank part,
// and a few outliers.
inline std::vector<float> make_rows(int n, int r, uint32_t seed, bool outliers = true) {
    std::mt19937 g(seed);
    std::normal_distribution<float> N(0, 1);
    std::vector<float> ch_off(r), ch_sc(r), u(n), w(r), x((size_t)n * r);
    for (int c = 0; c < r; c++) ch_off[c] = 0.5f * N(g), ch_sc[c] = 2.0f / (1.0f + 0.1f * c), w[c] = N(g);
    for (int t = 0; t < n; t++) u[t] = N(g);
    for (int t = 0; t < n; t++)
        for (int c = 0; c < r; c++) x[(size_t)t * r + c] = ch_off[c] + ch_sc[c] * (0.7f * N(g) + 0.5f * u[t] * w[c]);
    if (outliers)
        for (int i = 0; i < n * r / 100; i++) x[g() % (n * r)] += 8.0f * N(g);
    return x;
}

// Reference attention of G query heads (q [G x r_k]) over n slots (K [n x r_k],
// V [n x r_v]), summed in double, causal by position: out [G x r_v].
inline void ref_attention(const float* q, int G, const float* K, const float* V, const int32_t* pos, int n, int r_k,
                          int r_v, int32_t qpos, float scale, float* out) {
    std::vector<double> s(n);
    for (int j = 0; j < G; j++) {
        double mx = -1e300;
        for (int t = 0; t < n; t++) {
            if (pos[t] > qpos) {
                s[t] = -1e300;
                continue;
            }
            double d = 0;
            for (int c = 0; c < r_k; c++) d += (double)q[j * r_k + c] * K[(size_t)t * r_k + c];
            s[t] = d * scale;
            mx = std::max(mx, s[t]);
        }
        double l = 0;
        for (int t = 0; t < n; t++) l += s[t] > -1e299 ? std::exp(s[t] - mx) : 0;
        for (int c = 0; c < r_v; c++) {
            double a = 0;
            for (int t = 0; t < n; t++)
                if (s[t] > -1e299) a += std::exp(s[t] - mx) * V[(size_t)t * r_v + c];
            out[j * r_v + c] = (float)(a / l);
        }
    }
}

}  // namespace zk_test
