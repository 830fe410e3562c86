// Decode-time key-group selection (engine/kv_select.h).
#include "engine/kv_select.h"

#include <algorithm>
#include <cmath>

#include "ggml-like/error.h"
#include "kernels/cpu/simd.h"

namespace zk {

int64_t kv_select_float_scratch(int64_t n_groups, int n_group, int r_k) {
    return n_groups * (n_group + 1) + kernel_attention_select_scratch(n_group, r_k);
}
int64_t kv_select_index_scratch(int64_t n_groups) { return n_groups; }
int64_t kv_select_max_runs(int64_t select, int group) { return (select + group - 1) / group + 1; }

bool kv_select_applies(const attn_kv_view& kv, int64_t select) {
    const bool kivi = kv.k.layout == KV_LAYOUT_Q4 || kv.k.layout == KV_LAYOUT_Q2;
    return select > 0 && kivi && kv.group > 0 && kv.n_groups > 0 && kv.group_start[kv.n_groups] > select;
}

int64_t kv_select_runs(const attn_kv_view& kv, const attn_q_view& q, int64_t select, float* fscratch,
                       int64_t* iscratch, int64_t* runs, int64_t* n_slots) {
    ZK_ASSERT(kv_select_applies(kv, select));
    const int G = q.n_group;
    const int64_t ng = kv.n_groups;
    float* est = fscratch;             // [G x ng] the estimates
    float* score = fscratch + ng * G;  // [ng]
    kernel_attention_group_estimates(kv, q, 0, ng, k_select_spread, est, fscratch + ng * (G + 1));
    // a group's weight: sum_j e^(tau (est_j(g) - best_j)) over the query heads
    std::fill(score, score + ng, 0.0f);
    for (int j = 0; j < G; j++) {
        float* ej = est + j * ng;
        const float best = simd::max_f32(ej, (int)ng);
        simd::scale_f32(ej, (int)ng, k_select_tau);
        simd::exp_shift_sum(ej, (int)ng, k_select_tau * best);
        simd::axpy_f32(1.0f, ej, score, (int)ng);
    }
    const int64_t keep = std::min(ng, (select + kv.group - 1) / kv.group);
    int64_t* idx = iscratch;
    for (int64_t g = 0; g < ng; g++) idx[g] = g;
    // the best `keep` (ties to the newer group), then in slot order
    std::nth_element(idx, idx + keep - 1, idx + ng, [score](int64_t a, int64_t b) {
        return score[a] != score[b] ? score[a] > score[b] : a > b;
    });
    std::sort(idx, idx + keep);
    int64_t n = 0, slots = 0;
    auto add = [&](int64_t s0, int64_t s1) {
        if (s1 <= s0) return;
        slots += s1 - s0;
        if (n > 0 && runs[2 * n - 1] == s0) {
            runs[2 * n - 1] = s1;
            return;
        }
        runs[2 * n] = s0, runs[2 * n + 1] = s1;
        n++;
    };
    for (int64_t i = 0; i < keep; i++) add(kv.group_start[idx[i]], kv.group_start[idx[i] + 1]);
    add(kv.group_start[ng], kv.n_slots);  // the residual window
    *n_slots = slots;
    return n;
}

}  // namespace zk
