// The prefill attention kernel (kernels/attention_prefill.h) against a double
// precision reference of causal softmax attention on the same (f16-rounded or
// f32) rows, and against the decode kernel (kernel_attention_range + merge),
// for the group sizes of the supported models (1, 3 SmolLM2, 6 Qwen2.5-1.5B,
// 7 Qwen2.5-0.5B), head dims 64 and 128, compressed ranks (multiples of 4, not
// all of the vector width), slot counts that end mid key block and positions
// with gaps (an evicted cache); and the partial of a row tail (the slots past a
// block's quantized ones) merged with the decode kernel's over the slots before.
//
// Tolerance: 2e-6 x (largest |v| of the head) + 1e-6 x |ref|: float sums of up
// to a few hundred terms and the SIMD exp (relative error ~2e-7).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "ggml-like/dtype.h"
#include "kernels/attention.h"
#include "kernels/attention_prefill.h"

using namespace zk;

namespace {

struct prefill_case {
    int G, r_k, r_v;
    dtype type;
    int64_t n_slots;
    bool gaps;  // positions 3s + 1 instead of s
};

std::ostream& operator<<(std::ostream& o, const prefill_case& c) {
    return o << "G" << c.G << " rk" << c.r_k << " rv" << c.r_v << " " << dtype_name(c.type) << " n" << c.n_slots
             << (c.gaps ? " gaps" : "");
}

class AttnPrefill : public ::testing::TestWithParam<prefill_case> {};

}  // namespace

