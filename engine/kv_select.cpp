// Decode-time key-group selection (engine/kv_select.h).
#include "engine/kv_select.h"

#include <algorithm>
#include <cmath>

#include "engine/kv_cache.h"
#include "ggml-like/error.h"
#include "kernels/cpu/simd.h"

namespace zk {

namespace {

bool kivi_keys(const attn_kv_view& kv) { return kv.k.layout == KV_LAYOUT_Q4 || kv.k.layout == KV_LAYOUT_Q2; }

// Other keys: the slots past the sinks, and their pages.
int64_t page_slots(const attn_kv_view& kv) { return kv.n_slots - kv.n_sink_slots; }
int64_t n_pages(const attn_kv_view& kv) { return (page_slots(kv) + k_select_page - 1) / k_select_page; }
int64_t scores_scratch(const attn_kv_view& kv, int G) {
    return kernel_attention_scratch(G, page_slots(kv), kv.r_k, kv.r_v, std::max(kv.k.gear.rank, kv.v.gear.rank));
}

// Appends [s0, s1) to the runs, joined to the last run where they touch.
struct run_list {
    int64_t* runs;
    int64_t n = 0, slots = 0;
    void add(int64_t s0, int64_t s1) {
        if (s1 <= s0) return;
        slots += s1 - s0;
        if (n > 0 && runs[2 * n - 1] == s0) {
            runs[2 * n - 1] = s1;
            return;
        }
        runs[2 * n] = s0, runs[2 * n + 1] = s1;
        n++;
    }
};

// idx[0, keep) := the `keep` units of highest score (ties to the newer), in slot order.
void top_units(const float* score, int64_t n, int64_t keep, int64_t* idx) {
    for (int64_t g = 0; g < n; g++) idx[g] = g;
    std::nth_element(idx, idx + keep - 1, idx + n, [score](int64_t a, int64_t b) {
        return score[a] != score[b] ? score[a] > score[b] : a > b;
    });
    std::sort(idx, idx + keep);
}

int64_t select_groups(const attn_kv_view& kv, const attn_q_view& q, int64_t select, float* fscratch,
                      int64_t* iscratch, int64_t* runs, int64_t* n_slots) {
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
    top_units(score, ng, keep, iscratch);
    run_list rl{runs};
    for (int64_t i = 0; i < keep; i++) rl.add(kv.group_start[iscratch[i]], kv.group_start[iscratch[i] + 1]);
    rl.add(kv.group_start[ng], kv.n_slots);  // the residual window
    *n_slots = rl.slots;
    return rl.n;
}

int64_t select_pages(const attn_kv_view& kv, const attn_q_view& q, int64_t select, float* fscratch,
                     int64_t* iscratch, int64_t* runs, int64_t* n_slots) {
    const int G = q.n_group;
    const int64_t s0 = kv.n_sink_slots, n = page_slots(kv), np = n_pages(kv);
    kernel_attention_scores(kv, s0, kv.n_slots, q, fscratch);  // [G x n] at the start of the scratch
    float* mass = fscratch + scores_scratch(kv, G);  // [n] summed over the heads
    float* score = mass + n;                         // [np]
    std::fill(mass, mass + n, 0.0f);
    for (int j = 0; j < G; j++) {
        float* sj = fscratch + j * n;
        const float l = simd::exp_shift_sum(sj, (int)n, simd::max_f32(sj, (int)n));
        simd::axpy_f32(1.0f / l, sj, mass, (int)n);
    }
    for (int64_t p = 0; p < np; p++) {
        const int64_t a = p * k_select_page, b = std::min(n, a + k_select_page);
        float w = 0;
        for (int64_t s = a; s < b; s++) w += mass[s];
        score[p] = w;
    }
    const int64_t keep = std::min(np, (select + k_select_page - 1) / k_select_page);
    top_units(score, np, keep, iscratch);
    run_list rl{runs};
    for (int64_t i = 0; i < keep; i++) {
        const int64_t a = s0 + iscratch[i] * k_select_page;
        rl.add(a, std::min(kv.n_slots, a + k_select_page));
    }
    *n_slots = rl.slots;
    return rl.n;
}

}  // namespace

int64_t kv_select_float_scratch(const attn_kv_view& kv, int n_group) {
    if (kivi_keys(kv)) return kv.n_groups * (n_group + 1) + kernel_attention_select_scratch(n_group, kv.r_k);
    return scores_scratch(kv, n_group) + page_slots(kv) + n_pages(kv);
}
int64_t kv_select_index_scratch(const attn_kv_view& kv) { return kivi_keys(kv) ? kv.n_groups : n_pages(kv); }
int64_t kv_select_max_runs(const attn_kv_view& kv, int64_t select) {
    const int64_t unit = kivi_keys(kv) ? kv.group : k_select_page;
    return (select + unit - 1) / unit + 2;
}

kv_select_sizes kv_select_sizes_max(const kv_cache& c, int n_group) {
    kv_select_sizes m;
    const int64_t select = c.params().select;
    if (select <= 0) return m;
    for (int il = 0; il < c.n_layer(); il++)
        for (int g = 0; g < c.n_head_kv(); g++) {
            const kv_block& b = c.block(il, g);
            attn_kv_view kv = c.view(il, g);  // as it will be at its most
            kv.n_slots = b.capacity;
            if (b.windowed) kv.n_groups = (int64_t)b.group_start.size() - 1;
            m.f = std::max(m.f, kv_select_float_scratch(kv, n_group));
            m.i = std::max(m.i, kv_select_index_scratch(kv));
            m.runs = std::max(m.runs, kv_select_max_runs(kv, select));
        }
    return m;
}

bool kv_select_due(int layer, int32_t pos, int every) { return (pos + layer) % every == 0; }

int64_t kv_select_recall(const kv_select_memo& m, const attn_kv_view& kv, uint64_t edits, int64_t* runs,
                         int64_t* n_slots) {
    if (m.n_runs < 0 || m.edits != edits || kv.n_slots < m.n_slots) return -1;
    run_list rl{runs};
    for (int64_t r = 0; r < m.n_runs; r++) rl.add(m.runs[2 * r], m.runs[2 * r + 1]);
    rl.add(m.n_slots, kv.n_slots);
    *n_slots = rl.slots;
    return rl.n;
}

void kv_select_remember(kv_select_memo& m, const attn_kv_view& kv, uint64_t edits, const int64_t* runs,
                        int64_t n_runs) {
    m.runs.assign(runs, runs + 2 * n_runs);  // the capacity stays: no allocation after the first steps
    m.n_runs = n_runs;
    m.n_slots = kv.n_slots;
    m.edits = edits;
}

bool kv_select_applies(const attn_kv_view& kv, int64_t select) {
    if (select <= 0) return false;
    if (kivi_keys(kv)) return kv.group > 0 && kv.n_groups > 0 && kv.group_start[kv.n_groups] > select;
    return page_slots(kv) > 2 * select;
}

int64_t kv_select_runs(const attn_kv_view& kv, const attn_q_view& q, int64_t select, float* fscratch,
                       int64_t* iscratch, int64_t* runs, int64_t* n_slots) {
    ZK_ASSERT(kv_select_applies(kv, select));
    return kivi_keys(kv) ? select_groups(kv, q, select, fscratch, iscratch, runs, n_slots)
                         : select_pages(kv, q, select, fscratch, iscratch, runs, n_slots);
}

}  // namespace zk
