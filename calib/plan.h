// KV plans: what a session's cache keeps (precision, per-head ranks and key
// bases, optionally an eviction budget), chosen for a size target.
//
// A plan for a target fraction F of the f16 full-rank cache's bytes per token
// is predicted from the measured losses of a .zack (calib/sensitivity.h): the
// rank curves of every head's keys (per key basis) and values, and the loss of
// every pair of key and value precisions (16, 8, 4, 2 bits) at full rank. Every
// head takes one (key precision, value precision, key basis, key rank, value
// rank), the predicted loss of a choice being its two rank losses plus its
// precision pair's loss, and the choices minimising the summed loss within F's
// bytes are found exactly (calib/alloc.h's knapsack, costs from the cache
// layouts' bytes per token). The pair is measured, not summed from the sides:
// at 2 bits on Qwen2.5-Coder-1.5B keys and values together lose about twice
// what each loses alone. Where the .zack measured it, a head may also take
// 2-bit keys whose last 3/4 channels (at most 128) are a 1-bit tail (k_plan_tail_code;
// or, k_plan_zero_code, that tail's last d/4 channels at 0 bits, each its group's mean;
// at full key rank, so a rank cut and a tail compete for the same bytes). Files measured before pairs existed (both sides at
// one precision, 8 and 4 bits only) get one precision for every head: for each, the ranks
// allocated by loss at the least compression that fits F, and the precision
// whose predicted loss is least wins. `zack calibrate --kv-target F` records
// such plans in the .zack (zack.plans); `--kv-target F` computes one on the
// fly; `zack eval --target` measures plans end to end and writes the best as a
// plan file.
//
// Plan file (JSON, also the form stored in zack.plans):
//   {"zack_plan": 1 | 2, "model": {"source_sha256", "n_layer", "n_kv", "head_dim"},
//    "target": F, "kv_fraction": achieved, "bits": 16|8|4|2,
//    "bits_k": [...], "bits_v": [...]   (version 2: per head, n_layer x n_kv; "bits" is then the widest;
//                                       values also 1 and 0: vector codes, 4 x 64 and 8 x 256 books),
//    "tails_k": [...]   (optional, per head: the 1-bit tail of 4- or 2-bit keys, engine/kv_cache.h),
//    "zeros_k": [...]   (optional, per head: 0-bit key channels after the tail, engine/kv_cache.h),
//    "mids_k": [...]    (optional, per head: 2-bit channels of 4-bit keys before the tail, engine/kv_cache.h),
//    "ranks_k": [...], "ranks_v": [...], "key_basis": [...]   (n_layer x n_kv, or [] = full rank),
//    "evict": "none"|policy, "budget": tokens, "loss": predicted (or -1), "source": "...",
//    "group": tokens   (optional, 32 when absent: the KIVI group the plan's bytes and key widths are for),
//    "tier": tokens    (optional, 0 when absent: kv_cache_params::tier, the 4-bit tokens before the window
//                       that the plan was measured with; a fixed cost, not in kv_fraction)}
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "calib/alloc.h"
#include "calib/keybasis.h"