TEST_P(AttnPrefill, MatchesReferenceAndDecodeKernel) {
    const prefill_case pc = GetParam();
    const int G = pc.G, rk = pc.r_k, rv = pc.r_v;
    const int64_t n = pc.n_slots;
    std::mt19937 rng(7 + G + rk);
    std::normal_distribution<float> N(0.0f, 1.0f);
    // rows as the cache holds them, and their float values
    std::vector<float> kf((size_t)(n * rk)), vf((size_t)(n * rv));
    for (auto& x : kf) x = N(rng);
    for (auto& x : vf) x = N(rng);
    std::vector<uint16_t> kh(kf.size()), vh(vf.size());
    if (pc.type == dtype::F16) {
        for (size_t i = 0; i < kf.size(); i++) kh[i] = fp32_to_fp16(kf[i]), kf[i] = fp16_to_fp32(kh[i]);
        for (size_t i = 0; i < vf.size(); i++) vh[i] = fp32_to_fp16(vf[i]), vf[i] = fp16_to_fp32(vh[i]);
    }
    std::vector<int32_t> pos((size_t)n);
    for (int64_t s = 0; s < n; s++) pos[s] = (int32_t)(pc.gaps ? 3 * s + 1 : s);
    attn_kv_view kv{};
    kv.type = pc.type;
    kv.k.rows = pc.type == dtype::F16 ? (const void*)kh.data() : (const void*)kf.data();
    kv.v.rows = pc.type == dtype::F16 ? (const void*)vh.data() : (const void*)vf.data();
    kv.pos = pos.data();
    kv.n_slots = n;
    kv.r_k = rk;
    kv.r_v = rv;
    // every rank (multiples of 4 included) on a build with the kernel
    ASSERT_TRUE(kernel_prefill_supported(kv)) << pc;
    std::vector<float> kt((size_t)kernel_prefill_keys_size(n, rk), NAN);
    const int64_t nblk = (n + kernel_prefill_key_block() - 1) / kernel_prefill_key_block();
    kernel_prefill_keys(kv, 0, nblk / 2, kt.data());  // in two calls, as threads would
    kernel_prefill_keys(kv, nblk / 2, nblk, kt.data());

    const int D = std::max(rk, rv) + 3;  // query head stride past the rank (compressed heads)
    const int nt_full = kernel_prefill_tokens(G);
    for (int nt : {nt_full, 3, 1}) {
        // the last nt tokens of a prompt (every slot up to its own), plus a query
        // that sees only the first slots
        std::vector<int32_t> qpos((size_t)nt);
        for (int t = 0; t < nt; t++) qpos[t] = pos[std::max<int64_t>(0, n - nt + t)];
        if (nt > 1) qpos[0] = pos[0] + (pc.gaps ? 1 : 0);  // sees slot 0 only
        std::vector<float> q((size_t)nt * G * D);
        for (auto& x : q) x = 0.5f * N(rng);
        const float scale = 1.0f / std::sqrt((float)D);
        const attn_q_view qv{q.data(), (int64_t)G * D, D, G, nt, qpos.data(), scale};
        std::vector<float> out((size_t)nt * G * rv, NAN), scratch((size_t)kernel_prefill_scratch(G, nt, rk, rv));
        kernel_attention_prefill(kv, kt.data(), qv, out.data(), (int64_t)G * rv, rv, scratch.data());

        // The slots from lo on as the partial of the tiled kernel over the row
        // tail (kernel_prefill_row_tail; lo given as sinks, which only sets
        // where the tail starts), merged with the decode kernel's over [0, lo).
        std::vector<float> split((size_t)nt * G * rv);
        {
            attn_kv_view cut = kv;
            cut.n_sink_slots = n / 3;
            int64_t lo = -1;
            const attn_kv_view tail = kernel_prefill_row_tail(cut, &lo);
            ASSERT_EQ(lo, n / 3);
            ASSERT_EQ(tail.n_slots, n - lo);
            std::vector<float> ktt((size_t)kernel_prefill_keys_size(tail.n_slots, rk));
            kernel_prefill_keys(tail, 0, (tail.n_slots + kernel_prefill_key_block() - 1) / kernel_prefill_key_block(),
                                ktt.data());
            std::vector<float> tm((size_t)nt * G), tl((size_t)nt * G), tacc((size_t)nt * G * rv, NAN);
            const attn_partial tp{tm.data(), tl.data(), tacc.data()};
            kernel_attention_prefill_partial(tail, ktt.data(), qv, tp, scratch.data());
            std::vector<float> hm((size_t)G), hl((size_t)G), hacc((size_t)G * rv);
            std::vector<float> hscratch((size_t)kernel_attention_scratch(G, n, rk, rv, 0));
            for (int t = 0; t < nt; t++) {
                const attn_q_view q1{q.data() + (int64_t)t * G * D, (int64_t)G * D, D, G, 1, &qpos[t], scale};
                const attn_partial parts[2] = {{hm.data(), hl.data(), hacc.data()},
                                               {tm.data() + t * G, tl.data() + t * G, tacc.data() + (int64_t)t * G * rv}};
                kernel_attention_range(kv, 0, lo, q1, parts[0], hscratch.data());
                kernel_attention_merge(parts, 2, 1, G, rv, split.data() + (int64_t)t * G * rv, 0, rv);
            }
        }

        std::vector<float> dec((size_t)nt * G * rv);
        std::vector<float> dscratch((size_t)kernel_attention_scratch(G, n, rk, rv, 0));
        std::vector<float> m((size_t)G), l((size_t)G), acc((size_t)G * rv);
        for (int t = 0; t < nt; t++) {
            const attn_q_view q1{q.data() + (int64_t)t * G * D, (int64_t)G * D, D, G, 1, &qpos[t], scale};
            attn_partial p{m.data(), l.data(), acc.data()};
            kernel_attention_range(kv, 0, n, q1, p, dscratch.data());
            kernel_attention_merge(&p, 1, 1, G, rv, dec.data() + (int64_t)t * G * rv, 0, rv);
        }
        for (int t = 0; t < nt; t++)
            for (int j = 0; j < G; j++) {
                const float* qj = q.data() + ((int64_t)t * G + j) * D;
                std::vector<double> sc;
                double mx = -1e300, vmax = 0;
                for (int64_t s = 0; s < n && pos[s] <= qpos[t]; s++) {
                    double d = 0;
                    for (int c = 0; c < rk; c++) d += (double)qj[c] * kf[s * rk + c];
                    sc.push_back(d * scale);
                    mx = std::max(mx, sc.back());
                }
                double l_ref = 0;
                for (double& x : sc) l_ref += (x = std::exp(x - mx));
                for (int c = 0; c < rv; c++) {
                    double ref = 0;
                    for (size_t s = 0; s < sc.size(); s++) {
                        ref += sc[s] * vf[s * rv + c];
                        vmax = std::max(vmax, (double)std::fabs(vf[s * rv + c]));
                    }
                    ref /= l_ref;
                    const float got = out[((int64_t)t * G + j) * rv + c];
                    const double tol = 2e-6 * vmax + 1e-6 * std::fabs(ref);
                    ASSERT_NEAR(got, ref, tol) << pc << " nt " << nt << " token " << t << " head " << j << " ch " << c;
                    ASSERT_NEAR(got, dec[((int64_t)t * G + j) * rv + c], tol)
                        << pc << " (decode kernel) nt " << nt << " token " << t << " head " << j << " ch " << c;
                    ASSERT_NEAR(split[((int64_t)t * G + j) * rv + c], ref, tol)
                        << pc << " (row tail from slot n/3) nt " << nt << " token " << t << " head " << j << " ch " << c;
                }
            }
    }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, AttnPrefill,
    ::testing::Values(prefill_case{6, 128, 128, dtype::F16, 300, false}, prefill_case{6, 128, 128, dtype::F32, 45, false},
                      prefill_case{7, 64, 64, dtype::F16, 200, false}, prefill_case{3, 64, 64, dtype::F16, 97, false},
                      prefill_case{1, 64, 64, dtype::F32, 33, false}, prefill_case{6, 128, 128, dtype::F16, 150, true},
                      prefill_case{3, 36, 48, dtype::F16, 70, false}, prefill_case{2, 20, 16, dtype::F32, 1, false},
                      prefill_case{4, 44, 12, dtype::F16, 50, false}, prefill_case{6, 92, 100, dtype::F16, 130, false},
                      prefill_case{2, 128, 4, dtype::F32, 40, true},
                      // Gemma 3 270M: 4 query heads on one KV head of 256
                      prefill_case{4, 256, 256, dtype::F16, 300, false}));
