// Compression configurations, the sweep grid and the bisection for "the largest
// KV reduction that keeps >= target of the baseline".
//
// A configuration is a named list of command-line flags exactly as a user would
// type them ({"--kv-rate", "0.5"}, {"--kv-bits", "4"}, ...). The eval driver
// (main/cmd_eval.cpp) turns one into session_params through the same option
// table `zack run` uses, so every --kv-* flag registered there plugs in here
// without a change to this file. A method is a family of configurations with one
// knob, strength t in [0, 1] (0 = weakest, 1 = strongest), e.g. zack(t) =
// --kv-rate t * max_rate. Accuracy is assumed to fall as t grows, which is what
// makes bisection valid.
#pragma once
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/eval/eval_task.h"

namespace zk {

struct eval_config {
    std::string name;      // for tables: "zack 0.50", "h2o 128", "4-bit", "baseline"
    std::string method;    // the curve it belongs to
    double strength = 0;   // the method's knob
    std::vector<std::pair<std::string, std::string>> flags;  // in order, as typed
    std::string cli() const;  // "--kv-rate 0.5 --kv-bits 4" ("" for none)
    nlohmann::json to_json() const;
};

// Knob ranges of the standard methods.
struct eval_method_limits {
    double zack_max_rate = 0.875;     // t = 1 -> --kv-rate 0.875
    std::string evict_policy = "h2o"; // --kv-evict
    double evict_min_keep = 0.0625;   // t = 1 -> budget of 1/16 of the typical item
    int64_t n_tokens = 512;           // typical item length in tokens
    int quant_bits = 4;               // --kv-bits of the quantized methods
    double plan_min_fraction = 0.1;   // plan families: t = 1 -> --kv-target of this fraction of the f16 cache
    double plan_max_fraction = 1.0;   // plan families: t = 0 -> --kv-target of this fraction
    int tier_group = 32;              // plan+tier: a tier level is a multiple of this many tokens (the KIVI group)
};

// One family: which of ZACK, eviction and quantization it combines. Quantization
// has no knob (a fixed --kv-bits); the family is continuous when it has ZACK or
// eviction, and then both move with t together. The plan families move a byte
// target instead (--kv-target max - t (max - min), plan_max_fraction to
// plan_min_fraction): at each target
// the .zack's curves choose every head's precision, rank and key basis together
// (calib/plan.h). plan+evict searches plans and token budgets jointly: it is
// one plan family per eviction level (keep 1/2, 1/4, ... of the typical item,
// down to evict_min_keep), each moving the byte target, so bisection finds the
// smallest plan that keeps the target at every level and the report the
// smallest of them all. plan+tier does the same over 4-bit tiers (--kv-tier) of
// 1/4, 1/8 and 1/16 of the typical item: a tier is a fixed cost that a plan's
// per-token bytes do not show, so the report compares what each cache holds
// (eval_point_held). It is not in "all": a tier needs plans with codes below 4
// bits, and three more families are three more bisections.
struct eval_method {
    std::string name;  // zack, evict, q4, zack+evict, zack+q4, zack+evict+q4, plan, plan+evict 1/2, ...
    bool zack = false, evict = false, quant = false, plan = false;
    eval_method_limits lim;
    double keep = -1;  // plan+evict: the share of the typical item's tokens kept (fixed); -1 = moves with t
    int64_t tier = 0;  // plan+tier: this family's --kv-tier in tokens (fixed); 0 = none
    bool continuous() const { return zack || evict || plan; }
    eval_config at(double t) const;
};

// Limits a search cannot run with (a plan band upside down): one-line errors.
// eval_methods checks them; the driver calls it before the baseline's minutes.
void eval_limits_check(const eval_method_limits& lim);

// The standard families by name; "all" in names = every standard family, in the
// order zack, evict, q4, zack+evict, zack+q4, zack+evict+q4, plan, plan+evict
// (the latter one family per eviction level); plan+tier only by name (one
// family per tier level).
std::vector<eval_method> eval_methods(const std::vector<std::string>& names, const eval_method_limits& lim);

// One evaluated configuration.
struct eval_point {
    eval_config cfg;
    eval_score score;
    double retention = 1;        // share of the baseline kept (eval_retention)
    double bytes_per_token = 0;  // the cache's own accounting, all layers and heads
    double kv_fraction = 1;      // bytes_per_token * tokens_kept / f16 full-rank bytes_per_token
    // What the cache held at the task's context (its allocation: residual windows,
    // exact sinks and group grids included) over an f16 full-rank cache of the same
    // capacity. kv_fraction is the cost of one more token, which long contexts
    // approach; this is the whole cost at the context measured.
    double kv_held_fraction = 1;
    std::string error;           // non-empty: the configuration could not run
    bool available = true;       // false: its flags are not in this build / need a .zack model
    nlohmann::json session = nlohmann::json::object();  // the resolved session parameters (ranks, ...)
    bool ok() const { return error.empty(); }
};

// What a point's cache holds at the task's context, as a fraction of an f16
// full-rank cache of that context: the held fraction (of the cache's own
// capacity) times the share of the tokens eviction kept. The report's size:
// kv_fraction, the cost of one more token, leaves out fixed costs (a 4-bit tier,
// the residual window, sinks) that decide between plans with and without a tier.
double eval_point_held(const eval_point& p);

// Runs one configuration (the caller builds the session and measures the cache).
using eval_runner = std::function<eval_point(const eval_config&)>;

// Memoizes a runner by configuration (cli()), so bisection and grid share runs.
class eval_run_cache {
public:
    explicit eval_run_cache(eval_runner run) : run_(std::move(run)) {}
    const eval_point& get(const eval_config& c);
    std::vector<eval_point> all() const;  // in the order first run

private:
    eval_runner run_;
    std::map<std::string, size_t> index_;
    std::vector<eval_point> points_;
};

// Grid: every continuous family at t = k / points (k = 1..points), the fixed ones once.
std::vector<eval_point> eval_sweep_grid(const std::vector<eval_method>& methods, int points, eval_run_cache& runs);

// Cartesian product of flag values ("--kv-bits" -> {"8", "4"}, ...), method "grid".
std::vector<eval_config> eval_grid_configs(const std::vector<std::pair<std::string, std::vector<std::string>>>& axes);

// Bisection over t for a non-increasing pass(t): the largest t = k / 2^steps with
// pass(t), or found = false when pass(0) fails. Evaluates pass(1) first (done if it
// passes) and pass(0) only when check_zero (t = 0 is the baseline for pure ZACK or
// eviction families, but not for those that quantize).
struct eval_bisect_result {
    bool found = false;
    double t = 0;
    std::vector<std::pair<double, bool>> tried;  // (t, passed) in order
};
eval_bisect_result eval_bisect(const std::function<bool(double)>& pass, int steps, bool check_zero);
// Reference for tests: scans every t = k / 2^steps.
eval_bisect_result eval_dense_scan(const std::function<bool(double)>& pass, int steps);

struct eval_target_result {
    std::string method;
    bool found = false;
    eval_point best;  // the configuration found (valid when found)
    std::vector<eval_point> tried;
    std::string note; // why nothing was found / the family was skipped
};
// For one family: the strongest configuration with retention >= target.
eval_target_result eval_find_target(const eval_method& m, double target, int steps, eval_run_cache& runs);

// The Pareto front of the evaluated points (those that ran): no other point is
// at least as small (eval_point_held) and at least as good (retention) and better
// in one. Indices into pts, smallest first.
std::vector<size_t> eval_pareto_front(const std::vector<eval_point>& pts);
// The smallest point (eval_point_held) with retention >= target, or -1.
int64_t eval_smallest_passing(const std::vector<eval_point>& pts, double target);

}  // namespace zk