namespace zk {

struct model;
struct session_params;

// The precision code of 2-bit keys with a 1-bit tail in measured loss tables
// (calib/sensitivity.h's k_sens_tail_code; a plan stores such a head as 2-bit
// keys and its tail in tails_k).
constexpr int k_plan_tail_code = 1;
// 2-bit keys whose 1-bit tail ends in 0-bit channels (k_sens_zero_code; zeros_k).
constexpr int k_plan_zero_code = 0;
// Per-head widths (k_sens_wide_code): 4-bit keys whose directions, in the
// quantization order, go on in 2-bit codes, a 1-bit tail and 0-bit channels,
// the counts from the .zack's proxy (calib/keybasis.h keybasis_key_widths) for
// rows of k_key_wide_bits[w] bits a channel; a plan stores such a head as 4-bit
// keys with its mids_k, tails_k and zeros_k.
constexpr int k_plan_n_wide = 4;
constexpr int k_plan_wide_code[k_plan_n_wide] = {5, 6, 9, 10};  // 5, 6: without 2-bit channels (older files)
inline int plan_wide_index(int code) {
    for (int w = 0; w < k_plan_n_wide; w++)
        if (code == k_plan_wide_code[w]) return w;
    return -1;
}
// Whether a loss-table precision code is a keys-only layout (a tail, 0-bit channels, widths).
inline bool plan_keys_only(int code) {
    return code == k_plan_tail_code || code == k_plan_zero_code || plan_wide_index(code) >= 0;
}
// What 0-bit channels add to a tail's measured loss counts this many times in
// a plan. Dropping a channel's variation within a group is a rank cut of that
// part, and its error is as systematic as a cut's (plan_inputs::rank_weight),
// which the sensitivity pass's relative attention error does not see. Measured
// on Qwen2.5-Coder-1.5B, held-out Node.js docs at 4K (bench/RESULTS.md "0-bit
// key channels"), KLD of the plans at 12-15% of the f16 bytes: weight 1 lost
// 0.0704 / 0.0449 / 0.0276 / 0.0193, 8 lost 0.0704 / 0.0418 / - / 0.0155 (rank
// weight 10); with rank weight 30 the rank weight itself (30) lost 0.0548 /
// 0.0468 / 0.0344 / 0.0164, and 8 0.0533 / 0.0430 / 0.0326 / 0.0159. One
// model's measurement: a per-model fit as for the rank weight is the next step.
constexpr double k_plan_zero_weight = 8.0;

struct kv_plan {
    double target = 0;       // requested fraction of the f16 full-rank bytes per token
    double kv_fraction = 1;  // achieved, before eviction
    int bits = 16;           // one precision for every head (the widest of bits_k / bits_v when those are set)
    std::vector<int> bits_k, bits_v;  // [n_layer x n_kv] per-head precision (16, 8, 4, 2; values also 1, 0:
                                      // vector codes, engine/kv_vq.h); empty = `bits` everywhere
    std::vector<int> tails_k;  // [n_layer x n_kv] 1-bit key tails (channels; KIVI keys only); empty = none
    std::vector<int> zeros_k;  // [n_layer x n_kv] 0-bit key channels after the tail (KIVI keys only); empty = none
    std::vector<int> mids_k;   // [n_layer x n_kv] 2-bit channels before the tail (4-bit keys only); empty = none
    double rate = 0;         // ZACK rate of the ranks
    std::vector<int> ranks_k, ranks_v, kbasis;  // [n_layer x n_kv]; empty = full rank
    std::string evict = "none";
    int64_t budget = 0;      // tokens kept by eviction (0 = none)
    int group = 32;          // KIVI: tokens per key quantization group (kv_cache_params::group)
    int tier = 0;            // 4-bit tokens before the window (kv_cache_params::tier; 0 = none)
    double loss = -1;        // predicted loss (sensitivity units), -1 = not predicted
    std::string source;      // what made it ("calibrate --kv-target", "eval --target ppl", ...)
    // The model it is for.
    std::string source_sha256;
    int n_layer = 0, n_kv = 0, head_dim = 0;

