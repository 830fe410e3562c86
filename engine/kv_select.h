// Decode-time key-group selection (kv_cache_params::select): a decode step of
// one token attends, in each KV head, to `select` tokens' worth of its slots,
// plus the exact sinks; the other slots are skipped for that step, not evicted
// (a later choice may take them; a choice serves kv_cache_params::select_every
// steps).
// Prefill and steps of several tokens attend to everything.
//   - KIVI keys (4 or 2 bits): the key groups whose grid estimates
//     (kernel_attention_group_estimates at spread k_select_spread) are highest,
//     plus the residual window. This is Quest (Tang et al. 2024) with its
//     pages' min/max taken from the KIVI grids the cache already keeps; it
//     reads 1/group of the keys' bytes to choose.
//   - Other keys (8-bit codes, f16 rows) have no grids: their slots past the
//     sinks form pages of k_select_page, weighed by their exact softmax mass
//     from every slot's score (kernel_attention_scores). Choosing reads every
//     key, so what it saves is the skipped slots' value sums: it applies past
//     twice the budget, where those outweigh the chosen slots' keys read again.
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/attention.h"

namespace zk {

class kv_cache;

// The spread a group's estimate gives its channels' ranges: the centre plus
// half the half-width towards the query. The bound (spread 1) sits 8-13
// above the best key on random keys, and at 4K context in one-token steps on
// Qwen2.5-Coder-1.5B (budget 1,024) spread 0.5 lost KLD 0.0249 where the
// bound lost 0.0270, 0.25 lost 0.0271 and the centre (0) more still
// (bench/RESULTS.md, 2026-12-01).
constexpr float k_select_spread = 0.5f;

// How a group's estimates for the query heads sharing its KV head combine:
// sum_j e^(tau (est_j - best_j)), best_j head j's best group. tau -> infinity
// is the max over the heads (what Quest's GQA ports do); at 4K on Qwen2.5-
// Coder-1.5B (plan 0.14, budget 1,024, one-token steps) the max lost KLD
// 0.0251 over every group's 0.0199, tau 1 0.0238, 0.5 0.0231, 0.25 0.0232,
// 0.125 0.0235; on held-out Python 0.0722 / 0.0715 (tau 0.5) over 0.0594
// (bench/RESULTS.md, 2026-12-01, third pass). A group several heads want
// beats one a single head wants a little more.
constexpr float k_select_tau = 0.5f;

// Slots a page holds where the keys are not KIVI: the size of a KIVI group by
// default, so that runs are as long as there (a run has a fixed cost in the
// value kernels).
constexpr int k_select_page = 32;

// Steps one choice serves by default (kv_cache_params::select_every, k). A
// one-token step on layer il at position pos chooses afresh when (pos + il)
// is a multiple of k (a step so chooses for a k-th of the layers, not for all
// of them every k-th step); the others attend to the runs their head's last
// choice kept (kv_block::select_memo) plus the slots appended since. On
// Qwen2.5-Coder-1.5B (plan 0.14 with KIVI keys, budget 1,024, two threads)
// choosing took 76 of a layer's 205 us of attention at 32K, and a choice every
// 4 steps took the step from 46.0 to 44.3 ms (the fastest of 48, a cache of
// random rows). At 4K (one-token steps, held-out text) the KLD was 0.0237
// choosing every step, 0.0247 every 2 steps and 0.0262 every 4 with all
// layers at once, 0.0271 every 4 staggered as here (bench/RESULTS.md,
// 2026-12-01, choices kept for 4 steps).
constexpr int k_select_every = 4;

// A head's last choice, kept in its block (kv_block::select_memo) for the
// steps after it (kv_cache_params::select_every).
struct kv_select_memo {
    std::vector<int64_t> runs;  // [2 n_runs] as kv_select_runs wrote them
    int64_t n_runs = -1;        // -1: none kept
    int64_t n_slots = 0;        // the block's slots when chosen
    uint64_t edits = 0;         // kv_block::edits then: a compaction or clear since moves slots
};

// Whether a one-token step at position pos on layer il chooses afresh, one
// choice serving `every` steps.
bool kv_select_due(int layer, int32_t pos, int every);
// The runs memo m gives block view kv now (edits: its kv_block::edits): the
// kept runs, then the slots appended since, joined to the last where they
// touch. Returns the number of runs (at most kv_select_max_runs), *n_slots
// the slots they hold; -1, writing nothing, when m keeps none or is stale
// (the block edited since, or holding fewer slots).
int64_t kv_select_recall(const kv_select_memo& m, const attn_kv_view& kv, uint64_t edits, int64_t* runs,
                         int64_t* n_slots);
// Keeps n_runs runs just chosen for block view kv (edits: its kv_block::edits) in m.
void kv_select_remember(kv_select_memo& m, const attn_kv_view& kv, uint64_t edits, const int64_t* runs,
                        int64_t n_runs);

// Floats and int64s of scratch kv_select_runs needs for block view kv and
// n_group query heads (KIVI keys: by its groups; other keys: by its slots).
int64_t kv_select_float_scratch(const attn_kv_view& kv, int n_group);
int64_t kv_select_index_scratch(const attn_kv_view& kv);
// Most runs kv_select_runs writes for kv at a budget of `select` tokens, and
// one more for the slots kv_select_recall joins to them.
int64_t kv_select_max_runs(const attn_kv_view& kv, int64_t select);

// The most of each that any block of cache c needs at its full capacity for
// n_group query heads at the cache's budget (kv_cache_params::select): what
// forward_buffers::reserve_select sizes once, so that a decode step allocates
// nothing as the context grows.
struct kv_select_sizes {
    int64_t f = 0, i = 0, runs = 0;  // floats, int64s (kv_select_*_scratch), runs (kv_select_max_runs)
};
kv_select_sizes kv_select_sizes_max(const kv_cache& c, int n_group);

// Whether block view kv is one selection applies to at budget `select`: KIVI
// keys whose quantized slots exceed the budget; other keys whose slots past
// the sinks exceed twice the budget.
bool kv_select_applies(const attn_kv_view& kv, int64_t select);

// The slot ranges the query (its first token) attends to: runs[2 i], runs[2 i
// + 1] = [s0, s1) of run i, ascending. KIVI keys: a group's score is
// sum_j e^(k_select_tau (est_j(g) - max_g' est_j(g'))) over the query heads j,
// each head's estimate against its own best (the heads' score scales differ);
// the top ceil(select / group) groups are kept, and the residual window comes
// last. Other keys: a page's score is sum_j of head j's softmax mass in it
// (each head's mass summing to 1); the top ceil(select / k_select_page) pages
// are kept. Returns the number of runs; *n_slots gets the slots they hold.
int64_t kv_select_runs(const attn_kv_view& kv, const attn_q_view& q, int64_t select, float* fscratch,
                       int64_t* iscratch, int64_t* runs, int64_t* n_slots);

}  // namespace zk
