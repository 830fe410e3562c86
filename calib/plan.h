// KV plans: what a session's cache keeps (precision, per-head ranks and key
// bases, optionally an eviction budget), chosen for a size target.
//
// A plan for a target fraction F of the f16 full-rank cache's bytes per token
// is predicted from the measured loss curves of a .zack (calib/sensitivity.h):
// for each precision (16, 8, 4 bits) the ranks are allocated by loss
// (calib/alloc.h) at the least compression whose bytes fit F, and the
// precision whose predicted loss (ranks' loss + that precision's measured loss
// at full rank) is least wins. `zack calibrate --kv-target F` records such plans
// in the .zack (zack.plans); `--kv-target F` computes one on the fly; `zack eval
// --target` measures plans end to end and writes the best as a plan file.
//
// Plan file (JSON, also the form stored in zack.plans):
//   {"zack_plan": 1, "model": {"source_sha256", "n_layer", "n_kv", "head_dim"},
//    "target": F, "kv_fraction": achieved, "bits": 16|8|4,
//    "ranks_k": [...], "ranks_v": [...], "key_basis": [...]   (n_layer x n_kv, or [] = full rank),
//    "evict": "none"|policy, "budget": tokens, "loss": predicted (or -1), "source": "..."}
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "calib/alloc.h"

namespace zk {

struct model;
struct session_params;

struct kv_plan {
    double target = 0;       // requested fraction of the f16 full-rank bytes per token
    double kv_fraction = 1;  // achieved, before eviction
    int bits = 16;
    double rate = 0;         // ZACK rate of the ranks
    std::vector<int> ranks_k, ranks_v, kbasis;  // [n_layer x n_kv]; empty = full rank
    std::string evict = "none";
    int64_t budget = 0;      // tokens kept by eviction (0 = none)
    double loss = -1;        // predicted loss (sensitivity units), -1 = not predicted
    std::string source;      // what made it ("calibrate --kv-target", "eval --target ppl", ...)
    // The model it is for.
    std::string source_sha256;
    int n_layer = 0, n_kv = 0, head_dim = 0;

    nlohmann::json to_json() const;
    // Throws zk::error "WHERE: what" on a malformed plan.
    static kv_plan from_json(const nlohmann::json& j, const std::string& where);
    std::string describe() const;  // one line: bits, rate, fraction, eviction
};

// What a prediction needs: the curves, the measured losses of the 8-bit and
// 4-bit caches per head ([n_layer x n_kv]; empty = not measured) and the model.
struct plan_inputs {
    rank_curves curves;
    std::vector<double> q8, q4;
    std::string source_sha256;
    static plan_inputs from_model(const model& m);  // throws when the .zack has no curves
};

// The f16 full-rank bytes per token and the bytes per token of a cache with
// this precision and these ranks (engine/kv_cache.h's accounting; empty ranks = full).
double plan_f16_bytes(int n_layer, int n_kv, int head_dim);
double plan_bytes(int n_layer, int n_kv, int head_dim, int bits, const std::vector<int>& ranks_k,
                  const std::vector<int>& ranks_v);

// The predicted plan for target F in (0, 1] (see above). Throws when F is out
// of range or nothing fits F (naming the least fraction a 4-bit cache at the
// highest rate reaches).
kv_plan plan_for_target(const plan_inputs& in, double target);
kv_plan plan_for_target(const model& m, double target);
// The predicted loss of a precision + ranks (rank curves + the precision's loss).
double plan_predicted_loss(const plan_inputs& in, int bits, const std::vector<int>& ranks_k,
                           const std::vector<int>& ranks_v, const std::vector<int>& kbasis);

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