    nlohmann::json to_json() const;
    // Throws zk::error "WHERE: what" on a malformed plan.
    static kv_plan from_json(const nlohmann::json& j, const std::string& where);
    std::string describe() const;  // one line: bits, rate, fraction, eviction
    bool mixed() const { return !bits_k.empty(); }
    // The precision of head h's keys / values.
    int head_bits_k(size_t h) const { return bits_k.empty() ? bits : bits_k[h]; }
    int head_bits_v(size_t h) const { return bits_v.empty() ? bits : bits_v[h]; }
};

// What a prediction needs: the curves, the measured losses of the quantized
// caches at full rank (zack_sens_curves: precisions qbits, the first 16, and
// q [n_p x n_p x n_layer x n_kv], keys at qbits[i] and values at qbits[j]; NaN
// where not measured, as the pairs of mixed precision in older files) and the model.
struct plan_inputs {
    rank_curves curves;
    std::vector<int> qbits;
    std::vector<double> q;
    std::string source_sha256;
    // What a unit of rank loss costs against a unit of quantization loss. Both
    // are the same measured quantity (relative attention-output error), but a
    // rank cut's error is systematic and compounds through the layers while
    // quantization noise does not: on Qwen2.5-Coder-1.5B a plan that summed
    // them 1:1 took rate 0.54 with 2-bit codes and lost KLD 3.0 at 4K context.
    // Rank losses are multiplied by this (zack calibrate measures it end to end,
    // zack.sens.rank_weight; --kv-rank-weight overrides; 1 when absent).
    double rank_weight = 1.0;
    // Every head's keys in KIVI codes (4 or 2 bits, with tails and 0-bit
    // channels): what a run with decode-time selection (--kv-select) wants.
    // Selection estimates from the KIVI grids; a head with 8- or 16-bit keys
    // scores every slot to choose (engine/kv_select.h). At 32K on Qwen2.5-
    // Coder-1.5B one such head (plan 0.14's layer 0 head 0) took 23% of a
    // selected step's attention when it attended to every slot, and its
    // scores alone still cost more than a KIVI head's whole step
    // (bench/RESULTS.md, 2026-12-01 "KIVI keys for selection").
    bool kivi_keys = false;
    // [k_plan_n_wide][n_layer x n_kv] every head's widths for the widths codes
    // (from the .zack's blk.N.zack.kscore; empty without it), for KIVI groups of `group`.
    key_wide_rows wide;
    std::vector<float> kscore;  // [n_layer x n_kv x d] the proxy the rows come from (empty without it)
    // The KIVI group plans are made for: the calibration's (zack.sens.group, 32
    // when absent). The measured losses are the calibration group's; another
    // group (a session's --kv-group) changes the bytes and the key widths only.
    int group = 32;
    void set_group(int g);  // group = g, and the widths rows recomputed for it
    // Measured per-layer corrections of the losses (calib/layer_gain.h), [n_layer]
    // or empty: every loss of layer l (each precision pair's, each rank curve's)
    // counts gain[l] times. weigh_layers applies them once; what it was given is kept here.
    std::vector<double> layer_gain;
    void weigh_layers(const std::vector<double>& gain);
    // throws when the .zack has no curves; group > 0: plans for that KIVI group, else the calibration's
    static plan_inputs from_model(const model& m, int group = 0);
    // Every pair measured: plans choose a precision per head.
    bool per_head() const;
    // The measured loss of head h with keys at bits_k and values at bits_v (0 for
    // 16 and 16; bits_k k_plan_tail_code: 2-bit keys with a 1-bit tail); throws
    // when that pair was not measured.
    double qloss(int bits_k, int bits_v, size_t h) const;
    // What a plan counts for head h at that pair: qloss, but with 0-bit key
    // channels (k_plan_zero_code) the tail's loss plus k_plan_zero_weight
    // times what the 0-bit channels add to it.
    double head_qloss(int bits_k, int bits_v, size_t h) const;
    bool measured(int bits_k, int bits_v, size_t h) const;
    // The table's entry, NaN where the pair is not in it.
    double qloss_or_nan(int bits_k, int bits_v, size_t h) const;
};

// The f16 full-rank bytes per token, and the bytes per token of a cache with
// this precision and these ranks (engine/kv_cache.h's accounting; empty ranks = full).
double plan_f16_bytes(int n_layer, int n_kv, int head_dim);
double plan_bytes(int n_layer, int n_kv, int head_dim, int bits, const std::vector<int>& ranks_k,
                  const std::vector<int>& ranks_v, int group = 32);
// Bytes per token one side (keys or values) of one head costs at a precision and
// rank, in a cache without eviction scores: rows (16: f16), codes and scales
// (8: per token; 4 and 2: KIVI, keys' scales per `group` tokens); what a head
// costs besides its sides (a KIVI group table); and what the cache costs
// besides its heads (the slot positions, one ramp for every head of a cache
// without eviction: engine/kv_cache.h).
// tail, zero: a 4- or 2-bit key side's 1-bit and 0-bit channels, mid a 4-bit
// side's 2-bit ones (clamped as the cache does).
double plan_side_bytes(int bits, bool key, int r, int group = 32, int tail = 0, int zero = 0, int mid = 0);
double plan_head_bytes(int bits_k, int bits_v, int group = 32);
double plan_cache_bytes();
// The bytes per token of a plan's precisions and ranks (per-head bits).
double plan_bytes(const kv_plan& p);
// What one head at these precisions and ranks costs in a plan's search: its
// bytes per token rounded up to a whole byte (plans stay within their target,
// less plan_cache_bytes; at most n_layer x n_kv bytes per token below it).
int64_t plan_head_cost(int bits_k, int bits_v, int rank_k, int rank_v, int tail = 0, int zero = 0, int mid = 0,
                       int group = 32);

// The predicted plan for target F in (0, 1] (see above). Throws when F is out
// of range or nothing fits F (naming the least fraction a 4-bit cache at the
// highest rate reaches).
kv_plan plan_for_target(const plan_inputs& in, double target);
// rank_weight > 0 overrides the .zack's (plan_inputs::rank_weight); kivi_keys: plan_inputs::kivi_keys;
// group > 0: plan_inputs::from_model's.
kv_plan plan_for_target(const model& m, double target, double rank_weight = -1, bool kivi_keys = false,
                        int group = 0);
// The predicted loss of a precision + ranks (rank curves + the precision's loss).
double plan_predicted_loss(const plan_inputs& in, int bits, const std::vector<int>& ranks_k,
                           const std::vector<int>& ranks_v, const std::vector<int>& kbasis);
double plan_predicted_loss(const plan_inputs& in, const kv_plan& p);
// The plan with every head of one layer exact: 16-bit keys and values at full
// rank, without tails or narrower channels (its other heads unchanged).
kv_plan plan_with_layer_exact(const kv_plan& p, int layer);

// --kv-plan SPEC: a plan file (JSON), or the target of a plan the .zack
// recorded ("0.1"). Throws with a one-line reason (no such file or plan, made
// for another model, malformed).
kv_plan plan_load(const model& m, const std::string& spec);
// Checks that the plan fits the model (shapes, source hash, ranks), throws otherwise.
void plan_check_model(const kv_plan& p, const model& m, const std::string& where);
// Sets the session's precision, ranks, key bases and eviction from the plan.
void plan_apply(const kv_plan& p, const model& m, session_params& sp);
// The plans a .zack recorded (zack.plans), in file order.
std::vector<kv_plan> plan_list(const model& m);

// Validates a target fraction: in (0, 1].
void plan_validate_target(double target);

}  // namespace zk
